//! The checks of `computectl doctor` about the host the sandboxes run on: runsc, the
//! containerd runtime and its shim, cgroups, KVM, the tools workspace volumes need, and disk.

use std::path::{Path, PathBuf};

use super::daemon::InUse;
use super::{check, Check, Level};
use crate::api::admin::v1 as pb;
use crate::cli::human_bytes;
use crate::runtime::{platform_for, RunscInfo};

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The gVisor release this check wants (bookworm-backports); older ones still work.
const RUNSC_WANTED: u32 = 20240729;

/// runsc answers, with its version, platforms and features; the platform the daemon runs it on.
pub(super) fn runsc(used: &InUse, node: Option<&pb::GetNodeResponse>) -> Check {
    let info = RunscInfo::probe(&used.runsc);
    if info.version.is_empty() {
        return check(
            "runsc",
            Level::Fail,
            format!("{} not found or not runnable", used.runsc.display()),
            "apt-get install -t bookworm-backports runsc (scripts/install-deps, or the DaemonSet's installer), or set runsc_path",
        );
    }
    let platform = match node {
        Some(n) if !n.runsc_platform_in_use.is_empty() => n.runsc_platform_in_use.clone(),
        _ => platform_for(&used.platform, &info).unwrap_or_else(|e| e.to_string()),
    };
    let features = if info.features.is_empty() {
        "none".to_string()
    } else {
        info.features.join(", ")
    };
    let detail = format!(
        "{} at {}; platform {platform} (offers {}); features: {features}",
        info.version,
        used.runsc.display(),
        info.platforms.join(", ")
    );
    match info.date {
        Some(d) if d >= RUNSC_WANTED => check("runsc", Level::Ok, detail, ""),
        _ => check(
            "runsc",
            Level::Warn,
            detail,
            "works; gVisor 20240729 (bookworm-backports) is faster on systrap and checkpoints better: apt-get install -t bookworm-backports runsc",
        ),
    }
}

/// The containerd runtime the daemon chose, and the shim containerd starts for it.
pub(super) fn runtime(n: &pb::GetNodeResponse, checks: &mut Vec<Check>) {
    let shim = match n.runtime_name.as_str() {
        "io.containerd.runsc.v1" => "containerd-shim-runsc-v1",
        _ => "containerd-shim-runc-v2",
    };
    let binary = Path::new(&n.runtime_binary);
    let binary_ok = if shim == "containerd-shim-runc-v2" {
        is_executable(binary)
    } else {
        binary.is_file()
    };
    match (on_path(shim), binary_ok) {
        (Some(_), true) => checks.push(check(
            "runtime",
            Level::Ok,
            format!("{} via {shim}, {}", n.runtime_name, binary.display()),
            "",
        )),
        (None, _) => checks.push(check(
            "runtime",
            Level::Fail,
            format!("{shim} is not on PATH"),
            "install containerd's shims (apt-get install containerd, or runsc for its shim)",
        )),
        (_, false) => checks.push(check(
            "runtime",
            Level::Fail,
            format!("{} is missing or not executable", binary.display()),
            "restart the daemon: it writes this file at start",
        )),
    }
    if shim == "containerd-shim-runc-v2" {
        checks.push(check(
            "runsc shim",
            if on_path("containerd-shim-runsc-v1").is_some() { Level::Ok } else { Level::Warn },
            if on_path("containerd-shim-runsc-v1").is_some() {
                "containerd-shim-runsc-v1 present; the daemon uses the runc v2 shim (runtime = runc-wrapper?)"
            } else {
                "containerd-shim-runsc-v1 not on PATH"
            },
            "fine: sandboxes run through the runc v2 shim with a runsc wrapper; install the shim for production",
        ));
    }
}

/// The cgroup controllers sandboxes are metered and limited with.
pub(super) fn cgroups(used: &InUse) -> Check {
    let root = used.cgroup_root.as_path();
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
        check(
            "cgroups",
            Level::Ok,
            format!("{v:?} at {} with cpu, memory, pids", root.display()),
            "",
        )
    } else {
        check(
            "cgroups",
            Level::Fail,
            format!(
                "{v:?} at {}, missing {}",
                root.display(),
                missing.join(", ")
            ),
            "enable the cpu, memory and pids controllers",
        )
    }
}

/// KVM: needed only when the daemon runs runsc on the kvm platform.
pub(super) fn kvm(used: &InUse) -> Check {
    let kvm = Path::new("/dev/kvm").exists();
    let platform = if used.platform.is_empty() {
        "runsc's default"
    } else {
        used.platform.as_str()
    };
    match (used.platform == "kvm", kvm) {
        (true, false) => check(
            "kvm",
            Level::Fail,
            "runsc_platform = \"kvm\" but there is no /dev/kvm",
            "load kvm (modprobe kvm_intel/kvm_amd) or use runsc_platform = \"systrap\"/\"ptrace\"",
        ),
        (_, true) => check(
            "kvm",
            Level::Ok,
            format!("/dev/kvm present; platform {platform}"),
            "",
        ),
        (false, false) => check(
            "kvm",
            Level::Warn,
            format!("no /dev/kvm; platform {platform}"),
            "fine: runsc uses the ptrace/systrap platform; KVM is faster where available",
        ),
    }
}

/// Workspace volumes: the tools and the loop device they are made with.
pub(super) fn volumes() -> Check {
    let tools: Vec<&str> = ["mkfs.ext4", "mount", "umount"]
        .into_iter()
        .filter(|b| on_path(b).is_none())
        .collect();
    let loop_control = Path::new("/dev/loop-control").exists();
    if tools.is_empty() && loop_control {
        check(
            "volumes",
            Level::Ok,
            "mkfs.ext4, mount and /dev/loop-control present",
            "",
        )
    } else {
        check(
            "volumes",
            Level::Fail,
            format!(
                "missing: {} {}",
                tools.join(" "),
                if loop_control {
                    ""
                } else {
                    "/dev/loop-control"
                }
            ),
            "apt-get install e2fsprogs mount; load the loop module",
        )
    }
}

/// Disk, where the daemon keeps workspaces.
pub(super) fn disk(used: &InUse) -> Check {
    let dir = if used.state_dir.exists() {
        used.state_dir.clone()
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
            check(
                "disk",
                level,
                format!("{} free at {}", human_bytes(free), dir.display()),
                if level == Level::Ok {
                    ""
                } else {
                    "free disk space: workspaces live there"
                },
            )
        }
        Err(e) => check("disk", Level::Warn, e.to_string(), ""),
    }
}
