//! A CUDA kernel's PTX, compiled from its source by NVRTC once per process, or why NVRTC refused
//! it: kept, so every later use answers with the same error instead of compiling again.

use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

/// NVRTC's refusal of a kernel's source, with its compile log.
#[derive(Clone, Debug, thiserror::Error)]
#[error("NVRTC could not compile the {kernel}: {log}")]
pub struct NvrtcError {
    kernel: &'static str,
    log: String,
}

/// `source`'s PTX, compiled with `options` into `cell` on the first call.
pub fn compiled_ptx(
    cell: &'static OnceLock<Result<String, NvrtcError>>,
    kernel: &'static str,
    source: &str,
    options: impl FnOnce() -> CompileOptions,
) -> candle_core::Result<&'static str> {
    cell.get_or_init(|| {
        compile_ptx_with_opts(source, options())
            .map(|ptx| ptx.to_src())
            .map_err(|error| NvrtcError {
                kernel,
                log: format!("{error:?}"),
            })
    })
    .as_deref()
    .map_err(|error| candle_core::Error::wrap(error.clone()))
}
