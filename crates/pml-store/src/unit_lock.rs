//! Locks on store keys between the processes that share a store, so two runs on one fresh store
//! do not both encode every unit: the first to lock a key encodes it, the others wait and then
//! read what it stored. The locks are `flock`s on files in the store's `locks/` folder, so the
//! kernel releases them when their process dies — a crashed run never leaves a key locked.
//!
//! The lock file is removed once its key is stored. A waiter that then gets the lock holds it on
//! a file no longer in the folder, which guards nothing (a newcomer creates a new file); so a
//! lock counts only once the file locked is still the one at the path, else it is taken again.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use super::StoreError;
use super::key::StoreKey;

/// The lock files of one store.
#[derive(Clone, Debug)]
pub struct UnitLocks {
    dir: PathBuf,
}

/// A held lock; dropping it releases the lock and leaves the file.
#[derive(Debug)]
pub struct UnitLock {
    _file: File,
    path: PathBuf,
}

impl UnitLocks {
    /// The locks of the store rooted at `store_root`.
    pub fn new(store_root: &Path) -> Self {
        Self {
            dir: store_root.join("locks"),
        }
    }

    /// Blocks until this process holds `key`'s lock, calling `on_wait` once first when another
    /// process holds it. `None` when the file system cannot lock files (then nothing is shared
    /// safely, and the caller goes on unlocked as before).
    pub fn lock(
        &self,
        key: &StoreKey,
        on_wait: &mut dyn FnMut(),
    ) -> Result<Option<UnitLock>, StoreError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|error| StoreError::io("create directory", &self.dir, error))?;
        let path = self.dir.join(format!("{key}.lock"));
        let mut waited = false;
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|error| StoreError::io("open", &path, error))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    if !waited {
                        on_wait();
                        waited = true;
                    }
                    if let Err(error) = file.lock() {
                        return unsupported_or(error, &path);
                    }
                }
                Err(TryLockError::Error(error)) => return unsupported_or(error, &path),
            }
            if is_still_at(&file, &path) {
                return Ok(Some(UnitLock { _file: file, path }));
            }
        }
    }
}

impl UnitLock {
    /// Removes the lock file, then releases the lock: for a key that is now stored, so a later
    /// run finds the state and never needs the file.
    pub fn release_stored(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn unsupported_or(error: std::io::Error, path: &Path) -> Result<Option<UnitLock>, StoreError> {
    if error.kind() == std::io::ErrorKind::Unsupported {
        return Ok(None);
    }
    Err(StoreError::io("lock", path, error))
}

#[cfg(unix)]
fn is_still_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(current)) => held.dev() == current.dev() && held.ino() == current.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn is_still_at(_file: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn key() -> StoreKey {
        StoreKey::parse(&"ab".repeat(32)).expect("a key")
    }

    #[test]
    fn a_second_locker_waits_until_the_first_is_done() {
        let root = tempfile::tempdir().expect("tempdir");
        let locks = UnitLocks::new(root.path());
        let first = locks
            .lock(&key(), &mut || panic!("nobody holds it yet"))
            .expect("lock")
            .expect("supported");
        let released = Arc::new(AtomicBool::new(false));
        // The waiter says when it found the key held; only then is the first lock released, so
        // the waiter has certainly waited, however the threads are scheduled.
        let (waiting, told) = std::sync::mpsc::channel();
        let waiter = {
            let locks = locks.clone();
            let released = Arc::clone(&released);
            std::thread::spawn(move || {
                let lock = locks
                    .lock(&key(), &mut || {
                        waiting.send(()).expect("the test listens");
                    })
                    .expect("lock")
                    .expect("supported");
                assert!(
                    released.load(Ordering::SeqCst),
                    "got the lock while it was held"
                );
                drop(lock);
            })
        };
        told.recv().expect("the waiter found the key held");
        released.store(true, Ordering::SeqCst);
        first.release_stored();
        waiter.join().expect("waiter");
    }

    #[test]
    fn a_killed_holder_leaves_the_key_unlocked() {
        let root = tempfile::tempdir().expect("tempdir");
        let locks = UnitLocks::new(root.path());
        std::fs::create_dir_all(root.path().join("locks")).expect("mkdir");
        let path = root.path().join("locks").join(format!("{}.lock", key()));
        // Another process takes the lock (util-linux `flock`, which then execs a shell that
        // says so and becomes `sleep` still holding it: `--no-fork`), then dies without
        // releasing it. Its line on stdout is the signal: no polling, no timing.
        let mut holder = Command::new("flock")
            .arg("--no-fork")
            .arg(&path)
            .args(["sh", "-c", "echo locked; exec sleep 60"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("util-linux `flock` runs (Debian's util-linux is essential)");
        let mut said = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
            &mut said,
        )
        .expect("read the holder's line");
        assert_eq!(said.trim(), "locked", "the other process holds the lock");
        let probe = File::open(&path).expect("the lock file exists");
        assert!(
            matches!(probe.try_lock(), Err(TryLockError::WouldBlock)),
            "held by the other process"
        );
        drop(probe);
        holder.kill().expect("kill");
        let _ = holder.wait();
        let lock = locks
            .lock(&key(), &mut || panic!("still locked after its holder died"))
            .expect("lock");
        assert!(lock.is_some(), "the dead process's lock was released");
    }
}
