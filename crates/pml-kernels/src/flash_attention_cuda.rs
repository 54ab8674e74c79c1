//! Attention on CUDA in one kernel (`flash_attention.cu`), for half-precision caches: the
//! scores stay in registers, so a long prefill writes no `(heads, n, n)` matrix, and the cache's
//! rows are read in place (the ops path copies K and V head-major every call, then runs two
//! matrix products and the masked softmax around the scores). Same contract as
//! [`super::position_mask::attend_by_ops`], which it replaces where it applies: CUDA, an f16 or
//! bf16 cache, a head size the kernel is instantiated for, a GPU with `mma.sync` on bf16
//! (compute capability 8.0, Ampere, and later). `PML_NO_FLASH_ATTENTION=1` turns it off, so one
//! binary measures both paths.
//!
//! Compiled once per process by NVRTC for `compute_80`, as the masked softmax is.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::CompileOptions;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, CustomOp3, DType, Device, Layout, Shape, Tensor,
};

use super::KernelError;
use super::cpu_features;
use super::masked_softmax::{Visibility, check_shapes};
use super::nvrtc::{NvrtcError, compiled_ptx};

const SOURCE: &str = include_str!("flash_attention.cu");
/// The name candle caches the loaded module under, per device.
const MODULE: &str = "pml_flash_attention";
/// `THREADS` and `BLOCK_ROWS` in the source.
const THREADS: u32 = 128;
const BLOCK_ROWS: usize = 64;
/// The source's instances: head size, keys per tile (whose position ranges the host computes,
/// so the pair is in the kernel's name: a mismatch fails to load instead of misreading). Heads
/// of 64: SmolLM2, Qwen2.5, Llama 3.2 1B; of 128: Llama 3 8B, Mistral, Qwen2.5 7B and up.
const INSTANCES: [(usize, usize); 2] = [(64, 64), (128, 32)];
/// Environment switch that keeps attention on the ops path.
pub const NO_FLASH_ATTENTION_ENV: &str = "PML_NO_FLASH_ATTENTION";

/// Keys per tile of the instance for heads of `head_dim`, if there is one.
fn tile_keys(head_dim: usize) -> Option<usize> {
    INSTANCES
        .iter()
        .find(|&&(head, _)| head == head_dim)
        .map(|&(_, tile)| tile)
}

fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, NvrtcError>> = OnceLock::new();
    compiled_ptx(&PTX, "flash attention", SOURCE, || CompileOptions {
        arch: Some("compute_80"),
        ..Default::default()
    })
}

/// Whether the kernel runs on `device`: it has the tensor-core instructions the kernel uses,
/// the kernel compiled, and it is not turned off (read once: one process drives one GPU
/// model).
fn capable(device: &CudaDevice) -> bool {
    static CAPABLE: OnceLock<bool> = OnceLock::new();
    *CAPABLE.get_or_init(|| {
        if cpu_features::set(NO_FLASH_ATTENTION_ENV) {
            return false;
        }
        let capability = device.cuda_stream().context().compute_capability();
        if !matches!(capability, Ok((major, _)) if major >= 8) {
            tracing::info!(
                ?capability,
                "attention on the ops path: the GPU predates sm_80"
            );
            return false;
        }
        // A source NVRTC refuses leaves attention on the ops path instead of failing every
        // forward pass (the error is logged once).
        ptx()
            .inspect_err(|error| tracing::warn!(%error, "attention on the ops path"))
            .is_ok()
    })
}

/// Whether [`attend`] takes `queries` `(n, n_heads, head_dim)` over `keys` of this dtype.
pub(super) fn applies(queries: &Tensor, keys: &Tensor) -> bool {
    let Device::Cuda(device) = queries.device() else {
        return false;
    };
    matches!(keys.dtype(), DType::F16 | DType::BF16)
        && queries
            .dims()
            .get(2)
            .is_some_and(|&head_dim| tile_keys(head_dim).is_some())
        && capable(device)
}

/// `softmax(q kᵀ under the position mask) v`, `(n, n_heads * head_dim)` in the queries' dtype,
/// or `None` where the kernel does not apply (see [`applies`]).
pub(super) fn attend(
    queries: &Tensor,
    query_positions: &[u32],
    keys: &Tensor,
    values: &Tensor,
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Option<Tensor>, KernelError> {
    if !applies(queries, keys) {
        return Ok(None);
    }
    let (n_queries, n_heads, head_dim) = queries.dims3()?;
    let (n_keys, n_kv_heads, kv_dim) = keys.dims3()?;
    check_shapes(n_queries, n_keys, query_positions, key_positions)?;
    if kv_dim != head_dim
        || values.dims() != keys.dims()
        || values.dtype() != keys.dtype()
        || n_kv_heads == 0
        || !n_heads.is_multiple_of(n_kv_heads)
    {
        return Err(KernelError::InvalidInput(format!(
            "attention of {:?} queries over {:?} keys and {:?} values",
            queries.dims(),
            keys.dims(),
            values.dims()
        )));
    }
    // The kernel loads keys and values in runs of 8 elements from where the layout starts
    // (a cache's rows start at multiples of `head_dim`); anything else takes the ops path.
    let aligned = |tensor: &Tensor| tensor.layout().start_offset().is_multiple_of(8);
    if !aligned(keys) || !aligned(values) {
        return Ok(None);
    }
    let out_dtype = queries.dtype();
    let op = FlashAttention {
        query_positions,
        key_positions,
        window: Visibility::new(window).limit(),
        group: n_heads / n_kv_heads,
    };
    let attended = queries
        .to_dtype(keys.dtype())?
        .contiguous()?
        .apply_op3_no_bwd(&keys.contiguous()?, &values.contiguous()?, &op)?;
    Ok(Some(
        attended
            .reshape((n_queries, n_heads * head_dim))?
            .to_dtype(out_dtype)?,
    ))
}

struct FlashAttention<'a> {
    query_positions: &'a [u32],
    key_positions: &'a [u32],
    window: u32,
    group: usize,
}

impl FlashAttention<'_> {
    /// The positions and, per row block and per key tile, the least and greatest position
    /// (what the kernel skips whole tiles by), as one vector: one upload a call.
    fn host_arguments(&self, tile: usize) -> Vec<u32> {
        let n_rows = self.group * self.query_positions.len();
        let range = |positions: &[u32]| -> [u32; 2] {
            let least = positions.iter().copied().min().unwrap_or(u32::MAX);
            let greatest = positions.iter().copied().max().unwrap_or(0);
            [least, greatest]
        };
        let mut arguments = Vec::with_capacity(
            self.query_positions.len()
                + self.key_positions.len()
                + 2 * n_rows.div_ceil(BLOCK_ROWS)
                + 2 * self.key_positions.len().div_ceil(tile),
        );
        arguments.extend_from_slice(self.query_positions);
        arguments.extend_from_slice(self.key_positions);
        for first_row in (0..n_rows).step_by(BLOCK_ROWS) {
            let last_row = (first_row + BLOCK_ROWS).min(n_rows) - 1;
            let queries = &self.query_positions[first_row / self.group..=last_row / self.group];
            arguments.extend(range(queries));
        }
        for keys in self.key_positions.chunks(tile) {
            arguments.extend(range(keys));
        }
        arguments
    }

    /// Launches the instance `flash_attention_{dtype}_{head_dim}x{tile}`.
    fn launch<T: DeviceRepr>(
        &self,
        device: &CudaDevice,
        dtype: &str,
        [queries, keys, values]: [CudaView<'_, T>; 3],
        (n_heads, n_kv_heads, head_dim, tile): (usize, usize, usize, usize),
    ) -> candle_core::Result<CudaStorageSlice> {
        let kernel = format!("flash_attention_{dtype}_{head_dim}x{tile}");
        let function = device.get_or_load_custom_func(&kernel, MODULE, ptx()?)?;
        let (n_queries, n_keys) = (self.query_positions.len(), self.key_positions.len());
        let n_rows = self.group * n_queries;
        let (n_blocks, n_tiles) = (n_rows.div_ceil(BLOCK_ROWS), n_keys.div_ceil(tile));
        let too_large = || {
            candle_core::Error::Msg(format!(
                "attention of {n_queries} queries over {n_keys} keys: too many"
            ))
        };
        let as_u32 = |value: usize| u32::try_from(value).map_err(|_| too_large());
        if n_rows > i32::MAX as usize || n_keys > i32::MAX as usize {
            return Err(too_large());
        }
        let arguments = device.clone_htod(&self.host_arguments(tile))?;
        let query_positions = arguments.slice(..n_queries);
        let key_positions = arguments.slice(n_queries..n_queries + n_keys);
        let block_queries = arguments.slice(n_queries + n_keys..n_queries + n_keys + 2 * n_blocks);
        let tile_keys = arguments.slice(
            n_queries + n_keys + 2 * n_blocks..n_queries + n_keys + 2 * n_blocks + 2 * n_tiles,
        );
        // SAFETY: every element is written before anything reads it: each row r < n_queries *
        // group belongs to one warp of row block r / 64 (run by the block the grid orders
        // n_blocks - 1 - r / 64, one per KV head), whose four threads of the row write its
        // `head_dim` columns (pairs 2t, 2t + 1 of each 8), whether or not the row saw a key.
        let out = unsafe { device.alloc::<f32>(n_queries * n_heads * head_dim) }?;
        let (n_queries, n_keys, n_heads, n_kv_heads) = (
            as_u32(n_queries)?,
            as_u32(n_keys)?,
            as_u32(n_heads)?,
            as_u32(n_kv_heads)?,
        );
        let config = LaunchConfig {
            grid_dim: (as_u32(n_blocks)?, n_kv_heads, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = function.builder();
        builder.arg(&queries);
        builder.arg(&keys);
        builder.arg(&values);
        builder.arg(&out);
        builder.arg(&query_positions);
        builder.arg(&key_positions);
        builder.arg(&block_queries);
        builder.arg(&tile_keys);
        builder.arg(&n_queries);
        builder.arg(&n_keys);
        builder.arg(&n_heads);
        builder.arg(&n_kv_heads);
        builder.arg(&self.window);
        // SAFETY: the arguments are the kernel's, in its order and types (three 16-bit element
        // pointers, one float pointer, four `unsigned*`, five `unsigned`). `cuda_fwd` checked
        // the shapes: queries hold n_queries * n_heads * head_dim elements, keys and values
        // n_keys * n_kv_heads * head_dim, with n_heads = group * n_kv_heads; their element
        // offsets (checked even for queries, multiples of 8 for keys and values) on
        // allocations cudarc makes at least 256-byte aligned keep the 4- and 16-byte alignment
        // of the kernel's loads; the kernel's name fixes its tile at `tile`, the size the
        // ranges were computed for; block b reads positions of
        // queries below n_queries, rows below group * n_queries, keys below n_keys (loads
        // past the last key are guarded), `block_queries[2b..2b + 2]` for b < n_blocks and
        // `tile_keys[2t..2t + 2]` for t < n_tiles, each uploaded at that length; static shared
        // memory only.
        unsafe { builder.launch(config) }.w()?;
        Ok(CudaStorageSlice::F32(out))
    }
}

impl CustomOp3 for FlashAttention<'_> {
    fn name(&self) -> &'static str {
        "flash-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!(
            "the flash attention kernel runs on CUDA only (attend_by_ops is its CPU twin)"
        )
    }

    fn cuda_fwd(
        &self,
        queries: &CudaStorage,
        query_layout: &Layout,
        keys: &CudaStorage,
        key_layout: &Layout,
        values: &CudaStorage,
        value_layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (n_queries, n_heads, head_dim) = query_layout.shape().dims3()?;
        let (n_keys, n_kv_heads, kv_dim) = key_layout.shape().dims3()?;
        if n_queries != self.query_positions.len()
            || n_keys != self.key_positions.len()
            || kv_dim != head_dim
            || value_layout.shape() != key_layout.shape()
            || n_heads != self.group * n_kv_heads
        {
            candle_core::bail!(
                "flash attention of {:?} queries over {:?} keys, {:?} values",
                query_layout.shape(),
                key_layout.shape(),
                value_layout.shape()
            )
        }
        // Offsets into the storages; the kernel loads queries in pairs and keys and values in
        // runs of 8 elements.
        let span = |layout: &Layout, alignment: usize| -> candle_core::Result<(usize, usize)> {
            match layout.contiguous_offsets() {
                Some((start, end)) if start.is_multiple_of(alignment) => Ok((start, end)),
                _ => candle_core::bail!("flash attention needs contiguous, aligned operands"),
            }
        };
        let (q, k, v) = (
            span(query_layout, 2)?,
            span(key_layout, 8)?,
            span(value_layout, 8)?,
        );
        let Some(tile) = tile_keys(head_dim) else {
            candle_core::bail!("flash attention has no instance for heads of {head_dim}")
        };
        let shape = (n_heads, n_kv_heads, head_dim, tile);
        let device = queries.device();
        let slice = if n_queries == 0 || n_keys == 0 {
            // Nothing to attend, or nothing seen: zeros, as a row that sees no key gets.
            CudaStorageSlice::F32(device.alloc_zeros::<f32>(n_queries * n_heads * head_dim)?)
        } else {
            match (&queries.slice, &keys.slice, &values.slice) {
                (
                    CudaStorageSlice::F16(queries),
                    CudaStorageSlice::F16(keys),
                    CudaStorageSlice::F16(values),
                ) => self.launch(
                    device,
                    "f16",
                    [
                        queries.slice(q.0..q.1),
                        keys.slice(k.0..k.1),
                        values.slice(v.0..v.1),
                    ],
                    shape,
                )?,
                (
                    CudaStorageSlice::BF16(queries),
                    CudaStorageSlice::BF16(keys),
                    CudaStorageSlice::BF16(values),
                ) => self.launch(
                    device,
                    "bf16",
                    [
                        queries.slice(q.0..q.1),
                        keys.slice(k.0..k.1),
                        values.slice(v.0..v.1),
                    ],
                    shape,
                )?,
                _ => candle_core::bail!("flash attention of {:?} operands", queries.dtype()),
            }
        };
        Ok((
            CudaStorage {
                slice,
                device: device.clone(),
            },
            Shape::from((n_queries, n_heads, head_dim)),
        ))
    }
}
