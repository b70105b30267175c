//! Host-side readings and helpers: /proc/meminfo, a process's RSS, test data, ports, `ctr`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    meminfo_field("/proc/meminfo", "MemAvailable:")
}

/// `VmRSS` of a process, in bytes.
pub fn vm_rss(pid: u32) -> Option<u64> {
    meminfo_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// CPU time of a process and all its threads, dead ones included (utime + stime of
/// /proc/PID/stat), in ms; 10 ms resolution.
pub fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks * 10)
}

fn meminfo_field(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// Proportional set size of a process (shared pages split among their users), in bytes.
pub fn pss(pid: i32) -> Option<u64> {
    meminfo_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

/// The containerd shims of `namespace`: container id → shim pid (from their command lines,
/// `containerd-shim-… -namespace NS -id ID …`).
pub fn shims(namespace: &str) -> std::collections::HashMap<String, i32> {
    let mut out = std::collections::HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if !args
            .first()
            .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"))
        {
            continue;
        }
        let value = |flag: &str| {
            args.windows(2)
                .find(|w| w[0] == flag.as_bytes())
                .map(|w| String::from_utf8_lossy(w[1]).into_owned())
        };
        if value("-namespace").as_deref() == Some(namespace) {
            if let Some(id) = value("-id") {
                out.insert(id, pid);
            }
        }
    }
    out
}

/// Deterministic incompressible-looking bytes (xorshift64*), `len` long.
pub fn test_data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a daemon to bind.
///
/// It comes from below the kernel's ephemeral range, never from `bind(:0)`: a port the kernel
/// hands out can become the source port of an outgoing connection before the daemon binds it
/// (tests/common's `free_port` met that in CI). Calls move on from a per-process start.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 14_000;
    const SPAN: u32 = 6_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id() % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free loopback port in {LOW}..{}", LOW + SPAN),
    ))
}

/// Runs `ctr --address SOCK --namespace NS ARGS…` and returns stdout (empty on failure).
pub fn ctr(sock: &Path, ns: &str, args: &[&str]) -> String {
    Command::new("ctr")
        .arg("--address")
        .arg(sock)
        .args(["--namespace", ns])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Removes a namespace's images (synchronously collected) and then the namespace itself,
/// retrying while containerd's GC still frees its content and snapshots.
pub async fn drop_namespace(sock: &Path, ns: &str) {
    let sock2 = sock.to_path_buf();
    let ns2 = ns.to_string();
    let _ = tokio::task::spawn_blocking(move || {
        for line in ctr(&sock2, &ns2, &["images", "ls", "-q"]).lines() {
            let _ = ctr(&sock2, &ns2, &["images", "rm", "--sync", line]);
        }
        for _ in 0..50 {
            let ok = Command::new("ctr")
                .arg("--address")
                .arg(&sock2)
                .args(["namespaces", "rm", &ns2])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            let gone = !Command::new("ctr")
                .arg("--address")
                .arg(&sock2)
                .args(["namespaces", "ls", "-q"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == ns2))
                .unwrap_or(false);
            if ok || gone {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("compute-bench: could not remove containerd namespace {ns2}");
    })
    .await;
}

/// The host's description for the report: cores and cgroup version.
pub fn machine(runsc: &Path, platform: &str) -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cgroup = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "cgroup v2"
    } else {
        "cgroup v1"
    };
    let info = computed::runtime::RunscInfo::probe(runsc);
    let version = if info.version.is_empty() {
        "runsc ?".to_string()
    } else {
        info.version.clone()
    };
    let platform =
        computed::runtime::platform_for(platform, &info).unwrap_or_else(|e| e.to_string());
    format!("{cores} cores, {cgroup}, {version}, platform {platform}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_deterministic_and_sized() {
        let a = test_data(1000, 7);
        assert_eq!(a.len(), 1000);
        assert_eq!(a, test_data(1000, 7));
        assert_ne!(a, test_data(1000, 8));
    }
}
