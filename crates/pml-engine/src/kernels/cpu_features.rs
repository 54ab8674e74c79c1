//! Which SIMD paths this CPU takes, decided once: what it reports, less what `PML_NO_AVX2`
//! turns off, so an AVX2 machine can run the scalar fallbacks (scripts/test.sh does, for the
//! path an ARM or an old x86 CPU takes).

use std::sync::OnceLock;

/// Environment variable that, set to anything but `0`, makes [`avx2`] false.
pub const NO_AVX2_ENV: &str = "PML_NO_AVX2";

/// Whether the x86 kernels run: AVX2, FMA and F16C detected at run time, and not turned off.
pub fn avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| !turned_off() && detected())
}

fn turned_off() -> bool {
    std::env::var(NO_AVX2_ENV).is_ok_and(|value| !value.is_empty() && value != "0")
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
