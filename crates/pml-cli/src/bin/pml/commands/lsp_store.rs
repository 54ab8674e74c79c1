//! What `pml lsp` hovers say about compiled modules: the manifest that `pmlc compile` wrote for
//! the schema and the model ([`ManifestStore`]), and which tier of the module store holds each
//! unit. Read at hover time (a manifest is small), so compiling while the editor is open shows up
//! at the next hover. The store is opened only once a manifest exists, so an editor never creates
//! one.

use std::sync::OnceLock;

use pml_compiler::plan::LayoutUnit;
use pml_lsp::CompiledStates;
use pml_runtime::store::{ManifestLookup, ManifestStore, ModuleStore, StateSpec, StoreConfig};

pub struct StoreManifests {
    config: StoreConfig,
    spec: StateSpec,
    store: OnceLock<Result<ModuleStore, String>>,
}

impl StoreManifests {
    pub fn new(config: StoreConfig, spec: StateSpec) -> Self {
        Self {
            config,
            spec,
            store: OnceLock::new(),
        }
    }

    fn store(&self) -> Result<&ModuleStore, &str> {
        self.store
            .get_or_init(|| {
                ModuleStore::open(&self.config, self.spec.clone()).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }
}

impl CompiledStates for StoreManifests {
    fn describe(&self, schema_name: &str, unit: &LayoutUnit) -> String {
        let manifests = ManifestStore::new(&self.config.root);
        let manifest = match manifests.read(&self.spec.model_fingerprint, schema_name) {
            ManifestLookup::Found(manifest) => manifest,
            ManifestLookup::Missing => {
                return "KV: not compiled for this model (`pmlc compile SCHEMA` stores it)"
                    .to_string();
            }
            ManifestLookup::Unreadable { path, reason } => {
                return format!(
                    "KV: the manifest `{}` is not usable: {reason}",
                    path.display()
                );
            }
        };
        let Some(entry) = manifest
            .units
            .iter()
            .find(|entry| entry.unit_id == unit.id.0 && entry.path == unit.path)
        else {
            return "KV: compiled from another version of the schema (this module is not in \
                    its manifest); compile it again"
                .to_string();
        };
        if entry.n_tokens != unit.tokens.len() {
            return format!(
                "KV: compiled from another version of the schema ({} tokens then, {} now); \
                 compile it again",
                entry.n_tokens,
                unit.tokens.len()
            );
        }
        let store = match self.store() {
            Ok(store) => store,
            Err(reason) => return format!("KV: the module store cannot be opened: {reason}"),
        };
        let tier = store
            .tiers()
            .iter()
            .find(|tier| tier.contains(&entry.key).unwrap_or(false))
            .map(|tier| tier.name());
        match tier {
            Some(tier) => format!(
                "KV: {:.2} MB stored, in the `{tier}` tier",
                entry.bytes as f64 / 1e6
            ),
            None => "KV: listed in the manifest but missing from the store; compile it again"
                .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pml_compiler::plan::{EncodeMode, UnitId, UnitKind};
    use pml_engine::kv_cache::KvLayout;
    use pml_engine::model::KV_CACHE_DTYPE;
    use pml_runtime::store::{DiskTier, Manifest, ManifestUnit, StoreKey};

    fn unit(n_tokens: usize) -> LayoutUnit {
        LayoutUnit {
            id: UnitId(1),
            name: "a".into(),
            path: vec!["a".into()],
            kind: UnitKind::Module,
            parent: Some(UnitId::ROOT),
            start: 0,
            end: n_tokens as u32,
            tokens: vec![1; n_tokens],
            positions: (0..n_tokens as u32).collect(),
            params: Vec::new(),
            scaffold: vec![UnitId::ROOT],
        }
    }

    #[test]
    fn describes_missing_stale_absent_and_stored_units() {
        let root = tempfile::tempdir().expect("temp dir");
        let spec = StateSpec::new(
            "f".repeat(64),
            KvLayout {
                n_layers: 2,
                n_kv_heads: 1,
                head_dim: 4,
                dtype: KV_CACHE_DTYPE,
            },
        );
        let config = StoreConfig::local(root.path(), 1 << 20);
        let states = StoreManifests::new(config, spec.clone());
        assert!(states.describe("s", &unit(3)).contains("not compiled"));
        assert!(
            !root.path().join("objects").exists(),
            "no store is created for a lookup"
        );

        let key = StoreKey::parse(&"ab".repeat(32)).expect("a key");
        let manifest = Manifest::new(
            "s",
            spec.model_fingerprint.clone(),
            EncodeMode::Scaffolded,
            vec![ManifestUnit {
                unit_id: 1,
                path: vec!["a".into()],
                key: key.clone(),
                n_tokens: 3,
                bytes: 2_000_000,
            }],
        );
        ManifestStore::new(root.path())
            .write(&manifest)
            .expect("write manifest");
        assert!(
            states
                .describe("s", &unit(4))
                .contains("3 tokens then, 4 now")
        );
        assert!(
            states
                .describe("s", &unit(3))
                .contains("missing from the store")
        );

        let object = DiskTier::open(root.path(), spec)
            .expect("disk tier")
            .path_of(&key);
        std::fs::create_dir_all(object.parent().expect("shard folder")).expect("mkdir");
        std::fs::write(&object, b"stored").expect("write object");
        assert_eq!(
            states.describe("s", &unit(3)),
            "KV: 2.00 MB stored, in the `disk` tier"
        );
    }
}
