//! Workspace disk bytes.
//!
//! blkio counters read 0 for gVisor sandboxes here (the sentry's I/O is not attributed), so the
//! source depends on the volume:
//! * an `ext4-loop` workspace is its own block device: the loop device's sector counters
//!   (`/sys/block/loopN/stat`) count exactly what the workspace filesystem read from and wrote
//!   to its volume (data and ext4 metadata); a platform sandbox's extra mounts are volumes of
//!   their own, whose devices are added. Writes reach the device at writeback, so the node
//!   flushes the volume (`syncfs`) when an exec ends, to charge its writes to it.
//! * a `dir` workspace has no device of its own: the read_bytes/write_bytes I/O counters
//!   (procfs) of the sandbox's host processes (sentry and gofer, which do all of its file I/O)
//!   are used; they include the sandbox's writes to its root filesystem.

use std::path::{Path, PathBuf};

use super::{Error, SandboxCgroup};

type Result<T> = std::result::Result<T, Error>;

/// Where a sandbox's disk bytes are read from.
#[derive(Debug, Clone)]
pub enum DiskSource {
    /// The `stat` files of the loop devices of the workspace and its extra mounts.
    Loop(Vec<PathBuf>),
    /// The I/O counters of the processes in the sandbox cgroup.
    Procs(SandboxCgroup),
}

/// The block device mounted at `dir`, if any (e.g. `/dev/loop3`).
pub fn mount_source(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.display().to_string();
    info.lines().rev().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let mp = fields.get(4)?;
        if *mp != want {
            return None;
        }
        let sep = fields.iter().position(|f| *f == "-")?;
        fields.get(sep + 2).map(|s| s.to_string())
    })
}

impl DiskSource {
    /// The source for a workspace mounted (or not) at `data_dirs[0]`, with its extra mounts
    /// at the rest (all of one storage class).
    pub fn for_workspace(data_dirs: &[PathBuf], cg: &SandboxCgroup) -> Self {
        let loop_stat = |dir: &PathBuf| match mount_source(dir) {
            Some(dev) if dev.starts_with("/dev/loop") => {
                let name = dev.trim_start_matches("/dev/");
                Some(PathBuf::from(format!("/sys/block/{name}/stat")))
            }
            _ => None,
        };
        match data_dirs.first().and_then(loop_stat) {
            Some(first) => DiskSource::Loop(
                std::iter::once(first)
                    .chain(data_dirs[1..].iter().filter_map(loop_stat))
                    .collect(),
            ),
            None => DiskSource::Procs(cg.clone()),
        }
    }

    /// Whether writes must be flushed to be counted.
    pub fn needs_flush(&self) -> bool {
        matches!(self, DiskSource::Loop(_))
    }

    /// (bytes read, bytes written) so far.
    pub fn read(&self) -> Result<(u64, u64)> {
        match self {
            DiskSource::Loop(stats) => {
                let (mut r, mut w) = (0, 0);
                for stat in stats {
                    let s = std::fs::read_to_string(stat).map_err(|e| Error::Read {
                        path: stat.clone(),
                        why: e.to_string(),
                    })?;
                    let (dr, dw) = parse_block_stat(&s).ok_or_else(|| Error::Read {
                        path: stat.clone(),
                        why: "unexpected format".into(),
                    })?;
                    r += dr;
                    w += dw;
                }
                Ok((r, w))
            }
            DiskSource::Procs(cg) => {
                let mut r = 0;
                let mut w = 0;
                for pid in cg.procs()? {
                    let Ok(p) = procfs::process::Process::new(pid) else {
                        continue;
                    };
                    if let Ok(io) = p.io() {
                        r += io.read_bytes;
                        w += io.write_bytes.saturating_sub(io.cancelled_write_bytes);
                    }
                }
                Ok((r, w))
            }
        }
    }
}

/// Bytes read and written from a `/sys/block/*/stat` line (sectors are 512 bytes).
pub fn parse_block_stat(s: &str) -> Option<(u64, u64)> {
    let f: Vec<u64> = s
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some((f.get(2)? * 512, f.get(6)? * 512))
}

/// Flushes the filesystem mounted at `dir` to its device.
pub fn flush(dir: &Path) -> std::io::Result<()> {
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::fs::syncfs(&fd)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_stat_parses() {
        let s = "    1234        0    20480      100     5678        0    40960      200        0      300      300\n";
        assert_eq!(parse_block_stat(s), Some((20480 * 512, 40960 * 512)));
        assert_eq!(parse_block_stat("1 2"), None);
    }

    #[test]
    fn proc_is_not_a_block_device() {
        assert_eq!(mount_source(Path::new("/proc")).as_deref(), Some("proc"));
    }
}
