//! Scores: answers against gold answers with SQuAD's normalisation (lower case, punctuation and
//! the articles a/an/the removed, whitespace collapsed) as exact match and token F1, the best
//! over the gold answers; and a mode's fidelity to mode `full` on the same prompt.

use std::collections::HashMap;

/// SQuAD's `normalize_answer`.
pub fn normalize(text: &str) -> String {
    let lowered = text.to_lowercase();
    let no_punctuation: String = lowered
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    no_punctuation
        .split_whitespace()
        .filter(|word| !matches!(*word, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// 1 when the normalised answer equals a normalised gold answer.
pub fn exact_match(answer: &str, golds: &[String]) -> f64 {
    let answer = normalize(answer);
    f64::from(u8::from(golds.iter().any(|gold| normalize(gold) == answer)))
}

/// SQuAD token F1, the best over `golds`.
pub fn f1(answer: &str, golds: &[String]) -> f64 {
    golds
        .iter()
        .map(|gold| token_f1(&normalize(answer), &normalize(gold)))
        .fold(0.0, f64::max)
}

fn token_f1(prediction: &str, gold: &str) -> f64 {
    let predicted: Vec<&str> = prediction.split_whitespace().collect();
    let expected: Vec<&str> = gold.split_whitespace().collect();
    if predicted.is_empty() || expected.is_empty() {
        return f64::from(u8::from(predicted == expected));
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for word in &expected {
        *counts.entry(word).or_default() += 1;
    }
    let mut common = 0usize;
    for word in &predicted {
        if let Some(count) = counts.get_mut(word).filter(|count| **count > 0) {
            *count -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / predicted.len() as f64;
    let recall = common as f64 / expected.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// `KL(p ‖ q)` of the softmax distributions of two logit vectors, in nats.
pub fn kl_divergence(reference_logits: &[f32], logits: &[f32]) -> f64 {
    let p = log_softmax(reference_logits);
    let q = log_softmax(logits);
    p.iter()
        .zip(&q)
        .map(|(&log_p, &log_q)| {
            let prob = log_p.exp();
            if prob > 0.0 {
                prob * (log_p - log_q)
            } else {
                0.0
            }
        })
        .sum::<f64>()
        .max(0.0)
}

/// How far the most likely token's probability leads the runner-up's (0 for a tie, 1 for a
/// certain token): a first token that `full` barely prefers can flip on any rounding, so
/// agreement is also reported over the questions where `full` was decided.
pub fn top_two_margin(logits: &[f32]) -> f64 {
    let (first, second) = log_softmax(logits).into_iter().map(f64::exp).fold(
        (0.0f64, 0.0f64),
        |(first, second), prob| match prob > first {
            true => (prob, first),
            false => (first, second.max(prob)),
        },
    );
    first - second
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max: f64 = logits
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
        .into();
    let sum: f64 = logits
        .iter()
        .map(|&x| (f64::from(x) - max).exp())
        .sum::<f64>();
    let log_sum = sum.ln() + max;
    logits.iter().map(|&x| f64::from(x) - log_sum).collect()
}

/// Greedy agreement over `horizon` tokens: the length of the common prefix of the two greedy
/// continuations over `horizon`; continuations that both stop at the same token (end of
/// sequence) agree over the whole horizon.
pub fn greedy_agreement(reference: &Continuation, other: &Continuation, horizon: usize) -> f64 {
    let common = reference
        .tokens
        .iter()
        .zip(&other.tokens)
        .take_while(|(a, b)| a == b)
        .count();
    let identical_and_ended = reference.ended
        && other.ended
        && reference.tokens.len() == other.tokens.len()
        && common == reference.tokens.len();
    let agreeing = if identical_and_ended {
        horizon
    } else {
        common.min(horizon)
    };
    agreeing as f64 / horizon as f64
}

/// A greedy continuation: its tokens (the end-of-sequence token included when it `ended`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Continuation {
    pub tokens: Vec<u32>,
    pub ended: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golds(answers: &[&str]) -> Vec<String> {
        answers.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn squad_normalisation_f1_and_exact_match() {
        assert_eq!(
            normalize("The  Eiffel-Tower, a landmark!"),
            "eiffeltower landmark"
        );
        assert_eq!(exact_match("the Yes.", &golds(&["yes"])), 1.0);
        assert_eq!(exact_match("no", &golds(&["yes"])), 0.0);
        assert_eq!(f1("Barack Obama", &golds(&["Obama"])), 2.0 / 3.0);
        assert_eq!(f1("Obama", &golds(&["nobody", "Barack Obama"])), 2.0 / 3.0);
        assert_eq!(f1("", &golds(&["x"])), 0.0);
        assert_eq!(
            f1("a", &golds(&["the"])),
            1.0,
            "both empty after normalising"
        );
    }

    #[test]
    fn the_margin_is_the_leaders_probability_lead() {
        assert!(top_two_margin(&[1.0, 1.0, -5.0]).abs() < 1e-12);
        // softmax of ln 6, ln 3, ln 1: 0.6, 0.3, 0.1, the leader anywhere in the vector.
        let margin = top_two_margin(&[3f32.ln(), 1.0f32.ln(), 6f32.ln()]);
        assert!((margin - 0.3).abs() < 1e-6, "{margin}");
        assert!(top_two_margin(&[0.0, 100.0]) > 0.999);
    }

    #[test]
    fn kl_is_zero_for_equal_logits_and_positive_otherwise() {
        let a = [1.0, 2.0, 3.0];
        assert!(kl_divergence(&a, &a).abs() < 1e-12);
        assert!(kl_divergence(&a, &[3.0, 2.0, 1.0]) > 0.1);
        let shifted = [11.0, 12.0, 13.0];
        assert!(kl_divergence(&a, &shifted).abs() < 1e-9, "shift invariant");
    }

    #[test]
    fn greedy_agreement_counts_the_common_prefix() {
        let ended = |tokens: &[u32]| Continuation {
            tokens: tokens.to_vec(),
            ended: true,
        };
        let open = |tokens: &[u32]| Continuation {
            tokens: tokens.to_vec(),
            ended: false,
        };
        assert_eq!(
            greedy_agreement(&ended(&[1, 2, 9]), &ended(&[1, 2, 9]), 32),
            1.0
        );
        assert_eq!(
            greedy_agreement(&ended(&[1, 2, 9]), &open(&[1, 2, 3]), 32),
            2.0 / 32.0
        );
        assert_eq!(greedy_agreement(&open(&[5; 32]), &open(&[5; 32]), 32), 1.0);
        assert_eq!(
            greedy_agreement(&ended(&[1, 9]), &open(&[1, 9, 4]), 32),
            2.0 / 32.0
        );
    }
}
