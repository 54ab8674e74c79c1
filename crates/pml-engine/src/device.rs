//! Device selection, in one place: every tensor the runtime creates lives on the device chosen
//! here. Only the CPU is built today; a GPU backend (a `cuda` feature enabling candle's CUDA
//! support) adds its variant to [`DeviceChoice`] and its arm to [`select_device`], and nothing
//! else in the runtime needs to change.

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

/// The device used when nothing else is asked for.
pub fn default_device() -> Device {
    Device::Cpu
}
