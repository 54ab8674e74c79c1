//! The masked softmax on CUDA (`masked_softmax.cu`): one block per row of scores, f32, f16 or
//! bf16 in and out, f32 inside. It replaces the candle path's mask tensor, broadcast add,
//! softmax and row multiply (four passes over the scores, 60–70% of a long prefill's GPU time
//! on an H200) by one kernel that reads the scores and the two position vectors.
//!
//! The source is compiled once per process by NVRTC (which the `cuda` build links already, as
//! candle's own kernels need it), so the build needs no CUDA compiler of its own and the PTX
//! fits the driver it runs on.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::CompileOptions;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Shape};

use super::nvrtc::{NvrtcError, compiled_ptx};

const SOURCE: &str = include_str!("masked_softmax.cu");
/// The name candle caches the loaded module under, per device.
const MODULE: &str = "pml_masked_softmax";
/// `THREADS` in the source: one block of this many threads per row.
const THREADS: u32 = 256;
/// Longest row a block keeps in shared memory (f32, within the 48 KiB every launch may ask
/// for without opting in): rows up to 12k keys are read from global memory once.
const CACHED_ROW_KEYS: u32 = 12 * 1024;

/// The PTX of [`SOURCE`], compiled on first use.
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, NvrtcError>> = OnceLock::new();
    compiled_ptx(&PTX, "masked softmax", SOURCE, CompileOptions::default)
}

/// What every launch shares: the positions on the device and the shape.
struct Call<'a> {
    device: &'a CudaDevice,
    query_positions: CudaSlice<u32>,
    key_positions: CudaSlice<u32>,
    n_queries: u32,
    n_keys: u32,
    rows: u32,
    window: u32,
}

impl Call<'_> {
    fn launch<T: DeviceRepr>(
        &self,
        kernel: &str,
        scores: CudaView<'_, T>,
    ) -> candle_core::Result<CudaSlice<T>> {
        let function = self
            .device
            .get_or_load_custom_func(kernel, MODULE, ptx()?)?;
        let elements = self.rows as usize * self.n_keys as usize;
        // SAFETY: the kernel writes every element of `out` (each block its own row, every
        // column, 0 for masked ones) before anything reads it.
        let out = unsafe { self.device.alloc::<T>(elements) }?;
        let cache_row = u32::from(self.n_keys <= CACHED_ROW_KEYS);
        let config = LaunchConfig {
            grid_dim: (self.rows, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: cache_row * self.n_keys * std::mem::size_of::<f32>() as u32,
        };
        let mut builder = function.builder();
        builder.arg(&scores);
        builder.arg(&out);
        builder.arg(&self.query_positions);
        builder.arg(&self.key_positions);
        builder.arg(&self.n_queries);
        builder.arg(&self.n_keys);
        builder.arg(&self.window);
        builder.arg(&cache_row);
        // SAFETY: the arguments are the kernel's, in its order and types (`T::T*` twice, two
        // `unsigned*`, four `unsigned`); `cache_row` is 1 only when the launch gives each block
        // `n_keys` floats of shared memory, the most the kernel indexes; block `r` reads and writes elements
        // `r * n_keys .. (r + 1) * n_keys` of `scores` and `out`, both `rows * n_keys` long, and
        // reads `query_positions[r % n_queries]` and `key_positions[..n_keys]`, both uploaded at
        // those lengths.
        unsafe { builder.launch(config) }.w()?;
        Ok(out)
    }
}

/// `MaskedSoftmax`'s CUDA forward: `storage` holds the scores (`layout`: contiguous, rows of
/// `key_positions.len()`); `window` is `u32::MAX` for none.
pub(super) fn forward(
    storage: &CudaStorage,
    layout: &Layout,
    query_positions: &[u32],
    key_positions: &[u32],
    window: u32,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("masked softmax needs contiguous scores")
    };
    let n_keys = key_positions.len();
    if n_keys == 0 || start == end {
        return Ok((storage.try_clone(layout)?, layout.shape().clone()));
    }
    let too_large = || {
        candle_core::Error::Msg(format!(
            "masked softmax of {} scores in rows of {n_keys}: too many",
            end - start
        ))
    };
    let device = storage.device();
    let call = Call {
        device,
        query_positions: device.clone_htod(query_positions)?,
        key_positions: device.clone_htod(key_positions)?,
        n_queries: u32::try_from(query_positions.len()).map_err(|_| too_large())?,
        n_keys: u32::try_from(n_keys).map_err(|_| too_large())?,
        rows: u32::try_from((end - start) / n_keys)
            .ok()
            .filter(|&rows| rows <= i32::MAX as u32)
            .ok_or_else(too_large)?,
        window,
    };
    let slice = match &storage.slice {
        CudaStorageSlice::F32(scores) => {
            CudaStorageSlice::F32(call.launch("masked_softmax_f32", scores.slice(start..end))?)
        }
        CudaStorageSlice::F16(scores) => {
            CudaStorageSlice::F16(call.launch("masked_softmax_f16", scores.slice(start..end))?)
        }
        CudaStorageSlice::BF16(scores) => {
            CudaStorageSlice::BF16(call.launch("masked_softmax_bf16", scores.slice(start..end))?)
        }
        _ => candle_core::bail!("masked softmax of {:?} scores", storage.dtype()),
    };
    Ok((
        CudaStorage {
            slice,
            device: device.clone(),
        },
        layout.shape().clone(),
    ))
}
