//! Device selection, in one place: every tensor the engine (and the runtime above it) creates
//! lives on the device chosen here; [`default_device`] goes through [`select_device`]. Only the
//! CPU is selected today. The `cuda` feature (off by default) builds candle's CUDA backend, which
//! `scripts/check-cuda-build.sh` checks without a GPU; running on the GPU adds its variant to
//! [`DeviceChoice`] and its arm to [`select_device`], and its kernels behind the engine's
//! `kernels` seam; nothing else needs to change.

use candle_core::Device;

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    #[default]
    Cpu,
}

/// The device for `choice`.
pub fn select_device(choice: DeviceChoice) -> Result<Device, candle_core::Error> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
    }
}

/// The device used when nothing else is asked for: [`select_device`] of the default choice.
pub fn default_device() -> Device {
    // The CPU cannot fail to be selected; a GPU choice reports its failure through `select_device`.
    select_device(DeviceChoice::default()).unwrap_or(Device::Cpu)
}
