//! `computectl doctor`: checks what the node needs and says what to fix.

use std::path::{Path, PathBuf};

use super::{human_bytes, table, Output, Target};
use crate::api::admin::v1 as pb;
use crate::config::Config;

/// Options of `doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// containerd's socket, when the daemon does not answer (otherwise the daemon's own is
    /// checked). Default: the config's `containerd_socket`.
    #[arg(long, env = "CONTAINERD_ADDRESS")]
    pub containerd: Option<PathBuf>,
    /// The node daemon's config file, when the daemon does not answer.
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

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What the node uses: the daemon's answer when it runs, else the local config.
struct InUse {
    containerd: PathBuf,
    namespace: String,
    runsc: PathBuf,
    platform: String,
    state_dir: PathBuf,
    cgroup_root: PathBuf,
}

impl InUse {
    fn of_daemon(n: &pb::GetNodeResponse) -> Self {
        Self {
            containerd: n.containerd_address.clone().into(),
            namespace: n.namespace.clone(),
            runsc: n.runsc_path.clone().into(),
            platform: n.runsc_platform.clone(),
            state_dir: n.state_dir.clone().into(),
            cgroup_root: n.cgroup_root.clone().into(),
        }
    }

    fn of_config(cfg: &Config, containerd: Option<&Path>) -> Self {
        Self {
            containerd: containerd.map_or_else(|| cfg.containerd_socket.clone(), Path::to_path_buf),
            namespace: cfg.namespace.clone(),
            runsc: cfg.runsc_path.clone(),
            platform: cfg.runsc_platform.clone(),
            state_dir: cfg.state_dir.clone(),
            cgroup_root: cfg.cgroup_root.clone(),
        }
    }
}

/// Runs `doctor`; fails when a check fails. The daemon is asked first: every later check looks
/// at what the running daemon uses (its containerd socket and namespace, runtime, runsc, state
/// directory), not at this command's defaults. Without a daemon, the local config is checked.
pub async fn run(t: &Target, a: DoctorArgs) -> anyhow::Result<()> {
    let mut checks = Vec::new();
    // The daemon.
    let node = match t.admin().await {
        Ok(mut admin) => admin
            .get_node(pb::GetNodeRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| s.message().to_string()),
        Err(e) => Err(e.to_string()),
    };
    let used = match &node {
        Ok(n) => {
            let info = n.info.clone().unwrap_or_default();
            checks.push(check(
                "daemon",
                Level::Ok,
                format!(
                    "{} on {}: {} live sandboxes{}",
                    info.node_name,
                    n.state_dir,
                    info.live_sandboxes,
                    if info.draining { ", DRAINING" } else { "" }
                ),
                "",
            ));
            checks.push(check(
                "config",
                Level::Ok,
                if n.config_path.is_empty() {
                    "the daemon's: defaults and environment".to_string()
                } else {
                    format!("the daemon's: {}", n.config_path)
                },
                "",
            ));
            InUse::of_daemon(n)
        }
        Err(e) => {
            checks.push(check(
                "daemon",
                Level::Fail,
                e.clone(),
                "start `computed node` (scripts/up) or pass --socket/--addr",
            ));
            // No daemon to ask: check what the local config would use.
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
            InUse::of_config(&cfg, a.containerd.as_deref())
        }
    };
    // containerd: the daemon's own connection when it runs, else a local one.
    match &node {
        Ok(n) if !n.containerd_version.is_empty() => checks.push(check(
            "containerd",
            Level::Ok,
            format!(
                "{} at {} (namespace {})",
                n.containerd_version, n.containerd_address, n.namespace
            ),
            "",
        )),
        Ok(n) => checks.push(check(
            "containerd",
            Level::Fail,
            format!("the daemon gets no answer from {}", n.containerd_address),
            "start containerd (scripts/containerd-up) at the daemon's containerd_socket",
        )),
        Err(_) => match crate::runtime::Containerd::connect(&used.containerd, &used.namespace)
            .await
        {
            Ok(c) => match c.version().await {
                Ok(v) => checks.push(check(
                    "containerd",
                    Level::Ok,
                    format!("{v} at {}", used.containerd.display()),
                    "",
                )),
                Err(e) => checks.push(check(
                    "containerd",
                    Level::Fail,
                    format!("{}: {e}", used.containerd.display()),
                    "start containerd (scripts/containerd-up) or pass --containerd / CONTAINERD_ADDRESS",
                )),
            },
            Err(e) => checks.push(check(
                "containerd",
                Level::Fail,
                format!("{}: {e}", used.containerd.display()),
                "start containerd",
            )),
        },
    }
    // runsc.
    match version_of(&used.runsc) {
        Some(v) => checks.push(check(
            "runsc",
            Level::Ok,
            format!("{v} at {}", used.runsc.display()),
            "",
        )),
        None => checks.push(check(
            "runsc",
            Level::Fail,
            format!("{} not found or not runnable", used.runsc.display()),
            "apt-get install runsc (or the DaemonSet's installer), or set runsc_path",
        )),
    }
    // The containerd runtime the daemon chose, and the shim containerd starts for it.
    if let Ok(n) = &node {
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
    // cgroups.
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
        checks.push(check(
            "cgroups",
            Level::Ok,
            format!("{v:?} at {} with cpu, memory, pids", root.display()),
            "",
        ));
    } else {
        checks.push(check(
            "cgroups",
            Level::Fail,
            format!(
                "{v:?} at {}, missing {}",
                root.display(),
                missing.join(", ")
            ),
            "enable the cpu, memory and pids controllers",
        ));
    }
    // KVM: needed only when the daemon runs runsc on the kvm platform.
    let kvm = Path::new("/dev/kvm").exists();
    let platform = if used.platform.is_empty() {
        "runsc's default"
    } else {
        used.platform.as_str()
    };
    checks.push(match (used.platform == "kvm", kvm) {
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
    });
    // Workspace volumes.
    let tools: Vec<&str> = ["mkfs.ext4", "mount", "umount"]
        .into_iter()
        .filter(|b| on_path(b).is_none())
        .collect();
    let loop_control = Path::new("/dev/loop-control").exists();
    if tools.is_empty() && loop_control {
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
                if loop_control {
                    ""
                } else {
                    "/dev/loop-control"
                }
            ),
            "apt-get install e2fsprogs mount; load the loop module",
        ));
    }
    // Disk, where the daemon keeps workspaces.
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
    if let Ok(n) = &node {
        // The default image: CreateSandbox without an image needs it.
        checks.push(match (n.sandbox_image_present, n.pull_missing) {
            (true, _) => check("image", Level::Ok, format!("{} present", n.sandbox_image), ""),
            (false, true) => check(
                "image",
                Level::Warn,
                format!("{} absent; pulled on first use", n.sandbox_image),
                "import it ahead (computectl image import/pull) to spare the first sandbox the pull",
            ),
            (false, false) => check(
                "image",
                Level::Fail,
                format!("{} absent and pull_missing is off", n.sandbox_image),
                "computectl image import TARBALL --name IMAGE (scripts/build-image makes one)",
            ),
        });
        // The in-sandbox agent.
        checks.push(if !n.agent {
            check("agent", Level::Ok, "off (agent = false): execs use containerd exec", "")
        } else if n.agent_binary.is_empty() {
            check(
                "agent",
                Level::Warn,
                "agent = true but no sandbox-agent binary was found: execs use containerd exec (slower)",
                "build it with scripts/build-agent and set agent_binary",
            )
        } else {
            match std::fs::read(&n.agent_binary) {
                Ok(bin) if !crate::node::elf_interpreter(&bin) => check(
                    "agent",
                    Level::Ok,
                    format!("{} (static)", n.agent_binary),
                    "",
                ),
                Ok(_) => check(
                    "agent",
                    Level::Warn,
                    format!("{} is dynamically linked: it runs only in images with a compatible libc", n.agent_binary),
                    "build it with scripts/build-agent",
                ),
                Err(e) => check(
                    "agent",
                    Level::Fail,
                    format!("{}: {e}", n.agent_binary),
                    "restart the daemon: it installs the agent at start",
                ),
            }
        });
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
