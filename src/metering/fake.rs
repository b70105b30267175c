//! A fake cgroup tree in a temporary directory, v1 (one hierarchy per controller) or v2, for
//! the unit tests of metering and of the node: sandboxes' cgroups are made and their counters
//! set by hand.

use std::path::{Path, PathBuf};

use super::{CgroupVersion, SandboxCgroup};

/// One sandbox's counters as a test sets them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// CPU time, ns.
    pub cpu_ns: u64,
    /// Memory usage, bytes.
    pub usage: u64,
    /// Inactive file pages (not part of the working set), bytes.
    pub inactive: u64,
    /// Peak usage, bytes.
    pub peak: u64,
}

/// The tree. Dropping it removes it.
pub struct FakeTree {
    dir: tempfile::TempDir,
    version: CgroupVersion,
}

impl FakeTree {
    /// An empty tree of `version` (a v2 root has `cgroup.controllers`, as
    /// [`CgroupVersion::detect`] expects).
    pub fn new(version: CgroupVersion) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        if version == CgroupVersion::V2 {
            std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids\n")
                .expect("cgroup.controllers");
        }
        Self { dir, version }
    }

    /// The tree's root (the `cgroup_root` of a config).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    fn dirs(&self, rel: &str) -> Vec<PathBuf> {
        let rel = rel.trim_start_matches('/');
        match self.version {
            CgroupVersion::V1 => ["cpu", "cpuacct", "memory", "pids"]
                .iter()
                .map(|c| self.root().join(c).join(rel))
                .collect(),
            CgroupVersion::V2 => vec![self.root().join(rel)],
        }
    }

    /// Makes the cgroup at `rel` (e.g. `/compute/<id>`) with zero counters; returns it.
    pub fn add(&self, rel: &str) -> SandboxCgroup {
        for d in self.dirs(rel) {
            std::fs::create_dir_all(&d).expect("cgroup dir");
        }
        self.set(rel, Counters::default());
        SandboxCgroup::new(self.root(), self.version, rel)
    }

    /// Sets the counters of the cgroup at `rel`.
    pub fn set(&self, rel: &str, c: Counters) {
        let rel = rel.trim_start_matches('/');
        let w = |p: PathBuf, v: String| std::fs::write(p, v).expect("cgroup file");
        match self.version {
            CgroupVersion::V1 => {
                let (cpu, mem) = (
                    self.root().join("cpuacct").join(rel),
                    self.root().join("memory").join(rel),
                );
                w(cpu.join("cpuacct.usage"), format!("{}\n", c.cpu_ns));
                w(mem.join("memory.usage_in_bytes"), format!("{}\n", c.usage));
                w(
                    mem.join("memory.max_usage_in_bytes"),
                    format!("{}\n", c.peak),
                );
                w(
                    mem.join("memory.stat"),
                    format!("cache 5\ntotal_inactive_file {}\n", c.inactive),
                );
                w(mem.join("cgroup.procs"), String::new());
            }
            CgroupVersion::V2 => {
                let d = self.root().join(rel);
                w(
                    d.join("cpu.stat"),
                    format!("usage_usec {}\nuser_usec 0\n", c.cpu_ns / 1000),
                );
                w(d.join("memory.current"), format!("{}\n", c.usage));
                w(d.join("memory.peak"), format!("{}\n", c.peak));
                w(
                    d.join("memory.stat"),
                    format!("anon 1\ninactive_file {}\n", c.inactive),
                );
                w(d.join("cgroup.procs"), String::new());
            }
        }
    }
}
