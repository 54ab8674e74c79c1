//! Manifests of compiled schemas: `<root>/manifests/<model fingerprint prefix>/<schema>.json`
//! lists, for one schema compiled for one model, every unit's key, token count and stored size.
//! Written atomically after the units; a missing, unreadable or foreign manifest just means
//! "not compiled" to readers ([`ManifestLookup`]), since the units can always be re-encoded.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use pml_compiler::plan::EncodeMode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::StoreError;
use super::atomic_file::write_atomically;
use super::key::{KeepFraction, STORE_FORMAT_VERSION, StoreKey};

/// Characters of the model fingerprint that name a manifest directory: enough to tell models
/// apart at a glance; the full fingerprint is inside and checked.
const FINGERPRINT_PREFIX_LEN: usize = 16;

/// What compiling one schema for one model stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub schema_name: String,
    pub model_fingerprint: String,
    #[serde(with = "encode_mode_text")]
    pub encode_mode: EncodeMode,
    /// Seconds since the Unix epoch.
    pub created_unix_s: u64,
    /// `pmlc compile --keep F`: the units' states hold their heavy hitters only, this fraction
    /// of their rows; absent when they hold every row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<KeepFraction>,
    pub units: Vec<ManifestUnit>,
}

/// One stored unit of a schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestUnit {
    /// [`pml_compiler::plan::UnitId`] in the schema's layout.
    pub unit_id: u32,
    /// Module names from the outermost down; empty for the root.
    pub path: Vec<String>,
    pub key: StoreKey,
    pub n_tokens: usize,
    /// Size of the stored file.
    pub bytes: u64,
}

impl Manifest {
    /// A manifest stamped with the current time and format version.
    pub fn new(
        schema_name: impl Into<String>,
        model_fingerprint: impl Into<String>,
        encode_mode: EncodeMode,
        units: Vec<ManifestUnit>,
    ) -> Self {
        let created_unix_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        Self {
            format_version: STORE_FORMAT_VERSION,
            schema_name: schema_name.into(),
            model_fingerprint: model_fingerprint.into(),
            encode_mode,
            created_unix_s,
            keep: None,
            units,
        }
    }

    /// The same manifest for states that keep `keep` of their rows.
    pub fn with_keep(self, keep: Option<KeepFraction>) -> Self {
        Self { keep, ..self }
    }
}

/// The result of looking a manifest up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestLookup {
    Missing,
    /// Present but not usable (corrupt, another format version, another schema or model).
    Unreadable {
        path: PathBuf,
        reason: String,
    },
    Found(Manifest),
}

impl ManifestLookup {
    /// The manifest, if the schema counts as compiled.
    pub fn found(self) -> Option<Manifest> {
        match self {
            ManifestLookup::Found(manifest) => Some(manifest),
            _ => None,
        }
    }
}

/// The manifest directory of a store.
#[derive(Clone, Debug)]
pub struct ManifestStore {
    dir: PathBuf,
}

impl ManifestStore {
    /// Manifests of the store rooted at `store_root`.
    pub fn new(store_root: &Path) -> Self {
        Self {
            dir: store_root.join("manifests"),
        }
    }

    /// The folder of the store these manifests belong to.
    pub fn store_root(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// Where the manifest of `schema_name` compiled for `model_fingerprint` lives.
    pub fn path_of(&self, model_fingerprint: &str, schema_name: &str) -> PathBuf {
        let prefix: String = model_fingerprint
            .chars()
            .take(FINGERPRINT_PREFIX_LEN)
            .collect();
        self.dir
            .join(safe_file_name(&prefix))
            .join(format!("{}.json", safe_file_name(schema_name)))
    }

    /// Writes `manifest` atomically, replacing any earlier one; returns its path.
    pub fn write(&self, manifest: &Manifest) -> Result<PathBuf, StoreError> {
        let path = self.path_of(&manifest.model_fingerprint, &manifest.schema_name);
        let mut json = serde_json::to_vec_pretty(manifest).map_err(|error| {
            StoreError::Malformed(format!("cannot serialise the manifest: {error}"))
        })?;
        json.push(b'\n');
        write_atomically(&path, &json)?;
        Ok(path)
    }

    /// The manifest of `schema_name` for `model_fingerprint`.
    pub fn read(&self, model_fingerprint: &str, schema_name: &str) -> ManifestLookup {
        let path = self.path_of(model_fingerprint, schema_name);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return ManifestLookup::Missing;
            }
            Err(error) => {
                return ManifestLookup::Unreadable {
                    path,
                    reason: error.to_string(),
                };
            }
        };
        let unreadable = |reason: String| ManifestLookup::Unreadable {
            path: path.clone(),
            reason,
        };
        let manifest: Manifest = match serde_json::from_slice(&text) {
            Ok(manifest) => manifest,
            Err(error) => return unreadable(format!("not a manifest: {error}")),
        };
        if manifest.format_version != STORE_FORMAT_VERSION {
            return unreadable(format!(
                "format version {}, this build reads {STORE_FORMAT_VERSION}",
                manifest.format_version
            ));
        }
        if manifest.schema_name != schema_name || manifest.model_fingerprint != model_fingerprint {
            return unreadable(format!(
                "holds schema `{}` for model {}",
                manifest.schema_name, manifest.model_fingerprint
            ));
        }
        ManifestLookup::Found(manifest)
    }
}

/// The longest name [`safe_file_name`] returns. File systems cap a file name at 255 bytes and
/// callers add an extension (`.json`, 5 bytes); every name whose safe form fit that before names
/// were bounded keeps it, so no manifest or session already stored moves.
pub const MAX_SAFE_FILE_NAME_LEN: usize = 250;

/// Characters of a long name's safe form kept before its hash.
const LONG_NAME_PREFIX_LEN: usize = 200;

/// A file name that cannot escape its directory: ASCII letters, digits, `-` and `_` are kept,
/// anything else becomes `_`, and a changed name gets a hash suffix so two names never collide.
/// A name whose safe form would be longer than [`MAX_SAFE_FILE_NAME_LEN`] is cut and gets a
/// longer hash after a `.`, which no other form holds.
pub fn safe_file_name(name: &str) -> String {
    let kept: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if kept == name && !name.is_empty() && kept.len() <= MAX_SAFE_FILE_NAME_LEN {
        return kept;
    }
    let digest = format!("{:x}", Sha256::digest(name.as_bytes()));
    let short = format!("{kept}-{}", &digest[..8]);
    if short.len() <= MAX_SAFE_FILE_NAME_LEN {
        return short;
    }
    // `kept` is ASCII, so any byte is a character boundary.
    let prefix = kept.get(..LONG_NAME_PREFIX_LEN).unwrap_or(&kept);
    format!("{prefix}.{}", &digest[..32])
}

/// Serde for [`EncodeMode`] by its stable name (the compiler's type only serialises).
mod encode_mode_text {
    use pml_compiler::plan::EncodeMode;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::key::{encode_mode_name, parse_encode_mode};

    pub fn serialize<S: Serializer>(mode: &EncodeMode, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(encode_mode_name(*mode))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<EncodeMode, D::Error> {
        let name = String::deserialize(deserializer)?;
        parse_encode_mode(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown encode mode `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{ContextHash, StoreKeyParts};

    fn manifest(schema_name: &str) -> Manifest {
        let key = StoreKeyParts {
            model_fingerprint: "0123456789abcdef0123",
            weight_format: Default::default(),
            kv_dtype: candle_core::DType::F32,
            state_dtype: candle_core::DType::F16,
            kind: Default::default(),
            encode_mode: EncodeMode::Isolated,
            tokens: &[1],
            positions: &[0],
            context: ContextHash::NONE,
        }
        .key();
        Manifest::new(
            schema_name,
            "0123456789abcdef0123",
            EncodeMode::Isolated,
            vec![ManifestUnit {
                unit_id: 0,
                path: vec![],
                key,
                n_tokens: 1,
                bytes: 100,
            }],
        )
    }

    #[test]
    fn round_trips_and_tolerates_damage() {
        let root = tempfile::tempdir().unwrap();
        let manifests = ManifestStore::new(root.path());
        let fingerprint = "0123456789abcdef0123";
        assert_eq!(
            manifests.read(fingerprint, "travel"),
            ManifestLookup::Missing
        );

        let written = manifest("travel");
        let path = manifests.write(&written).unwrap();
        assert!(path.ends_with("manifests/0123456789abcdef/travel.json"));
        assert_eq!(
            manifests.read(fingerprint, "travel").found(),
            Some(written.clone())
        );
        assert_eq!(manifests.read("ffff", "travel"), ManifestLookup::Missing);
        let kept = manifest("kept").with_keep(KeepFraction::new(0.5));
        manifests.write(&kept).unwrap();
        assert_eq!(manifests.read(fingerprint, "kept").found(), Some(kept));

        std::fs::write(&path, b"{\"format_version\": 1, \"schema_na").unwrap();
        assert!(matches!(
            manifests.read(fingerprint, "travel"),
            ManifestLookup::Unreadable { .. }
        ));
        let mut other_version = written;
        other_version.format_version += 1;
        std::fs::write(&path, serde_json::to_vec(&other_version).unwrap()).unwrap();
        assert!(manifests.read(fingerprint, "travel").found().is_none());
    }

    #[test]
    fn long_names_get_bounded_file_names() {
        let root = tempfile::tempdir().unwrap();
        let manifests = ManifestStore::new(root.path());
        let fingerprint = "0123456789abcdef0123";
        // From 251 characters the manifest's file name passed 255 bytes and the write failed.
        for length in [250, 251, 300, 10_000] {
            for name in ["n".repeat(length), "é".repeat(length)] {
                let file_name = safe_file_name(&name);
                assert!(file_name.len() <= MAX_SAFE_FILE_NAME_LEN, "{length}");
                let written = manifest(&name);
                manifests.write(&written).unwrap();
                assert_eq!(manifests.read(fingerprint, &name).found(), Some(written));
            }
        }
        // What fit before is unchanged.
        assert_eq!(safe_file_name(&"n".repeat(250)), "n".repeat(250));
        let short_changed = safe_file_name(&"é".repeat(241));
        assert_eq!(short_changed.len(), 250);
        assert!(short_changed.starts_with(&"_".repeat(241)));
        // Long names alike in their first characters stay apart.
        let a = format!("{}a", "n".repeat(300));
        let b = format!("{}b", "n".repeat(300));
        assert_ne!(safe_file_name(&a), safe_file_name(&b));
    }

    #[test]
    fn schema_names_cannot_escape_or_collide() {
        let manifests = ManifestStore::new(Path::new("/store"));
        let fingerprint = "0123456789abcdef";
        let names = [
            "../../etc/passwd",
            ".",
            "..",
            "",
            "a/b",
            "a_b",
            "a b",
            "a.b",
        ];
        let mut paths: Vec<PathBuf> = names
            .iter()
            .map(|name| manifests.path_of(fingerprint, name))
            .collect();
        for path in &paths {
            assert_eq!(
                path.parent(),
                Some(Path::new("/store/manifests/0123456789abcdef"))
            );
        }
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), names.len());
    }
}
