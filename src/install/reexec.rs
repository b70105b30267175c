//! `--restart-mode reexec`: restarts the containerd that serves `--containerd-config` in place,
//! for nodes where no service manager runs containerd (a script started it, as on the one-node
//! cluster `tests/k1/run.sh` deploys to): `systemctl restart` cannot work there, and stopping it
//! alone would leave the node without containerd.
//!
//! 1. Find the one process whose `argv[0]` is `containerd` and whose `--config` (`-c`; default
//!    `/etc/containerd/config.toml`) is that file. None, or more than one: refused.
//! 2. Refuse one that systemd runs (a cgroup named `*containerd*.service`: systemd would see its
//!    unit fail and restart it as well; `--restart-mode command` is for it), one in another PID
//!    or user namespace, and one whose root directory is not `--host-root` (its paths would not
//!    be the host's).
//! 3. Record its command line, environment, working directory, cgroups (every hierarchy) and
//!    stdout/stderr when they are files. Nothing has been changed if any of this fails.
//! 4. `computed install-exec` ([`exec_in_host`], this binary again, with containerd's
//!    environment) opens the old containerd's namespaces (cgroup, IPC, UTS, network, mount),
//!    stops it (SIGTERM; SIGKILL after 30 s), joins those namespaces, its cgroups and a session
//!    of its own, reopens its output files for appending and execs the same command line. It
//!    joins the cgroups before it execs, so containerd never belongs to the installer's pod
//!    (whose processes are killed when the init container ends).
//! 5. `--containerd-pid-file` is rewritten when it held the old pid, and the installer waits,
//!    within `--restart-timeout-secs`, until the config's gRPC socket accepts a connection.
//!
//! Running containers are unaffected, as with any containerd restart: their shims keep them,
//! and the new containerd reconnects to the shims.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::containerd;
use super::host::{self, HostRoot};
use super::{Error, InstallOpts, Report};

/// How long containerd may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// containerd's config file when its command line names none.
const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";

/// The namespaces the new containerd joins (the old one's), in the order it joins them (mount
/// last: the others are opened before, and it changes the root and working directory).
const NAMESPACES: [(&str, CloneFlags); 5] = [
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

/// Restarts the containerd serving `opts.containerd_config` in place (see the module docs).
/// `config_text` is the config it will read, for its gRPC address.
pub(super) fn restart(
    opts: &InstallOpts,
    host: &HostRoot,
    config_text: &str,
    report: &mut Report,
) -> Result<(), Error> {
    // On a thread of its own: reading another cgroup namespace's paths means joining it,
    // which changes only the calling thread.
    std::thread::scope(|s| {
        s.spawn(|| restart_here(opts, host, config_text, report))
            .join()
            .unwrap_or_else(|_| {
                Err(Error::ReexecFailed {
                    reason: "the restart thread panicked".into(),
                })
            })
    })
}

fn restart_here(
    opts: &InstallOpts,
    host: &HostRoot,
    config_text: &str,
    report: &mut Report,
) -> Result<(), Error> {
    let pid = find(&opts.containerd_config)?;
    let target = Target::record(pid, host)?;
    report.line(format!(
        "containerd: pid {pid} serves {}: {}",
        opts.containerd_config.display(),
        target.summary()
    ));
    let address = flag(&target.argv, &["--address", "-a"])
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_else(|| containerd::grpc_address(config_text));
    let socket = host.resolve(Path::new(&address))?;

    let mut child = target.spawn(pid)?;
    let new = child.id();
    let deadline = Instant::now() + Duration::from_secs(opts.restart_timeout_secs);
    let mut stopped = false;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(Error::ReexecFailed {
                reason: format!(
                    "the new containerd (pid {new}) exited ({st}); {}",
                    if gone(pid) {
                        format!(
                            "containerd is stopped; its output went to {}",
                            target.stderr
                        )
                    } else {
                        "the old one still runs".into()
                    }
                ),
            });
        }
        if !stopped && gone(pid) {
            stopped = true;
            report.line(format!("containerd: pid {pid} stopped"));
        }
        // The old socket stays until the new containerd replaces it: it must be gone first.
        if stopped && UnixStream::connect(&socket).is_ok() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Error::ReexecFailed {
                reason: format!(
                    "the new containerd (pid {new}) did not answer on {address} within {} s",
                    opts.restart_timeout_secs
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    report.line(format!(
        "containerd: started again as pid {new} (same command line, namespaces and cgroups), \
         answers on {address}"
    ));
    if let Some(pf) = &opts.containerd_pid_file {
        let real = host.resolve(pf)?;
        let held = host::read_if_exists(&real)?
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        if held == pid.to_string() {
            host::write_bytes(
                &real,
                format!("{new}\n").as_bytes(),
                host::Attrs::of_existing(&real, 0o644),
            )?;
            report.line(format!(
                "containerd: pid file {} now holds {new}",
                pf.display()
            ));
        } else {
            report.line(format!(
                "containerd: pid file {} left alone (it held {held:?}, not {pid})",
                pf.display()
            ));
        }
    }
    // Not waited for: it outlives the installer (and is reparented when the installer ends).
    drop(child);
    Ok(())
}

fn refused(reason: impl Into<String>) -> Error {
    Error::ReexecRefused {
        reason: reason.into(),
    }
}

/// The pid of the one containerd whose config file is `config`.
fn find(config: &Path) -> Result<i32, Error> {
    let me = std::process::id() as i32;
    let want = normalize(config);
    let mut found = Vec::new();
    let dir = std::fs::read_dir("/proc").map_err(host::io("read", Path::new("/proc")))?;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv = split_nul(&raw);
        if argv.first().and_then(|a| Path::new(a).file_name()) != Some(OsStr::new("containerd")) {
            continue;
        }
        let cfg = PathBuf::from(flag(&argv, &["--config", "-c"]).unwrap_or(DEFAULT_CONFIG.into()));
        let cfg = if cfg.is_relative() {
            match std::fs::read_link(format!("/proc/{pid}/cwd")) {
                Ok(cwd) => cwd.join(cfg),
                Err(_) => continue,
            }
        } else {
            cfg
        };
        if normalize(&cfg) == want {
            found.push(pid);
        }
    }
    match found.as_slice() {
        [pid] => Ok(*pid),
        [] => Err(refused(format!(
            "no containerd process runs with --config {}",
            config.display()
        ))),
        many => Err(refused(format!(
            "{} containerd processes run with --config {} (pids {many:?}); which one to restart \
             is not clear",
            many.len(),
            config.display()
        ))),
    }
}

/// A containerd process as it runs, recorded so that it can be started again the same way.
struct Target {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    exe: PathBuf,
    cwd: PathBuf,
    /// Its cgroup directories (host paths), one per hierarchy.
    cgroups: Vec<PathBuf>,
    /// Where its stdout and stderr went: a file (host path) or `/dev/null`.
    stdout: String,
    stderr: String,
}

impl Target {
    fn record(pid: i32, host: &HostRoot) -> Result<Self, Error> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let gone = |what: &str, e: std::io::Error| refused(format!("pid {pid}: {what}: {e}"));
        for ns in ["pid", "user"] {
            let theirs = std::fs::read_link(proc.join("ns").join(ns)).map_err(|e| gone(ns, e))?;
            if Some(theirs) != std::fs::read_link(format!("/proc/self/ns/{ns}")).ok() {
                return Err(refused(format!(
                    "containerd (pid {pid}) runs in another {ns} namespace than the installer"
                )));
            }
        }
        let root = std::fs::metadata(proc.join("root")).map_err(|e| gone("root", e))?;
        let host_root = std::fs::metadata(host.path()).map_err(|e| gone("host root", e))?;
        if (root.dev(), root.ino()) != (host_root.dev(), host_root.ino()) {
            return Err(refused(format!(
                "containerd (pid {pid}) does not run in the host's root filesystem ({}), so its \
                 paths are not the host's",
                host.path().display()
            )));
        }
        let argv = split_nul(&std::fs::read(proc.join("cmdline")).map_err(|e| gone("cmdline", e))?);
        let env = split_nul(&std::fs::read(proc.join("environ")).map_err(|e| gone("environ", e))?)
            .into_iter()
            .filter_map(|kv| {
                let b = kv.into_vec();
                let eq = b.iter().position(|&c| c == b'=')?;
                Some((
                    OsString::from_vec(b[..eq].to_vec()),
                    OsString::from_vec(b[eq + 1..].to_vec()),
                ))
            })
            .collect();
        let exe = std::fs::read_link(proc.join("exe")).map_err(|e| gone("exe", e))?;
        // An upgraded binary shows as "… (deleted)": start the file now at that path.
        let exe = match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
            Some(s) => PathBuf::from(s),
            None => exe,
        };
        let cwd = std::fs::read_link(proc.join("cwd")).map_err(|e| gone("cwd", e))?;

        // Its cgroups as it sees them: read from inside its cgroup namespace (this thread
        // joins it), so that /proc/PID/cgroup and the cgroup mounts' roots agree.
        let ns = proc.join("ns/cgroup");
        if std::fs::read_link(&ns).ok() != std::fs::read_link("/proc/thread-self/ns/cgroup").ok() {
            let f = File::open(&ns).map_err(|e| gone("ns/cgroup", e))?;
            setns(&f, CloneFlags::CLONE_NEWCGROUP)
                .map_err(|e| gone("joining its cgroup namespace", e.into()))?;
        }
        let cgroup_lines =
            std::fs::read_to_string(proc.join("cgroup")).map_err(|e| gone("cgroup", e))?;
        let mountinfo =
            std::fs::read_to_string(proc.join("mountinfo")).map_err(|e| gone("mountinfo", e))?;
        let mounts = cgroup_mounts(&mountinfo);
        let mut cgroups = Vec::new();
        for line in cgroup_lines.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if let Some(unit) = path
                .rsplit('/')
                .next()
                .filter(|u| u.ends_with(".service") && u.contains("containerd"))
            {
                return Err(refused(format!(
                    "containerd (pid {pid}) is systemd's unit {unit}: restart it with \
                     `--restart-mode command` (systemctl)"
                )));
            }
            let Some(dir) = cgroup_dir(&mounts, controllers, path) else {
                continue; // a hierarchy not mounted where containerd runs
            };
            // Checked here, joined by the new process (which must be able to write it).
            let procs = host.resolve(&dir.join("cgroup.procs"))?;
            OpenOptions::new()
                .write(true)
                .open(&procs)
                .map_err(|e| gone(&format!("cgroup {}", dir.display()), e))?;
            cgroups.push(dir);
        }
        Ok(Self {
            argv,
            env,
            exe,
            cwd,
            cgroups,
            stdout: output(pid, 1),
            stderr: output(pid, 2),
        })
    }

    fn summary(&self) -> String {
        let argv: Vec<_> = self.argv.iter().map(|a| a.to_string_lossy()).collect();
        format!(
            "`{}`, {} cgroups, output to {}",
            argv.join(" "),
            self.cgroups.len(),
            self.stderr
        )
    }

    /// Starts `computed install-exec` to replace process `pid` by a new containerd (see the
    /// module docs, step 4), with containerd's environment.
    fn spawn(&self, pid: i32) -> Result<std::process::Child, Error> {
        let failed = |e: std::io::Error| Error::ReexecFailed {
            reason: format!("starting `computed install-exec`: {e} (containerd still runs)"),
        };
        let me = std::env::current_exe().map_err(failed)?;
        let mut cmd = Command::new(me);
        cmd.arg("install-exec")
            .arg("--replace")
            .arg(pid.to_string())
            .arg("--cwd")
            .arg(&self.cwd)
            .arg("--exe")
            .arg(&self.exe)
            .arg("--stdout")
            .arg(&self.stdout)
            .arg("--stderr")
            .arg(&self.stderr);
        for dir in &self.cgroups {
            cmd.arg("--cgroup").arg(dir);
        }
        cmd.arg("--")
            .args(&self.argv)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd.spawn().map_err(failed)
    }
}

/// The arguments of `computed install-exec` (internal: the second half of a restart in place).
#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    /// The process to stop first and take the namespaces of (its command line must be
    /// `argv`).
    #[arg(long)]
    pub replace: i32,
    /// The working directory (a path in its mount namespace).
    #[arg(long)]
    pub cwd: PathBuf,
    /// The binary to exec.
    #[arg(long)]
    pub exe: PathBuf,
    /// A file that stdout is appended to (`/dev/null`: none).
    #[arg(long)]
    pub stdout: PathBuf,
    /// A file that stderr is appended to (`/dev/null`: none).
    #[arg(long)]
    pub stderr: PathBuf,
    /// A cgroup directory to join; repeated for each hierarchy.
    #[arg(long = "cgroup")]
    pub cgroups: Vec<PathBuf>,
    /// The command line, `argv[0]` first.
    #[arg(last = true, required = true)]
    pub argv: Vec<OsString>,
}

/// `computed install-exec`: opens the namespaces of process `--replace` (cgroup, IPC, UTS,
/// network, mount), stops it, joins those namespaces, the cgroups given and a new session,
/// points stdout and stderr at the files given and execs the command in the working directory.
/// Must run before any thread starts (joining a mount namespace needs a single-threaded
/// process). Returns only on failure.
pub fn exec_in_host(args: &ExecArgs) -> std::io::Error {
    let run = || -> std::io::Result<std::convert::Infallible> {
        let pid = args.replace;
        let err =
            |what: String| move |e: std::io::Error| std::io::Error::other(format!("{what}: {e}"));
        // The pid is still the containerd the installer recorded.
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).map_err(err(format!("pid {pid}")))?;
        if split_nul(&cmdline) != args.argv {
            return Err(std::io::Error::other(format!(
                "pid {pid} is no longer the containerd to restart"
            )));
        }
        let mut namespaces = Vec::new();
        for (ns, flags) in NAMESPACES {
            let theirs = format!("/proc/{pid}/ns/{ns}");
            if std::fs::read_link(&theirs).ok()
                != std::fs::read_link(format!("/proc/self/ns/{ns}")).ok()
            {
                namespaces.push((File::open(&theirs).map_err(err(theirs))?, flags));
            }
        }
        stop(pid)?;
        for (f, flags) in &namespaces {
            setns(f, *flags).map_err(|e| std::io::Error::other(format!("setns: {e}")))?;
        }
        let me = std::process::id().to_string();
        for dir in &args.cgroups {
            let procs = dir.join("cgroup.procs");
            std::fs::write(&procs, &me).map_err(err(procs.display().to_string()))?;
        }
        nix::unistd::setsid().map_err(std::io::Error::from)?;
        std::env::set_current_dir(&args.cwd).map_err(err(args.cwd.display().to_string()))?;
        for (path, fd) in [(&args.stdout, 1), (&args.stderr, 2)] {
            let f = OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(err(path.display().to_string()))?;
            nix::unistd::dup2(f.as_raw_fd(), fd).map_err(std::io::Error::from)?;
        }
        Err(Command::new(&args.exe)
            .arg0(&args.argv[0])
            .args(&args.argv[1..])
            .exec())
    };
    match run() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// SIGTERM to `pid`, then SIGKILL after [`STOP_GRACE`]; returns once it is gone (or a zombie).
fn stop(pid: i32) -> std::io::Result<()> {
    let p = Pid::from_raw(pid);
    let _ = kill(p, Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while !gone(pid) {
        if Instant::now() >= deadline {
            let _ = kill(p, Signal::SIGKILL);
            let hard = Instant::now() + Duration::from_secs(10);
            while !gone(pid) {
                if Instant::now() >= hard {
                    return Err(std::io::Error::other(format!(
                        "containerd (pid {pid}) outlived SIGKILL"
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `pid` has exited (its /proc entry is gone, or it is a zombie).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The file fd `fd` of `pid` writes to (a path in its mount namespace), or `/dev/null` when it
/// is not a regular file (a pipe, a socket, a deleted file).
fn output(pid: i32, fd: u8) -> String {
    let link = format!("/proc/{pid}/fd/{fd}");
    match (std::fs::read_link(&link), std::fs::metadata(&link)) {
        (Ok(p), Ok(m)) if m.is_file() && !p.to_string_lossy().ends_with(" (deleted)") => {
            p.display().to_string()
        }
        _ => "/dev/null".into(),
    }
}

/// The value of the first of `names` (`--name value`, `--name=value`) in `argv`.
fn flag(argv: &[OsString], names: &[&str]) -> Option<OsString> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.as_bytes();
        for n in names {
            let n = n.as_bytes();
            if a == n {
                return it.next().cloned();
            }
            if a.len() > n.len() && a.starts_with(n) && a[n.len()] == b'=' {
                return Some(OsStr::from_bytes(&a[n.len() + 1..]).to_os_string());
            }
        }
    }
    None
}

fn split_nul(raw: &[u8]) -> Vec<OsString> {
    raw.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect()
}

/// `p` with `.` and `..` worked out (no symlinks followed).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// A cgroup filesystem mount: v2 (`controllers` empty) or v1 with its controllers (and
/// `name=…`).
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    root: String,
    mount_point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

/// The cgroup mounts of a mountinfo table.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        let v2 = match r[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        let controllers = if v2 {
            Vec::new()
        } else {
            r[2].split(',')
                .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains("xattr"))
                .map(str::to_string)
                .collect()
        };
        out.push(CgroupMount {
            root: unescape(l[3]),
            mount_point: PathBuf::from(unescape(l[4])),
            v2,
            controllers,
        });
    }
    out
}

/// The directory of the cgroup `path` of the hierarchy with `controllers` (a line of
/// /proc/PID/cgroup: empty for v2), under a mount of it that shows it.
fn cgroup_dir(mounts: &[CgroupMount], controllers: &str, path: &str) -> Option<PathBuf> {
    let want: Vec<&str> = controllers.split(',').filter(|c| !c.is_empty()).collect();
    let m = mounts.iter().find(|m| {
        if want.is_empty() {
            m.v2
        } else {
            !m.v2 && want.iter().all(|c| m.controllers.iter().any(|h| h == c))
        }
    })?;
    let rel = if m.root == "/" {
        path
    } else {
        path.strip_prefix(m.root.as_str())
            .filter(|r| r.is_empty() || r.starts_with('/'))?
    };
    Some(m.mount_point.join(rel.trim_start_matches('/')))
}

/// mountinfo's octal escapes (`\040` for a space) decoded.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
36 30 0:32 /kubepods /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
37 30 0:33 / /mnt/with\\040space rw - cgroup cgroup rw,pids
";

    #[test]
    fn cgroup_lines_map_to_the_mounts_that_show_them() {
        let m = cgroup_mounts(MOUNTINFO);
        assert_eq!(m.len(), 5, "{m:?}");
        let dir = |c: &str, p: &str| cgroup_dir(&m, c, p).map(|d| d.display().to_string());
        assert_eq!(dir("", "/x").as_deref(), Some("/sys/fs/cgroup/unified/x"));
        assert_eq!(
            dir("name=systemd", "/").as_deref(),
            Some("/sys/fs/cgroup/systemd/")
        );
        assert_eq!(
            dir("cpu,cpuacct", "/a/b").as_deref(),
            Some("/sys/fs/cgroup/cpu,cpuacct/a/b")
        );
        // A mount of a sub-tree shows only what is under it.
        assert_eq!(
            dir("memory", "/kubepods/pod1").as_deref(),
            Some("/sys/fs/cgroup/memory/pod1")
        );
        assert_eq!(dir("memory", "/system.slice"), None);
        assert_eq!(dir("memory", "/kubepodsX"), None);
        assert_eq!(dir("pids", "/p").as_deref(), Some("/mnt/with space/p"));
        // A hierarchy that is not mounted.
        assert_eq!(dir("blkio", "/"), None);
    }

    #[test]
    fn flags_in_both_spellings() {
        let argv: Vec<OsString> = ["containerd", "-l", "debug", "--config=/a.toml", "-c", "/b"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(flag(&argv, &["--config", "-c"]), Some("/a.toml".into()));
        assert_eq!(flag(&argv, &["-c"]), Some("/b".into()));
        assert_eq!(flag(&argv, &["--address", "-a"]), None);
        assert_eq!(
            normalize(Path::new("/etc/./x/../containerd//c.toml")),
            PathBuf::from("/etc/containerd/c.toml")
        );
    }

    #[test]
    fn no_containerd_for_the_config_is_refused() {
        let e = find(Path::new("/nonexistent/computed-reexec-test/config.toml")).unwrap_err();
        assert!(matches!(e, Error::ReexecRefused { .. }), "{e}");
        assert!(e.to_string().contains("no containerd process"), "{e}");
    }
}
