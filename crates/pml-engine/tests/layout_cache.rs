//! The layout cache (`model::layout_cache`): a file's second load reads its matrices in place
//! and computes the very same logits as a load without the cache; a damaged or malformed cache
//! file is never served but rebuilt; the directory keeps a bounded number of files.
//!
//! The cache holds our kernels' layouts, which a CPU without AVX2 (or a run with
//! `PML_NO_AVX2`) does not use: there these tests check only that nothing is cached.

use std::path::{Path, PathBuf};

use candle_core::Device;
use pml_engine::device::Backend;
use pml_engine::gguf::GgufFile;
use pml_engine::model::layout_cache::{KEPT_FILES, LayoutCache, wait_for_writes};
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_engine::testing::{last_position_logits, write_tiny_gguf};

const PROMPT: [u32; 9] = [1, 17, 200, 45, 3, 99, 128, 7, 255];

/// Whether the engine uses the layout cache here (the one answer the loader itself asks).
fn cached_here() -> bool {
    LayoutCache::serves(WeightFormat::Quantized, &backend())
}

fn backend() -> Backend {
    Backend::on(&Device::Cpu)
}

fn load(path: &Path, cache: Option<&Path>) -> Model {
    let gguf = GgufFile::open(path).expect("GGUF opens");
    let model = Model::from_gguf_on(&gguf, WeightFormat::Quantized, &backend(), cache)
        .expect("model loads");
    wait_for_writes();
    model
}

fn layout_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|entry| entry.expect("entry").path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "layout"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The tiny model of `arch` written to a fresh directory, with an empty cache directory.
fn tiny_file(arch: Arch) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("tiny-{}.gguf", arch.gguf_name()));
    write_tiny_gguf(arch, &path, false);
    let cache = dir.path().join("layouts");
    (dir, path, cache)
}

fn second_load_reads_in_place(arch: Arch) {
    let (_dir, path, cache) = tiny_file(arch);
    let reference = load(&path, None);
    let expected = last_position_logits(&reference, &PROMPT);
    // A separate lookup table is read in place from the GGUF's map by every load.
    let from_the_file = reference.weights_in_place_bytes();

    let first = load(&path, Some(&cache));
    assert_eq!(last_position_logits(&first, &PROMPT), expected);
    assert_eq!(
        first.weights_in_place_bytes(),
        from_the_file,
        "the first load builds"
    );
    if !cached_here() {
        assert!(layout_files(&cache).is_empty(), "no layouts to cache");
        return;
    }
    assert_eq!(
        layout_files(&cache).len(),
        1,
        "the first load writes its file"
    );

    let second = load(&path, Some(&cache));
    assert_eq!(
        last_position_logits(&second, &PROMPT),
        expected,
        "{arch:?}: logits from the mapped layouts"
    );
    assert!(second.weights_in_place_bytes() > from_the_file);
    // Every matrix is one of our layouts or a lookup table; only biases are held beside them.
    if !matches!(arch, Arch::Qwen2) {
        assert_eq!(
            second.weights_in_place_bytes(),
            second.weights_size_in_bytes(),
            "{arch:?}: every matrix read in place"
        );
    }
}

#[test]
fn qwen2_second_load_reads_its_layouts_in_place() {
    second_load_reads_in_place(Arch::Qwen2);
}

/// Llama's Q/K rows are reordered on load: the cache holds them reordered.
#[test]
fn llama_second_load_reads_its_layouts_in_place() {
    second_load_reads_in_place(Arch::Llama);
}

/// Phi-3's fused matrices are split on load, and its token embedding is a lookup table.
#[test]
fn phi3_second_load_reads_its_layouts_in_place() {
    second_load_reads_in_place(Arch::Phi3);
}

/// The tiny model of `arch`, the cache file its first load wrote, and its logits without
/// the cache; `None` (after checking that nothing was written) where the cache is not used.
struct Written {
    _dir: tempfile::TempDir,
    path: PathBuf,
    cache: PathBuf,
    file: PathBuf,
    expected: Vec<f32>,
}

fn written_cache(arch: Arch) -> Option<Written> {
    let (dir, path, cache) = tiny_file(arch);
    let expected = last_position_logits(&load(&path, None), &PROMPT);
    load(&path, Some(&cache));
    let Some(file) = layout_files(&cache).pop() else {
        assert!(!cached_here(), "a file was written");
        return None;
    };
    Some(Written {
        _dir: dir,
        path,
        cache,
        file,
        expected,
    })
}

#[test]
fn a_damaged_cache_is_rebuilt_not_served() {
    let Some(Written {
        _dir,
        path,
        cache,
        file,
        expected,
    }) = written_cache(Arch::Llama)
    else {
        return;
    };
    // Every byte after the table changed: the check must notice before serving anything.
    let mut bytes = std::fs::read(&file).expect("read");
    for byte in &mut bytes[4096..] {
        *byte ^= 0x55;
    }
    std::fs::write(&file, &bytes).expect("damaged");

    let rebuilt = load(&path, Some(&cache));
    assert_eq!(
        rebuilt.weights_in_place_bytes(),
        0,
        "damaged layouts served"
    );
    assert_eq!(last_position_logits(&rebuilt, &PROMPT), expected);
    let again = load(&path, Some(&cache));
    assert!(
        again.weights_in_place_bytes() > 0,
        "the rebuilt file is used"
    );
    assert_eq!(last_position_logits(&again, &PROMPT), expected);
}

#[test]
fn a_malformed_cache_file_is_ignored_and_replaced() {
    let Some(Written {
        _dir,
        path,
        cache,
        file,
        expected,
    }) = written_cache(Arch::Qwen3)
    else {
        return;
    };
    for garbage in [
        &b""[..],
        b"PMLLAYT1",
        b"PMLLAYT1\xff\xff\xff\xff\xff\xff\xff\xff",
    ] {
        std::fs::write(&file, garbage).expect("garbage written");
        let model = load(&path, Some(&cache));
        assert_eq!(model.weights_in_place_bytes(), 0);
        assert_eq!(last_position_logits(&model, &PROMPT), expected);
        assert!(
            std::fs::metadata(&file).expect("rewritten").len() > 4096,
            "the load wrote a whole file again"
        );
    }
}

#[test]
fn the_directory_keeps_the_most_recently_used_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("layouts");
    // The same weights in files of different modification times: each is a file of its own
    // to the cache (an edited file must never read an older file's layouts).
    for version in 0..KEPT_FILES as u64 + 2 {
        let path = dir.path().join(format!("tiny-{version}.gguf"));
        write_tiny_gguf(Arch::Llama, &path, false);
        let modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 * version);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|file| file.set_modified(modified))
            .expect("modification time set");
        load(&path, Some(&cache));
    }
    let kept = layout_files(&cache).len();
    if cached_here() {
        assert_eq!(kept, KEPT_FILES);
    } else {
        assert_eq!(kept, 0);
    }
}
