//! The checks of `computectl doctor` about the node daemon: whether it answers, its config,
//! its containerd, its default image and its in-sandbox agent; and what the node uses
//! ([`InUse`]), from the daemon's answer or, without one, from the local config.

use std::path::{Path, PathBuf};

use super::{check, Check, DoctorArgs, Level};
use crate::api::admin::v1 as pb;
use crate::config::Config;

/// The daemon's answer to GetNode, or why there is none.
pub(super) type Node = Result<pb::GetNodeResponse, String>;

/// What the node uses: the daemon's answer when it runs, else the local config.
pub(super) struct InUse {
    /// containerd's socket.
    pub containerd: PathBuf,
    /// The containerd namespace.
    pub namespace: String,
    /// The runsc binary.
    pub runsc: PathBuf,
    /// runsc's `--platform` (empty: runsc's default).
    pub platform: String,
    /// Where the daemon keeps its state and the workspaces.
    pub state_dir: PathBuf,
    /// The cgroup root sandboxes are placed under.
    pub cgroup_root: PathBuf,
}

impl InUse {
    fn of_daemon(n: &pb::GetNodeResponse) -> Self {
        Self {
            containerd: n.containerd_address.clone().into(),
            namespace: n.namespace.clone(),
            runsc: n.runsc_path.clone().into(),
            // What it runs on; a daemon from before the field: what its config says.
            platform: if n.runsc_platform_in_use.is_empty() {
                n.runsc_platform.clone()
            } else {
                n.runsc_platform_in_use.clone()
            },
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

/// The daemon and its config (without a daemon, the local config): what the later checks
/// look at.
pub(super) fn daemon(node: &Node, a: &DoctorArgs, checks: &mut Vec<Check>) -> InUse {
    match node {
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
    }
}

/// containerd: the daemon's own connection when it runs, else a local one.
pub(super) async fn containerd(node: &Node, used: &InUse) -> Check {
    match node {
        Ok(n) if !n.containerd_version.is_empty() => check(
            "containerd",
            Level::Ok,
            format!(
                "{} at {} (namespace {})",
                n.containerd_version, n.containerd_address, n.namespace
            ),
            "",
        ),
        Ok(n) => check(
            "containerd",
            Level::Fail,
            format!("the daemon gets no answer from {}", n.containerd_address),
            "start containerd (scripts/containerd-up) at the daemon's containerd_socket",
        ),
        Err(_) => match crate::runtime::Containerd::connect(&used.containerd, &used.namespace)
            .await
        {
            Ok(c) => match c.version().await {
                Ok(v) => check(
                    "containerd",
                    Level::Ok,
                    format!("{v} at {}", used.containerd.display()),
                    "",
                ),
                Err(e) => check(
                    "containerd",
                    Level::Fail,
                    format!("{}: {e}", used.containerd.display()),
                    "start containerd (scripts/containerd-up) or pass --containerd / CONTAINERD_ADDRESS",
                ),
            },
            Err(e) => check(
                "containerd",
                Level::Fail,
                format!("{}: {e}", used.containerd.display()),
                "start containerd",
            ),
        },
    }
}

/// The default image: CreateSandbox without an image needs it.
pub(super) fn image(n: &pb::GetNodeResponse) -> Check {
    match (n.sandbox_image_present, n.pull_missing) {
        (true, _) => check(
            "image",
            Level::Ok,
            format!("{} present", n.sandbox_image),
            "",
        ),
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
    }
}

/// Suspend with memory (issue 19): what this node's runtime and runsc can do.
pub(super) fn suspend(n: &pb::GetNodeResponse) -> Check {
    let idle = if n.idle_suspend_secs > 0 {
        format!(
            "compute.v1 sandboxes idle {} s are suspended",
            n.idle_suspend_secs
        )
    } else {
        "compute.v1 idle suspend off (idle_suspend_secs = 0)".to_string()
    };
    if n.suspend_unsupported.is_empty() {
        check(
            "suspend",
            Level::Ok,
            format!(
                "memory kept: runsc checkpoint/restore through {} ({}); {idle}",
                n.runtime_name, n.runsc_version
            ),
            "",
        )
    } else {
        check(
            "suspend",
            Level::Warn,
            format!("unavailable: {}", n.suspend_unsupported),
            "runtime = \"runc-wrapper\" and runsc 20240729 or later (bookworm-backports); \
             until then SuspendSandbox answers FAILED_PRECONDITION and idle sandboxes stay up",
        )
    }
}

/// Sandbox networks: whether the node gives them, and whether those sandboxes can be
/// suspended.
pub(super) fn egress(n: &pb::GetNodeResponse) -> Check {
    if n.egress.is_empty() {
        return check(
            "egress",
            Level::Ok,
            "off: platform sandboxes have no network (GrantEgress is UNIMPLEMENTED)",
            "",
        );
    }
    if n.suspend_networked_unsupported.is_empty() {
        check("egress", Level::Ok, format!("on: {}", n.egress), "")
    } else {
        check(
            "egress",
            Level::Warn,
            format!(
                "on: {}; sandboxes with a network are not suspended: {}",
                n.egress, n.suspend_networked_unsupported
            ),
            "idle sandboxes with a network stay up; SuspendSandbox of one is FAILED_PRECONDITION",
        )
    }
}

/// The in-sandbox agent.
pub(super) fn agent(n: &pb::GetNodeResponse) -> Check {
    if !n.agent {
        check(
            "agent",
            Level::Ok,
            "off (agent = false): execs use containerd exec",
            "",
        )
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
                format!(
                    "{} is dynamically linked: it runs only in images with a compatible libc",
                    n.agent_binary
                ),
                "build it with scripts/build-agent",
            ),
            Err(e) => check(
                "agent",
                Level::Fail,
                format!("{}: {e}", n.agent_binary),
                "restart the daemon: it installs the agent at start",
            ),
        }
    }
}
