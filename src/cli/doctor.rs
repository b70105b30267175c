//! `computectl doctor`: checks what the node needs and says what to fix.

use std::path::{Path, PathBuf};

use super::{human_bytes, table, Output, Target};
use crate::api::admin::v1 as pb;
use crate::config::Config;

/// Options of `doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// containerd's socket.
    #[arg(
        long,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    pub containerd: PathBuf,
    /// The node daemon's config file, if it uses one.
    #[arg(long, env = "COMPUTE_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Check {
    name: &'static str,
    level: Level,
    detail: String,
    fix: String,
}

fn check(
    name: &'static str,
    level: Level,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        name,
        level,
        detail: detail.into(),
        fix: fix.into(),
    }
}

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

fn version_of(bin: &Path) -> Option<String> {
    let o = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()?;
    String::from_utf8(o.stdout)
        .ok()?
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

/// Runs `doctor`; fails when a check fails.
pub async fn run(t: &Target, a: DoctorArgs) -> anyhow::Result<()> {
    let mut checks = Vec::new();
    // Config.
    let cfg = match Config::load(a.config.as_deref()) {
        Ok(c) => {
            checks.push(check(
                "config",
                Level::Ok,
                a.config
                    .as_ref()
                    .map_or("defaults".into(), |p| p.display().to_string()),
                "",
            ));
            c
        }
        Err(e) => {
            checks.push(check(
                "config",
                Level::Fail,
                e.to_string(),
                "fix the config file or the environment variable it names",
            ));
            Config::default()
        }
    };
    // containerd.
    match crate::runtime::Containerd::connect(&a.containerd, &cfg.namespace).await {
        Ok(c) => match c.version().await {
            Ok(v) => checks.push(check("containerd", Level::Ok, format!("{v} at {}", a.containerd.display()), "")),
            Err(e) => checks.push(check("containerd", Level::Fail, e.to_string(), "start containerd (scripts/containerd-up) or pass --containerd / CONTAINERD_ADDRESS")),
        },
        Err(e) => checks.push(check("containerd", Level::Fail, e.to_string(), "start containerd")),
    }
    // runsc and the shim.
    match version_of(&cfg.runsc_path).or_else(|| on_path("runsc").and_then(|p| version_of(&p))) {
        Some(v) => checks.push(check("runsc", Level::Ok, v, "")),
        None => checks.push(check(
            "runsc",
            Level::Fail,
            format!("{} not found or not runnable", cfg.runsc_path.display()),
            "apt-get install runsc (or the DaemonSet's installer)",
        )),
    }
    match on_path("containerd-shim-runsc-v1") {
        Some(p) => checks.push(check("runsc shim", Level::Ok, p.display().to_string(), "")),
        None => checks.push(check("runsc shim", Level::Warn, "containerd-shim-runsc-v1 not on PATH", "fine: sandboxes run through the runc v2 shim with a runsc wrapper; install the shim for production")),
    }
    // cgroups.
    let root = Path::new("/sys/fs/cgroup");
    let v = crate::metering::CgroupVersion::detect(root);
    let missing: Vec<&str> = match v {
        crate::metering::CgroupVersion::V1 => ["cpu", "cpuacct", "memory", "pids"]
            .into_iter()
            .filter(|c| !root.join(c).is_dir())
            .collect(),
        crate::metering::CgroupVersion::V2 => {
            let have = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            ["cpu", "memory", "pids"]
                .into_iter()
                .filter(|c| !have.split_whitespace().any(|h| h == *c))
                .collect()
        }
    };
    if missing.is_empty() {
        checks.push(check(
            "cgroups",
            Level::Ok,
            format!("{v:?} with cpu, memory, pids"),
            "",
        ));
    } else {
        checks.push(check(
            "cgroups",
            Level::Fail,
            format!("{v:?}, missing {}", missing.join(", ")),
            "enable the cpu, memory and pids controllers",
        ));
    }
    // KVM.
    if Path::new("/dev/kvm").exists() {
        checks.push(check(
            "kvm",
            Level::Ok,
            "/dev/kvm present (runsc_platform = \"kvm\" is possible)",
            "",
        ));
    } else {
        checks.push(check(
            "kvm",
            Level::Warn,
            "no /dev/kvm",
            "fine: runsc uses the ptrace/systrap platform; KVM is faster where available",
        ));
    }
    // Workspace volumes.
    let tools: Vec<&str> = ["mkfs.ext4", "mount", "umount"]
        .into_iter()
        .filter(|b| on_path(b).is_none())
        .collect();
    if tools.is_empty() && Path::new("/dev/loop-control").exists() {
        checks.push(check(
            "volumes",
            Level::Ok,
            "mkfs.ext4, mount and /dev/loop-control present",
            "",
        ));
    } else {
        checks.push(check(
            "volumes",
            Level::Fail,
            format!(
                "missing: {} {}",
                tools.join(" "),
                if Path::new("/dev/loop-control").exists() {
                    ""
                } else {
                    "/dev/loop-control"
                }
            ),
            "apt-get install e2fsprogs mount; load the loop module",
        ));
    }
    // Disk.
    let dir = if cfg.state_dir.exists() {
        cfg.state_dir.clone()
    } else {
        PathBuf::from("/")
    };
    match nix::sys::statvfs::statvfs(&dir) {
        Ok(s) => {
            let free = s.blocks_available() * s.fragment_size();
            let level = if free < 1 << 30 {
                Level::Fail
            } else if free < 5 << 30 {
                Level::Warn
            } else {
                Level::Ok
            };
            checks.push(check(
                "disk",
                level,
                format!("{} free at {}", human_bytes(free), dir.display()),
                if level == Level::Ok {
                    ""
                } else {
                    "free disk space: workspaces live there"
                },
            ));
        }
        Err(e) => checks.push(check("disk", Level::Warn, e.to_string(), "")),
    }
    // The daemon.
    match t.admin().await {
        Ok(mut admin) => match admin.get_node(pb::GetNodeRequest {}).await {
            Ok(n) => {
                let n = n.into_inner();
                let info = n.info.unwrap_or_default();
                checks.push(check(
                    "daemon",
                    Level::Ok,
                    format!(
                        "{} on {}: {} live sandboxes, runtime {}{}",
                        info.node_name,
                        n.state_dir,
                        info.live_sandboxes,
                        info.runtime,
                        if info.draining { ", DRAINING" } else { "" }
                    ),
                    "",
                ));
            }
            Err(s) => checks.push(check(
                "daemon",
                Level::Fail,
                s.message().to_string(),
                "check the daemon's log",
            )),
        },
        Err(e) => checks.push(check(
            "daemon",
            Level::Fail,
            e.to_string(),
            "start `computed node` (scripts/up) or pass --socket/--addr",
        )),
    }

    let word = |l: Level| match l {
        Level::Ok => "ok",
        Level::Warn => "warn",
        Level::Fail => "FAIL",
    };
    if t.output == Output::Json {
        let v: Vec<_> = checks.iter().map(|c| serde_json::json!({"check": c.name, "status": word(c.level), "detail": c.detail, "fix": c.fix})).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let rows: Vec<Vec<String>> = checks
            .iter()
            .map(|c| {
                vec![
                    c.name.to_string(),
                    word(c.level).to_string(),
                    c.detail.clone(),
                    c.fix.clone(),
                ]
            })
            .collect();
        table(&["CHECK", "STATUS", "DETAIL", "FIX"], &rows);
    }
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}
