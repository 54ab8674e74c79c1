//! A GGUF model file: its metadata with typed accessors for the hyper-parameters the engine needs,
//! its tensor table, a content fingerprint (sha256 of everything before the tensor data and of
//! samples of every tensor's data), and its tensors read in place from the mapped file.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use sha2::{Digest, Sha256};

pub use crate::error::GgufError;
use crate::stored_tensor::StoredTensor;
use pml_kernels::memory::mapped::{MappedFile, MappedSlice};

/// Bytes of each tensor's data the fingerprint hashes, at its start and at its middle: a few
/// MB for a model of hundreds of tensors, read in milliseconds, where hashing whole weights
/// would take seconds; a fine-tune changes nearly every weight, so it changes the samples.
pub const SAMPLE_BYTES: usize = 4096;

/// Hashes [`SAMPLE_BYTES`] at the start and the middle of each tensor's data (bounded by the
/// next tensor and the end of the file), in file order.
fn sample_tensor_data(file: &[u8], content: &Content, hasher: &mut Sha256) {
    let end = file.len() as u64;
    let mut starts: Vec<u64> = content
        .tensor_infos
        .values()
        .map(|info| content.tensor_data_offset.saturating_add(info.offset))
        .collect();
    starts.sort_unstable();
    starts.dedup();
    for (index, &start) in starts.iter().enumerate() {
        let stop = starts.get(index + 1).copied().unwrap_or(end).min(end);
        if start >= stop {
            continue;
        }
        for offset in [start, start + (stop - start) / 2] {
            let len = (stop - offset).min(SAMPLE_BYTES as u64);
            hasher.update(&file[offset as usize..(offset + len) as usize]);
        }
    }
}

/// An opened GGUF file: parsed header and metadata, plus the path to read tensors from.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    fingerprint: String,
    /// The whole file, mapped: tensors are read from it in place (no read into a buffer first),
    /// and a lookup table can keep reading its rows after the load (shared).
    map: Arc<MappedFile>,
}

impl GgufFile {
    /// Maps `path`, parses its header, metadata and tensor table, and fingerprints them.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_owned();
        let io_error = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io_error)?;
        let mapped = MappedFile::open_lazily(&file).map_err(io_error)?;
        let map = mapped.bytes();
        let content = Content::read(&mut Cursor::new(map)).map_err(|source| GgufError::Parse {
            path: path.clone(),
            source: Box::new(source),
        })?;

        // The fingerprint covers the header, every metadata entry and the tensor table (names,
        // shapes, types, offsets), and samples of every tensor's data: two fine-tunes of one
        // model can share every byte before the data, but not the weights.
        let header_len = usize::try_from(content.tensor_data_offset).unwrap_or(usize::MAX);
        // A vocab-only file (no tensors) may end before the alignment padding of its empty data.
        if header_len > map.len() && !content.tensor_infos.is_empty() {
            return Err(io_error(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "file ends before its tensor data",
            )));
        }
        let mut hasher = Sha256::new();
        hasher.update(&map[..header_len.min(map.len())]);
        sample_tensor_data(map, &content, &mut hasher);
        let fingerprint = format!("{:x}", hasher.finalize());
        Ok(Self {
            path,
            content,
            fingerprint,
            map: mapped,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed candle content (metadata map, tensor infos, data offset).
    pub fn content(&self) -> &Content {
        &self.content
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// Lower-case hex sha256 of the bytes before the tensor data and of [`SAMPLE_BYTES`] at the
    /// start and in the middle of each tensor's data.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    // ---- generic metadata access ----

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    /// A non-negative integer of any GGUF integer type.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        value_as_u64(self.require(key)?)
            .ok_or_else(|| wrong_type(key, "a non-negative integer", self.get(key)))
    }

    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let value = self.get_u64(key)?;
        usize::try_from(value)
            .map_err(|_| wrong_type(key, "an integer that fits in usize", self.get(key)))
    }

    /// A floating-point number (f32 or f64).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        match self.require(key)? {
            Value::F32(value) => Ok(f64::from(*value)),
            Value::F64(value) => Ok(*value),
            other => Err(wrong_type(key, "a float", Some(other))),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(value) => Ok(*value),
            other => Err(wrong_type(key, "a bool", Some(other))),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(value) => Ok(value),
            other => Err(wrong_type(key, "a string", Some(other))),
        }
    }

    fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        match self.require(key)? {
            Value::Array(values) => Ok(values),
            other => Err(wrong_type(key, "an array", Some(other))),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|value| match value {
                Value::String(text) => Ok(text.as_str()),
                other => Err(wrong_type(key, "an array of strings", Some(other))),
            })
            .collect()
    }

    /// An array of floats.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|value| match value {
                Value::F32(number) => Ok(*number),
                // Scores are f32 in every GGUF seen so far; f64 is narrowed rather than rejected.
                Value::F64(number) => Ok(*number as f32),
                other => Err(wrong_type(key, "an array of floats", Some(other))),
            })
            .collect()
    }

    /// An array of integers (any GGUF integer type, as i64).
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|value| {
                value_as_i64(value)
                    .ok_or_else(|| wrong_type(key, "an array of integers", Some(value)))
            })
            .collect()
    }

    /// `Ok(None)` when `key` is absent, else the result of `read`.
    pub fn optional<'a, T>(
        &'a self,
        key: &str,
        read: impl FnOnce(&'a Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.get(key).is_none() {
            Ok(None)
        } else {
            read(self, key).map(Some)
        }
    }

    // ---- model hyper-parameters ----

    /// `general.architecture` (`qwen2`, `gemma3`, `llama`, ...).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// Key `{architecture}.{suffix}`.
    pub fn arch_key(&self, suffix: &str) -> Result<String, GgufError> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    pub fn context_length(&self) -> Result<usize, GgufError> {
        self.get_usize(&self.arch_key("context_length")?)
    }

    /// Number of transformer blocks.
    pub fn block_count(&self) -> Result<usize, GgufError> {
        self.get_usize(&self.arch_key("block_count")?)
    }

    /// Model width (d_model).
    pub fn embedding_length(&self) -> Result<usize, GgufError> {
        self.get_usize(&self.arch_key("embedding_length")?)
    }

    pub fn feed_forward_length(&self) -> Result<usize, GgufError> {
        self.get_usize(&self.arch_key("feed_forward_length")?)
    }

    /// Number of query heads.
    pub fn head_count(&self) -> Result<usize, GgufError> {
        self.get_usize(&self.arch_key("attention.head_count")?)
    }

    /// Number of key/value heads; equal to the query heads when the file does not say (as llama.cpp).
    pub fn head_count_kv(&self) -> Result<usize, GgufError> {
        let key = self.arch_key("attention.head_count_kv")?;
        match self.optional(&key, Self::get_usize)? {
            Some(n_kv_heads) => Ok(n_kv_heads),
            None => self.head_count(),
        }
    }

    /// Per-head dimension of keys (and queries): `attention.key_length`, else d_model / heads.
    pub fn head_dim(&self) -> Result<usize, GgufError> {
        let key = self.arch_key("attention.key_length")?;
        match self.optional(&key, Self::get_usize)? {
            Some(head_dim) => Ok(head_dim),
            None => {
                let n_heads = self.head_count()?;
                if n_heads == 0 {
                    return Err(wrong_type(
                        &self.arch_key("attention.head_count")?,
                        "a positive integer",
                        self.get(&key),
                    ));
                }
                Ok(self.embedding_length()? / n_heads)
            }
        }
    }

    /// Per-head dimension of values: `attention.value_length`, else [`Self::head_dim`].
    pub fn value_head_dim(&self) -> Result<usize, GgufError> {
        let key = self.arch_key("attention.value_length")?;
        match self.optional(&key, Self::get_usize)? {
            Some(value_dim) => Ok(value_dim),
            None => self.head_dim(),
        }
    }

    /// RoPE base frequency; 10 000 when absent (llama.cpp's default).
    pub fn rope_freq_base(&self) -> Result<f64, GgufError> {
        Ok(self
            .optional(&self.arch_key("rope.freq_base")?, Self::get_f64)?
            .unwrap_or(10_000.0))
    }

    /// RoPE base of sliding-window layers when the file states one (`rope.freq_base_swa`).
    /// Gemma-3 files usually do not: llama.cpp then uses 10 000 for its local layers.
    pub fn rope_freq_base_swa(&self) -> Result<Option<f64>, GgufError> {
        self.optional(&self.arch_key("rope.freq_base_swa")?, Self::get_f64)
    }

    /// Number of rotated dimensions per head, when only part of each head is rotated.
    pub fn rope_dimension_count(&self) -> Result<Option<usize>, GgufError> {
        self.optional(&self.arch_key("rope.dimension_count")?, Self::get_usize)
    }

    /// Sliding-window size of local attention layers, for models that have them.
    pub fn sliding_window(&self) -> Result<Option<usize>, GgufError> {
        self.optional(&self.arch_key("attention.sliding_window")?, Self::get_usize)
    }

    /// Epsilon of the RMS norms.
    pub fn rms_eps(&self) -> Result<f64, GgufError> {
        self.get_f64(&self.arch_key("attention.layer_norm_rms_epsilon")?)
    }

    /// Number of tokens in the vocabulary (`tokenizer.ggml.tokens`).
    pub fn vocab_size(&self) -> Result<usize, GgufError> {
        Ok(self.get_array("tokenizer.ggml.tokens")?.len())
    }

    /// The Jinja chat template, when the file carries one.
    pub fn chat_template(&self) -> Result<Option<&str>, GgufError> {
        self.optional("tokenizer.chat_template", Self::get_str)
    }

    // ---- tensors ----

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.content.tensor_infos.get(name)
    }

    /// Names of all tensors, sorted.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .content
            .tensor_infos
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        names
    }

    /// Tensor `name` as stored, its bytes read in place from the mapped file.
    pub fn stored(&self, name: &str) -> Result<StoredTensor<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_owned(),
            })?;
        let tensor_error = |source| self.tensor_error(name, source);
        let dims: Vec<usize> = info.shape.dims().to_vec();
        let len = StoredTensor::byte_len(info.ggml_dtype, &dims);
        let bytes = self
            .data_range(info, len)
            .and_then(|range| self.map.bytes().get(range))
            .ok_or_else(|| {
                tensor_error(candle_core::Error::Msg(format!(
                    "its {len} bytes at offset {} lie past the end of the file ({} bytes)",
                    info.offset,
                    self.map.bytes().len()
                )))
            })?;
        StoredTensor::new(Cow::Borrowed(bytes), info.ggml_dtype, dims).map_err(tensor_error)
    }

    /// Tensor `name`'s bytes as a slice of the shared map, for a table read in place after the
    /// load.
    pub fn mapped(&self, name: &str) -> Option<MappedSlice> {
        let range = self.byte_range(name)?;
        MappedSlice::new(self.map.clone(), range.start, range.len())
    }

    /// Drops tensor `name`'s pages from this process once the loader holds its own copy
    /// ([`MappedFile::release`]).
    pub fn release(&self, name: &str) {
        if let Some(range) = self.byte_range(name) {
            self.map.release(range);
        }
    }

    /// Where tensor `name`'s bytes lie in the file, if it holds them.
    fn byte_range(&self, name: &str) -> Option<std::ops::Range<usize>> {
        let info = self.tensor_info(name)?;
        let len = StoredTensor::byte_len(info.ggml_dtype, info.shape.dims());
        self.data_range(info, len)
            .filter(|range| range.end <= self.map.bytes().len())
    }

    /// The file offsets of `len` bytes of the tensor `info` describes (not checked against the
    /// file's length), if they fit in `usize`.
    fn data_range(&self, info: &TensorInfo, len: usize) -> Option<std::ops::Range<usize>> {
        let start = self.content.tensor_data_offset.checked_add(info.offset)?;
        let start = usize::try_from(start).ok()?;
        Some(start..start.checked_add(len)?)
    }

    /// Loads tensor `name` (still quantized) onto `device`.
    pub fn tensor(&self, name: &str, device: &Device) -> Result<QTensor, GgufError> {
        self.stored(name)?
            .to_qtensor(device)
            .map_err(|source| self.tensor_error(name, source))
    }

    fn tensor_error(&self, name: &str, source: candle_core::Error) -> GgufError {
        GgufError::Tensor {
            name: name.to_owned(),
            path: self.path.clone(),
            source: Box::new(source),
        }
    }
}

fn value_as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::U8(number) => Some(u64::from(*number)),
        Value::U16(number) => Some(u64::from(*number)),
        Value::U32(number) => Some(u64::from(*number)),
        Value::U64(number) => Some(*number),
        Value::I8(number) => u64::try_from(*number).ok(),
        Value::I16(number) => u64::try_from(*number).ok(),
        Value::I32(number) => u64::try_from(*number).ok(),
        Value::I64(number) => u64::try_from(*number).ok(),
        _ => None,
    }
}

fn value_as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::I8(number) => Some(i64::from(*number)),
        Value::I16(number) => Some(i64::from(*number)),
        Value::I32(number) => Some(i64::from(*number)),
        Value::I64(number) => Some(*number),
        Value::U8(number) => Some(i64::from(*number)),
        Value::U16(number) => Some(i64::from(*number)),
        Value::U32(number) => Some(i64::from(*number)),
        Value::U64(number) => i64::try_from(*number).ok(),
        _ => None,
    }
}

fn wrong_type(key: &str, expected: &'static str, found: Option<&Value>) -> GgufError {
    let found = match found {
        Some(Value::Array(values)) => format!("an array of {} values", values.len()),
        Some(Value::String(text)) => {
            format!("the string {:?}", text.chars().take(40).collect::<String>())
        }
        Some(other) => format!("{other:?}"),
        None => "absent".to_owned(),
    };
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found,
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Tensor;
    use candle_core::quantized::GgmlDType;

    use super::*;
    use pml_testkit::fetched_model;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn write_small_gguf(path: &Path, block_count: Value) -> TestResult {
        let weights = Tensor::arange(0f32, 64f32, &Device::Cpu)?.reshape((2, 32))?;
        let weights = QTensor::quantize(&weights, GgmlDType::F32)?;
        let metadata = [
            ("general.architecture", Value::String("llama".to_owned())),
            ("llama.block_count", block_count),
            ("llama.embedding_length", Value::U64(32)),
            ("llama.attention.head_count", Value::I32(4)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("llama.context_length", Value::String("long".to_owned())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vec![
                    Value::String("a".to_owned()),
                    Value::String("b".to_owned()),
                ]),
            ),
        ];
        let metadata: Vec<(&str, &Value)> =
            metadata.iter().map(|(key, value)| (*key, value)).collect();
        let mut file = File::create(path)?;
        candle_core::quantized::gguf_file::write(&mut file, &metadata, &[("w", &weights)])?;
        Ok(())
    }

    #[test]
    fn typed_accessors_defaults_and_errors_on_a_small_file() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("small.gguf");
        write_small_gguf(&path, Value::U32(3))?;
        let gguf = GgufFile::open(&path)?;
        assert_eq!(gguf.architecture()?, "llama");
        assert_eq!(gguf.block_count()?, 3);
        assert_eq!(gguf.head_count()?, 4);
        assert_eq!(gguf.head_count_kv()?, 4);
        assert_eq!(gguf.head_dim()?, 8);
        assert_eq!(gguf.value_head_dim()?, 8);
        assert_eq!(gguf.rope_freq_base()?, 10_000.0);
        assert_eq!(gguf.sliding_window()?, None);
        assert!((gguf.rms_eps()? - 1e-5).abs() < 1e-9);
        assert_eq!(gguf.vocab_size()?, 2);
        assert_eq!(gguf.chat_template()?, None);
        assert!(
            matches!(gguf.feed_forward_length(), Err(GgufError::MissingKey { key }) if key == "llama.feed_forward_length")
        );
        assert!(matches!(
            gguf.context_length(),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            gguf.get_bool("llama.block_count"),
            Err(GgufError::WrongType { .. })
        ));

        let tensor = gguf.tensor("w", &Device::Cpu)?;
        assert_eq!(tensor.shape().dims(), &[2, 32]);
        let values = tensor
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        assert_eq!(values[63], 63.0);
        assert!(matches!(
            gguf.tensor("missing", &Device::Cpu),
            Err(GgufError::MissingTensor { .. })
        ));
        assert_eq!(gguf.tensor_names(), ["w"]);

        // Same metadata gives the same fingerprint; one changed value changes it.
        assert_eq!(GgufFile::open(&path)?.fingerprint(), gguf.fingerprint());
        let other_path = dir.path().join("other.gguf");
        write_small_gguf(&other_path, Value::U32(4))?;
        assert_ne!(
            GgufFile::open(&other_path)?.fingerprint(),
            gguf.fingerprint()
        );
        assert_eq!(gguf.fingerprint().len(), 64);

        // Same metadata and tensor table, one weight changed (a fine-tune): another fingerprint.
        let mut bytes = std::fs::read(&path)?;
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        let tuned_path = dir.path().join("tuned.gguf");
        std::fs::write(&tuned_path, &bytes)?;
        assert_ne!(
            GgufFile::open(&tuned_path)?.fingerprint(),
            gguf.fingerprint()
        );
        Ok(())
    }

    #[test]
    fn a_file_that_is_not_gguf_is_a_parse_error() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, b"not a gguf file at all")?;
        assert!(matches!(
            GgufFile::open(&path),
            Err(GgufError::Parse { .. })
        ));
        assert!(matches!(
            GgufFile::open(dir.path().join("absent.gguf")),
            Err(GgufError::Io { .. })
        ));
        Ok(())
    }

    #[test]
    fn qwen_hyper_parameters() -> TestResult {
        let Some(path) = fetched_model("qwen2.5-0.5b") else {
            return Ok(());
        };
        let gguf = GgufFile::open(path)?;
        assert_eq!(gguf.architecture()?, "qwen2");
        assert_eq!(gguf.block_count()?, 24);
        assert_eq!(gguf.embedding_length()?, 896);
        assert_eq!(gguf.feed_forward_length()?, 4864);
        assert_eq!(gguf.head_count()?, 14);
        assert_eq!(gguf.head_count_kv()?, 2);
        assert_eq!(gguf.head_dim()?, 64);
        assert_eq!(gguf.context_length()?, 32768);
        assert_eq!(gguf.rope_freq_base()?, 1_000_000.0);
        assert_eq!(gguf.sliding_window()?, None);
        assert_eq!(gguf.vocab_size()?, 151_936);
        assert!(
            gguf.chat_template()?
                .is_some_and(|template| template.contains("<|im_start|>"))
        );
        let embeddings = gguf.tensor("token_embd.weight", &Device::Cpu)?;
        assert_eq!(embeddings.shape().dims(), &[151_936, 896]);
        Ok(())
    }

    #[test]
    fn gemma_hyper_parameters_and_distinct_fingerprints() -> TestResult {
        let Some(path) = fetched_model("gemma3-270m") else {
            return Ok(());
        };
        let gguf = GgufFile::open(path)?;
        assert_eq!(gguf.architecture()?, "gemma3");
        assert_eq!(gguf.block_count()?, 18);
        assert_eq!(gguf.embedding_length()?, 640);
        assert_eq!(gguf.head_count()?, 4);
        assert_eq!(gguf.head_count_kv()?, 1);
        assert_eq!(gguf.head_dim()?, 256);
        assert_eq!(gguf.value_head_dim()?, 256);
        assert_eq!(gguf.sliding_window()?, Some(512));
        assert_eq!(gguf.vocab_size()?, 262_144);
        assert!((gguf.rms_eps()? - 1e-6).abs() < 1e-9);
        assert!(gguf.tensor_info("blk.0.attn_q_norm.weight").is_some());
        if let Some(qwen) = fetched_model("qwen2.5-0.5b") {
            assert_ne!(GgufFile::open(qwen)?.fingerprint(), gguf.fingerprint());
        }
        Ok(())
    }
}
