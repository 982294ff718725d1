//! Benchmark support: "null" servers for the three services and process resource readings.
//!
//! - [`null_server`]: a `Publish`, `MutateRows` or `CreateTask` endpoint
//!   ([`null_server::NullService`]) that acknowledges every request at once (or after a fixed
//!   latency) and only counts what it receives. It shows the client-side ceiling of a pipeline:
//!   how fast this process can turn rows into acknowledged writes when the service costs
//!   nothing. `gcp-sql serve-null --service S` runs it as its own process.
//! - [`ResourceUsage`]: CPU time and peak memory of this process, read from `getrusage` and
//!   `/proc/self/status`.
//!
//! `docs/benchmarks.md` shows how the workloads in `examples/bench.rs` use both.

pub mod null_method;
pub mod null_server;

use std::time::Duration;

/// CPU time and memory of this process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceUsage {
    /// User CPU time (`ru_utime`, every thread of the process).
    pub user: Duration,
    /// System CPU time (`ru_stime`).
    pub system: Duration,
    /// Peak resident set size so far (`ru_maxrss`), in bytes.
    pub max_rss_bytes: u64,
}

impl ResourceUsage {
    /// Reads `getrusage(RUSAGE_SELF)`. All zero if the call fails (it cannot with these
    /// arguments).
    ///
    /// ```
    /// let before = gcp_sql::bench::ResourceUsage::now();
    /// let burn: u64 = (0..1_000_000u64).map(|i| i ^ (i >> 3)).sum();
    /// let after = gcp_sql::bench::ResourceUsage::now();
    /// assert!(after.cpu() >= before.cpu(), "{burn}");
    /// assert!(after.max_rss_bytes > 0);
    /// ```
    pub fn now() -> Self {
        // SAFETY: `usage` is a plain C struct that getrusage fills; zeroed is a valid value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a valid pointer to a rusage struct.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        if rc != 0 {
            return ResourceUsage::default();
        }
        let time = |t: libc::timeval| {
            Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
                + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
        };
        ResourceUsage {
            user: time(usage.ru_utime),
            system: time(usage.ru_stime),
            // Linux reports ru_maxrss in kibibytes.
            max_rss_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
        }
    }

    /// User plus system CPU time.
    pub fn cpu(&self) -> Duration {
        self.user + self.system
    }
}

/// A `VmXXX:` line of `/proc/self/status`, in bytes (`None` where the file or line is missing,
/// as off Linux).
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kib(&status, field).map(|kib| kib * 1024)
}

fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// The peak resident set size of this process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM")
}

/// The current resident set size of this process (`VmRSS`), in bytes.
pub fn current_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS")
}

/// Resets the peak resident set size (`VmHWM`) to the current size, by writing `5` to
/// `/proc/self/clear_refs` (Linux 4.0 and later), so that a later [`peak_rss_bytes`] covers only
/// what follows. Returns whether the kernel accepted it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_kib_line_of_proc_status() {
        let status = "Name:\tx\nVmHWM:\t  123456 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(123_456));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(1000));
    }

    #[test]
    fn missing_or_malformed_status_lines_read_as_none() {
        assert_eq!(parse_status_kib("VmRSS:\t1000 kB\n", "VmHWM"), None);
        assert_eq!(parse_status_kib("VmHWM:\tlots kB\n", "VmHWM"), None);
        assert_eq!(parse_status_kib("VmHWMX:\t10 kB\n", "VmHWM"), None);
    }

    #[test]
    fn this_process_has_a_peak_rss_on_linux() {
        if cfg!(target_os = "linux") {
            // Current first: other test threads may grow the process between the two reads,
            // and the high-water mark read afterwards covers that.
            let now = current_rss_bytes().expect("VmRSS on Linux");
            let peak = peak_rss_bytes().expect("VmHWM on Linux");
            assert!(peak >= now, "peak {peak} below current {now}");
        }
    }
}
