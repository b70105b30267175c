//! `computed install` end to end, through the real binary:
//!
//! * against scratch host roots (version-2 and version-3 containerd configs, a fake runsc, a
//!   restart command that counts): the first run copies, edits and restarts once; a second run
//!   changes nothing and restarts nothing; new runsc bytes are copied again without a restart;
//!   `--dry-run` changes nothing; a version-1 config is refused;
//! * `--runtime auto`: gVisor's shim when the image ships it, else containerd's runc shim with
//!   runsc (or `--runc-binary`) as its binary, and switching leaves no stale key;
//! * against a real containerd (root + `containerd` + `ctr`): a private containerd reads its
//!   config from a scratch host root, the installer edits it and restarts that containerd
//!   through `--restart-cmd`, and containerd proves it took the edit: it answers, its CRI
//!   plugin loaded, and `containerd config dump` shows the runsc handler;
//! * `--restart-mode reexec` against a real containerd started by a script, in a cgroup of its
//!   own: the installer finds it by its config, stops it and starts the same command line in the
//!   same cgroups with its output appended to the same log, rewrites its pid file, and the new
//!   containerd serves the edited config; a second run restarts nothing; one in a
//!   `*containerd*.service` cgroup (systemd's) is refused and left running.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{nothing_missing, which};

const FAKE_RUNSC: &[u8] = b"#!/bin/sh\necho 'runsc version fake-1'\n";

const V2: &str = r#"# containerd config of a test node
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"   # keep this comment
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"#;

const V3: &str = r#"version = 3
root = '/var/lib/containerd'

[plugins]
  # the CRI runtime plugin of containerd 2.x
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
"#;

/// Runs `computed install ARGS`, with the node config at its defaults.
fn install(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_computed"))
        .env_remove("COMPUTE_CONFIG")
        .arg("install")
        .args(args)
        .output()
        .expect("run computed install")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "computed install failed ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(&o)
}

fn has_line(out: &str, prefix: &str) -> bool {
    out.lines().any(|l| l.starts_with(prefix))
}

/// A scratch node: a host root, an "image" with a fake runsc, and a restart command that
/// appends a line to a marker file.
struct Scratch {
    dir: tempfile::TempDir,
    root: PathBuf,
    runsc_src: PathBuf,
    marker: PathBuf,
}

impl Scratch {
    fn new(config: Option<&str>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("computed-install-")
            .tempdir()
            .unwrap();
        let root = dir.path().join("host");
        std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
        std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        if let Some(c) = config {
            std::fs::write(root.join("etc/containerd/config.toml"), c).unwrap();
        }
        let image = dir.path().join("image");
        std::fs::create_dir_all(&image).unwrap();
        let runsc_src = image.join("runsc");
        std::fs::write(&runsc_src, FAKE_RUNSC).unwrap();
        let marker = dir.path().join("restarts");
        Self {
            dir,
            root,
            runsc_src,
            marker,
        }
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--host-root".into(),
            self.root.display().to_string(),
            "--runsc-src".into(),
            self.runsc_src.display().to_string(),
            "--shim-src".into(),
            self.dir.path().join("image/no-shim").display().to_string(),
            "--restart-cmd".into(),
            format!("echo restarted >> '{}'", self.marker.display()),
            // The runsc shim's keys, whether or not the (fake) image ships the shim;
            // `auto` is tested by itself below.
            "--runtime".into(),
            "runsc-shim".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn run(&self, extra: &[&str]) -> Output {
        let a = self.args(extra);
        install(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn restarts(&self) -> usize {
        std::fs::read_to_string(&self.marker)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn host(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }

    /// Every entry under the host root: bytes, mode, inode and mtime, so a rewrite with the
    /// same bytes still shows.
    fn snapshot(&self) -> BTreeMap<PathBuf, (Vec<u8>, u32, u64, i64, i64)> {
        let mut out = BTreeMap::new();
        let mut todo = vec![self.root.clone()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let bytes = if m.is_dir() {
                    todo.push(p.clone());
                    vec![]
                } else if m.is_symlink() {
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes()
                } else {
                    std::fs::read(&p).unwrap()
                };
                out.insert(p, (bytes, m.mode(), m.ino(), m.mtime(), m.mtime_nsec()));
            }
        }
        out
    }
}

/// The runsc handler's table in a containerd config (or config dump).
fn runsc_entry(text: &str) -> toml::Value {
    let v: toml::Table = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let plugin = match v.get("version").and_then(toml::Value::as_integer) {
        Some(3) => "io.containerd.cri.v1.runtime",
        _ => "io.containerd.grpc.v1.cri",
    };
    v["plugins"][plugin]["containerd"]["runtimes"]["runsc"].clone()
}

fn assert_runsc_entry(text: &str) {
    let r = runsc_entry(text);
    assert_eq!(
        r["runtime_type"].as_str(),
        Some("io.containerd.runsc.v1"),
        "{text}"
    );
    assert_eq!(
        r["options"]["TypeUrl"].as_str(),
        Some("io.containerd.runsc.v1.options")
    );
    assert_eq!(
        r["options"]["ConfigPath"].as_str(),
        Some("/etc/containerd/runsc.toml")
    );
}

fn scratch_host(original: &str) {
    let s = Scratch::new(Some(original));

    // A dry run first: nothing changes.
    let before = s.snapshot();
    let out = ok(s.run(&["--dry-run"]));
    assert!(
        has_line(&out, "runsc: would copy to /usr/local/bin/runsc"),
        "{out}"
    );
    assert!(
        has_line(&out, "containerd config: would be changed"),
        "{out}"
    );
    assert!(has_line(&out, "containerd: would restart"), "{out}");
    assert_eq!(s.snapshot(), before, "--dry-run changed the host root");
    assert_eq!(s.restarts(), 0);

    // First run: copy, write, edit, restart once.
    let out = ok(s.run(&[]));
    assert!(
        has_line(&out, "runsc: copied to /usr/local/bin/runsc"),
        "{out}"
    );
    assert!(has_line(&out, "containerd-shim-runsc-v1: skipped"), "{out}");
    assert!(
        has_line(&out, "runsc config: written /etc/containerd/runsc.toml"),
        "{out}"
    );
    assert!(
        has_line(
            &out,
            "containerd config: changed /etc/containerd/config.toml"
        ),
        "{out}"
    );
    assert!(has_line(&out, "containerd: restarted"), "{out}");
    assert_eq!(s.restarts(), 1);
    let runsc = s.host("usr/local/bin/runsc");
    assert_eq!(std::fs::read(&runsc).unwrap(), FAKE_RUNSC);
    assert_eq!(std::fs::metadata(&runsc).unwrap().mode() & 0o7777, 0o755);
    let edited = std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap();
    assert_runsc_entry(&edited);
    // Everything that was there is still there, comments and formatting included.
    assert!(edited.starts_with(original), "{edited}");
    assert_eq!(
        std::fs::read_to_string(s.host("etc/containerd/config.toml.bak-computed")).unwrap(),
        original
    );
    let shim_cfg = std::fs::read_to_string(s.host("etc/containerd/runsc.toml")).unwrap();
    assert!(
        shim_cfg.contains("binary_name = \"/usr/local/bin/runsc\""),
        "{shim_cfg}"
    );
    assert!(!s
        .host("etc/containerd/config.toml.computed-restart-pending")
        .exists());

    // Second run: nothing changes (not even an inode), nothing restarts.
    let before = s.snapshot();
    let out = ok(s.run(&[]));
    assert!(
        has_line(&out, "runsc: unchanged /usr/local/bin/runsc"),
        "{out}"
    );
    assert!(has_line(&out, "runsc config: unchanged"), "{out}");
    assert!(has_line(&out, "containerd config: unchanged"), "{out}");
    assert!(has_line(&out, "containerd: not restarted"), "{out}");
    assert_eq!(s.snapshot(), before, "the second run changed the host root");
    assert_eq!(s.restarts(), 1);

    // New runsc bytes: a dry run says so and changes nothing...
    std::fs::write(&s.runsc_src, b"#!/bin/sh\necho 'runsc version fake-2'\n").unwrap();
    let out = ok(s.run(&["--dry-run"]));
    assert!(has_line(&out, "runsc: would copy to"), "{out}");
    assert!(has_line(&out, "containerd: not restarted"), "{out}");
    assert_eq!(s.snapshot(), before);
    // ...the real run copies them, and only them, without a restart.
    let out = ok(s.run(&[]));
    assert!(
        has_line(&out, "runsc: copied to /usr/local/bin/runsc"),
        "{out}"
    );
    assert!(has_line(&out, "containerd config: unchanged"), "{out}");
    assert!(has_line(&out, "containerd: not restarted"), "{out}");
    assert_eq!(
        std::fs::read(&runsc).unwrap(),
        b"#!/bin/sh\necho 'runsc version fake-2'\n"
    );
    assert_eq!(
        std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap(),
        edited
    );
    assert_eq!(s.restarts(), 1);
    // The backup still holds the very first original.
    assert_eq!(
        std::fs::read_to_string(s.host("etc/containerd/config.toml.bak-computed")).unwrap(),
        original
    );
}

#[test]
fn scratch_host_with_a_version_2_config() {
    scratch_host(V2);
}

#[test]
fn scratch_host_with_a_version_3_config() {
    scratch_host(V3);
}

#[test]
fn scratch_host_without_a_config_gets_a_minimal_one() {
    let s = Scratch::new(None);
    let out = ok(s.run(&[]));
    assert!(
        has_line(
            &out,
            "containerd config: created /etc/containerd/config.toml"
        ),
        "{out}"
    );
    let text = std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap();
    assert_runsc_entry(&text);
    // containerd's default runtime survives (a runtimes table replaces the built-in one).
    let v: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(
        v["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["runtime_type"]
            .as_str(),
        Some("io.containerd.runc.v2")
    );
    assert!(!s.host("etc/containerd/config.toml.bak-computed").exists());
    assert_eq!(s.restarts(), 1);
    let out = ok(s.run(&[]));
    assert!(has_line(&out, "containerd: not restarted"), "{out}");
    assert_eq!(s.restarts(), 1);
}

#[test]
fn version_1_configs_and_escaping_paths_are_refused() {
    let v1 = "[plugins.cri]\n  sandbox_image = \"pause:3.2\"\n";
    let s = Scratch::new(Some(v1));
    let o = s.run(&[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is version 1"), "{err}");
    assert!(err.contains("only versions 2 and 3"), "{err}");
    assert_eq!(
        std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap(),
        v1
    );
    assert_eq!(s.restarts(), 0);

    let s = Scratch::new(Some(V2));
    // A symlink on the host that climbs out of the root.
    std::os::unix::fs::symlink("../../../../../../..", s.host("etc/up")).unwrap();
    let before = s.snapshot();
    for bad in [
        ["--bin-dir", "/usr/local/../../../tmp"],
        ["--runsc-config", "/../etc/runsc.toml"],
        ["--containerd-config", "etc/containerd/config.toml"],
    ] {
        let o = s.run(&bad);
        assert!(!o.status.success(), "{bad:?} was accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("escapes the host root") || err.contains("must be absolute"),
            "{bad:?}: {err}"
        );
    }
    let o = s.run(&["--runsc-config", "/etc/up/tmp/runsc.toml"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("escapes the host root"));
    // Refused before anything was touched (not even the binaries).
    assert_eq!(s.snapshot(), before);
    assert_eq!(s.restarts(), 0);
}

// ---- against a real containerd ----

/// root, `containerd` and `ctr`: fails under CI when missing, else skips with the reason.
fn real_containerd_prerequisites() -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::Uid::effective().is_root() {
        missing.push("root".to_string());
    }
    for bin in ["containerd", "ctr"] {
        if which(bin).is_none() {
            missing.push(format!("{bin} on PATH"));
        }
    }
    nothing_missing(&missing)
}

/// start / stop / restart of the private containerd, also the installer's `--restart-cmd`.
/// `stop` waits until the process is gone or a zombie (this test process reaps it).
const CTL: &str = r#"#!/bin/sh
set -eu
d=__DIR__
cfg=$d/host/etc/containerd/config.toml
stop() {
  [ -f "$d/pid" ] || return 0
  pid=$(cat "$d/pid")
  kill -TERM "$pid" 2>/dev/null || true
  i=0
  while [ -e "/proc/$pid" ] && [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]; do
    i=$((i + 1))
    if [ "$i" -eq 100 ]; then kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.1
  done
  rm -f "$d/pid"
}
start() {
  setsid containerd --config "$cfg" >>"$d/containerd.log" 2>&1 </dev/null &
  echo $! >"$d/pid"
  i=0
  until ctr --address "$d/c.sock" version >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -eq 150 ]; then echo "containerd did not come up; see $d/containerd.log" >&2; exit 1; fi
    sleep 0.1
  done
}
case "$1" in
  start) start ;;
  stop) stop ;;
  restart) stop; start; echo restarted >>"$d/restarts" ;;
esac
"#;

/// The private containerd; stopped (and reaped) on drop, also when the test fails, and then
/// its scratch dir removed.
struct Private {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Private {
    /// A scratch dir (`prefix`…) with a host root whose containerd config (returned as it was
    /// written) keeps everything under the dir, `ctl.sh`, an "image" with a fake runsc, and a
    /// containerd started from that config by `ctl.sh`. Orphans become this process's
    /// children (containerd is started by shell scripts that exit), to reap.
    fn start(prefix: &str) -> (Self, String) {
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        let cfg = d.join("host/etc/containerd/config.toml");
        std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
        // Everything containerd writes stays under `d` (the opt plugin would make /opt/containerd).
        let original = format!(
            r#"# a private containerd for tests/install.rs; the CRI plugin is on, with its defaults
version = 2
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#,
            d = d.display()
        );
        std::fs::write(&cfg, &original).unwrap();
        std::fs::write(
            d.join("ctl.sh"),
            CTL.replace("__DIR__", &format!("'{}'", d.display())),
        )
        .unwrap();
        let image = d.join("image");
        std::fs::create_dir_all(&image).unwrap();
        std::fs::write(image.join("runsc"), FAKE_RUNSC).unwrap();

        let private = Private { dir: d, _tmp: tmp };
        let o = private.ctl("start");
        assert!(
            o.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&o.stderr),
            private.log()
        );
        (private, original)
    }

    fn ctl(&self, verb: &str) -> Output {
        Command::new("sh")
            .arg(self.dir.join("ctl.sh"))
            .arg(verb)
            .output()
            .unwrap()
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    fn sock(&self) -> PathBuf {
        self.dir.join("c.sock")
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.sock())
            .args(args)
            .output()
            .unwrap()
    }

    /// The status column of the CRI plugin in `ctr plugins ls` (`ok` when it loaded).
    fn cri_status(&self) -> String {
        let o = self.ctr(&["plugins", "ls"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("cri"))
            .and_then(|l| l.split_whitespace().last().map(str::to_string))
            .unwrap_or_else(|| "absent".into())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    fn stop(&self) {
        let pid = self.pid();
        self.ctl("stop");
        if let Some(p) = pid {
            reap(p);
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reaps `pid` if it is our child (orphans come to us: we are a child subreaper); waits at
/// most 10 s for it to exit.
fn reap(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(50)),
            _ => return,
        }
    }
}

#[test]
fn restarts_a_real_containerd_that_takes_the_edited_config() {
    if !real_containerd_prerequisites() {
        return;
    }
    let (private, original) = Private::start("computed-install-ctrd-");
    let d = private.dir.clone();
    let root = d.join("host");
    let cfg = root.join("etc/containerd/config.toml");
    let ctl = d.join("ctl.sh");
    let image = d.join("image");
    let first = private.pid().expect("pid of the private containerd");
    assert_eq!(private.cri_status(), "ok", "{}", private.log());

    let restart_cmd = format!("sh '{}' restart", ctl.display());
    let (runsc_src, shim_src) = (image.join("runsc"), image.join("no-shim"));
    let args = [
        "--host-root",
        root.to_str().unwrap(),
        "--runsc-src",
        runsc_src.to_str().unwrap(),
        "--shim-src",
        shim_src.to_str().unwrap(),
        "--restart-cmd",
        &restart_cmd,
        "--runtime",
        "runsc-shim",
    ];
    let out = ok(install(&args));
    assert!(has_line(&out, "containerd config: changed"), "{out}");
    assert!(has_line(&out, "containerd: restarted"), "{out}");
    let restarts = || {
        std::fs::read_to_string(d.join("restarts"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    assert_eq!(restarts(), 1);
    let second = private.pid().expect("pid after the restart");
    assert_ne!(first, second, "containerd was not restarted");
    reap(first);
    assert!(
        !Path::new(&format!("/proc/{first}")).exists(),
        "the old containerd is still there"
    );

    // containerd took the edited config: it answers, its CRI plugin loaded the runtimes
    // (a runtimes table without runc would fail it), and its merged config has runsc.
    let v = private.ctr(&["version"]);
    assert!(v.status.success(), "{}", private.log());
    assert!(String::from_utf8_lossy(&v.stdout).contains("Server:"));
    assert_eq!(private.cri_status(), "ok", "{}", private.log());
    let dump = Command::new("containerd")
        .arg("--config")
        .arg(&cfg)
        .args(["config", "dump"])
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert_runsc_entry(&dump);
    let dumped: toml::Table = toml::from_str(&dump).unwrap();
    assert_eq!(
        dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
            ["runtime_type"]
            .as_str(),
        Some("io.containerd.runc.v2")
    );
    // The file the operator restores from on rollback.
    assert_eq!(
        std::fs::read_to_string(root.join("etc/containerd/config.toml.bak-computed")).unwrap(),
        original
    );

    // Again: nothing to do, no restart, same containerd.
    let out = ok(install(&args));
    assert!(has_line(&out, "containerd config: unchanged"), "{out}");
    assert!(has_line(&out, "containerd: not restarted"), "{out}");
    assert_eq!(restarts(), 1);
    assert_eq!(private.pid(), Some(second));

    // No leftovers: the containerd is gone (and reaped).
    private.stop();
    assert!(
        !Path::new(&format!("/proc/{second}")).exists(),
        "containerd {second} is still there"
    );
    assert!(!private.sock().exists() || private.ctr(&["version"]).status.code() != Some(0));
}

#[test]
fn auto_runtime_picks_the_shim_only_when_the_image_ships_it() {
    let s = Scratch::new(Some(V2));
    let auto = |extra: &[&str]| {
        let mut a = s.args(extra);
        let i = a.iter().position(|x| x == "--runtime").unwrap();
        a[i + 1] = "auto".into();
        ok(install(&a.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    // No shim in the image: the runc shim runs runsc from --bin-dir.
    let out = auto(&[]);
    assert!(
        has_line(
            &out,
            "runsc handler: containerd's runc v2 shim running /usr/local/bin/runsc"
        ),
        "{out}"
    );
    assert!(has_line(&out, "runsc config: skipped"), "{out}");
    let text = std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap();
    let r = runsc_entry(&text);
    assert_eq!(
        r["runtime_type"].as_str(),
        Some("io.containerd.runc.v2"),
        "{text}"
    );
    assert_eq!(
        r["options"]["BinaryName"].as_str(),
        Some("/usr/local/bin/runsc")
    );
    assert!(r["options"].get("TypeUrl").is_none(), "{text}");
    assert!(!s.host("etc/containerd/runsc.toml").exists());
    assert!(!s.host("usr/local/bin/containerd-shim-runsc-v1").exists());
    // A wrapper in runsc's place.
    let out = auto(&["--runc-binary", "/opt/k1/runsc-wrapper"]);
    assert!(has_line(&out, "containerd config: changed"), "{out}");
    let text = std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap();
    assert_eq!(
        runsc_entry(&text)["options"]["BinaryName"].as_str(),
        Some("/opt/k1/runsc-wrapper")
    );
    assert_eq!(s.restarts(), 2);
    // The image ships the shim: gVisor's shim, installed, and the runc shim's key gone.
    std::fs::write(s.dir.path().join("image/no-shim"), b"fake shim").unwrap();
    let out = auto(&[]);
    assert!(has_line(&out, "runsc handler: gVisor's shim"), "{out}");
    let text = std::fs::read_to_string(s.host("etc/containerd/config.toml")).unwrap();
    assert_runsc_entry(&text);
    assert!(
        runsc_entry(&text)["options"].get("BinaryName").is_none(),
        "{text}"
    );
    assert_eq!(
        std::fs::read(s.host("usr/local/bin/containerd-shim-runsc-v1")).unwrap(),
        b"fake shim"
    );
    assert_eq!(s.restarts(), 3);
}

/// A cgroup made for one test in the first hierarchy it finds (cgroup v1: `pids`; v2: the
/// unified one), removed on drop (its processes moved back to the root first).
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    fn new(name: &str) -> Self {
        let base = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/pids")
        };
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Self { dir }
    }

    fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    fn procs(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let root = self.dir.parent().unwrap().join("cgroup.procs");
        for p in self.procs() {
            let _ = std::fs::write(&root, p.to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The cgroup lines of a process, sorted.
fn cgroups_of(pid: i32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

fn cmdline_of(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/cmdline")).unwrap()
}

#[test]
fn reexec_restarts_a_script_started_containerd_in_place() {
    if !real_containerd_prerequisites() {
        return;
    }
    // The host is this machine (host root /): the config, binaries and pid file are real
    // paths in the scratch dir.
    let (private, original) = Private::start("computed-install-reexec-");
    let d = private.dir.clone();
    let root = d.join("host");
    let cfg = root.join("etc/containerd/config.toml");
    let image = d.join("image");
    let first = private.pid().unwrap();
    let cg = TestCgroup::new(&format!("computed-reexec-{}", std::process::id()));
    cg.add(first);
    let cgroups_before = cgroups_of(first);
    let cmdline_before = cmdline_of(first);
    let log_before = private.log().len();

    let bin_dir = d.join("bin");
    let args: Vec<String> = [
        "--host-root",
        "/",
        "--runsc-src",
        image.join("runsc").to_str().unwrap(),
        "--shim-src",
        image.join("no-shim").to_str().unwrap(),
        "--bin-dir",
        bin_dir.to_str().unwrap(),
        "--containerd-config",
        cfg.to_str().unwrap(),
        "--runsc-config",
        d.join("runsc.toml").to_str().unwrap(),
        "--restart-mode",
        "reexec",
        "--containerd-pid-file",
        d.join("pid").to_str().unwrap(),
        "--restart-timeout-secs",
        "30",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ok(install(&args));
    assert!(
        has_line(&out, &format!("containerd: pid {first} stopped")),
        "{out}"
    );
    assert!(has_line(&out, "containerd: restarted"), "{out}");
    reap(first);
    assert!(!Path::new(&format!("/proc/{first}")).exists(), "{out}");
    // The pid file names the new one, which runs the same command line in the same cgroups.
    let second = private.pid().expect("pid file");
    assert_ne!(second, first, "{out}");
    assert!(
        has_line(
            &out,
            &format!(
                "containerd: pid file {}/pid now holds {second}",
                d.display()
            )
        ),
        "{out}"
    );
    assert_eq!(cmdline_of(second), cmdline_before);
    assert_eq!(cgroups_of(second), cgroups_before);
    assert!(cg.procs().contains(&second));
    assert!(
        out.contains(&format!(
            "containerd: started again as pid {second} (same command line, namespaces and \
             cgroups), answers on {}/c.sock",
            d.display()
        )),
        "{out}"
    );
    // Its output went on in the same log, and it serves the edited config (runc shim + runsc).
    let log = private.log();
    assert!(log.len() > log_before, "nothing appended to the log");
    assert_eq!(
        log.matches("containerd successfully booted").count(),
        2,
        "{log}"
    );
    assert!(private.ctr(&["version"]).status.success());
    assert_eq!(private.cri_status(), "ok", "{log}");
    let dump = Command::new("containerd")
        .arg("--config")
        .arg(&cfg)
        .args(["config", "dump"])
        .output()
        .unwrap();
    let r = runsc_entry(&String::from_utf8_lossy(&dump.stdout));
    assert_eq!(r["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(
        r["options"]["BinaryName"].as_str(),
        Some(bin_dir.join("runsc").to_str().unwrap())
    );

    // Again: nothing owed, nothing restarted.
    let out = ok(install(&args));
    assert!(has_line(&out, "containerd: not restarted"), "{out}");
    assert_eq!(private.pid(), Some(second));

    // A containerd that systemd runs is refused, and left running.
    let unit = TestCgroup::new(&format!(
        "computed-test-containerd-{}.service",
        std::process::id()
    ));
    unit.add(second);
    std::fs::write(&cfg, &original).unwrap(); // a restart is owed again
    let o = install(&args);
    assert!(!o.status.success(), "{}", stdout(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is systemd's unit") && err.contains("--restart-mode command"),
        "{err}"
    );
    assert!(Path::new(&format!("/proc/{second}")).exists());
    assert!(private.ctr(&["version"]).status.success());
    assert_eq!(private.pid(), Some(second));
    assert!(root
        .join("etc/containerd/config.toml.computed-restart-pending")
        .exists());
    drop(unit);
    private.stop();
    assert!(!Path::new(&format!("/proc/{second}")).exists());
}
