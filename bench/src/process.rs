//! Readings of this process for the benchmarks: resident memory (optionally after handing
//! freed heap back to the OS), CPU time, allocations, and the open-file limit.

use serde::{Deserialize, Serialize};

/// One reading of a server process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub rss_kib: u64,
    /// User + system CPU time of the whole process, in µs.
    pub cpu_us: u64,
    /// Of it, the time spent in the kernel (syscalls, the loopback network stack), in µs.
    #[serde(default)]
    pub sys_us: u64,
    pub allocations: u64,
    pub allocated_bytes: u64,
    /// Heap bytes in use (allocated and not freed).
    #[serde(default)]
    pub live_heap_bytes: u64,
}

impl Stat {
    /// What happened between `self` (earlier) and `later`; RSS is the later reading's.
    pub fn until(&self, later: &Stat) -> Stat {
        Stat {
            rss_kib: later.rss_kib,
            cpu_us: later.cpu_us.saturating_sub(self.cpu_us),
            sys_us: later.sys_us.saturating_sub(self.sys_us),
            allocations: later.allocations.saturating_sub(self.allocations),
            allocated_bytes: later.allocated_bytes.saturating_sub(self.allocated_bytes),
            live_heap_bytes: later.live_heap_bytes,
        }
    }
}

/// Reads this process now; with `trim`, freed heap pages go back to the OS first, so RSS
/// tracks live memory.
pub fn read(trim: bool) -> Result<Stat, String> {
    if trim {
        release_free_memory();
    }
    let (allocations, allocated_bytes) = crate::alloc::totals();
    Ok(Stat {
        rss_kib: rss_kib()?,
        cpu_us: cpu_us(),
        sys_us: sys_us(),
        allocations,
        allocated_bytes,
        live_heap_bytes: crate::alloc::live_bytes(),
    })
}

fn rss_kib() -> Result<u64, String> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

fn cpu_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0;
    if !ok {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

fn sys_us() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    (usage.ru_stime.tv_sec as u64) * 1_000_000 + usage.ru_stime.tv_usec as u64
}

/// Hands freed heap pages back to the OS, so RSS tracks live memory.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: glibc's malloc_trim takes no pointers and locks each arena itself.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

/// The soft `RLIMIT_NOFILE`, from /proc/self/limits.
pub fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_of_this_process_has_memory_and_cpu() {
        let s = read(true).expect("readable /proc/self");
        assert!(s.rss_kib > 0, "a running process has resident memory");
        let later = read(false).expect("readable");
        let d = s.until(&later);
        assert!(later.allocations >= s.allocations, "counters only grow");
        assert_eq!(d.rss_kib, later.rss_kib, "a difference carries the later RSS");
    }
}
