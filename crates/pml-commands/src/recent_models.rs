//! The GGUF files recently run by path (`--model ./file.gguf`), newest first, for
//! `pml models list`: a plain list in `$PML_HOME/recent-models.txt`, one absolute path a line,
//! rewritten whole (temp file, then rename) so a reader never sees half of it.

use std::path::{Path, PathBuf};

use pml_models::PmlHome;
use pml_store::atomic_file::write_atomically;

/// How many files the list keeps.
const KEEP: usize = 10;

fn list_file(home: &PmlHome) -> PathBuf {
    home.root().join("recent-models.txt")
}

/// The remembered files, newest first (those deleted since included: the caller says so).
pub fn recent(home: &PmlHome) -> Vec<PathBuf> {
    std::fs::read_to_string(list_file(home))
        .map(|text| {
            text.lines()
                .filter(|line| !line.trim().is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Puts `path` at the top of the list.
pub fn remember(home: &PmlHome, path: &Path) -> anyhow::Result<()> {
    let mut files = recent(home);
    files.retain(|file| file != path);
    files.insert(0, path.to_owned());
    files.truncate(KEEP);
    let mut text = String::new();
    for file in &files {
        text.push_str(&file.to_string_lossy());
        text.push('\n');
    }
    std::fs::create_dir_all(home.root())?;
    write_atomically(&list_file(home), text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_first_without_repeats_and_bounded() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let home = PmlHome::new(dir.path());
        assert!(recent(&home).is_empty());
        for index in 0..12 {
            remember(&home, Path::new(&format!("/models/{index}.gguf")))?;
        }
        remember(&home, Path::new("/models/5.gguf"))?;
        let files = recent(&home);
        assert_eq!(files.len(), KEEP);
        assert_eq!(files[0], Path::new("/models/5.gguf"));
        assert_eq!(files[1], Path::new("/models/11.gguf"));
        assert_eq!(files.iter().filter(|f| f.ends_with("5.gguf")).count(), 1);
        Ok(())
    }
}
