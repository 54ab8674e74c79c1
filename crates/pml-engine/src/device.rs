//! Where a model runs and which kernels run it, chosen in one place: [`select_backend`] turns a
//! [`BackendChoice`] (`--device`, `--kernels`, `$PML_DEVICE`, `$PML_KERNELS`) into a [`Backend`],
//! whose device every tensor of the engine (and of the runtime above it) lives on.
//!
//! Two implementations sit behind the engine's `kernels` seam ([`Kernels`]): our CPU kernels
//! (the default on the CPU, the fastest there) and candle's operations alone, which run on any
//! candle device. The candle path is the only one on CUDA, and it runs on the CPU too, so the
//! code that runs on a GPU is the code every CPU test run goes through; what differs between the
//! two devices is candle's, not ours.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};

/// The dtype the KV cache holds K and V in unless `--cache-type` says otherwise: f32, K and V
/// exactly as computed. f16 (llama.cpp's default) halves what a decode step reads, but
/// rounding K once moves Gemma-3-270M's logits by up to 15% of the largest (Qwen2.5-0.5B: 2%;
/// `engine_real`'s `f16_cache_stays_close_to_f32`), so it is the user's choice, not the default.
pub const KV_CACHE_DTYPE: DType = DType::F32;

/// Where the model runs (`--device cpu|cuda[:N]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceChoice {
    #[default]
    Cpu,
    /// The CUDA GPU of this ordinal; needs a build with the `cuda` feature.
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
            _ => text
                .strip_prefix("cuda:")
                .and_then(|ordinal| ordinal.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or(DeviceError::UnknownDevice(text)),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

pub use pml_kernels::{Kernels, UnknownKernels};

/// What was asked for: a device, and kernels unless the device's default will do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BackendChoice {
    pub device: DeviceChoice,
    pub kernels: Option<Kernels>,
    /// The KV cache's dtype; [`KV_CACHE_DTYPE`] when `None`.
    pub kv_dtype: Option<DType>,
}

/// Environment variable naming the device when no `--device` is given.
pub const DEVICE_ENV: &str = "PML_DEVICE";
/// Environment variable naming the kernels when no `--kernels` is given.
pub const KERNELS_ENV: &str = "PML_KERNELS";

impl BackendChoice {
    /// `device` and `kernels` where given, else `$PML_DEVICE` and `$PML_KERNELS`, else the
    /// CPU with its default kernels. A variable that does not parse is an error, not ignored.
    pub fn resolve(
        device: Option<DeviceChoice>,
        kernels: Option<Kernels>,
    ) -> Result<Self, DeviceError> {
        let from_env = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let device = match device {
            Some(device) => device,
            None => from_env(DEVICE_ENV)
                .map(|value| value.parse())
                .transpose()?
                .unwrap_or_default(),
        };
        let kernels = match kernels {
            Some(kernels) => Some(kernels),
            None => from_env(KERNELS_ENV)
                .map(|value| value.parse())
                .transpose()?,
        };
        Ok(Self {
            device,
            kernels,
            kv_dtype: None,
        })
    }

    /// The same choice with the KV cache in `kv_dtype`.
    pub fn with_kv_dtype(self, kv_dtype: DType) -> Self {
        Self {
            kv_dtype: Some(kv_dtype),
            ..self
        }
    }
}

/// A device, the kernels that run on it, and the dtype its KV cache holds.
#[derive(Clone, Debug)]
pub struct Backend {
    pub device: Device,
    pub kernels: Kernels,
    /// f32 (the default, [`KV_CACHE_DTYPE`]), f16 or bf16 (`--cache-type`).
    pub kv_dtype: DType,
}

impl Backend {
    /// `device` with its default kernels and cache dtype.
    pub fn on(device: &Device) -> Self {
        Self {
            device: device.clone(),
            kernels: Kernels::default_for(device),
            kv_dtype: KV_CACHE_DTYPE,
        }
    }

    /// The CPU with candle's kernels: the device path, run where every test runs.
    pub fn candle_cpu() -> Self {
        Self {
            device: Device::Cpu,
            kernels: Kernels::Candle,
            kv_dtype: KV_CACHE_DTYPE,
        }
    }

    /// The same backend with its KV cache in `kv_dtype` (f16, bf16 or f32; a model refuses
    /// any other at load).
    pub fn with_kv_dtype(self, kv_dtype: DType) -> Self {
        Self { kv_dtype, ..self }
    }
}

/// Why a backend could not be selected.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device `{0}` (expected cpu, cuda or cuda:N)")]
    UnknownDevice(String),
    #[error(transparent)]
    UnknownKernels(#[from] UnknownKernels),
    #[error(
        "this build of pml has no CUDA support; rebuild with `cargo build --release --features \
         cuda` (scripts/gpu-check.sh shows how), or use --device cpu"
    )]
    CudaNotBuilt,
    #[error("cannot open CUDA device {ordinal}: {source}")]
    CudaUnavailable {
        ordinal: usize,
        source: candle_core::Error,
    },
    #[error("the native kernels run on the CPU only; use --kernels candle with --device {0}")]
    NativeOffCpu(DeviceChoice),
}

/// The device for `choice`.
pub fn select_device(choice: DeviceChoice) -> Result<Device, DeviceError> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(ordinal) => cuda_device(ordinal),
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> Result<Device, DeviceError> {
    Device::new_cuda(ordinal).map_err(|source| DeviceError::CudaUnavailable { ordinal, source })
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_ordinal: usize) -> Result<Device, DeviceError> {
    Err(DeviceError::CudaNotBuilt)
}

/// The device and kernels for `choice`: the device's default kernels unless others are asked
/// for, and never the native ones off the CPU.
pub fn select_backend(choice: BackendChoice) -> Result<Backend, DeviceError> {
    let device = select_device(choice.device)?;
    let kernels = choice
        .kernels
        .unwrap_or_else(|| Kernels::default_for(&device));
    if kernels == Kernels::Native && !device.is_cpu() {
        return Err(DeviceError::NativeOffCpu(choice.device));
    }
    Ok(Backend {
        device,
        kernels,
        kv_dtype: choice.kv_dtype.unwrap_or(KV_CACHE_DTYPE),
    })
}

/// The device used when nothing else is asked for: the CPU.
pub fn default_device() -> Device {
    Device::Cpu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_as_the_flags_spell_them() {
        assert_eq!("cpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cpu);
        assert_eq!(
            "CUDA".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(0)
        );
        assert_eq!(
            "cuda:3".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(3)
        );
        assert!(matches!(
            "cuda:x".parse::<DeviceChoice>(),
            Err(DeviceError::UnknownDevice(_))
        ));
        assert!(matches!(
            "metal".parse::<DeviceChoice>(),
            Err(DeviceError::UnknownDevice(_))
        ));
        assert_eq!(DeviceChoice::Cuda(1).to_string(), "cuda:1");
    }

    #[test]
    fn kernels_default_to_native_on_the_cpu_and_can_be_candle() {
        let native = select_backend(BackendChoice::default()).unwrap();
        assert!(native.device.is_cpu());
        assert_eq!(native.kernels, Kernels::Native);
        assert_eq!(native.kv_dtype, DType::F32);
        let candle = select_backend(
            BackendChoice {
                device: DeviceChoice::Cpu,
                kernels: Some(Kernels::Candle),
                kv_dtype: None,
            }
            .with_kv_dtype(DType::F16),
        )
        .unwrap();
        assert_eq!(candle.kernels, Kernels::Candle);
        assert_eq!(candle.kv_dtype, DType::F16);
        assert!(matches!("fast".parse::<Kernels>(), Err(UnknownKernels(_))));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let error = select_backend(BackendChoice {
            device: DeviceChoice::Cuda(0),
            kernels: None,
            kv_dtype: None,
        })
        .unwrap_err();
        assert!(matches!(error, DeviceError::CudaNotBuilt));
        assert!(error.to_string().contains("--features cuda"));
    }
}
