//! How the process's allocator treats the forward pass's buffers. A prefill allocates and frees
//! tens of megabytes of activations per layer (Gemma-3-270M at 512 tokens: 4 MB per MLP
//! intermediate); glibc serves blocks above its mmap threshold (128 KiB, rising only after a
//! free) with fresh `mmap`s and trims the heap's top above 128 KiB, so every layer paid page faults
//! and the kernel's zeroing of those pages again. Keeping freed memory for the next layer is what
//! llama.cpp gets from its preallocated compute buffers.

/// The largest mmap threshold glibc accepts on 64-bit targets (`DEFAULT_MMAP_THRESHOLD_MAX`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Freed memory at the heap's top kept up to this much before it is returned to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Has the allocator keep freed buffers for reuse: blocks up to 32 MiB from the heap instead of
/// their own mappings, and up to 1 GiB of freed heap kept. Process-wide; binaries call it once
/// at start (a library never does); `pml bench engine` shows what it is worth on a machine.
/// `false` where the C library is not glibc (nothing changed) or refused a value.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets allocator parameters, under the allocator's own lock, and
        // may be called at any time; both values lie in the ranges glibc documents (it returns
        // 0 and changes nothing otherwise).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_both_values() {
        assert_eq!(
            super::keep_freed_memory(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
    }
}
