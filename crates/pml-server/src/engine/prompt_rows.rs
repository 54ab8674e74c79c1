//! A PML prompt's tokens in position order and how each was obtained — spliced from a module's
//! stored KV, recomputed by `blend`, or computed new — for `usage.prompt_token_kinds` (the
//! playground's coloured strip of the prompt).

use std::collections::HashMap;
use std::sync::Arc;

use pml_engine::Tokenizer;
use pml_runtime::inference::{PrefillStats, Runtime, SplicePlan};
use serde::Serialize;

/// How a prompt token's KV was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKind {
    Reused,
    Recomputed,
    New,
}

/// One prompt token: its text (lossy where it is part of a UTF-8 sequence) and kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PromptToken(pub String, pub RowKind);

/// A bound prompt's tokens and positions, in position order, and which were new text.
#[derive(Debug)]
pub struct PromptRows {
    pub tokens: Vec<u32>,
    positions: Vec<u32>,
    new: Vec<bool>,
}

impl PromptRows {
    pub fn of(plan: SplicePlan) -> Self {
        // `all_tokens` is the spans' rows, then the new tokens, stably sorted by position (a
        // new token may share a position with a cached row): the same sort of their origins
        // tells each row's.
        let cached = plan.spans.iter().flat_map(|span| span.positions.iter());
        let mut origins: Vec<(u32, bool)> = cached
            .map(|&position| (position, false))
            .chain(plan.new_positions.iter().map(|&position| (position, true)))
            .collect();
        origins.sort_by_key(|&(position, _)| position);
        Self {
            tokens: plan.all_tokens,
            positions: plan.all_positions,
            new: origins.into_iter().map(|(_, new)| new).collect(),
        }
    }

    /// Each token's kind after a prefill with `stats`: nothing spliced (mode `full`, or the
    /// guard sent it there) makes every token new.
    pub fn kinds(&self, stats: &PrefillStats) -> Vec<RowKind> {
        if stats.tokens_reused == 0 {
            return vec![RowKind::New; self.tokens.len()];
        }
        // `recomputed_positions` holds a position once per token that ran through the last
        // layer, every new token among them: what is left at a position after its new tokens
        // are the cached rows recomputed there.
        let mut recomputed: HashMap<u32, usize> = HashMap::new();
        for &position in &stats.recomputed_positions {
            *recomputed.entry(position).or_default() += 1;
        }
        for (position, _) in self
            .positions
            .iter()
            .zip(&self.new)
            .filter(|(_, new)| **new)
        {
            if let Some(count) = recomputed.get_mut(position) {
                *count = count.saturating_sub(1);
            }
        }
        self.positions
            .iter()
            .zip(&self.new)
            .map(|(position, &new)| {
                if new {
                    return RowKind::New;
                }
                match recomputed.get_mut(position) {
                    Some(count) if *count > 0 => {
                        *count -= 1;
                        RowKind::Recomputed
                    }
                    _ => RowKind::Reused,
                }
            })
            .collect()
    }
}

/// The tokens with their texts, for a response.
pub fn spelled(runtime: &Runtime, tokens: &[u32], kinds: &[RowKind]) -> Arc<[PromptToken]> {
    let tokenizer = runtime.tokenizer();
    tokens
        .iter()
        .zip(kinds)
        .map(|(&token, &kind)| {
            let text = tokenizer.decode(&[token]).unwrap_or_default();
            PromptToken(text, kind)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pml_compiler::plan::UnitId;
    use pml_runtime::inference::{InferenceMode, PlannedSpan};

    /// Four cached rows at positions 0–3 and new tokens at 2 and 4: the new token at 2 shares
    /// its position with a cached row and sorts after it.
    fn rows() -> PromptRows {
        let span = PlannedSpan {
            unit: UnitId::ROOT,
            rows: vec![0, 1, 2, 3],
            tokens: vec![10, 11, 12, 13],
            encoded_positions: vec![0, 1, 2, 3],
            positions: vec![0, 1, 2, 3],
        };
        PromptRows::of(SplicePlan {
            spans: vec![span],
            new_tokens: vec![20, 21],
            new_positions: vec![2, 4],
            all_tokens: vec![10, 11, 12, 20, 13, 21],
            all_positions: vec![0, 1, 2, 2, 3, 4],
        })
    }

    #[test]
    fn each_row_is_reused_recomputed_or_new_by_its_origin() {
        let mut stats = PrefillStats::new(InferenceMode::Reuse);
        stats.tokens_reused = 4;
        use RowKind::{New, Recomputed, Reused};
        // Position 2 once: the new token there, not the cached row.
        stats.recomputed_positions = vec![4, 1, 2];
        assert_eq!(
            rows().kinds(&stats),
            [Reused, Recomputed, Reused, New, Reused, New]
        );
        // Position 2 twice: both.
        stats.recomputed_positions = vec![4, 2, 1, 2];
        assert_eq!(
            rows().kinds(&stats),
            [Reused, Recomputed, Recomputed, New, Reused, New]
        );
        stats.recomputed_positions.clear();
        assert_eq!(
            rows().kinds(&stats),
            [Reused, Reused, Reused, New, Reused, New]
        );
    }

    #[test]
    fn nothing_spliced_makes_every_row_new() {
        let stats = PrefillStats::new(InferenceMode::Full);
        assert!(
            rows()
                .kinds(&stats)
                .iter()
                .all(|&kind| kind == RowKind::New)
        );
    }
}
