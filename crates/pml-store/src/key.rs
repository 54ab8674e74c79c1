//! Store keys: a [`StoreKey`] is the sha256 of everything that determines a module's stored state
//! ([`StoreKeyParts`]): the store format version, the model's fingerprint, the weight format and KV
//! dtype the engine ran with, the dtype the state is stored in, the kind of state, the encoding mode, the unit's tokens and positions,
//! and a hash of the context it was encoded after. A state is therefore never reused across
//! models, dtypes, layouts or contexts: any difference is a different key, hence a miss.

use std::fmt;

use candle_core::DType;
use pml_compiler::plan::EncodeMode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::StoreError;
use pml_engine::model::WeightFormat;

/// Version of the key derivation and of the stored file layout. Bumping it makes every old entry a
/// miss instead of a misread. 2: states stored in f16 by default (the stored dtype is part of the
/// key) and sealed with BLAKE3 instead of sha256 (`checksum_blake3`). 3: sealed with XXH3-128
/// over 8 MiB pieces (`checksum_xxh3`, see `checksum.rs`).
pub const STORE_FORMAT_VERSION: u32 = 3;

/// A key: 64 lowercase hex digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct StoreKey(String);

impl StoreKey {
    /// Checks that `text` looks like a key (it may come from a manifest on disk).
    pub fn parse(text: &str) -> Result<Self, StoreError> {
        let is_key = text.len() == 64
            && text
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte));
        if is_key {
            Ok(Self(text.to_string()))
        } else {
            Err(StoreError::InvalidKey(text.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first two hex digits: the shard directory of the disk tier (256 shards keep every
    /// directory small even with hundreds of thousands of entries).
    pub fn shard(&self) -> &str {
        &self.0[..2]
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl TryFrom<String> for StoreKey {
    type Error = StoreError;

    fn try_from(text: String) -> Result<Self, StoreError> {
        Self::parse(&text)
    }
}

impl From<StoreKey> for String {
    fn from(key: StoreKey) -> String {
        key.0
    }
}

/// What a stored state holds. The kind (with its layer) is part of the key and of the file
/// metadata, so kinds can never be confused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// Per-layer K (after RoPE) and V of the unit's tokens, every layer.
    #[default]
    Kv,
    /// K and V of one layer (a layer the restore planner keeps as KV).
    KvLayer(u16),
    /// The input hidden states of one layer, `(n_tokens, d_model)`: restored by projecting them
    /// to K/V at the unit's positions (HCache).
    HiddenLayer(u16),
    /// K and V of every layer for the unit's heavy hitters only (`pmlc compile --keep F`): a
    /// fraction of the unit's rows, at their positions, chosen as [`KEPT_ROWS_SELECTION`] names.
    KvKept(KeepFraction),
}

/// How the runtime chooses the rows of a [`StateKind::KvKept`] state, hashed into its key: a
/// compressed state chosen another way is another state. Change it with the runtime's choice.
pub const KEPT_ROWS_SELECTION: &str = "sinks-4+second-reading-attention";

/// The fraction of a unit's rows a compressed state keeps, in thousandths (1 to 999; keeping
/// everything is a plain [`StateKind::Kv`] state), so that it hashes and prints exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct KeepFraction(u16);

impl KeepFraction {
    /// `fraction` rounded to thousandths; `None` unless it lies strictly between 0 and 1 there.
    pub fn new(fraction: f64) -> Option<Self> {
        let per_mille = (fraction * 1000.0).round();
        (1.0..=999.0)
            .contains(&per_mille)
            .then_some(Self(per_mille as u16))
    }

    /// The fraction in thousandths.
    pub fn per_mille(self) -> u16 {
        self.0
    }

    pub fn get(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// Rows kept of a unit of `n` rows: the fraction rounded up, at least one of a non-empty unit.
    pub fn rows_of(self, n: usize) -> usize {
        (n * usize::from(self.0)).div_ceil(1000).clamp(n.min(1), n)
    }
}

impl fmt::Display for KeepFraction {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.get())
    }
}

impl TryFrom<f64> for KeepFraction {
    type Error = String;

    fn try_from(fraction: f64) -> Result<Self, String> {
        Self::new(fraction).ok_or_else(|| format!("keep fraction {fraction} is not in (0, 1)"))
    }
}

impl From<KeepFraction> for f64 {
    fn from(keep: KeepFraction) -> f64 {
        keep.get()
    }
}

impl StateKind {
    pub fn name(self) -> &'static str {
        match self {
            StateKind::Kv => "kv",
            StateKind::KvLayer(_) => "kv-layer",
            StateKind::HiddenLayer(_) => "hidden-layer",
            StateKind::KvKept(_) => "kv-kept",
        }
    }

    /// The layer of a one-layer kind.
    pub fn layer(self) -> Option<usize> {
        match self {
            StateKind::Kv | StateKind::KvKept(_) => None,
            StateKind::KvLayer(layer) | StateKind::HiddenLayer(layer) => Some(usize::from(layer)),
        }
    }

    /// The fraction of a compressed state.
    pub fn keep(self) -> Option<KeepFraction> {
        match self {
            StateKind::KvKept(keep) => Some(keep),
            _ => None,
        }
    }

    /// The kind named `name` (of layer `layer` for one-layer kinds, keeping `keep` thousandths
    /// for compressed ones), as file metadata spells it.
    pub fn parse(name: &str, layer: Option<u16>, keep: Option<u16>) -> Option<Self> {
        match (name, layer, keep) {
            ("kv", None, None) => Some(StateKind::Kv),
            ("kv-layer", Some(layer), None) => Some(StateKind::KvLayer(layer)),
            ("hidden-layer", Some(layer), None) => Some(StateKind::HiddenLayer(layer)),
            ("kv-kept", None, Some(per_mille)) if (1..=999).contains(&per_mille) => {
                Some(StateKind::KvKept(KeepFraction(per_mille)))
            }
            _ => None,
        }
    }
}

/// Hash of the tokens and positions a unit was encoded after (its scaffold context); every
/// empty context, isolated encoding included, is [`ContextHash::NONE`]. Serialised as 64 hex
/// digits (saved conversations record it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ContextHash([u8; 32]);

impl TryFrom<String> for ContextHash {
    type Error = StoreError;

    fn try_from(text: String) -> Result<Self, StoreError> {
        let bytes = StoreKey::parse(&text)?;
        let mut hash = [0; 32];
        for (index, byte) in hash.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&bytes.as_str()[2 * index..2 * index + 2], 16)
                .map_err(|_| StoreError::InvalidKey(text.clone()))?;
        }
        Ok(Self(hash))
    }
}

impl From<ContextHash> for String {
    fn from(hash: ContextHash) -> String {
        hash.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }
}

impl ContextHash {
    pub const NONE: ContextHash = ContextHash([0; 32]);

    /// The hash of a context given as parallel token and position lists.
    pub fn of(tokens: &[u32], positions: &[u32]) -> Self {
        if tokens.is_empty() && positions.is_empty() {
            return Self::NONE;
        }
        let mut hasher = Sha256::new();
        hasher.update(b"pml-context");
        hash_u32s(&mut hasher, tokens);
        hash_u32s(&mut hasher, positions);
        Self(hasher.finalize().into())
    }

    /// The context of everything before a block and the block itself, chained on `self` (the
    /// context before the block): vLLM's block-hash chain, so a block's hash names its whole
    /// prefix without rehashing it.
    pub fn chain(&self, tokens: &[u32], positions: &[u32]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"pml-prefix-chain");
        hasher.update(self.0);
        hash_u32s(&mut hasher, tokens);
        hash_u32s(&mut hasher, positions);
        Self(hasher.finalize().into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Everything a stored state depends on; [`StoreKeyParts::key`] hashes it.
#[derive(Clone, Copy, Debug)]
pub struct StoreKeyParts<'a> {
    /// [`pml_engine::gguf::GgufFile::fingerprint`] of the model file.
    pub model_fingerprint: &'a str,
    pub weight_format: WeightFormat,
    /// Dtype of the engine's KV cache the state was computed in.
    pub kv_dtype: DType,
    /// Dtype the state is stored in ([`super::StateSpec::state_dtype`]): an f16 copy of an f32
    /// state is another state, so an f32 store and an f16 store sharing a folder never read
    /// each other's entries.
    pub state_dtype: DType,
    pub kind: StateKind,
    pub encode_mode: EncodeMode,
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub context: ContextHash,
}

impl StoreKeyParts<'_> {
    pub fn key(&self) -> StoreKey {
        let mut hasher = Sha256::new();
        hasher.update(b"pml-store-key");
        hasher.update(STORE_FORMAT_VERSION.to_le_bytes());
        // Every variable-length field is length-prefixed, so no two part lists hash alike.
        for text in [
            self.model_fingerprint,
            self.weight_format.name(),
            self.kv_dtype.as_str(),
            self.state_dtype.as_str(),
            self.kind.name(),
            encode_mode_name(self.encode_mode),
        ] {
            hasher.update((text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        }
        // Whole-unit KV keys hash no layer, so they are unchanged since before one-layer kinds.
        if let Some(layer) = self.kind.layer() {
            hasher.update((layer as u64).to_le_bytes());
        }
        if let Some(keep) = self.kind.keep() {
            hasher.update(u64::from(keep.per_mille()).to_le_bytes());
            hasher.update((KEPT_ROWS_SELECTION.len() as u64).to_le_bytes());
            hasher.update(KEPT_ROWS_SELECTION.as_bytes());
        }
        hash_u32s(&mut hasher, self.tokens);
        hash_u32s(&mut hasher, self.positions);
        hasher.update(self.context.as_bytes());
        StoreKey(format!("{:x}", hasher.finalize()))
    }
}

fn hash_u32s(hasher: &mut Sha256, values: &[u32]) {
    hasher.update((values.len() as u64).to_le_bytes());
    for value in values {
        hasher.update(value.to_le_bytes());
    }
}

/// Stable name of an encoding mode (also its spelling in manifests).
pub fn encode_mode_name(mode: EncodeMode) -> &'static str {
    match mode {
        EncodeMode::Scaffolded => "scaffolded",
        EncodeMode::Isolated => "isolated",
    }
}

/// Inverse of [`encode_mode_name`].
pub fn parse_encode_mode(name: &str) -> Option<EncodeMode> {
    [EncodeMode::Scaffolded, EncodeMode::Isolated]
        .into_iter()
        .find(|&mode| encode_mode_name(mode) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENS: [u32; 3] = [10, 20, 30];
    const POSITIONS: [u32; 3] = [5, 6, 7];

    fn base() -> StoreKeyParts<'static> {
        StoreKeyParts {
            model_fingerprint: "ab12",
            weight_format: WeightFormat::QuantizedAndF16,
            kv_dtype: DType::F32,
            state_dtype: DType::F16,
            kind: StateKind::Kv,
            encode_mode: EncodeMode::Scaffolded,
            tokens: &TOKENS,
            positions: &POSITIONS,
            context: ContextHash::of(&[1, 2], &[0, 1]),
        }
    }

    #[test]
    fn key_is_deterministic_hex() {
        let key = base().key();
        assert_eq!(key, base().key());
        assert_eq!(StoreKey::parse(key.as_str()).unwrap(), key);
        assert_eq!(key.shard(), &key.as_str()[..2]);
    }

    #[test]
    fn every_part_changes_the_key() {
        let base_key = base().key();
        let variants = [
            StoreKeyParts {
                model_fingerprint: "ab13",
                ..base()
            },
            StoreKeyParts {
                weight_format: WeightFormat::F16,
                ..base()
            },
            StoreKeyParts {
                kv_dtype: DType::F16,
                ..base()
            },
            StoreKeyParts {
                state_dtype: DType::F32,
                ..base()
            },
            StoreKeyParts {
                encode_mode: EncodeMode::Isolated,
                ..base()
            },
            StoreKeyParts {
                kind: StateKind::KvLayer(0),
                ..base()
            },
            StoreKeyParts {
                kind: StateKind::KvLayer(1),
                ..base()
            },
            StoreKeyParts {
                kind: StateKind::HiddenLayer(0),
                ..base()
            },
            StoreKeyParts {
                kind: StateKind::KvKept(KeepFraction::new(0.5).unwrap()),
                ..base()
            },
            StoreKeyParts {
                kind: StateKind::KvKept(KeepFraction::new(0.3).unwrap()),
                ..base()
            },
            StoreKeyParts {
                tokens: &[10, 20, 31],
                ..base()
            },
            StoreKeyParts {
                positions: &[5, 6, 8],
                ..base()
            },
            StoreKeyParts {
                context: ContextHash::NONE,
                ..base()
            },
            StoreKeyParts {
                context: ContextHash::of(&[1, 2], &[0, 2]),
                ..base()
            },
        ];
        let mut keys: Vec<StoreKey> = variants.iter().map(StoreKeyParts::key).collect();
        assert!(keys.iter().all(|key| *key != base_key));
        keys.sort();
        keys.dedup();
        assert_eq!(
            keys.len(),
            variants.len(),
            "variants collide with each other"
        );
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        // The same concatenated tokens split differently between tokens and positions.
        let first = StoreKeyParts {
            tokens: &[1, 2],
            positions: &[3],
            ..base()
        };
        let second = StoreKeyParts {
            tokens: &[1],
            positions: &[2, 3],
            ..base()
        };
        assert_ne!(first.key(), second.key());
        assert_eq!(ContextHash::of(&[], &[]), ContextHash::NONE);
        assert_ne!(ContextHash::of(&[0], &[0]), ContextHash::NONE);
    }

    #[test]
    fn parse_rejects_non_keys() {
        for text in ["", "abc", &"A".repeat(64), &"g".repeat(64), &"0".repeat(65)] {
            assert!(StoreKey::parse(text).is_err(), "{text:?} accepted");
        }
        let json = serde_json::to_string(&base().key()).unwrap();
        let back: StoreKey = serde_json::from_str(&json).unwrap();
        assert_eq!(back, base().key());
        assert!(serde_json::from_str::<StoreKey>("\"../etc/passwd\"").is_err());
    }

    #[test]
    fn keep_fractions_are_thousandths_strictly_inside_0_and_1() {
        assert_eq!(
            KeepFraction::new(0.5).map(KeepFraction::per_mille),
            Some(500)
        );
        assert_eq!(
            KeepFraction::new(0.3333).map(KeepFraction::per_mille),
            Some(333)
        );
        for outside in [0.0, 0.0004, 0.9996, 1.0, 1.5, -0.2, f64::NAN] {
            assert_eq!(KeepFraction::new(outside), None, "{outside}");
        }
        let half = KeepFraction::new(0.5).unwrap();
        assert_eq!(
            [0, 1, 2, 3, 1001].map(|n| half.rows_of(n)),
            [0, 1, 1, 2, 501]
        );
        assert_eq!(KeepFraction::new(0.001).unwrap().rows_of(10), 1);
        let json = serde_json::to_string(&half).unwrap();
        assert_eq!(json, "0.5");
        assert_eq!(serde_json::from_str::<KeepFraction>(&json).unwrap(), half);
        assert!(serde_json::from_str::<KeepFraction>("1.0").is_err());
        let kind = StateKind::KvKept(half);
        assert_eq!(StateKind::parse(kind.name(), None, Some(500)), Some(kind));
        assert_eq!(StateKind::parse("kv-kept", None, Some(1000)), None);
        assert_eq!(StateKind::parse("kv", None, Some(500)), None);
    }

    #[test]
    fn encode_mode_names_round_trip() {
        for mode in [EncodeMode::Scaffolded, EncodeMode::Isolated] {
            assert_eq!(parse_encode_mode(encode_mode_name(mode)), Some(mode));
        }
        assert_eq!(parse_encode_mode("blended"), None);
    }
}
