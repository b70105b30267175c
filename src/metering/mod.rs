//! Metering from the sandbox's host cgroup (v1 and v2).
//!
//! The sandbox cgroup holds runsc's sentry, gofer and platform stubs, so its counters are the
//! sandbox's true host cost. Reads are plain synchronous file reads: callers on the async runtime
//! go through `spawn_blocking`.

use std::path::{Path, PathBuf};

pub mod disk;
#[cfg(test)]
pub mod fake;
pub mod meter;

/// Errors of metering reads.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cgroup file could not be read or parsed.
    #[error("cgroup file {path}: {why}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// A cgroup file could not be written.
    #[error("cgroup file {path}: write {value:?}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What we wrote.
        value: String,
        /// The error.
        source: std::io::Error,
    },
}

/// The host limits of a sandbox cgroup, as the OCI spec gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    /// CFS quota in microseconds per 100 ms period.
    pub cpu_quota: i64,
    /// Memory limit in bytes (memory_bytes plus headroom).
    pub memory_limit: i64,
    /// pids limit.
    pub pids_limit: i64,
}

/// CFS period of every sandbox, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

fn write_file(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(|source| Error::Write {
        path: path.into(),
        value: value.into(),
        source,
    })
}

type Result<T> = std::result::Result<T, Error>;

/// Which cgroup hierarchy the host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CgroupVersion {
    /// Legacy or hybrid: one hierarchy per controller.
    V1,
    /// Unified hierarchy.
    V2,
}

impl CgroupVersion {
    /// Detects the version from the mount at `root` (normally `/sys/fs/cgroup`).
    pub fn detect(root: &Path) -> Self {
        if root.join("cgroup.controllers").exists() {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        }
    }
}

/// Usage counters of one measurement window, in the units of `UsageMetrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// CPU time in milliseconds.
    pub cpu_ms: u64,
    /// Peak memory in bytes.
    pub memory_peak_bytes: u64,
    /// Time-weighted average memory in bytes.
    pub memory_avg_bytes: u64,
    /// Bytes read from the workspace.
    pub disk_read_bytes: u64,
    /// Bytes written to the workspace.
    pub disk_write_bytes: u64,
    /// Bytes sent out.
    pub network_egress_bytes: u64,
    /// Bytes received.
    pub network_ingress_bytes: u64,
}

/// A point-in-time reading of a sandbox cgroup.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Total CPU time in nanoseconds since the cgroup was made.
    pub cpu_ns: u64,
    /// Memory in use, not counting reclaimable inactive file cache.
    pub working_set: u64,
    /// The kernel's own high-water mark of memory use.
    pub peak: u64,
}

/// The cgroup of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    root: PathBuf,
    version: CgroupVersion,
    rel: String,
}

fn read_u64(path: &Path) -> Result<u64> {
    let s = std::fs::read_to_string(path).map_err(|e| Error::Read {
        path: path.into(),
        why: e.to_string(),
    })?;
    s.trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| Error::Read {
            path: path.into(),
            why: e.to_string(),
        })
}

fn read_stat_key(path: &Path, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(path).map_err(|e| Error::Read {
        path: path.into(),
        why: e.to_string(),
    })?;
    for line in s.lines() {
        let mut it = line.split_whitespace();
        if it.next() == Some(key) {
            if let Some(v) = it.next().and_then(|v| v.parse().ok()) {
                return Ok(v);
            }
        }
    }
    Err(Error::Read {
        path: path.into(),
        why: format!("no key {key}"),
    })
}

impl SandboxCgroup {
    /// The cgroup at `rel` (the OCI `cgroupsPath`, e.g. `/compute/<id>`) under `root`.
    pub fn new(root: &Path, version: CgroupVersion, rel: &str) -> Self {
        Self {
            root: root.to_path_buf(),
            version,
            rel: rel.trim_start_matches('/').to_string(),
        }
    }

    fn file(&self, controller: &str, name: &str) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.root.join(controller).join(&self.rel).join(name),
            CgroupVersion::V2 => self.root.join(&self.rel).join(name),
        }
    }

    /// The directories this cgroup occupies (one per controller on v1).
    pub fn dirs(&self) -> Vec<PathBuf> {
        match self.version {
            CgroupVersion::V1 => [
                "cpu", "cpuacct", "memory", "pids", "cpuset", "devices", "freezer", "blkio",
            ]
            .iter()
            .map(|c| self.root.join(c).join(&self.rel))
            .collect(),
            CgroupVersion::V2 => vec![self.root.join(&self.rel)],
        }
    }

    /// The pids in the cgroup.
    pub fn procs(&self) -> Result<Vec<i32>> {
        let p = self.file("memory", "cgroup.procs");
        let s = std::fs::read_to_string(&p).map_err(|e| Error::Read {
            path: p.clone(),
            why: e.to_string(),
        })?;
        Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Whether the cgroup exists (the sandbox is running).
    pub fn exists(&self) -> bool {
        self.file("memory", "").exists()
    }

    /// Total CPU time in nanoseconds.
    pub fn cpu_ns(&self) -> Result<u64> {
        match self.version {
            CgroupVersion::V1 => read_u64(&self.file("cpuacct", "cpuacct.usage")),
            CgroupVersion::V2 => {
                Ok(read_stat_key(&self.file("cpu", "cpu.stat"), "usage_usec")? * 1000)
            }
        }
    }

    /// Memory in use minus inactive file cache (the kubelet's "working set").
    pub fn working_set(&self) -> Result<u64> {
        let (usage, inactive) = match self.version {
            CgroupVersion::V1 => (
                read_u64(&self.file("memory", "memory.usage_in_bytes"))?,
                read_stat_key(&self.file("memory", "memory.stat"), "total_inactive_file")
                    .unwrap_or(0),
            ),
            CgroupVersion::V2 => (
                read_u64(&self.file("memory", "memory.current"))?,
                read_stat_key(&self.file("memory", "memory.stat"), "inactive_file").unwrap_or(0),
            ),
        };
        Ok(usage.saturating_sub(inactive))
    }

    /// The kernel's memory high-water mark for the cgroup.
    pub fn peak(&self) -> Result<u64> {
        match self.version {
            CgroupVersion::V1 => read_u64(&self.file("memory", "memory.max_usage_in_bytes")),
            CgroupVersion::V2 => read_u64(&self.file("memory", "memory.peak")),
        }
    }

    /// Changes the limits of a running sandbox's cgroup (a claimed warm-pool member gets the
    /// limits of its request). Blocks.
    pub fn set_limits(&self, l: &HostLimits) -> Result<()> {
        match self.version {
            CgroupVersion::V1 => {
                write_file(
                    &self.file("cpu", "cpu.cfs_period_us"),
                    &CPU_PERIOD_US.to_string(),
                )?;
                write_file(
                    &self.file("cpu", "cpu.cfs_quota_us"),
                    &l.cpu_quota.to_string(),
                )?;
                // With a memory+swap limit set, memory.limit_in_bytes must stay at or under
                // it: raise memsw first when growing, lower it last when shrinking.
                let limit = self.file("memory", "memory.limit_in_bytes");
                let memsw = self.file("memory", "memory.memsw.limit_in_bytes");
                let memsw_set = read_u64(&memsw).is_ok_and(|v| v < (1 << 62));
                let value = l.memory_limit.to_string();
                if memsw_set {
                    if write_file(&memsw, &value).is_ok() {
                        write_file(&limit, &value)?;
                    } else {
                        write_file(&limit, &value)?;
                        write_file(&memsw, &value)?;
                    }
                } else {
                    write_file(&limit, &value)?;
                }
                write_file(&self.file("pids", "pids.max"), &l.pids_limit.to_string())
            }
            CgroupVersion::V2 => {
                write_file(
                    &self.file("cpu", "cpu.max"),
                    &format!("{} {CPU_PERIOD_US}", l.cpu_quota),
                )?;
                write_file(
                    &self.file("memory", "memory.max"),
                    &l.memory_limit.to_string(),
                )?;
                write_file(&self.file("pids", "pids.max"), &l.pids_limit.to_string())
            }
        }
    }

    /// The limits currently in force (what [`SandboxCgroup::set_limits`] writes).
    pub fn limits(&self) -> Result<HostLimits> {
        let max_or = |s: &str| -> i64 { s.trim().parse().unwrap_or(-1) };
        let read = |p: PathBuf| {
            std::fs::read_to_string(&p).map_err(|e| Error::Read {
                path: p,
                why: e.to_string(),
            })
        };
        match self.version {
            CgroupVersion::V1 => Ok(HostLimits {
                cpu_quota: max_or(&read(self.file("cpu", "cpu.cfs_quota_us"))?),
                memory_limit: max_or(&read(self.file("memory", "memory.limit_in_bytes"))?),
                pids_limit: max_or(&read(self.file("pids", "pids.max"))?),
            }),
            CgroupVersion::V2 => {
                let cpu = read(self.file("cpu", "cpu.max"))?;
                Ok(HostLimits {
                    cpu_quota: max_or(cpu.split_whitespace().next().unwrap_or("")),
                    memory_limit: max_or(&read(self.file("memory", "memory.max"))?),
                    pids_limit: max_or(&read(self.file("pids", "pids.max"))?),
                })
            }
        }
    }

    /// One reading of every counter.
    pub fn sample(&self) -> Result<Sample> {
        Ok(Sample {
            cpu_ns: self.cpu_ns()?,
            working_set: self.working_set()?,
            peak: self.peak().unwrap_or(0),
        })
    }
}

/// Accumulates memory samples over a window into a peak and a time-weighted average.
#[derive(Debug, Clone)]
pub struct MemoryWindow {
    start: std::time::Instant,
    last: std::time::Instant,
    last_value: u64,
    weighted: u128,
    peak: u64,
}

impl MemoryWindow {
    /// Starts a window with a first sample.
    pub fn new(first: u64) -> Self {
        let now = std::time::Instant::now();
        Self {
            start: now,
            last: now,
            last_value: first,
            weighted: 0,
            peak: first,
        }
    }

    /// Adds a sample taken now.
    pub fn add(&mut self, value: u64) {
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last).as_micros();
        self.weighted += dt * u128::from(self.last_value.saturating_add(value) / 2);
        self.last = now;
        self.last_value = value;
        self.peak = self.peak.max(value);
    }

    /// (Σ value × µs, µs covered) so far.
    pub fn parts(&self) -> (u128, u128) {
        (
            self.weighted,
            self.last.duration_since(self.start).as_micros(),
        )
    }

    /// The peak so far.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// The time-weighted average so far (the last sample if the window is empty).
    pub fn average(&self) -> u64 {
        let total = self.last.duration_since(self.start).as_micros();
        self.weighted
            .checked_div(total)
            .map_or(self.last_value, |v| v as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{Counters, FakeTree};
    use super::*;

    #[test]
    fn reads_v1_and_v2_trees() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let tree = FakeTree::new(version);
            assert_eq!(CgroupVersion::detect(tree.root()), version);
            let cg = tree.add("/compute/abc");
            let c = Counters {
                cpu_ns: 2_500_000,
                usage: 9000,
                inactive: 1000,
                peak: 12000,
            };
            tree.set("/compute/abc", c);
            let s = cg.sample().unwrap();
            assert_eq!(
                (s.cpu_ns, s.working_set, s.peak),
                (2_500_000, 8000, 12000),
                "{version:?}"
            );
        }
    }

    #[test]
    fn limits_are_written_on_v1_and_v2() {
        let l = HostLimits {
            cpu_quota: 25_000,
            memory_limit: 300 << 20,
            pids_limit: 64,
        };
        // (version, a file the limits go to, what it holds)
        let cases = [
            (
                CgroupVersion::V1,
                "cpu/compute/a/cpu.cfs_period_us",
                "100000".to_string(),
            ),
            (
                CgroupVersion::V1,
                "memory/compute/a/memory.limit_in_bytes",
                (300u64 << 20).to_string(),
            ),
            (
                CgroupVersion::V2,
                "compute/a/cpu.max",
                "25000 100000".to_string(),
            ),
            (CgroupVersion::V2, "compute/a/pids.max", "64".to_string()),
        ];
        for (version, file, want) in cases {
            let tree = FakeTree::new(version);
            let cg = tree.add("/compute/a");
            cg.set_limits(&l).unwrap();
            assert_eq!(cg.limits().unwrap(), l, "{version:?}");
            let got = std::fs::read_to_string(tree.root().join(file)).unwrap();
            assert_eq!(got, want, "{file}");
        }
        let tree = FakeTree::new(CgroupVersion::V2);
        // A missing cgroup (the sandbox is gone) is an error, not a silent no-op.
        let cg = SandboxCgroup::new(tree.root(), CgroupVersion::V2, "compute/none");
        assert!(cg.set_limits(&l).is_err());
    }

    #[test]
    fn missing_cgroup_is_an_error() {
        let tree = FakeTree::new(CgroupVersion::V1);
        let cg = SandboxCgroup::new(tree.root(), CgroupVersion::V1, "compute/none");
        assert!(cg.sample().is_err());
        assert!(!cg.exists());
    }

    #[test]
    fn memory_window_tracks_peak_and_average() {
        let mut w = MemoryWindow::new(100);
        std::thread::sleep(std::time::Duration::from_millis(10));
        w.add(300);
        std::thread::sleep(std::time::Duration::from_millis(10));
        w.add(100);
        assert_eq!(w.peak(), 300);
        let avg = w.average();
        assert!(avg > 100 && avg < 300, "avg {avg}");
    }
}
