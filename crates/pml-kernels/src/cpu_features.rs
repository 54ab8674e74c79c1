//! Which SIMD paths this CPU takes, decided once: what it reports, less what `PML_NO_AVX2`
//! turns off, so an AVX2 machine can run the scalar fallbacks (scripts/test.sh does, for the
//! path an ARM or an old x86 CPU takes), and less what `PML_NO_AVX512` turns off, so an
//! AVX-512 machine can run the AVX2 kernels.

use std::sync::OnceLock;

/// Environment variable that, set to anything but `0`, makes [`avx2`] false.
pub const NO_AVX2_ENV: &str = "PML_NO_AVX2";

/// Whether the x86 kernels run: AVX2, FMA and F16C detected at run time, and not turned off.
pub fn avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| !turned_off() && detected())
}

/// Environment variable that, set to anything but `0`, makes [`avx512_vnni`] false.
pub const NO_AVX512_ENV: &str = "PML_NO_AVX512";

/// Whether the AVX-512 VNNI variants of the quantized tiles run: [`avx2`], and AVX-512 F, BW,
/// VL and VNNI detected at run time, and not turned off. The tiles stay 256 bits wide (VL):
/// what they gain is `vpdpbusd`, one instruction for `maddubs` + add, with i32 sums.
pub fn avx512_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| avx2() && !set(NO_AVX512_ENV) && detected_avx512_vnni())
}

fn turned_off() -> bool {
    set(NO_AVX2_ENV)
}

/// Whether the environment switch `name` is on: set, and to anything but empty or `0`.
pub fn set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|value| !value.is_empty() && value != "0")
}

#[cfg(target_arch = "x86_64")]
fn detected_avx512_vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn detected_avx512_vnni() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> bool {
    false
}
