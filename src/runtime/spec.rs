//! OCI runtime spec documents for sandboxes and exec processes, and the runsc wrapper script.

use std::path::Path;

use serde_json::{json, Value};

use super::ConsoleSize;

/// Default PATH inside sandboxes when the image sets none.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The capabilities a sandbox's processes get (Docker's default set; gVisor implements them
/// inside its own kernel, none reaches the host).
const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The resources and mounts of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec<'a> {
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// The init process's argv.
    pub init_args: Vec<String>,
    /// The image's environment.
    pub env: Vec<String>,
    /// Host directory of the workspace.
    pub workspace_dir: &'a Path,
    /// Where the workspace is mounted inside.
    pub mount_path: &'a str,
    /// The workspace is read-only inside.
    pub read_only: bool,
    /// More workspace mounts (a platform sandbox's second and later ones).
    pub extra_mounts: Vec<BindMount>,
    /// Read-only host directory mounted at `/.compute` (helpers such as a static init).
    pub helpers_dir: Option<&'a Path>,
    /// The OCI cgroupsPath.
    pub cgroups_path: String,
    /// CFS quota in microseconds per 100 ms period.
    pub cpu_quota: i64,
    /// Host memory limit (memory_bytes plus headroom for the sentry).
    pub memory_limit: i64,
    /// pids limit.
    pub pids_limit: i64,
    /// The network namespace it joins (runsc `--network=sandbox` then takes its interface);
    /// None: a namespace of its own with nothing in it.
    pub netns: Option<std::path::PathBuf>,
    /// Files bind-mounted read-only at `/etc/hosts` (its own name and address) and
    /// `/etc/resolv.conf` (the node's DNS answering), for a sandbox with a network.
    pub net_files: Option<[std::path::PathBuf; 2]>,
}

/// A host directory bind-mounted into a sandbox.
#[derive(Debug, Clone)]
pub struct BindMount {
    /// The host directory.
    pub source: std::path::PathBuf,
    /// Where the sandbox sees it.
    pub destination: String,
    /// Read-only inside.
    pub read_only: bool,
}

fn bind(source: &Path, destination: &str, read_only: bool) -> Value {
    let mode = if read_only { "ro" } else { "rw" };
    json!({"destination": destination, "type": "bind",
           "source": source.display().to_string(), "options": ["rbind", mode]})
}

fn caps() -> Value {
    json!({
        "bounding": CAPS, "effective": CAPS, "permitted": CAPS,
    })
}

/// The OCI spec JSON of a sandbox container.
pub fn sandbox_spec(s: &SandboxSpec<'_>) -> Vec<u8> {
    let mut env = s.env.clone();
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push(DEFAULT_PATH.into());
    }
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777"]}),
        bind(s.workspace_dir, s.mount_path, s.read_only),
    ];
    for m in &s.extra_mounts {
        mounts.push(bind(&m.source, &m.destination, m.read_only));
    }
    if let Some([hosts, resolv]) = &s.net_files {
        for (dest, f) in [("/etc/hosts", hosts), ("/etc/resolv.conf", resolv)] {
            mounts.push(json!({"destination": dest, "type": "bind",
                "source": f.display().to_string(), "options": ["rbind", "ro"]}));
        }
    }
    if let Some(h) = s.helpers_dir {
        mounts.push(json!({"destination": "/.compute", "type": "bind",
            "source": h.display().to_string(), "options": ["rbind", "ro"]}));
    }
    let spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": s.init_args,
            "env": env,
            "cwd": "/",
            "capabilities": caps(),
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1048576u64, "soft": 1048576u64}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": s.hostname,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": s.cgroups_path,
            "resources": {
                "memory": {"limit": s.memory_limit},
                "cpu": {"quota": s.cpu_quota, "period": 100000u64},
                "pids": {"limit": s.pids_limit}
            },
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                match &s.netns {
                    Some(p) => json!({"type": "network", "path": p.display().to_string()}),
                    None => json!({"type": "network"}),
                }
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
        }
    });
    serde_json::to_vec(&spec).unwrap_or_default()
}

/// The OCI Process JSON of one exec; with `terminal`, on a pseudo-terminal of that size.
pub fn exec_process(
    args: &[String],
    env: &[String],
    cwd: &str,
    terminal: Option<ConsoleSize>,
) -> Vec<u8> {
    let mut p = json!({
        "terminal": terminal.is_some(),
        "user": {"uid": 0, "gid": 0},
        "args": args,
        "env": env,
        "cwd": cwd,
        "capabilities": caps(),
        "noNewPrivileges": true
    });
    if let Some(size) = terminal {
        p["consoleSize"] = json!({"height": size.height, "width": size.width});
    }
    serde_json::to_vec(&p).unwrap_or_default()
}

/// The runsc wrapper containerd's runc v2 shim runs as its runc: runsc with `flags`, and
/// `--network=none` unless one of its arguments names a file in `net_dir` (a container with a
/// network: the node's sandbox networks, [`crate::egress`]), which gets `--network={stack}`
/// (`sandbox`: gVisor's netstack; `host`: the host kernel's, inside the container's own
/// namespace) and `net_flags`.
/// With netstack, such a container's `start` and `restore` run in a mount namespace of their
/// own with a tmpfs over `/proc/sys` holding only `vm/mmap_min_addr`: this runsc takes a
/// namespace where `/proc/sys/net/core/rmem_default` exists for the host's own and refuses it
/// (DESIGN.md). The host stack reads the kernel's settings there and gets the real one.
pub fn wrapper_script(
    runsc: &Path,
    flags: &[String],
    net_flags: &[String],
    checkpoint_flags: &[String],
    net_dir: &Path,
    stack: &str,
) -> String {
    let q = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let quoted = |v: &[String]| v.iter().map(|f| q(f)).collect::<Vec<_>>().join(" ");
    let flags = quoted(flags);
    let net_flags = quoted(net_flags);
    let checkpoint_flags = quoted(checkpoint_flags);
    let runsc = q(&runsc.display().to_string());
    let dir = q(&net_dir.display().to_string());
    let stack = if stack == "host" { "host" } else { "sandbox" };
    // runc's shim passes runc's own checkpoint and restore flags, which runsc does not know:
    // `--work-path DIR` (CRIU's work directory) and `-no-subreaper`. They are dropped. Our own
    // checkpoint flags (`checkpoint_compression`) go right after the `checkpoint` subcommand.
    format!(
        r#"#!/bin/sh
# Written by computed: runsc for containerd's runc v2 shim.
net=--network=none
sub=
ckpt=
skip=
for a do
  shift
  if [ -n "$skip" ]; then skip=; continue; fi
  case $a in
    --work-path|-work-path) skip=1; continue ;;
    --work-path=*|-work-path=*|-no-subreaper|--no-subreaper) continue ;;
    start|restore) [ -z "$sub" ] && sub=$a ;;
    checkpoint) if [ -z "$sub" ] && [ -z "$ckpt" ]; then ckpt=1; set -- "$@" "$a" {checkpoint_flags}; continue; fi ;;
    */*|-*) ;;
    *) [ -e {dir}/"$a" ] && net=--network={stack} ;;
  esac
  set -- "$@" "$a"
done
if [ "$net" != --network=none ]; then
  if [ "$net" = --network=sandbox ] && [ -n "$sub" ]; then
    exec unshare -m --propagation private /bin/sh -c 'm=$(cat /proc/sys/vm/mmap_min_addr) && mount -t tmpfs -o size=64k tmpfs /proc/sys && mkdir /proc/sys/vm && echo "$m" > /proc/sys/vm/mmap_min_addr && exec "$@"' runsc {runsc} "$net" {flags} {net_flags} "$@"
  fi
  exec {runsc} "$net" {flags} {net_flags} "$@"
fi
exec {runsc} "$net" {flags} "$@"
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_carries_limits_and_mounts() {
        let ws = Path::new("/var/lib/compute/workspaces/x/data");
        let s = SandboxSpec {
            hostname: "sandbox-1234".into(),
            init_args: vec!["/bin/sh".into()],
            env: vec![],
            workspace_dir: ws,
            mount_path: "/workspace",
            read_only: false,
            extra_mounts: vec![BindMount {
                source: "/var/lib/compute/workspaces/x/mounts/1/data".into(),
                destination: "/data".into(),
                read_only: true,
            }],
            helpers_dir: None,
            cgroups_path: "/compute/x".into(),
            cpu_quota: 25000,
            memory_limit: 1 << 30,
            pids_limit: 100,
            netns: Some("/run/netns/cs-7".into()),
            net_files: Some([
                "/run/compute/net/x.hosts".into(),
                "/run/compute/net/x.resolv".into(),
            ]),
        };
        let v: Value = serde_json::from_slice(&sandbox_spec(&s)).unwrap();
        assert_eq!(v["linux"]["resources"]["cpu"]["quota"], 25000);
        assert_eq!(v["linux"]["resources"]["pids"]["limit"], 100);
        assert_eq!(v["hostname"], "sandbox-1234");
        assert!(v["process"]["env"][0]
            .as_str()
            .unwrap()
            .starts_with("PATH="));
        let mounts = v["mounts"].as_array().unwrap();
        let at = |dest: &str| mounts.iter().find(|m| m["destination"] == dest).unwrap();
        assert_eq!(at("/workspace")["source"], ws.display().to_string());
        assert_eq!(at("/workspace")["options"][1], "rw");
        assert_eq!(
            at("/data")["source"],
            "/var/lib/compute/workspaces/x/mounts/1/data"
        );
        assert_eq!(at("/data")["options"][1], "ro");
        assert_eq!(at("/etc/hosts")["options"][1], "ro");
        assert_eq!(
            at("/etc/resolv.conf")["source"],
            "/run/compute/net/x.resolv"
        );
        let ns = v["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.contains(&json!({"type": "network", "path": "/run/netns/cs-7"})));
    }

    #[test]
    fn an_exec_on_a_terminal_carries_its_size() {
        let args = ["sh".to_string()];
        let plain: Value = serde_json::from_slice(&exec_process(&args, &[], "/", None)).unwrap();
        assert_eq!(plain["terminal"], false);
        assert!(plain.get("consoleSize").is_none());
        let size = ConsoleSize {
            height: 40,
            width: 132,
        };
        let tty: Value =
            serde_json::from_slice(&exec_process(&args, &[], "/", Some(size))).unwrap();
        assert_eq!(tty["terminal"], true);
        assert_eq!(tty["consoleSize"], json!({"height": 40, "width": 132}));
    }

    #[test]
    fn wrapper_quotes_flags() {
        let w = wrapper_script(
            Path::new("/usr/bin/runsc"),
            &["--overlay2=root:memory".into(), "--x='y'".into()],
            &["--net-disconnect-ok".into()],
            &[],
            Path::new("/run/compute/net"),
            "sandbox",
        );
        assert!(
            w.contains(r#"'--x='\''y'\''' '--net-disconnect-ok' "$@""#),
            "{w}"
        );
        assert!(
            w.contains(
                r#"exec '/usr/bin/runsc' "$net" '--overlay2=root:memory' '--x='\''y'\''' "$@""#
            ),
            "{w}"
        );
        assert!(
            w.contains(r#"[ -e '/run/compute/net'/"$a" ] && net=--network=sandbox"#),
            "{w}"
        );
        let h = wrapper_script(
            Path::new("/usr/bin/runsc"),
            &[],
            &[],
            &[],
            Path::new("/n"),
            "host",
        );
        assert!(
            h.contains(r#"[ -e '/n'/"$a" ] && net=--network=host"#),
            "{h}"
        );
    }

    /// The wrapper run for real with a runsc that prints its arguments: runc's own checkpoint
    /// flags go, ours come right after `checkpoint`, and other subcommands get none.
    #[test]
    fn wrapper_rewrites_checkpoint_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("runsc");
        std::fs::write(&fake, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let wrapper = dir.path().join("wrapper");
        std::fs::write(
            &wrapper,
            wrapper_script(
                &fake,
                &["--overlay2=root:memory".into()],
                &[],
                &["--compression=none".into()],
                &dir.path().join("net"),
                "sandbox",
            ),
        )
        .unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("sh")
                .arg(&wrapper)
                .args(args)
                .env("PATH", "/usr/bin:/bin")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let ckpt = run(&[
            "--root",
            "/r",
            "checkpoint",
            "--image-path",
            "/img",
            "--work-path",
            "/w",
            "--leave-running",
            "sb1",
        ]);
        assert_eq!(
            ckpt.lines().collect::<Vec<_>>(),
            [
                "--network=none",
                "--overlay2=root:memory",
                "--root",
                "/r",
                "checkpoint",
                "--compression=none",
                "--image-path",
                "/img",
                "--leave-running",
                "sb1",
            ]
        );
        let start = run(&["--root", "/r", "start", "sb1"]);
        assert!(!start.contains("compression"), "{start}");
    }
}
