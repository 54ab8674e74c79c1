//! What identifies a unit's encoded KV: the model (GGUF fingerprint and the weight format the
//! engine computes with), the encoding mode, the unit's tokens and positions, and a hash of the
//! context it attended to. Two encodings with equal keys are the same computation, so a state is
//! never reused across models, layouts or contexts, and recompiling re-encodes only the units
//! whose tokens, positions or context changed.

use pml_compiler::plan::EncodeMode;
use sha2::{Digest, Sha256};

use crate::model::{ACTIVATION_DTYPE, Model, WeightFormat};

/// Which model computes the KV, in the terms a cached state depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelIdentity {
    /// Content fingerprint of the GGUF file ([`crate::gguf::GgufFile::fingerprint`]), or any
    /// stable name for an in-process model (the tiny test models use their seed).
    pub fingerprint: String,
    /// How the weights are held and the activation dtype: both change the computed KV.
    pub dtype: String,
}

impl ModelIdentity {
    /// The identity of `model` loaded from a file with fingerprint `fingerprint`.
    pub fn of(model: &Model, fingerprint: impl Into<String>) -> Self {
        Self::new(fingerprint, model.weight_format())
    }

    pub fn new(fingerprint: impl Into<String>, weight_format: WeightFormat) -> Self {
        Self {
            fingerprint: fingerprint.into(),
            dtype: format!("{weight_format:?}/{ACTIVATION_DTYPE:?}"),
        }
    }
}

/// The parts of a unit's store key. The store derives its own key from these
/// ([`UnitKey::digest`] is one such derivation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnitKey {
    pub model: ModelIdentity,
    pub mode: EncodeMode,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// sha256 of the context's tokens and positions ([`context_hash`]).
    pub context_hash: String,
}

impl UnitKey {
    /// Hex sha256 over every part, each length-prefixed so no two keys share an encoding.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field(self.model.fingerprint.as_bytes());
        field(self.model.dtype.as_bytes());
        field(mode_name(self.mode).as_bytes());
        field(&u32s_as_bytes(&self.tokens));
        field(&u32s_as_bytes(&self.positions));
        field(self.context_hash.as_bytes());
        format!("{:x}", hasher.finalize())
    }
}

/// The stable spelling of an encoding mode in keys and reports.
pub fn mode_name(mode: EncodeMode) -> &'static str {
    match mode {
        EncodeMode::Scaffolded => "scaffolded",
        EncodeMode::Isolated => "isolated",
    }
}

/// Hex sha256 of a context given as tokens and their positions, in the order attended.
pub fn context_hash(tokens: &[u32], positions: &[u32]) -> String {
    let mut hasher = Sha256::new();
    hasher.update((tokens.len() as u64).to_le_bytes());
    hasher.update(u32s_as_bytes(tokens));
    hasher.update(u32s_as_bytes(positions));
    format!("{:x}", hasher.finalize())
}

fn u32s_as_bytes(values: &[u32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> UnitKey {
        UnitKey {
            model: ModelIdentity::new("model-a", WeightFormat::F32),
            mode: EncodeMode::Scaffolded,
            tokens: vec![1, 2, 3],
            positions: vec![4, 5, 6],
            context_hash: context_hash(&[9], &[0]),
        }
    }

    #[test]
    fn every_part_changes_the_digest() {
        let base = key().digest();
        let variants = [
            UnitKey {
                model: ModelIdentity::new("model-b", WeightFormat::F32),
                ..key()
            },
            UnitKey {
                model: ModelIdentity::new("model-a", WeightFormat::F16),
                ..key()
            },
            UnitKey {
                mode: EncodeMode::Isolated,
                ..key()
            },
            UnitKey {
                tokens: vec![1, 2, 4],
                ..key()
            },
            UnitKey {
                positions: vec![5, 6, 7],
                ..key()
            },
            UnitKey {
                context_hash: context_hash(&[9], &[1]),
                ..key()
            },
        ];
        for variant in variants {
            assert_ne!(variant.digest(), base, "{variant:?}");
        }
        assert_eq!(key().digest(), base);
    }

    #[test]
    fn moving_a_boundary_between_tokens_and_positions_changes_the_context_hash() {
        assert_ne!(
            context_hash(&[1, 2], &[3, 4]),
            context_hash(&[1], &[2, 3, 4])
        );
    }
}
