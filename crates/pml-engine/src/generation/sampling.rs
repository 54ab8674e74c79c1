//! Choosing the next token from a logits vector: the sampling parameters, and a seeded [`Sampler`]
//! that applies the repetition penalty, temperature, top-k and top-p (nucleus) filters and draws a
//! token, or takes the argmax when sampling is greedy. Works on plain `&[f32]` so every step can be
//! read and tested without tensors.

use std::cmp::Ordering;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::error::SamplingError;
use super::speculative::Speculation;

/// How the next token is chosen and when generation ends.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 takes the most likely token (greedy), so runs are reproducible.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all of them.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// CTRL-style penalty on tokens seen in the last `repetition_window` tokens; 1 disables it.
    pub repetition_penalty: f32,
    /// How many of the most recent tokens the repetition penalty looks at; 0 disables it.
    pub repetition_window: usize,
    /// Seed of the random generator, so a sampled run can be repeated exactly.
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Strings that end generation; the text before the first one found is kept, nothing after.
    pub stop: Vec<String>,
    /// How tokens are drafted ahead of the model and verified; the answer's distribution (and,
    /// for a given seed, its tokens) is the same either way.
    pub speculation: Speculation,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            repetition_penalty: 1.0,
            repetition_window: 64,
            seed: 0,
            max_tokens: 256,
            stop: Vec::new(),
            speculation: Speculation::default(),
        }
    }
}

impl SamplingParams {
    /// Whether the next token is the argmax rather than a random draw.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks that every number is in its meaningful range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let invalid = |reason: String| Err(SamplingError::InvalidParams(reason));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return invalid(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return invalid(format!(
                "repetition penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        self.speculation
            .validate()
            .map_err(SamplingError::InvalidParams)?;
        Ok(())
    }
}

/// A token still in the running, with its temperature-scaled logit and later its unnormalised
/// probability.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    token_id: u32,
    score: f32,
}

/// Most likely first; among equal scores the lower token id first, so results never depend on
/// the order a selection algorithm happened to leave.
fn most_likely_first(a: &Candidate, b: &Candidate) -> Ordering {
    b.score
        .total_cmp(&a.score)
        .then_with(|| a.token_id.cmp(&b.token_id))
}

/// How many candidates the nucleus search sorts first; most nuclei are far smaller than the
/// vocabulary, so sorting all 150k tokens is rarely needed.
const NUCLEUS_FIRST_GUESS: usize = 64;

/// Chooses tokens according to [`SamplingParams`]; owns its random generator and scratch buffers,
/// which are reused from one step to the next.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    scores: Vec<f32>,
    candidates: Vec<Candidate>,
    recent_tokens: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
            scores: Vec::new(),
            candidates: Vec::new(),
            recent_tokens: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token given the model's `logits` and every token so far (prompt and generated,
    /// in order); only the last `repetition_window` of them are penalised.
    pub fn sample(
        &mut self,
        logits: &[f32],
        previous_tokens: &[u32],
    ) -> Result<u32, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        // -inf is a token masked out (constrained decoding); NaN or +inf is a broken forward pass.
        if let Some((token_id, &value)) = logits
            .iter()
            .enumerate()
            .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
        {
            return Err(SamplingError::NonFiniteLogit { token_id, value });
        }
        if logits.iter().all(|&value| value == f32::NEG_INFINITY) {
            return Err(SamplingError::EverythingMasked);
        }
        self.scores.clear();
        self.scores.extend_from_slice(logits);
        self.apply_repetition_penalty(previous_tokens)?;

        if self.params.is_greedy() {
            return Ok(argmax(&self.scores));
        }
        self.keep_top_k();
        let total_weight = self.exponentiate();
        let total_weight = self.keep_nucleus(total_weight);
        Ok(self.draw(total_weight))
    }

    /// Divides positive logits and multiplies negative ones by the penalty (CTRL, Keskar et al.
    /// 2019), once per distinct token, so a token is never pushed further the more often it
    /// appeared.
    fn apply_repetition_penalty(&mut self, previous_tokens: &[u32]) -> Result<(), SamplingError> {
        let penalty = self.params.repetition_penalty;
        let window = self.params.repetition_window.min(previous_tokens.len());
        if penalty == 1.0 || window == 0 {
            return Ok(());
        }
        self.recent_tokens.clear();
        self.recent_tokens
            .extend_from_slice(&previous_tokens[previous_tokens.len() - window..]);
        self.recent_tokens.sort_unstable();
        self.recent_tokens.dedup();
        let vocab_size = self.scores.len();
        for &token_id in &self.recent_tokens {
            let score =
                self.scores
                    .get_mut(token_id as usize)
                    .ok_or(SamplingError::TokenOutOfRange {
                        token_id,
                        vocab_size,
                    })?;
            *score = if *score > 0.0 {
                *score / penalty
            } else {
                *score * penalty
            };
        }
        Ok(())
    }

    /// Fills `candidates` with the temperature-scaled scores, keeping only the `top_k` best.
    fn keep_top_k(&mut self) {
        let inverse_temperature = 1.0 / self.params.temperature;
        self.candidates.clear();
        self.candidates
            .extend(
                self.scores
                    .iter()
                    .enumerate()
                    .map(|(token_id, &score)| Candidate {
                        token_id: token_id as u32,
                        score: score * inverse_temperature,
                    }),
            );
        let top_k = self.params.top_k;
        if top_k > 0 && top_k < self.candidates.len() {
            self.candidates
                .select_nth_unstable_by(top_k - 1, most_likely_first);
            self.candidates.truncate(top_k);
        }
    }

    /// Turns each candidate's score into an unnormalised probability `exp(score - max)` and
    /// returns their sum.
    fn exponentiate(&mut self) -> f64 {
        let max_score = self
            .candidates
            .iter()
            .map(|candidate| candidate.score)
            .fold(f32::NEG_INFINITY, f32::max);
        let mut total_weight = 0.0f64;
        for candidate in &mut self.candidates {
            candidate.score = (candidate.score - max_score).exp();
            total_weight += f64::from(candidate.score);
        }
        total_weight
    }

    /// Keeps the smallest most-likely-first prefix whose probability reaches `top_p` (at least one
    /// token) and returns the weight kept. Sorts a growing prefix instead of the whole vocabulary.
    fn keep_nucleus(&mut self, total_weight: f64) -> f64 {
        if self.params.top_p >= 1.0 {
            return total_weight;
        }
        let target_weight = f64::from(self.params.top_p) * total_weight;
        let n_candidates = self.candidates.len();
        let mut n_sorted = NUCLEUS_FIRST_GUESS.min(n_candidates);
        loop {
            if n_sorted < n_candidates {
                self.candidates
                    .select_nth_unstable_by(n_sorted - 1, most_likely_first);
            }
            self.candidates[..n_sorted].sort_unstable_by(most_likely_first);
            let mut kept_weight = 0.0f64;
            for (index, candidate) in self.candidates[..n_sorted].iter().enumerate() {
                kept_weight += f64::from(candidate.score);
                if kept_weight >= target_weight {
                    self.candidates.truncate(index + 1);
                    return kept_weight;
                }
            }
            if n_sorted == n_candidates {
                // Rounding left the sum of all weights a hair below `top_p` of itself: keep all.
                return kept_weight;
            }
            n_sorted = (n_sorted * 8).min(n_candidates);
        }
    }

    /// Draws a candidate with probability proportional to its weight.
    fn draw(&mut self, total_weight: f64) -> u32 {
        let mut remaining = self.rng.random::<f64>() * total_weight;
        for candidate in &self.candidates {
            remaining -= f64::from(candidate.score);
            if remaining < 0.0 {
                return candidate.token_id;
            }
        }
        // Only reachable through rounding: the draw landed at the very end of the distribution.
        self.candidates
            .iter()
            .rev()
            .find(|candidate| candidate.score > 0.0)
            .map_or(self.candidates[0].token_id, |candidate| candidate.token_id)
    }
}

/// Index of the largest value; the lowest index wins a tie. `values` must be non-empty and free
/// of NaN.
fn argmax(values: &[f32]) -> u32 {
    let mut best_index = 0;
    for (index, &value) in values.iter().enumerate().skip(1) {
        if value > values[best_index] {
            best_index = index;
        }
    }
    best_index as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::default()
        }
    }

    /// Logits that look like a model's: a few likely tokens in a long tail.
    fn model_like_logits(n_vocab: usize) -> Vec<f32> {
        (0..n_vocab)
            .map(|index| ((index * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect()
    }

    fn draw_many(sampler: &mut Sampler, logits: &[f32], n_draws: usize) -> Vec<u32> {
        (0..n_draws)
            .map(|_| sampler.sample(logits, &[]).expect("finite logits"))
            .collect()
    }

    #[test]
    fn greedy_takes_argmax_and_lowest_index_on_ties() {
        let mut sampler = Sampler::new(params(0.0, 0, 1.0)).unwrap();
        assert_eq!(sampler.sample(&[0.1, 3.0, -2.0, 2.9], &[]), Ok(1));
        assert_eq!(sampler.sample(&[1.0, 5.0, 5.0, 5.0], &[]), Ok(1));
        let logits = model_like_logits(50_000);
        let expected = argmax(&logits);
        let max_logit = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(logits[expected as usize], max_logit);
        assert!(logits[..expected as usize].iter().all(|&v| v < max_logit));
        assert_eq!(sampler.sample(&logits, &[]), Ok(expected));
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let logits = model_like_logits(10_000);
        let greedy = argmax(&logits);
        for temperature in [0.5, 1.0, 5.0, 100.0] {
            let mut sampler = Sampler::new(params(temperature, 1, 1.0)).unwrap();
            assert!(
                draw_many(&mut sampler, &logits, 50)
                    .iter()
                    .all(|&t| t == greedy)
            );
        }
    }

    #[test]
    fn same_seed_repeats_and_other_seed_differs() {
        let logits = model_like_logits(1_000);
        let run = |seed| {
            let mut sampler = Sampler::new(SamplingParams {
                seed,
                ..params(1.5, 0, 1.0)
            })
            .unwrap();
            draw_many(&mut sampler, &logits, 200)
        };
        assert_eq!(run(7), run(7));
        let (first, second) = (run(7), run(8));
        let n_equal = first.iter().zip(&second).filter(|(a, b)| a == b).count();
        // Independent draws from this flat-ish distribution rarely agree; 200 draws agreeing on
        // more than a third would mean the seed is ignored.
        assert!(n_equal < 70, "{n_equal} of 200 draws equal across seeds");
    }

    #[test]
    fn draws_follow_the_softmax_probabilities() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1.
        let logits = [0.0f32, -(2.0f32.ln()), -(4.0f32.ln()), -(4.0f32.ln())];
        let mut sampler = Sampler::new(params(1.0, 0, 1.0)).unwrap();
        let n_draws = 40_000;
        let mut counts = [0usize; 4];
        for token in draw_many(&mut sampler, &logits, n_draws) {
            counts[token as usize] += 1;
        }
        for (count, probability) in counts.iter().zip([0.5, 0.25, 0.125, 0.125]) {
            let frequency = *count as f64 / n_draws as f64;
            // Five standard deviations of a binomial frequency at this sample size.
            let tolerance = 5.0 * (probability * (1.0 - probability) / n_draws as f64).sqrt();
            assert!(
                (frequency - probability).abs() < tolerance,
                "{counts:?} far from the softmax"
            );
        }
    }

    #[test]
    fn top_k_only_draws_the_k_best() {
        let logits = model_like_logits(5_000);
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth_best = sorted[9];
        let mut sampler = Sampler::new(params(10.0, 10, 1.0)).unwrap();
        let draws = draw_many(&mut sampler, &logits, 500);
        assert!(
            draws
                .iter()
                .all(|&token| logits[token as usize] >= kth_best)
        );
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(
            distinct.len() > 1,
            "a hot temperature should spread the draws"
        );
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // Probabilities 0.4, 0.3, 0.2, 0.1 (in shuffled token order).
        let probabilities = [0.2f32, 0.4, 0.1, 0.3];
        let logits: Vec<f32> = probabilities.iter().map(|p| p.ln()).collect();
        let allowed_tokens = |top_p: f32| {
            let mut sampler = Sampler::new(params(1.0, 0, top_p)).unwrap();
            let mut tokens = draw_many(&mut sampler, &logits, 2_000);
            tokens.sort_unstable();
            tokens.dedup();
            tokens
        };
        assert_eq!(allowed_tokens(0.35), vec![1]);
        assert_eq!(allowed_tokens(0.65), vec![1, 3]);
        assert_eq!(allowed_tokens(0.75), vec![0, 1, 3]);
        assert_eq!(allowed_tokens(1.0), vec![0, 1, 2, 3]);
        // Even a tiny p keeps the single most likely token.
        assert_eq!(allowed_tokens(1e-6), vec![1]);
    }

    #[test]
    fn top_p_on_a_flat_vocabulary_grows_past_the_first_guess() {
        let n_vocab = 10_000;
        let logits = vec![0.0f32; n_vocab];
        let mut sampler = Sampler::new(params(1.0, 0, 0.5)).unwrap();
        let draws = draw_many(&mut sampler, &logits, 2_000);
        // Ties are broken towards low ids, so the nucleus is exactly the first half.
        assert!(draws.iter().all(|&token| (token as usize) < n_vocab / 2));
        assert!(
            draws
                .iter()
                .any(|&token| token as usize >= NUCLEUS_FIRST_GUESS)
        );
    }

    #[test]
    fn repetition_penalty_lowers_recent_tokens_once() {
        let logits = [2.0f32, 1.9, -1.0, -1.05];
        let greedy = |penalty: f32, previous: &[u32]| {
            let mut sampler = Sampler::new(SamplingParams {
                repetition_penalty: penalty,
                ..params(0.0, 0, 1.0)
            })
            .unwrap();
            sampler.sample(&logits, previous).unwrap()
        };
        assert_eq!(greedy(1.0, &[0]), 0);
        assert_eq!(greedy(1.2, &[0]), 1);
        // Negative logits are multiplied: token 2 (-1.2) falls below token 3 (-1.05).
        let only_negative = [-1.0f32, -1.05];
        let mut sampler = Sampler::new(SamplingParams {
            repetition_penalty: 1.2,
            ..params(0.0, 0, 1.0)
        })
        .unwrap();
        assert_eq!(sampler.sample(&only_negative, &[0]), Ok(1));
        // Seen three times or once: the same single penalty.
        let mut scores = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0, 0, 1.0)
        })
        .unwrap();
        scores.scores = logits.to_vec();
        scores.apply_repetition_penalty(&[0, 0, 0, 2]).unwrap();
        assert_eq!(scores.scores, vec![1.0, 1.9, -2.0, -1.05]);
    }

    #[test]
    fn repetition_penalty_only_sees_the_window() {
        let mut sampler = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            repetition_window: 2,
            ..params(0.0, 0, 1.0)
        })
        .unwrap();
        sampler.scores = vec![4.0, 4.0, 4.0];
        sampler.apply_repetition_penalty(&[0, 1, 2]).unwrap();
        assert_eq!(sampler.scores, vec![4.0, 2.0, 2.0]);
    }

    #[test]
    fn non_finite_logits_are_errors_and_masked_ones_are_never_drawn() {
        let mut sampler = Sampler::new(params(1.0, 0, 0.9)).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let logits = [0.0, bad, 1.0];
            assert!(matches!(
                sampler.sample(&logits, &[]),
                Err(SamplingError::NonFiniteLogit { token_id: 1, .. })
            ));
        }
        assert_eq!(sampler.sample(&[], &[]), Err(SamplingError::EmptyLogits));
        // -inf masks a token out, whatever the temperature, penalty or draw.
        let masked = [f32::NEG_INFINITY, 0.5, f32::NEG_INFINITY, 0.0];
        for seed in 0..50 {
            let mut sampler = Sampler::new(SamplingParams {
                seed,
                repetition_penalty: 1.3,
                ..params(1.5, 0, 1.0)
            })
            .unwrap();
            let token = sampler.sample(&masked, &[0, 2]).unwrap();
            assert!(token == 1 || token == 3, "drew masked token {token}");
        }
        assert_eq!(
            sampler.sample(&[f32::NEG_INFINITY; 3], &[]),
            Err(SamplingError::EverythingMasked)
        );
    }

    #[test]
    fn out_of_vocabulary_history_and_bad_params_are_errors() {
        let mut sampler = Sampler::new(SamplingParams {
            repetition_penalty: 1.1,
            ..params(0.0, 0, 1.0)
        })
        .unwrap();
        assert_eq!(
            sampler.sample(&[0.0, 1.0], &[5]),
            Err(SamplingError::TokenOutOfRange {
                token_id: 5,
                vocab_size: 2
            })
        );
        for bad in [
            params(-1.0, 0, 1.0),
            params(f32::NAN, 0, 1.0),
            params(1.0, 0, 0.0),
            params(1.0, 0, 1.5),
            SamplingParams {
                repetition_penalty: 0.0,
                ..SamplingParams::default()
            },
        ] {
            assert!(matches!(
                Sampler::new(bad),
                Err(SamplingError::InvalidParams(_))
            ));
        }
    }
}
