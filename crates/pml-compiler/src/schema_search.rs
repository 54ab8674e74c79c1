//! Where a prompt's schema is looked for by every host that finds schemas among files (`pmlc
//! check`, `pml run`, the language server): `NAME.pml` beside the prompt first, then the other
//! `.pml` files of the prompt's folder in sorted order. Hosts differ only in how they list a folder
//! and read a file (the language server adds the open documents), so the order and the "looked
//! in" text of the not-found diagnostic live here, once.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The files to try, in order, for the schema `name` of a prompt in `folder`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaSearch {
    folder: PathBuf,
    by_file_name: PathBuf,
    candidates: Vec<PathBuf>,
}

impl SchemaSearch {
    /// `pml_files`: the `.pml` files of `folder`, in any order, possibly with repeats.
    pub fn new(folder: &Path, name: &str, pml_files: impl IntoIterator<Item = PathBuf>) -> Self {
        let by_file_name = folder.join(format!("{name}.pml"));
        let others: BTreeSet<PathBuf> = pml_files
            .into_iter()
            .filter(|path| *path != by_file_name)
            .collect();
        let candidates = std::iter::once(by_file_name.clone())
            .chain(others)
            .collect();
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
            "`{}` and the other `.pml` files in `{}`",
            self.by_file_name.display(),
            self.folder.display()
        )
    }
}

pub fn is_pml(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "pml")
}

/// The `.pml` files directly in `folder` on disk (none when it cannot be read).
pub fn pml_files_in(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| is_pml(path) && path.is_file())
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
                PathBuf::from("/p/travel.pml"),
                PathBuf::from("/p/a.pml"),
                PathBuf::from("/p/z.pml"),
            ],
        );
        assert_eq!(
            search.candidates(),
            [
                PathBuf::from("/p/travel.pml"),
                PathBuf::from("/p/a.pml"),
                PathBuf::from("/p/z.pml")
            ]
        );
        assert_eq!(
            search.looked_in(),
            "`/p/travel.pml` and the other `.pml` files in `/p`"
        );
    }
}
