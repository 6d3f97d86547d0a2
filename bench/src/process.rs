//! Readings of this process for the benchmarks: resident memory (after handing freed heap
//! back to the OS) and the open-file limit.

use std::future::Future;
use std::time::Duration;

/// Quiet time before each reading, so closed sockets and tasks are gone.
const SETTLE: Duration = Duration::from_millis(1500);

/// RSS growth per item while `open`'s items are held, in KiB, and how many opened.
pub(crate) async fn rss_growth<T>(open: impl Future<Output = Vec<Option<T>>>) -> Result<(f64, usize), String> {
    let before = settled_rss_kib().await?;
    let held: Vec<T> = open.await.into_iter().flatten().collect();
    let after = settled_rss_kib().await?;
    let opened = held.len();
    drop(held);
    tokio::time::sleep(SETTLE).await;
    if opened == 0 {
        return Err("no stream or socket could be opened".into());
    }
    Ok(((after as f64 - before as f64) / opened as f64, opened))
}

async fn settled_rss_kib() -> Result<u64, String> {
    tokio::time::sleep(SETTLE).await;
    release_free_memory();
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// Hands freed heap pages back to the OS, so RSS tracks live memory.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::os::raw::c_int;
    }
    // SAFETY: glibc's malloc_trim takes no pointers and locks each arena itself.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

/// The soft `RLIMIT_NOFILE`, from /proc/self/limits.
pub(crate) fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
