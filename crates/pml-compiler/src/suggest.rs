//! "Did you mean ...?" suggestions: the closest known name to a misspelt one, by edit distance.

/// The candidate closest to `unknown`, if it is close enough to be a plausible typo: at most a
/// third of the longer name's characters differ (at least one edit is always allowed, but never
/// a rewrite of the whole name: `b` does not suggest `a`), or the names differ only in case.
pub fn closest<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let unknown_lower = unknown.to_lowercase();
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        if candidate == unknown {
            continue;
        }
        let distance = edit_distance(&unknown_lower, &candidate.to_lowercase());
        let longest = unknown.chars().count().max(candidate.chars().count());
        let allowed = (longest / 3).max(1);
        if distance <= allowed
            && distance < longest
            && best.is_none_or(|(best_distance, _)| distance < best_distance)
        {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// ` (did you mean `x`?)`-style help text, or `None` when nothing is close.
pub fn did_you_mean<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    closest(unknown, candidates).map(|candidate| format!("did you mean `{candidate}`?"))
}

/// Damerau-Levenshtein distance (optimal string alignment) in characters, so that a swapped pair
/// (`lenght` for `length`) costs one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rolling rows: the one before the previous is needed for transpositions.
    let mut before_previous = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before_previous[j - 2] + 1);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before_previous, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("lenght", "length"), 1);
        assert_eq!(edit_distance("tokyo", "tokyo"), 0);
        assert_eq!(edit_distance("東京", "東都"), 1);
    }

    #[test]
    fn suggests_close_names_only() {
        let names = ["travel-plan", "domestic", "overseas"];
        assert_eq!(closest("travel-plans", names), Some("travel-plan"));
        assert_eq!(closest("Domestic", names), Some("domestic"));
        assert_eq!(closest("kitchen", names), None);
        assert_eq!(closest("x", ["y"]), None);
        assert_eq!(closest("ab", ["ax"]), Some("ax"));
        assert_eq!(
            closest("domestic", names),
            None,
            "an exact match is not a suggestion"
        );
    }

    #[test]
    fn prefers_the_closest() {
        assert_eq!(closest("lenght", ["len", "length"]), Some("length"));
        assert_eq!(
            did_you_mean("lne", ["len", "name"]),
            Some("did you mean `len`?".to_string())
        );
    }
}
