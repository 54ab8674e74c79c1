//! KV budgets (H2O, "Heavy-Hitter Oracle", in the brief's reading notes): a sequence keeps at
//! most a budget of KV slots — the first few (attention sinks), the most recent, and among the
//! rest those that received the most attention so far (the heavy hitters) — and evicts the
//! others, keeping every kept slot at the position it was computed at.
//!
//! The attention each slot receives is summed over every query, head and layer that has seen it
//! ([`HeavyHitters::forward`] runs each pass with the engine's attention observer). H2O scores
//! per layer and head and evicts per head; this cache holds one set of slots for all layers, so
//! a slot's score is its sum over them (one eviction decision per slot, as SpAtten makes it).
//! A prompt longer than the budget is computed in chunks, evicting before each, so the cache
//! never holds more than the budget; its later tokens then attend only what was kept.
//!
//! A sequence may also run past the positions the model was trained on (a chat longer than its
//! context): with a position limit, once the next token would reach it the kept slots are moved
//! to positions `0..k` in order (their keys re-rotated, as StreamingLLM places its cache and
//! llama.cpp's context shift moves it) and the sequence goes on from `k`. Callers keep counting
//! positions as if nothing moved; the cache is told them less the accumulated shift.

use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::{EngineError, Model};

use crate::attention_mass::observed_pass;

/// Why a budget cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvBudgetError {
    #[error(
        "a KV budget of {slots} slots cannot hold {sinks} attention sinks, {recent} recent slots \
         and one more: raise --kv-budget or lower --kv-recent"
    )]
    TooSmall {
        slots: usize,
        recent: usize,
        sinks: usize,
    },
    #[error(
        "a KV budget of {slots} slots does not fit a context of {limit} positions: lower \
         --kv-budget to at most {limit}"
    )]
    BeyondContext { slots: usize, limit: u32 },
}

/// How many slots a sequence may keep, and which are never evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    /// Most slots held at once.
    pub slots: usize,
    /// The newest slots, always kept.
    pub recent: usize,
    /// The first slots, always kept: a model's softmax parks attention there (StreamingLLM's
    /// attention sinks), and evicting them derails it.
    pub sinks: usize,
}

/// Attention sinks kept by default (StreamingLLM keeps 4).
pub const DEFAULT_SINKS: usize = 4;

impl KvBudget {
    /// A budget of `slots` that keeps the `recent` newest and the `sinks` first slots, with room
    /// for at least one heavy hitter.
    pub fn new(slots: usize, recent: usize, sinks: usize) -> Result<Self, KvBudgetError> {
        // Not `sinks + recent >= slots`: a huge `--kv-recent` would overflow it.
        if sinks >= slots || recent >= slots - sinks {
            return Err(KvBudgetError::TooSmall {
                slots,
                recent,
                sinks,
            });
        }
        Ok(Self {
            slots,
            recent,
            sinks,
        })
    }

    /// H2O's budget of `slots`: the [`DEFAULT_SINKS`] first, the `recent` newest (default:
    /// half the budget, H2O's split of heavy hitters and recent tokens) and heavy hitters.
    pub fn h2o(slots: usize, recent: Option<usize>) -> Result<Self, KvBudgetError> {
        Self::new(slots, recent.unwrap_or(slots / 2), DEFAULT_SINKS)
    }

    /// Slots evicted beyond need each time, so the cache is rebuilt once per that many new
    /// tokens rather than for every token.
    fn slack(&self) -> usize {
        ((self.slots - self.sinks - self.recent) / 8).max(1)
    }

    /// The slots to keep, in slot order, of a sequence whose slots scored `scores` when at most
    /// `room` may stay: the sinks, the `recent` newest and the highest scoring of the others
    /// (ties to the newer slot).
    pub fn keep(&self, scores: &[f32], room: usize, recent: usize) -> Vec<usize> {
        let n = scores.len();
        if n <= room {
            return (0..n).collect();
        }
        let sinks = self.sinks.min(room);
        let recent = recent.min(room - sinks);
        let middle = sinks..n - recent;
        let mut ranked: Vec<usize> = middle.collect();
        // Highest score first; a newer slot first among equal scores.
        ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(b.cmp(&a)));
        ranked.truncate(room - sinks - recent);
        let mut kept: Vec<usize> = (0..sinks).chain(ranked).chain(n - recent..n).collect();
        kept.sort_unstable();
        kept
    }
}

/// A sequence's heavy-hitter scores, and the passes and evictions that keep it within budget.
#[derive(Clone, Debug)]
pub struct HeavyHitters {
    budget: KvBudget,
    /// Per slot of the cache, the attention it has received, summed over every (query, head,
    /// layer) that saw it. H2O's sum, not the mean per query that saw the slot: on three
    /// HotpotQA questions at budgets of 0.7 and 0.5 of the prompt the mean's first-token KL to
    /// full KV was 0.30 and 0.65, the sum's 0.06 and 0.22.
    scores: Vec<f32>,
    evicted: usize,
    /// Positions the cache holds must stay below this (`None`: no limit).
    position_limit: Option<u32>,
    /// What the callers' positions exceed the cache's by, after the moves to `0..k`.
    shift: u32,
    /// Times the kept slots were moved back to position 0.
    moves: usize,
    /// The callers' position after the last token run ([`Self::step`] runs there).
    next_position: u32,
}

impl HeavyHitters {
    /// No slot scored yet: a slot of the cache these passes did not compute counts as having
    /// received no attention.
    pub fn new(budget: KvBudget) -> Self {
        Self {
            budget,
            scores: Vec::new(),
            evicted: 0,
            position_limit: None,
            shift: 0,
            moves: 0,
            next_position: 0,
        }
    }

    /// Goes on after a prefill computed elsewhere (spliced modules, a selective recompute):
    /// `scores` are its slots' heavy-hitter scores so far, and the next token runs at
    /// `next_position`. A cache above the budget is cut to it before that token runs.
    pub fn after_prefill(budget: KvBudget, scores: Vec<f32>, next_position: u32) -> Self {
        Self {
            scores,
            next_position,
            ..Self::new(budget)
        }
    }

    /// The cache's positions kept below `limit` (the model's context), the kept slots moved
    /// back to position 0 when the next token would reach it.
    pub fn with_position_limit(mut self, limit: u32) -> Result<Self, KvBudgetError> {
        if self.budget.slots > limit as usize {
            return Err(KvBudgetError::BeyondContext {
                slots: self.budget.slots,
                limit,
            });
        }
        self.position_limit = Some(limit);
        Ok(self)
    }

    pub fn budget(&self) -> KvBudget {
        self.budget
    }

    /// An empty cache that never holds, nor allocates, more rows than the budget.
    pub fn new_cache(&self, model: &Model) -> Result<KvCache, EngineError> {
        let mut kv = KvCache::with_capacity(model.kv_layout(), model.device(), self.budget.slots)?;
        kv.limit_rows(self.budget.slots);
        Ok(kv)
    }

    /// Slots evicted so far.
    pub fn evicted(&self) -> usize {
        self.evicted
    }

    /// Times the kept slots were moved back to position 0 (past the position limit).
    pub fn moves(&self) -> usize {
        self.moves
    }

    /// Runs `token` at the position after the last token run (a decoding step); returns its
    /// logits `(vocab,)`.
    pub fn step(
        &mut self,
        model: &Model,
        token: u32,
        kv: &mut KvCache,
    ) -> Result<candle_core::Tensor, EngineError> {
        let position = self.next_position;
        self.forward(model, &[token], &[position], kv)
    }

    /// Runs `tokens` at `positions` (increasing, after every position run before) after what
    /// `kv` holds, in chunks that keep the cache within the budget (evicting before each as
    /// needed) and its positions below the limit, summing the attention every slot receives;
    /// returns the last token's logits `(vocab,)`.
    pub fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        positions: &[u32],
        kv: &mut KvCache,
    ) -> Result<candle_core::Tensor, EngineError> {
        if tokens.is_empty() || tokens.len() != positions.len() {
            return Err(EngineError::InvalidInput(format!(
                "{} tokens at {} positions",
                tokens.len(),
                positions.len()
            )));
        }
        let increasing = positions.windows(2).all(|pair| pair[0] < pair[1]);
        if !increasing || positions[0] < self.next_position {
            return Err(EngineError::InvalidInput(format!(
                "a budgeted sequence runs increasing positions from {} on, not {}..={}",
                self.next_position,
                positions[0],
                positions[positions.len() - 1]
            )));
        }
        // A chunk counts towards the recent window it joins; a quarter of the budget at least,
        // so a long prompt takes few passes, and never so much that no heavy hitter fits.
        let room = self.budget.slots - self.budget.sinks;
        let chunk = self.budget.recent.max(room / 4).min(room - 1).max(1);
        let mut logits = None;
        for start in (0..tokens.len()).step_by(chunk) {
            let end = tokens.len().min(start + chunk);
            self.make_room(model, kv, end - start)?;
            if let Some(limit) = self.position_limit
                && positions[end - 1] - self.shift >= limit
            {
                self.move_to_start(model, kv, positions[start])?;
                if positions[end - 1] - self.shift >= limit {
                    return Err(EngineError::InvalidInput(format!(
                        "positions {}..={} span more than the context of {limit}",
                        positions[start],
                        positions[end - 1]
                    )));
                }
            }
            let cache_positions: Vec<u32> = positions[start..end]
                .iter()
                .map(|position| position - self.shift)
                .collect();
            logits = Some(self.observed_pass(model, &tokens[start..end], &cache_positions, kv)?);
        }
        self.next_position = positions[positions.len() - 1] + 1;
        logits.ok_or_else(|| EngineError::InvalidInput("no tokens to run".into()))
    }

    /// Moves the kept slots to positions `0..k` in order, so the callers' `next` runs at `k`.
    fn move_to_start(
        &mut self,
        model: &Model,
        kv: &mut KvCache,
        next: u32,
    ) -> Result<(), EngineError> {
        let held = kv.len();
        let block = kv.gather(&(0..held).collect::<Vec<_>>())?;
        let positions: Vec<u32> = (0..held as u32).collect();
        *kv = self.rebuilt(model, &model.reposition(&block, &positions)?)?;
        self.shift = next - held as u32;
        // Kept at least the shift, so a failed pass after the move leaves a usable state.
        self.next_position = next;
        self.moves += 1;
        Ok(())
    }

    /// One pass of every layer, its attention observed.
    fn observed_pass(
        &mut self,
        model: &Model,
        tokens: &[u32],
        positions: &[u32],
        kv: &mut KvCache,
    ) -> Result<candle_core::Tensor, EngineError> {
        let hidden = observed_pass(model, tokens, positions, kv, &mut self.scores)?;
        Ok(model.logits(&hidden, &[tokens.len() - 1])?.squeeze(0)?)
    }

    /// A cache holding `block`'s rows, with room for the budget and never more.
    fn rebuilt(&self, model: &Model, block: &KvBlock) -> Result<KvCache, EngineError> {
        let mut kv = KvCache::from_blocks(
            model.kv_layout(),
            model.device(),
            &[block],
            self.budget.slots - block.len(),
        )?;
        kv.limit_rows(self.budget.slots);
        Ok(kv)
    }

    /// Evicts so that `incoming` more slots fit the budget: down to the budget less `incoming`
    /// and a slack, so the cache is rebuilt once per several tokens. The incoming tokens count
    /// towards the recent window, so as many fewer held slots are kept as recent.
    fn make_room(
        &mut self,
        model: &Model,
        kv: &mut KvCache,
        incoming: usize,
    ) -> Result<(), EngineError> {
        if kv.len() + incoming <= self.budget.slots {
            return Ok(());
        }
        let room = self
            .budget
            .slots
            .saturating_sub(incoming + self.budget.slack())
            .max(self.budget.sinks + 1);
        let recent = self.budget.recent.saturating_sub(incoming);
        self.scores.resize(kv.len(), 0.0);
        let keep = self.budget.keep(&self.scores, room, recent);
        // A spliced prompt's sliding-window layers may have left out slots no later query
        // sees; the kept slots stay at their positions, so those layers still never read them.
        let block = kv.gather_visible(&keep)?;
        self.evicted += kv.len() - keep.len();
        *kv = self.rebuilt(model, &block)?;
        self.scores = keep.iter().map(|&slot| self.scores[slot]).collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use pml_engine::model::tiny::random_model;
    use pml_engine::model::{Arch, WeightFormat};
    use pml_engine::testing::max_abs_diff;

    use super::*;

    fn prompt(n: u32) -> (Vec<u32>, Vec<u32>) {
        (
            (0..n).map(|t| 3 + (t * 7) % 200).collect(),
            (0..n).collect(),
        )
    }

    /// A budget the sequence never reaches changes nothing: the observed passes give the
    /// plain passes' logits.
    #[test]
    fn a_budget_never_reached_computes_what_full_kv_does() {
        for arch in Arch::ALL {
            let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).expect("model");
            let (tokens, positions) = prompt(40);
            let mut plain = model.new_kv_cache().expect("cache");
            let budget = KvBudget::new(64, 8, DEFAULT_SINKS).expect("budget");
            let mut hitters = HeavyHitters::new(budget);
            let mut budgeted = hitters.new_cache(&model).expect("cache");
            let expected = model
                .forward(&tokens, &positions, &mut plain)
                .expect("plain");
            let logits = hitters
                .forward(&model, &tokens, &positions, &mut budgeted)
                .expect("observed");
            assert!(max_abs_diff(&expected, &logits) < 1e-4, "{arch:?}");
            for (token, position) in [(9u32, 40u32), (17, 41)] {
                let expected = model
                    .forward(&[token], &[position], &mut plain)
                    .expect("step");
                let logits = hitters
                    .forward(&model, &[token], &[position], &mut budgeted)
                    .expect("step");
                assert!(max_abs_diff(&expected, &logits) < 1e-4, "{arch:?}");
            }
            assert_eq!(hitters.evicted(), 0);
        }
    }

    /// Every query's attention is counted: each row of softmax weights sums to 1, so the
    /// scores of a pass sum to its queries × heads × layers.
    #[test]
    fn scores_sum_every_query_head_and_layer() {
        let model = random_model(Arch::Qwen2, 3, WeightFormat::F32, &Device::Cpu).expect("model");
        let budget = KvBudget::new(64, 8, DEFAULT_SINKS).expect("budget");
        let mut hitters = HeavyHitters::new(budget);
        let mut kv = hitters.new_cache(&model).expect("cache");
        let (tokens, positions) = prompt(20);
        hitters
            .forward(&model, &tokens, &positions, &mut kv)
            .expect("pass");
        let config = model.config();
        let expected = (20 * config.n_heads * config.n_layers) as f32;
        let total: f32 = hitters.scores.iter().sum();
        assert!(
            (total - expected).abs() < 1e-2 * expected,
            "{total} vs {expected}"
        );
    }

    /// A prompt three times the budget, then a long generation: the cache never holds (nor
    /// allocates) more than the budget, keeps its sinks, its newest slots and their positions,
    /// and goes on.
    #[test]
    fn the_cache_stays_within_the_budget_past_it() {
        for arch in Arch::ALL {
            let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).expect("model");
            let budget = KvBudget::new(48, 12, DEFAULT_SINKS).expect("budget");
            let mut hitters = HeavyHitters::new(budget);
            let mut kv = hitters.new_cache(&model).expect("cache");
            let (tokens, positions) = prompt(150);
            hitters
                .forward(&model, &tokens, &positions, &mut kv)
                .expect("prompt");
            let row_bytes = model.kv_layout().slot_bytes();
            for step in 0..60u32 {
                let position = 150 + step;
                hitters.step(&model, 5 + step % 90, &mut kv).expect("step");
                assert!(kv.len() <= 48, "{arch:?}: {} slots", kv.len());
                assert!(kv.allocated_bytes() <= 48 * row_bytes, "{arch:?}");
                let held = kv.positions();
                assert_eq!(&held[..DEFAULT_SINKS], &[0, 1, 2, 3], "{arch:?}: the sinks");
                assert_eq!(held.last(), Some(&position), "{arch:?}: the newest");
                assert!(held.windows(2).all(|pair| pair[0] < pair[1]), "{arch:?}");
            }
            assert!(hitters.evicted() >= 150 + 60 - 48, "{arch:?}");
        }
    }

    /// A budget of `slots` (`recent` newest) whose positions stay below `limit`, and its cache.
    fn limited(model: &Model, slots: usize, recent: usize, limit: u32) -> (HeavyHitters, KvCache) {
        let budget = KvBudget::new(slots, recent, DEFAULT_SINKS).expect("budget");
        let hitters = HeavyHitters::new(budget)
            .with_position_limit(limit)
            .expect("limit");
        let kv = hitters.new_cache(model).expect("cache");
        (hitters, kv)
    }

    /// Reaching the position limit moves the kept slots to `0..k` and the sequence goes on
    /// from `k`: slots 20..30 moved to 0..10 and the next tokens run at 10.. compute what a
    /// cache that held them there from the start computes (RoPE depends on distances only).
    #[test]
    fn the_limit_moves_the_kept_slots_to_position_zero() {
        for arch in Arch::ALL {
            let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).expect("model");
            let (mut hitters, mut kv) = limited(&model, 48, 12, 64);
            let first: Vec<u32> = (0..10).map(|t| 3 + t * 11).collect();
            let second: Vec<u32> = (0..10).map(|t| 5 + t * 13).collect();
            let at = |from: u32| (from..from + 10).collect::<Vec<u32>>();
            hitters
                .forward(&model, &first, &at(20), &mut kv)
                .expect("first");
            let logits = hitters
                .forward(&model, &second, &at(100), &mut kv)
                .expect("second");
            assert_eq!(hitters.moves(), 1, "{arch:?}");
            assert_eq!(kv.positions(), (0..20).collect::<Vec<u32>>(), "{arch:?}");

            let mut plain = model.new_kv_cache().expect("cache");
            model.forward(&first, &at(0), &mut plain).expect("first");
            let expected = model.forward(&second, &at(10), &mut plain).expect("second");
            assert!(max_abs_diff(&expected, &logits) < 1e-4, "{arch:?}");
            // Decoding goes on after the callers' last position, at the cache's next one.
            let stepped = hitters.step(&model, 7, &mut kv).expect("step");
            let expected = model.forward(&[7], &[20], &mut plain).expect("step");
            assert!(max_abs_diff(&expected, &stepped) < 1e-4, "{arch:?}");
        }
    }

    /// A sequence many times the limit long: the cache stays within the budget and below the
    /// limit, and goes on.
    #[test]
    fn a_sequence_runs_far_past_the_limit() {
        for arch in Arch::ALL {
            let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).expect("model");
            let (mut hitters, mut kv) = limited(&model, 32, 8, 48);
            let (tokens, positions) = prompt(100);
            hitters
                .forward(&model, &tokens, &positions, &mut kv)
                .expect("prompt");
            for step in 0..100u32 {
                hitters.step(&model, 5 + step % 90, &mut kv).expect("step");
                let held = kv.positions();
                assert!(held.len() <= 32, "{arch:?}");
                assert!(held.iter().all(|&position| position < 48), "{arch:?}");
                assert!(held.windows(2).all(|pair| pair[0] < pair[1]), "{arch:?}");
            }
            assert!(hitters.moves() >= 200 / 48, "{arch:?}: {}", hitters.moves());
        }
    }

    #[test]
    fn a_budget_must_fit_the_position_limit() {
        let budget = KvBudget::new(64, 8, DEFAULT_SINKS).expect("budget");
        assert!(matches!(
            HeavyHitters::new(budget).with_position_limit(32),
            Err(KvBudgetError::BeyondContext {
                slots: 64,
                limit: 32
            })
        ));
        assert!(HeavyHitters::new(budget).with_position_limit(64).is_ok());
    }

    #[test]
    fn keeps_the_sinks_the_recent_and_the_heaviest_in_slot_order() {
        let budget = KvBudget::new(6, 2, 1).expect("budget");
        // Slots 0..10; the heaviest of the middle are 3 (9.0), 6 (7.0) and 2 (5.0).
        let scores = [0.1, 1.0, 5.0, 9.0, 0.2, 0.3, 7.0, 0.0, 0.4, 0.5];
        assert_eq!(budget.keep(&scores, 6, 2), vec![0, 2, 3, 6, 8, 9]);
        assert_eq!(budget.keep(&scores, 4, 2), vec![0, 3, 8, 9]);
        // Fewer recent slots (new tokens about to join them): more heavy hitters.
        assert_eq!(budget.keep(&scores, 4, 0), vec![0, 2, 3, 6]);
        assert_eq!(budget.keep(&scores[..5], 6, 2), vec![0, 1, 2, 3, 4]);
        // Equal scores: the newer slot stays.
        assert_eq!(budget.keep(&[1.0; 8], 4, 2), vec![0, 5, 6, 7]);
    }

    #[test]
    fn a_budget_must_hold_more_than_its_sinks_and_recent_slots() {
        assert_eq!(
            KvBudget::new(6, 5, 1),
            Err(KvBudgetError::TooSmall {
                slots: 6,
                recent: 5,
                sinks: 1
            })
        );
        assert!(KvBudget::new(7, 5, 1).is_ok());
    }
}
