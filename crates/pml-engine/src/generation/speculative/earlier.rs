//! Drafts from a server's earlier answers (REST's datastore; llama.cpp's dynamic lookup cache):
//! answers to a workload's prompts repeat one another (the same question asked again, the same
//! phrasing around different facts), so the tokens that followed the sequence's last n tokens
//! in an earlier answer are drafts a sequence's own lookup cannot find in its prompt.
//!
//! Each answer is held with the last prompt tokens before it, so an answer's first tokens are
//! found after the generation prompt they followed, and under its whole prompt's key, so the
//! same prompt again finds it whole. A sequence that drafted from an answer follows it while
//! it goes on as the answer did, its drafts' acceptance kept by how long the two have agreed
//! (an n-gram's length, growing as it follows, the same prompt the longest). The store holds
//! at most a budget of tokens: past it the oldest answers go (and the index is rebuilt, over
//! what is left).
//! Drafts only change how fast an answer comes, never which tokens it has; they do make a
//! server's speed depend on what it answered before, which is why a server can turn them off.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::draft_model::ModelPace;
use super::ngram::{MAX_NGRAM, NgramDraft, insert_ngrams, longest_match};
use super::pace::Acceptance;

/// `pml serve --draft-answers`' default: tokens of earlier answers held (about 13 MB of index).
pub const DEFAULT_ANSWER_TOKENS: usize = 1 << 16;

/// The longest run of tokens, shared by a sequence and an earlier answer, whose drafts'
/// acceptance is kept apart: a draft after the same whole prompt counts as this long.
pub const MAX_FOLLOWED: usize = 16;

/// A place in an earlier answer: the token at `next` is the one after the sequence's end, and
/// `matched` tokens before it are the sequence's too (at most [`MAX_FOLLOWED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerAt {
    id: u64,
    next: usize,
    matched: usize,
}

/// An earlier answer after the last prompt tokens it followed.
#[derive(Clone, Debug)]
struct Held {
    tokens: Vec<u32>,
    /// How many of `tokens` are the prompt's.
    context: usize,
    /// [`prompt_key`] of the whole prompt.
    prompt: u64,
}

/// The key of a whole prompt: an answer to the same prompt is found by it.
pub fn prompt_key(prompt: &[u32]) -> u64 {
    let mut hasher = DefaultHasher::new();
    prompt.hash(&mut hasher);
    hasher.finish()
}

/// Earlier answers and the index of their n-grams.
#[derive(Clone, Debug)]
pub struct EarlierAnswers {
    /// `answers[0]` has id `first_id`.
    answers: VecDeque<Held>,
    first_id: u64,
    /// Tokens held, and the most that may be.
    held: usize,
    budget: usize,
    /// `latest[n - 1]`: n-gram → the answer and index of the token that followed it last.
    latest: Vec<HashMap<u128, (u64, usize)>>,
    /// [`prompt_key`] → the latest answer to that prompt.
    by_prompt: HashMap<u64, u64>,
}

impl EarlierAnswers {
    /// A store of at most `budget` tokens (0 holds nothing).
    pub fn new(budget: usize) -> Self {
        Self {
            answers: VecDeque::new(),
            first_id: 0,
            held: 0,
            budget,
            latest: vec![HashMap::new(); MAX_NGRAM],
            by_prompt: HashMap::new(),
        }
    }

    /// Tokens held.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Adds an answer, `answer`, that followed `prompt` (only its last tokens are kept, and
    /// its key).
    pub fn add(&mut self, prompt: &[u32], answer: &[u32]) {
        let context = &prompt[prompt.len().saturating_sub(MAX_NGRAM)..];
        let length = context.len() + answer.len();
        if answer.is_empty() || length > self.budget {
            return;
        }
        let mut tokens = Vec::with_capacity(length);
        tokens.extend_from_slice(context);
        tokens.extend_from_slice(answer);
        if self.held + length > self.budget {
            // Down to three quarters, so the rebuild runs once per many answers.
            while self.held + length > self.budget * 3 / 4 {
                let Some(oldest) = self.answers.pop_front() else {
                    break;
                };
                self.held -= oldest.tokens.len();
                self.first_id += 1;
            }
            self.reindex();
        }
        let held = Held {
            tokens,
            context: context.len(),
            prompt: prompt_key(prompt),
        };
        let id = self.first_id + self.answers.len() as u64;
        self.index(id, &held);
        self.held += length;
        self.answers.push_back(held);
    }

    /// Up to `max_tokens` tokens that followed the latest occurrence in an earlier answer of
    /// the longest n-gram (at least `min_ngram` long) that `tail` ends with, up to that
    /// answer's end, and where they start; `None` when nothing matches.
    pub fn draft(
        &self,
        tail: &[u32],
        min_ngram: usize,
        max_tokens: usize,
    ) -> Option<(NgramDraft, AnswerAt)> {
        let (matched, (id, next)) = longest_match(&self.latest, tail, min_ngram)?;
        self.continuation(AnswerAt { id, next, matched }, max_tokens)
    }

    /// The latest answer to the prompt of key `prompt` (its [`prompt_key`]), when it began with
    /// `first` as the sequence did: up to `max_tokens` of its tokens after that one, as a match
    /// of [`MAX_FOLLOWED`] tokens, and where they start.
    pub fn answer_to(
        &self,
        prompt: u64,
        first: u32,
        max_tokens: usize,
    ) -> Option<(NgramDraft, AnswerAt)> {
        let id = *self.by_prompt.get(&prompt)?;
        let held = self.answer(id)?;
        if held.tokens.get(held.context) != Some(&first) {
            return None;
        }
        let at = AnswerAt {
            id,
            next: held.context + 1,
            matched: MAX_FOLLOWED,
        };
        self.continuation(at, max_tokens)
    }

    /// Where a sequence that went on from `at` with the tokens `since` (those drafted from
    /// there that were accepted, and the model's own) is, if it still follows that answer: up
    /// to `max_tokens` tokens after, the match grown by `since`, and where they start. `None`
    /// once the sequence left the answer, or reached its end.
    pub fn follow(
        &self,
        at: AnswerAt,
        since: &[u32],
        max_tokens: usize,
    ) -> Option<(NgramDraft, AnswerAt)> {
        let held = self.answer(at.id)?;
        if !held.tokens.get(at.next..)?.starts_with(since) {
            return None;
        }
        let at = AnswerAt {
            next: at.next + since.len(),
            matched: (at.matched + since.len()).min(MAX_FOLLOWED),
            ..at
        };
        self.continuation(at, max_tokens)
    }

    /// Up to `max_tokens` of the answer's tokens from `at`, and `at`.
    fn continuation(&self, at: AnswerAt, max_tokens: usize) -> Option<(NgramDraft, AnswerAt)> {
        let tokens = &self.answer(at.id)?.tokens;
        let stop = (at.next + max_tokens).min(tokens.len());
        (stop > at.next).then(|| {
            let draft = NgramDraft {
                matched: at.matched,
                tokens: tokens[at.next..stop].to_vec(),
            };
            (draft, at)
        })
    }

    fn answer(&self, id: u64) -> Option<&Held> {
        let index = usize::try_from(id.checked_sub(self.first_id)?).ok()?;
        self.answers.get(index)
    }

    /// Indexes answer `id`: its prompt's key, and the n-grams of its tokens whose next token is
    /// the answer's (the prompt tokens before it are only looked up after).
    fn index(&mut self, id: u64, held: &Held) {
        self.by_prompt.insert(held.prompt, id);
        let tokens = &held.tokens;
        for next in held.context.max(1)..tokens.len() {
            insert_ngrams(&mut self.latest, tokens, next - 1, (id, next));
        }
    }

    fn reindex(&mut self) {
        self.latest = vec![HashMap::new(); MAX_NGRAM];
        self.by_prompt.clear();
        let answers = std::mem::take(&mut self.answers);
        for (offset, held) in answers.iter().enumerate() {
            self.index(self.first_id + offset as u64, held);
        }
        self.answers = answers;
    }
}

/// What a server learns from every answer's drafts, shared by the answers it decodes: how often
/// drafts were accepted, by where they came from, and the earlier answers themselves.
#[derive(Clone, Debug)]
pub struct Learnt {
    /// Drafts found in the sequence itself (its prompt, its answer so far).
    pub own: Acceptance,
    /// Drafts found in earlier answers.
    pub earlier: Acceptance,
    pub answers: EarlierAnswers,
    /// Whether the draft model (`--draft-model`) is worth asking: answers of a workload
    /// draft alike, and each one's first ask costs its draft cache's fill.
    pub model: ModelPace,
}

impl Learnt {
    /// A record with room for `answer_tokens` tokens of earlier answers.
    pub fn new(answer_tokens: usize) -> Self {
        Self {
            own: Acceptance::new(MAX_NGRAM),
            earlier: Acceptance::new(MAX_FOLLOWED),
            answers: EarlierAnswers::new(answer_tokens),
            model: ModelPace::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Drafter, Speculation};
    use super::*;

    #[test]
    fn a_sequence_drafts_an_earlier_answer_after_the_same_prompt_end_and_learns_it_apart() {
        let mut learnt = Learnt::new(1000);
        learnt.answers.add(&[1, 2, 3, 4, 5], &[40, 41, 42, 43]);
        let speculation = Speculation::Ngram {
            max_draft: 7,
            min_match: 1,
        };
        let mut drafter = Drafter::new(speculation, &[9, 9, 3, 4, 5]).unwrap();
        assert_eq!(drafter.prompt(), &[9, 9, 3, 4, 5]);
        // The answer's first token, as the earlier answer's: its prompt lacks it.
        drafter.push(40);
        assert_eq!(drafter.offer(8, None), None);
        let (tokens, offer) = drafter.offer(8, Some(&learnt)).expect("an earlier answer");
        assert_eq!((tokens, offer.available), (vec![41, 42, 43], 3));
        assert!(drafter.drafting_from_answers());
        let prior = Acceptance::new(MAX_FOLLOWED).rate(4);
        drafter.share_verdict(3, false, &mut learnt);
        assert!(learnt.earlier.rate(4) > prior);
        assert_eq!(learnt.own.rate(4), prior);
        // The same prompt again: the earlier answer from its first token, as the longest match.
        learnt.answers.add(&[9, 9, 3, 4, 5], &[40, 41, 42, 43, 44]);
        let mut again = Drafter::new(speculation, &[9, 9, 3, 4, 5]).unwrap();
        again.push(40);
        let (tokens, _) = again.offer(8, Some(&learnt)).unwrap();
        assert_eq!(tokens, vec![41, 42, 43, 44]);
        assert_eq!(again.pending_match, MAX_FOLLOWED);
        // A longer match of the sequence's own goes first.
        let mut drafter = Drafter::new(speculation, &[3, 4, 5, 40, 7, 3, 4, 5]).unwrap();
        drafter.push(40);
        let (tokens, _) = drafter.offer(8, Some(&learnt)).unwrap();
        assert!(!drafter.drafting_from_answers());
        assert_eq!(tokens[0], 7);
    }

    #[test]
    fn an_answer_is_found_after_its_prompt_and_drafted_to_its_end() {
        let mut store = EarlierAnswers::new(1000);
        store.add(&[1, 2, 8, 9], &[10, 11, 12, 13]);
        // The same generation prompt again: the answer from its first token.
        let (draft, at) = store.draft(&[5, 6, 8, 9], 1, 8).expect("a match");
        assert_eq!((draft.matched, draft.tokens), (2, vec![10, 11, 12, 13]));
        // Inside the answer, at most `max_tokens`, never past its end.
        let (draft, _) = store.draft(&[7, 11], 1, 2).expect("a match");
        assert_eq!((draft.matched, draft.tokens), (1, vec![12, 13]));
        // A sequence that took 10 and 11 from there follows the answer on; one that took 10
        // and then 7 has left it, and one at the answer's end has nothing to follow.
        let (draft, _) = store.follow(at, &[10, 11], 8).expect("still the answer");
        assert_eq!((draft.matched, draft.tokens), (2 + 2, vec![12, 13]));
        assert_eq!(store.follow(at, &[10, 7], 8), None);
        assert_eq!(store.follow(at, &[10, 11, 12, 13], 8), None);
        // The same whole prompt finds the answer that began as the sequence did.
        let same = prompt_key(&[1, 2, 8, 9]);
        let (draft, _) = store.answer_to(same, 10, 8).expect("the same prompt");
        assert_eq!(
            (draft.matched, draft.tokens),
            (MAX_FOLLOWED, vec![11, 12, 13])
        );
        assert_eq!(store.answer_to(same, 7, 8), None);
        assert_eq!(store.answer_to(prompt_key(&[5, 6, 8, 9]), 10, 8), None);
        assert_eq!(store.draft(&[12, 13], 1, 4), None);
        assert_eq!(store.draft(&[4, 4], 1, 4), None);
        // The prompt's tokens are context, not drafts: nothing follows "1" there.
        assert_eq!(store.draft(&[1], 1, 4), None);
        assert_eq!(store.draft(&[7, 11], 2, 4), None);
    }

    #[test]
    fn the_latest_answer_wins_and_the_oldest_go_past_the_budget() {
        let mut store = EarlierAnswers::new(20);
        store.add(&[9], &[1, 2, 3, 4, 5]);
        store.add(&[9], &[1, 7, 7, 7, 7]);
        assert_eq!(store.draft(&[1], 1, 2).unwrap().0.tokens, vec![7, 7]);
        assert_eq!(store.draft(&[3], 1, 2).unwrap().0.tokens, vec![4, 5]);
        store.add(&[9], &[3, 6, 6, 6, 6]);
        assert_eq!(store.draft(&[3], 1, 2).unwrap().0.tokens, vec![6, 6]);
        assert_eq!(store.held(), 18);
        // Past the budget the oldest answers go, down to three quarters of it.
        store.add(&[9], &[2, 8, 8, 8, 8]);
        assert_eq!(store.held(), 12);
        assert_eq!(store.draft(&[2], 1, 2).unwrap().0.tokens, vec![8, 8]);
        assert_eq!(store.draft(&[3], 1, 2).unwrap().0.tokens, vec![6, 6]);
        assert_eq!(store.draft(&[1], 1, 2), None);
        assert_eq!(store.draft(&[4], 1, 2), None);
        // An answer larger than the budget is not held; a budget of 0 holds nothing.
        store.add(&[], &[1; 40]);
        assert_eq!(store.held(), 12);
        let mut off = EarlierAnswers::new(0);
        off.add(&[9], &[1, 2]);
        assert_eq!((off.held(), off.draft(&[9], 1, 2)), (0, None));
    }
}
