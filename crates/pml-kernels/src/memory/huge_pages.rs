//! Large zeroed buffers backed by transparent huge pages where the kernel offers them.
//!
//! A fresh allocation is backed page by page on first touch; with 4 KiB pages a 95 MB buffer
//! takes ~23,000 page faults, measured at 54 ms here against 11 ms on 2 MiB pages (Linux, THP
//! in `madvise` mode, as Debian ships it). Only whole 2 MiB pages inside the allocation are
//! advised; elsewhere, or where the advice is refused, the buffer is an ordinary one.

/// The huge page size advised for (x86-64 and most aarch64 kernels).
const HUGE_PAGE: usize = 2 << 20;

/// `len` zeros, allocated zeroed (fresh pages from the OS, not a pass over the buffer) and
/// advised onto huge pages before anything touches them.
pub fn zeroed_vec<T: bytemuck::Zeroable + Clone>(len: usize) -> Vec<T> {
    let buffer = bytemuck::zeroed_vec::<T>(len);
    advise_huge_pages(&buffer);
    buffer
}

/// The first `len` items of `items` in a buffer on huge pages: the weight layouts the loader
/// builds (hundreds of MB, every page touched once while filling) fault in 2 MiB at a time.
/// Fewer items than `len` leave a shorter vector.
///
/// The buffer is filled by pushing into reserved, untouched memory, never zeroed first: for
/// types aligned beyond the allocator's 16 bytes a zeroed allocation is `aligned_alloc` and a
/// `memset`, which faults every page in at 4 KiB before any advice applies (a third of a 7B
/// model's load was the kernel clearing those small pages).
pub fn collect_on_huge_pages<T>(len: usize, items: impl Iterator<Item = T>) -> Vec<T> {
    let mut buffer = Vec::with_capacity(len);
    advise_huge_pages(buffer.spare_capacity_mut());
    buffer.extend(items.take(len));
    buffer
}

/// `[make(0), …, make(len - 1)]` in a buffer on huge pages, made by the cores candle uses, each
/// filling one contiguous part: a model's load is mostly faulting in and filling its layouts'
/// fresh pages, which two cores do in about half the time of one.
pub fn fill_on_huge_pages<T: Send>(len: usize, make: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut buffer = Vec::with_capacity(len);
    let spare = &mut buffer.spare_capacity_mut()[..len];
    advise_huge_pages(spare);
    let threads = candle_core::utils::get_num_threads().clamp(1, len.max(1));
    let part = len.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (index, slots) in spare.chunks_mut(part).enumerate() {
            let make = &make;
            scope.spawn(move || {
                for (offset, slot) in slots.iter_mut().enumerate() {
                    slot.write(make(index * part + offset));
                }
            });
        }
    });
    // SAFETY: the scope above joined every thread, and together their parts cover the first
    // `len` slots of the capacity, each written once; a panic in `make` would have propagated
    // out of the scope before this line, leaving the vector empty.
    unsafe { buffer.set_len(len) };
    buffer
}

#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(buffer: &[T]) {
    let start = buffer.as_ptr() as usize;
    let end = start + std::mem::size_of_val(buffer);
    let first = start.next_multiple_of(HUGE_PAGE);
    let last = end - end % HUGE_PAGE;
    if last > first {
        // SAFETY: `first..last` lies inside `buffer`'s own allocation, which this function
        // borrows and does not change; MADV_HUGEPAGE only chooses how the kernel backs those
        // pages (their contents stay zero either way), so no Rust invariant depends on it. A
        // refusal (THP off, an old kernel) leaves ordinary pages, hence the ignored result.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages<T>(_buffer: &[T]) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_whatever_their_size() {
        for len in [0, 1, 1000, (3 * HUGE_PAGE) / 4 + 7] {
            let buffer = zeroed_vec::<f32>(len);
            assert_eq!(buffer.len(), len);
            assert!(buffer.iter().all(|&value| value == 0.0));
        }
    }

    #[test]
    fn collected_items_keep_their_order_and_a_short_iterator_leaves_a_short_vector() {
        let len = HUGE_PAGE / 4 + 3;
        let collected = collect_on_huge_pages(len, (0..len as u32).map(|i| i * 3));
        assert!(
            collected
                .iter()
                .enumerate()
                .all(|(i, &v)| v == i as u32 * 3)
        );
        assert_eq!(collect_on_huge_pages(10, 0..4u32), [0, 1, 2, 3]);
    }

    #[test]
    fn filled_items_are_made_once_each_in_order_whatever_the_length() {
        for len in [0, 1, 2, 3, HUGE_PAGE / 8 + 5] {
            let made = std::sync::atomic::AtomicUsize::new(0);
            let filled = fill_on_huge_pages(len, |i| {
                made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (i as u64) * 7
            });
            assert_eq!(filled.len(), len);
            assert_eq!(made.into_inner(), len);
            assert!(filled.iter().enumerate().all(|(i, &v)| v == i as u64 * 7));
        }
    }
}
