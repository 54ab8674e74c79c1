//! Which rows of a cache are parallel contexts — modules encoded apart and spliced side by side —
//! and how attention re-weights them ([`pml_kernels::ParallelScaling`], APE's correction).
//! Rows are named by position, not slot, so the setting survives appends and evictions.

use std::ops::Range;

use pml_kernels::ParallelScaling;

/// The context rows of a cache, as position ranges, and the correction attention applies to them.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelContexts {
    /// Sorted, non-overlapping.
    ranges: Vec<Range<u32>>,
    scaling: ParallelScaling,
}

impl ParallelContexts {
    /// The rows at `ranges` (any order; overlapping or touching ranges are merged).
    pub fn new(mut ranges: Vec<Range<u32>>, scaling: ParallelScaling) -> Self {
        ranges.retain(|range| !range.is_empty());
        ranges.sort_by_key(|range| range.start);
        let mut merged: Vec<Range<u32>> = Vec::with_capacity(ranges.len());
        for range in ranges {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        Self {
            ranges: merged,
            scaling,
        }
    }

    pub fn scaling(&self) -> ParallelScaling {
        self.scaling
    }

    pub fn contains(&self, position: u32) -> bool {
        let after = self.ranges.partition_point(|range| range.start <= position);
        after > 0 && position < self.ranges[after - 1].end
    }

    /// One flag per position: whether it is a context row.
    pub fn flags(&self, positions: &[u32]) -> Vec<bool> {
        positions
            .iter()
            .map(|&position| self.contains(position))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_merged_and_looked_up_by_position() {
        let contexts =
            ParallelContexts::new(vec![10..20, 5..8, 15..25, 30..30], ParallelScaling::NONE);
        assert_eq!(contexts.ranges, vec![5..8, 10..25]);
        assert_eq!(
            contexts.flags(&[4, 5, 7, 8, 9, 10, 24, 25, 30]),
            [false, true, true, false, false, true, true, false, false]
        );
    }
}
