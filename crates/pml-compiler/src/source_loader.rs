//! Loading the files that modules name in `src="..."`. The checker goes through the
//! [`SourceLoader`] trait so each host decides what a schema may read: the CLI reads the schema's
//! folder ([`FsSourceLoader`]), tests use a map ([`MemorySourceLoader`]), and a server that
//! accepts schemas from clients refuses every `src` ([`RefuseSources`]). Files are read only when
//! they are regular files ([`read_regular_file`], which every host uses for the PML files it
//! finds): reading a FIFO or a device can block for ever.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use thiserror::Error;

use crate::rules::SOURCE_TOO_LARGE;

/// Why a `src` file could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SourceError {
    #[error("`{0}` is an absolute path")]
    Absolute(String),
    #[error("`{0}` leads outside the schema's folder")]
    OutsideRoot(String),
    #[error("`{0}` does not exist")]
    NotFound(String),
    #[error("`{0}` is not valid UTF-8")]
    NotUtf8(String),
    #[error("`{path}` is not a regular file ({kind})")]
    NotRegularFile { path: String, kind: &'static str },
    #[error("`{path}` cannot be read: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("`{0}` cannot be loaded: this host does not allow `src` files")]
    Refused(String),
}

impl SourceError {
    /// True when the path itself is forbidden (as opposed to a file that is missing or broken).
    pub fn is_escape(&self) -> bool {
        matches!(self, SourceError::Absolute(_) | SourceError::OutsideRoot(_))
    }
}

/// Reads the text of a module's `src` file, given the path exactly as written in the schema.
pub trait SourceLoader {
    fn load(&self, path: &str) -> Result<String, SourceError>;
}

/// Reads files under one folder (the schema's), refusing absolute paths and any path that, with
/// `..` and symbolic links resolved, leaves the folder.
#[derive(Clone, Debug)]
pub struct FsSourceLoader {
    root: PathBuf,
}

impl FsSourceLoader {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        FsSourceLoader { root: root.into() }
    }
}

impl SourceLoader for FsSourceLoader {
    fn load(&self, path: &str) -> Result<String, SourceError> {
        let relative = relative_path(path)?;
        let unreadable = |error: std::io::Error| match error.kind() {
            std::io::ErrorKind::NotFound => SourceError::NotFound(path.to_string()),
            _ => SourceError::Unreadable {
                path: path.to_string(),
                reason: error.to_string(),
            },
        };
        let root = self.root.canonicalize().map_err(unreadable)?;
        // Canonicalising resolves `..` and every symbolic link, so the containment test below sees
        // where the file really is.
        let file = root.join(relative).canonicalize().map_err(unreadable)?;
        if !file.starts_with(&root) {
            return Err(SourceError::OutsideRoot(path.to_string()));
        }
        let bytes = read_regular_file(&file).map_err(|error| match error {
            ReadFileError::NotRegular(kind) => SourceError::NotRegularFile {
                path: path.to_string(),
                kind,
            },
            ReadFileError::Io(error) => unreadable(error),
            too_large @ ReadFileError::TooLarge { .. } => SourceError::Unreadable {
                path: path.to_string(),
                reason: too_large.to_string(),
            },
        })?;
        String::from_utf8(bytes).map_err(|_| SourceError::NotUtf8(path.to_string()))
    }
}

/// Why [`read_regular_file`] read nothing.
#[derive(Debug, Error)]
pub enum ReadFileError {
    /// The path (symbolic links followed) is a directory, FIFO, socket or device.
    #[error("not a regular file ({0})")]
    NotRegular(&'static str),
    /// Larger than [`MAX_SOURCE_BYTES`]; nothing was read.
    #[error(
        "{code} {name}: the file is {bytes} bytes, more than the {} MiB a PML file may have",
        MAX_SOURCE_BYTES >> 20,
        code = SOURCE_TOO_LARGE.code,
        name = SOURCE_TOO_LARGE.name
    )]
    TooLarge { bytes: u64 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The largest PML file read (schema, prompt or `src=` file), PML307: parsing and checking take
/// memory in proportion to a file's size, and 8 MiB of text is far past any context.
pub const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// Refuses `bytes` of PML source past [`MAX_SOURCE_BYTES`] (a body uploaded to a server).
pub fn check_source_size(bytes: u64) -> Result<(), ReadFileError> {
    if bytes > MAX_SOURCE_BYTES {
        return Err(ReadFileError::TooLarge { bytes });
    }
    Ok(())
}

/// The bytes of `path` if it is a regular file, symbolic links followed. Anything else is refused
/// before it is opened: opening a FIFO blocks until some process writes to it, and a device may
/// never end, so a schema naming one (or a folder holding one) would hang whoever reads it, with
/// no timeout and deaf to signals. The opened file is checked again, in case the path was
/// replaced in between.
pub fn read_regular_file(path: &Path) -> Result<Vec<u8>, ReadFileError> {
    let kind = |metadata: &std::fs::Metadata| {
        let file_type = metadata.file_type();
        (!file_type.is_file()).then(|| describe_file_type(file_type))
    };
    if let Some(kind) = kind(&std::fs::metadata(path)?) {
        return Err(ReadFileError::NotRegular(kind));
    }
    let mut file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    if let Some(kind) = kind(&metadata) {
        return Err(ReadFileError::NotRegular(kind));
    }
    check_source_size(metadata.len())?;
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or_default());
    std::io::Read::read_to_end(&mut file, &mut bytes)?;
    Ok(bytes)
}

/// What a file that is not a regular file is, for messages.
fn describe_file_type(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_block_device() || file_type.is_char_device() {
            return "a device";
        }
    }
    "a special file"
}

/// Files held in memory, keyed by normalised relative path (`a/./b/../c.txt` finds `a/c.txt`).
#[derive(Clone, Debug, Default)]
pub struct MemorySourceLoader {
    files: HashMap<PathBuf, Result<String, Vec<u8>>>,
}

impl MemorySourceLoader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a UTF-8 file.
    pub fn with_file(mut self, path: &str, text: &str) -> Self {
        self.files
            .insert(normalise(Path::new(path)), Ok(text.to_string()));
        self
    }

    /// Adds a file whose bytes need not be UTF-8.
    pub fn with_bytes(mut self, path: &str, bytes: &[u8]) -> Self {
        let content = String::from_utf8(bytes.to_vec()).map_err(|error| error.into_bytes());
        self.files.insert(normalise(Path::new(path)), content);
        self
    }
}

impl SourceLoader for MemorySourceLoader {
    fn load(&self, path: &str) -> Result<String, SourceError> {
        let relative = relative_path(path)?;
        match self.files.get(&normalise(relative)) {
            Some(Ok(text)) => Ok(text.clone()),
            Some(Err(_)) => Err(SourceError::NotUtf8(path.to_string())),
            None => Err(SourceError::NotFound(path.to_string())),
        }
    }
}

/// Refuses every `src`: for hosts that check schemas they did not write.
#[derive(Clone, Copy, Debug, Default)]
pub struct RefuseSources;

impl SourceLoader for RefuseSources {
    fn load(&self, path: &str) -> Result<String, SourceError> {
        Err(SourceError::Refused(path.to_string()))
    }
}

/// The path as a relative path that does not climb above its starting folder, judged lexically
/// (the filesystem loader also checks where symbolic links lead).
fn relative_path(path: &str) -> Result<&Path, SourceError> {
    let as_path = Path::new(path);
    // `Path::is_absolute` is platform-dependent; a leading slash or backslash is absolute in
    // a schema whatever the platform, so that schemas mean the same everywhere.
    if as_path.is_absolute() || path.starts_with(['/', '\\']) || as_path.has_root() {
        return Err(SourceError::Absolute(path.to_string()));
    }
    let mut depth: usize = 0;
    for component in as_path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| SourceError::OutsideRoot(path.to_string()))?;
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(SourceError::Absolute(path.to_string()));
            }
        }
    }
    Ok(as_path)
}

/// `a/./b/../c` → `a/c`, for a path already known not to climb above its start.
fn normalise(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => {
                normal.pop();
            }
            _ => {}
        }
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_loader_normalises_and_refuses_escapes() {
        let loader = MemorySourceLoader::new()
            .with_file("code/a.py", "print(1)")
            .with_bytes("bin.dat", &[0xff, 0xfe]);
        assert_eq!(loader.load("code/./x/../a.py"), Ok("print(1)".to_string()));
        assert_eq!(
            loader.load("code/b.py"),
            Err(SourceError::NotFound("code/b.py".into()))
        );
        assert_eq!(
            loader.load("bin.dat"),
            Err(SourceError::NotUtf8("bin.dat".into()))
        );
        assert_eq!(
            loader.load("../a.py"),
            Err(SourceError::OutsideRoot("../a.py".into()))
        );
        assert_eq!(
            loader.load("code/../../a.py"),
            Err(SourceError::OutsideRoot("code/../../a.py".into()))
        );
        assert_eq!(
            loader.load("/etc/passwd"),
            Err(SourceError::Absolute("/etc/passwd".into()))
        );
        assert_eq!(
            loader.load("\\server\\x"),
            Err(SourceError::Absolute("\\server\\x".into()))
        );
    }

    #[test]
    fn refuse_sources_refuses() {
        assert_eq!(
            RefuseSources.load("a.txt"),
            Err(SourceError::Refused("a.txt".into()))
        );
        assert!(!SourceError::Refused("a".into()).is_escape());
        assert!(SourceError::Absolute("/a".into()).is_escape());
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pml-source-loader-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("schema/sub")).expect("create temp dir");
        dir
    }

    #[test]
    fn fs_loader_reads_inside_and_refuses_outside() {
        let dir = temp_dir("fs");
        let schema_dir = dir.join("schema");
        std::fs::write(schema_dir.join("sub/a.txt"), "inside").expect("write");
        std::fs::write(dir.join("secret.txt"), "outside").expect("write");
        std::fs::write(schema_dir.join("latin1.txt"), [0xe9u8]).expect("write");
        let loader = FsSourceLoader::new(&schema_dir);
        assert_eq!(loader.load("sub/a.txt"), Ok("inside".to_string()));
        assert_eq!(loader.load("sub/../sub/a.txt"), Ok("inside".to_string()));
        assert_eq!(
            loader.load("../secret.txt"),
            Err(SourceError::OutsideRoot("../secret.txt".into()))
        );
        assert_eq!(
            loader.load("missing.txt"),
            Err(SourceError::NotFound("missing.txt".into()))
        );
        assert_eq!(
            loader.load("latin1.txt"),
            Err(SourceError::NotUtf8("latin1.txt".into()))
        );
        assert_eq!(
            loader.load("sub"),
            Err(SourceError::NotRegularFile {
                path: "sub".into(),
                kind: "a directory"
            })
        );
        let absolute = dir.join("secret.txt").display().to_string();
        assert_eq!(
            loader.load(&absolute),
            Err(SourceError::Absolute(absolute.clone()))
        );
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.join("secret.txt"), schema_dir.join("link.txt"))
                .expect("symlink");
            assert_eq!(
                loader.load("link.txt"),
                Err(SourceError::OutsideRoot("link.txt".into()))
            );
            std::os::unix::fs::symlink(schema_dir.join("sub/a.txt"), schema_dir.join("inner.txt"))
                .expect("symlink");
            assert_eq!(loader.load("inner.txt"), Ok("inside".to_string()));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Loads `path` on another thread, so that a load that blocks fails the test instead of
    /// hanging it.
    #[cfg(unix)]
    fn load_or_hang(loader: FsSourceLoader, path: &str) -> Result<String, SourceError> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let path = path.to_string();
        std::thread::spawn(move || {
            let _ = sender.send(loader.load(&path));
        });
        receiver
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("loading returns instead of blocking")
    }

    #[cfg(unix)]
    #[test]
    fn fs_loader_refuses_fifos_without_opening_them() {
        let dir = temp_dir("fifo");
        let schema_dir = dir.join("schema");
        let fifo = schema_dir.join("pipe.txt");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo failed");
        std::os::unix::fs::symlink(&fifo, schema_dir.join("to-pipe.txt")).expect("symlink");
        let loader = FsSourceLoader::new(&schema_dir);
        for path in ["pipe.txt", "to-pipe.txt"] {
            assert_eq!(
                load_or_hang(loader.clone(), path),
                Err(SourceError::NotRegularFile {
                    path: path.into(),
                    kind: "a FIFO"
                })
            );
        }
        assert!(matches!(
            read_regular_file(&fifo),
            Err(ReadFileError::NotRegular("a FIFO"))
        ));
        assert!(matches!(
            read_regular_file(Path::new("/dev/zero")),
            Err(ReadFileError::NotRegular("a device"))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
