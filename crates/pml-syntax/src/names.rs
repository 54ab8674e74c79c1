//! The element names PML gives meaning to, and the "did you mean" suggestion for tags in a
//! schema that are close to one of them.

/// Elements allowed inside a schema (its element set is closed).
pub const SCHEMA_ELEMENTS: &[&str] = &[
    "module",
    "union",
    "collection",
    "param",
    "parameter",
    "system",
    "user",
    "assistant",
];

/// The two root elements; the first one in a file decides what the file is.
pub const ROOT_ELEMENTS: &[&str] = &["schema", "prompt"];

pub(crate) fn is_root(name: &str) -> bool {
    ROOT_ELEMENTS.contains(&name)
}

pub(crate) fn is_schema_element(name: &str) -> bool {
    SCHEMA_ELEMENTS.contains(&name)
}

/// A name that is markup in at least one kind of file. A malformed tag with such a name is
/// recovered as a tag (and reported as an error) rather than kept as text.
pub(crate) fn is_structural(name: &str) -> bool {
    is_root(name) || is_schema_element(name)
}

/// The schema element a misspelled tag name most likely meant: the nearest by edit distance
/// (case-insensitive, at most 2), first in [`SCHEMA_ELEMENTS`] order on ties.
pub(crate) fn suggest_schema_element(name: &str) -> Option<&'static str> {
    const MAX_DISTANCE: usize = 2;
    let lowered = name.to_lowercase();
    // Longer names cannot be within the distance of any element; skip the quadratic work.
    if lowered.chars().count() > "collection".len() + MAX_DISTANCE {
        return None;
    }
    SCHEMA_ELEMENTS
        .iter()
        .map(|candidate| (edit_distance(&lowered, candidate), *candidate))
        .filter(|(distance, _)| *distance <= MAX_DISTANCE)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b_chars: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b_chars.len()).collect();
    let mut current = vec![0; b_chars.len() + 1];
    for (i, a_char) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, b_char) in b_chars.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b_chars.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_substitutions() {
        assert_eq!(edit_distance("modle", "module"), 1);
        assert_eq!(edit_distance("", "user"), 4);
        assert_eq!(edit_distance("unit", "union"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn suggestions_are_close_and_case_insensitive() {
        assert_eq!(suggest_schema_element("modle"), Some("module"));
        assert_eq!(suggest_schema_element("Module"), Some("module"));
        assert_eq!(suggest_schema_element("params"), Some("param"));
        assert_eq!(suggest_schema_element("String"), None);
        assert_eq!(suggest_schema_element("T"), None);
        assert_eq!(suggest_schema_element(&"x".repeat(10_000)), None);
    }
}
