//! Where a prompt's schema is looked for by every host that finds schemas among files (`pmlc
//! check`, `pml run`, the language server): `NAME.pml` beside the prompt first, then `NAME.xml`
//! (the original Prompt Cache names its schemas and prompts `*.xml`), then the other `.pml` and
//! `.xml` files of the prompt's folder in sorted order. Hosts differ only in how they list a folder
//! and read a file (the language server adds the open documents), so the order and the "looked
//! in" text of the not-found diagnostic live here, once.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The files to try, in order, for the schema `name` of a prompt in `folder`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaSearch {
    folder: PathBuf,
    by_file_name: [PathBuf; 2],
    candidates: Vec<PathBuf>,
}

impl SchemaSearch {
    /// `source_files`: the `.pml` and `.xml` files of `folder`, in any order, possibly with repeats.
    pub fn new(folder: &Path, name: &str, source_files: impl IntoIterator<Item = PathBuf>) -> Self {
        let by_file_name =
            SOURCE_EXTENSIONS.map(|extension| folder.join(format!("{name}.{extension}")));
        let others: BTreeSet<PathBuf> = source_files
            .into_iter()
            .filter(|path| !by_file_name.contains(path))
            .collect();
        let candidates = by_file_name.iter().cloned().chain(others).collect();
        SchemaSearch {
            folder: folder.to_path_buf(),
            by_file_name,
            candidates,
        }
    }

    pub fn candidates(&self) -> &[PathBuf] {
        &self.candidates
    }

    /// Where the search looked, for the help of a schema-not-found diagnostic.
    pub fn looked_in(&self) -> String {
        format!(
            "`{}`, `{}` and the other `.pml` and `.xml` files in `{}`",
            self.by_file_name[0].display(),
            self.by_file_name[1].display(),
            self.folder.display()
        )
    }
}

/// The extensions of files a schema is looked for in, in order of preference.
const SOURCE_EXTENSIONS: [&str; 2] = ["pml", "xml"];

/// Whether `path` may hold PML: `.pml`, or `.xml` as the original Prompt Cache names its files.
pub fn is_pml_source(path: &Path) -> bool {
    path.extension()
        .is_some_and(|extension| SOURCE_EXTENSIONS.iter().any(|known| extension == *known))
}

/// The `.pml` and `.xml` files directly in `folder` on disk (none when it cannot be read).
pub fn pml_sources_in(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| is_pml_source(path) && path.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_file_comes_first_then_the_others_sorted_once() {
        let folder = Path::new("/p");
        let search = SchemaSearch::new(
            folder,
            "travel",
            [
                PathBuf::from("/p/z.pml"),
                PathBuf::from("/p/travel.xml"),
                PathBuf::from("/p/travel.pml"),
                PathBuf::from("/p/b.xml"),
                PathBuf::from("/p/a.pml"),
                PathBuf::from("/p/z.pml"),
            ],
        );
        assert_eq!(
            search.candidates(),
            [
                PathBuf::from("/p/travel.pml"),
                PathBuf::from("/p/travel.xml"),
                PathBuf::from("/p/a.pml"),
                PathBuf::from("/p/b.xml"),
                PathBuf::from("/p/z.pml")
            ]
        );
        assert_eq!(
            search.looked_in(),
            "`/p/travel.pml`, `/p/travel.xml` and the other `.pml` and `.xml` files in `/p`"
        );
    }

    #[test]
    fn xml_files_count_as_pml_sources() {
        assert!(is_pml_source(Path::new("mbti.xml")));
        assert!(is_pml_source(Path::new("a/b.pml")));
        assert!(!is_pml_source(Path::new("notes.txt")));
        assert!(!is_pml_source(Path::new("pml")));
    }
}
