//! Atomic replacement: a whole new file or the old one, and no temporary left behind.

use std::io::Write;

use pml_home::atomic_write::{AtomicWriteError, is_temporary, replace_with, write_atomically};

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("listed")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn a_write_replaces_the_file_whole_and_creates_its_folder() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("nested/folder/file.json");
    write_atomically(&path, b"first").expect("written");
    write_atomically(&path, b"second, longer").expect("written");
    assert_eq!(std::fs::read(&path).expect("read"), b"second, longer");
    assert_eq!(names(path.parent().expect("folder")), ["file.json"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
    }
}

/// What a caller's `fill` may fail with: its own refusal, or a step of the write.
#[derive(Debug)]
enum FillError {
    Refused,
    Step,
}

impl From<AtomicWriteError> for FillError {
    fn from(_: AtomicWriteError) -> Self {
        FillError::Step
    }
}

#[test]
fn a_refused_fill_leaves_the_old_file_and_no_temporary() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("model.gguf");
    write_atomically(&path, b"old").expect("written");
    let refused = replace_with(&path, |mut file| -> Result<(), FillError> {
        file.write_all(b"half of a new file").expect("written");
        Err(FillError::Refused)
    });
    assert!(matches!(refused, Err(FillError::Refused)), "{refused:?}");
    assert_eq!(std::fs::read(&path).expect("read"), b"old");
    assert_eq!(names(dir.path()), ["model.gguf"]);
    let streamed = replace_with(&path, |mut file| -> Result<usize, AtomicWriteError> {
        file.write_all(b"new").map_err(|source| AtomicWriteError {
            step: "write",
            path: path.clone(),
            source,
        })?;
        Ok(3)
    });
    assert_eq!(streamed.expect("written"), 3);
    assert_eq!(std::fs::read(&path).expect("read"), b"new");
}

#[test]
fn temporaries_are_told_from_entries() {
    assert!(is_temporary(".tmp-abc123.tmp"));
    assert!(!is_temporary("state.safetensors"));
    assert!(is_temporary(".tmp-abc123"));
    assert!(is_temporary(".model.layout.4242.tmp"));
    assert!(!is_temporary("model.layout"));
}

#[test]
fn an_unwritable_folder_names_the_step_and_path() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"not a folder").expect("written");
    let error = write_atomically(&blocker.join("inside.json"), b"x").expect_err("refused");
    assert_eq!(error.step, "create the folder");
    assert!(error.to_string().contains("a-file"), "{error}");
}
