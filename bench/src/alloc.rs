//! A counting global allocator: every allocation (and reallocation) the process makes is
//! counted, so a server process started by the benchmark can report allocations per request
//! and per relayed event.
//!
//! Written by hand because it is a dozen lines over `std::alloc::System`; counting is two
//! relaxed atomic adds per allocation, the same for tailcut and the bare proxy.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed.
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        LIVE_BYTES.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count(bytes: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    LIVE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Heap bytes in use now.
pub fn live_bytes() -> u64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Allocations (reallocations included) and bytes asked for since the process started.
pub fn totals() -> (u64, u64) {
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        ALLOCATED_BYTES.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn allocations_are_counted() {
        let (before, _) = super::totals();
        let boxed = std::hint::black_box(Box::new([0u8; 64]));
        drop(boxed);
        let (after, _) = super::totals();
        assert!(after > before, "a Box::new counts at least one allocation");
        let live = super::live_bytes();
        let held = std::hint::black_box(vec![0u8; 1 << 20]);
        assert!(super::live_bytes() >= live + (1 << 19), "a held MiB is live");
        drop(held);
    }
}
