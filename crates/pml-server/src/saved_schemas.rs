//! Schemas uploaded through the API, kept as files so a restarted server serves them again:
//! `<folder>/<hex of the name>.pml` (the hex keeps any name a plain file name), written to a
//! temporary file and renamed, removed on deletion, all loaded at start.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder of one server's saved schemas.
#[derive(Clone, Debug)]
pub struct SavedSchemas {
    folder: PathBuf,
}

impl SavedSchemas {
    pub fn new(folder: impl Into<PathBuf>) -> Self {
        Self {
            folder: folder.into(),
        }
    }

    pub fn folder(&self) -> &Path {
        &self.folder
    }

    fn path_of(&self, name: &str) -> PathBuf {
        let hex: String = name.bytes().map(|byte| format!("{byte:02x}")).collect();
        self.folder.join(format!("{hex}.pml"))
    }

    /// Saves `source` as schema `name`, replacing an earlier one whole or not at all.
    pub fn save(&self, name: &str, source: &str) -> std::io::Result<()> {
        fs::create_dir_all(&self.folder)?;
        let mut temp = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempfile_in(&self.folder)?;
        temp.write_all(source.as_bytes())?;
        temp.as_file().sync_all()?;
        temp.persist(self.path_of(name))
            .map_err(|error| error.error)?;
        Ok(())
    }

    /// Forgets schema `name` (nothing to do when it was never saved).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        match fs::remove_file(self.path_of(name)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// Every saved schema's source, in file-name order; a missing folder holds none.
    pub fn load_all(&self) -> std::io::Result<Vec<(PathBuf, String)>> {
        let entries = match fs::read_dir(&self.folder) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "pml"))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|path| fs::read_to_string(&path).map(|source| (path, source)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_schemas_round_trip_and_names_stay_file_names() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let saved = SavedSchemas::new(dir.path().join("schemas"));
        assert!(saved.load_all().expect("empty").is_empty());
        saved
            .save("notes", "<schema name=\"notes\"/>")
            .expect("save");
        saved
            .save("../odd/name", "<schema/>")
            .expect("save an odd name");
        saved
            .save("notes", "<schema name=\"notes\">v2</schema>")
            .expect("replace");
        let all = saved.load_all().expect("load");
        assert_eq!(all.len(), 2);
        assert!(
            all.iter()
                .all(|(path, _)| path.parent() == Some(saved.folder()))
        );
        assert!(
            all.iter()
                .any(|(_, source)| source.ends_with("v2</schema>"))
        );
        saved.remove("notes").expect("remove");
        saved.remove("never saved").expect("nothing to remove");
        assert_eq!(saved.load_all().expect("load").len(), 1);
    }
}
