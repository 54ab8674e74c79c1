//! How many diagnostics of one file a host shows. A file with 50,000 duplicate imports has
//! 50,000 diagnostics, and printing them all buries the first (which usually caused the rest)
//! under megabytes; every host (`pmlc check` in text and JSON, `pml run`, the language server)
//! shows the first few and says how many more there are, as compilers' error limits do.

use crate::diagnostic::{Diagnostic, Severity};

/// Diagnostics of one file shown unless the user asks for another limit.
pub const DEFAULT_MAX_SHOWN: usize = 50;

/// The diagnostics left out by [`first_shown`], by severity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Omitted {
    pub errors: usize,
    pub warnings: usize,
}

impl Omitted {
    pub fn total(self) -> usize {
        self.errors + self.warnings
    }

    /// `12 more diagnostics (10 errors, 2 warnings) not shown`, or `None` when nothing was left out.
    pub fn describe(self) -> Option<String> {
        (self.total() > 0).then(|| {
            format!(
                "{} more {} ({}, {}) not shown",
                self.total(),
                if self.total() == 1 {
                    "diagnostic"
                } else {
                    "diagnostics"
                },
                plural(self.errors, "error"),
                plural(self.warnings, "warning")
            )
        })
    }
}

/// `1 error`, `2 errors`: counts in the messages every host prints.
pub fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The first `max` diagnostics (all of them when `max` is 0) and what was left out.
pub fn first_shown(diagnostics: &[Diagnostic], max: usize) -> (&[Diagnostic], Omitted) {
    if max == 0 || diagnostics.len() <= max {
        return (diagnostics, Omitted::default());
    }
    let (shown, rest) = diagnostics.split_at(max);
    let mut omitted = Omitted::default();
    for diagnostic in rest {
        match diagnostic.severity {
            Severity::Error => omitted.errors += 1,
            Severity::Warning => omitted.warnings += 1,
        }
    }
    (shown, omitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_are_shown_and_the_rest_counted() {
        let diagnostics: Vec<Diagnostic> = (0..5)
            .map(|i| {
                if i % 2 == 0 {
                    Diagnostic::error("PML208", "e")
                } else {
                    Diagnostic::warning("PML001", "w")
                }
            })
            .collect();
        let (shown, omitted) = first_shown(&diagnostics, 2);
        assert_eq!(shown.len(), 2);
        assert_eq!(
            omitted,
            Omitted {
                errors: 2,
                warnings: 1
            }
        );
        assert_eq!(
            omitted.describe().as_deref(),
            Some("3 more diagnostics (2 errors, 1 warning) not shown")
        );
        let (all, none) = first_shown(&diagnostics, 0);
        assert_eq!((all.len(), none.describe()), (5, None));
        assert_eq!(first_shown(&diagnostics, 5).0.len(), 5);
    }
}
