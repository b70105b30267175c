//! Unit tests of [`super`]: whole installs into a scratch host root, with a restart command that counts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;

struct Scratch {
    dir: tempfile::TempDir,
    opts: InstallOpts,
    marker: PathBuf,
}

/// A host root with a fake runsc in the "image" and a restart command that counts.
fn scratch(config: Option<&str>) -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    std::fs::create_dir_all(&image).unwrap();
    std::fs::write(image.join("runsc"), b"#!/bin/sh\necho fake runsc\n").unwrap();
    let root = dir.path().join("host");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    if let Some(c) = config {
        std::fs::write(root.join("etc/containerd/config.toml"), c).unwrap();
    }
    let marker = dir.path().join("restarts");
    let opts = InstallOpts {
        host_root: root,
        runsc_src: image.join("runsc"),
        shim_src: image.join("containerd-shim-runsc-v1"),
        restart_cmd: format!("echo restart >> {}", marker.display()),
        // The runsc shim's config, shipped shim or not (`auto` is tested in tests/install.rs).
        runtime: RuntimeMode::RunscShim,
        ..InstallOpts::default()
    };
    Scratch { dir, opts, marker }
}

fn restarts(s: &Scratch) -> usize {
    std::fs::read_to_string(&s.marker)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

fn host_file(s: &Scratch, p: &str) -> Option<String> {
    std::fs::read_to_string(s.opts.host_root.join(p)).ok()
}

/// Whether the marker of an owed restart is on the host.
fn restart_pending(s: &Scratch) -> bool {
    s.opts
        .host_root
        .join("etc/containerd/config.toml.computed-restart-pending")
        .exists()
}

const V2: &str = "# node config\nversion = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"  # the default\n";
const V3: &str = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n";

#[test]
fn first_run_installs_second_run_does_nothing() {
    for (name, cfg) in [("v2", Some(V2)), ("v3", Some(V3)), ("missing", None)] {
        let s = scratch(cfg);
        let r = install(&s.opts).unwrap();
        assert!(r.containerd_config_changed && r.restarted, "{name}: {r:?}");
        assert_eq!(restarts(&s), 1, "{name}");
        assert_eq!(
            host_file(&s, "usr/local/bin/runsc").as_deref(),
            Some("#!/bin/sh\necho fake runsc\n")
        );
        assert_eq!(
            host::mode_of(&s.opts.host_root.join("usr/local/bin/runsc")),
            Some(0o755)
        );
        let text = host_file(&s, "etc/containerd/config.toml").unwrap();
        assert!(text.contains("io.containerd.runsc.v1"), "{name}: {text}");
        assert!(text.contains("ConfigPath = "), "{name}: {text}");
        // The backup holds the original; a created file has none.
        assert_eq!(
            host_file(&s, "etc/containerd/config.toml.bak-computed").as_deref(),
            cfg
        );
        assert!(host_file(&s, "etc/containerd/runsc.toml")
            .unwrap()
            .contains("binary_name = \"/usr/local/bin/runsc\""));
        assert!(r
            .lines
            .iter()
            .any(|l| l.starts_with("containerd-shim-runsc-v1: skipped")));
        if let Some(c) = cfg {
            assert!(text.starts_with(c), "{name}: comments/format lost:\n{text}");
        }

        let r2 = install(&s.opts).unwrap();
        assert_eq!(r2.files_changed, 0, "{name}: {:?}", r2.lines);
        assert!(!r2.containerd_config_changed && !r2.restarted);
        assert_eq!(restarts(&s), 1, "{name}");
        assert_eq!(host_file(&s, "etc/containerd/config.toml").unwrap(), text);
        assert!(!restart_pending(&s));
    }
}

#[test]
fn v1_config_is_a_clear_error_and_nothing_restarts() {
    let s = scratch(Some("[plugins.cri]\n  sandbox_image = \"pause\"\n"));
    let e = install(&s.opts).unwrap_err();
    assert!(matches!(e, Error::UnsupportedVersion { .. }), "{e}");
    assert_eq!(restarts(&s), 0);
    assert_eq!(
        host_file(&s, "etc/containerd/config.toml").as_deref(),
        Some("[plugins.cri]\n  sandbox_image = \"pause\"\n")
    );
}

#[test]
fn a_failed_restart_is_retried_by_the_next_run() {
    let mut s = scratch(Some(V2));
    s.opts.restart_cmd = "exit 3".into();
    let e = install(&s.opts).unwrap_err();
    assert!(matches!(e, Error::RestartFailed { .. }), "{e}");
    assert!(restart_pending(&s));
    s.opts.restart_cmd = format!("echo restart >> {}", s.marker.display());
    let r = install(&s.opts).unwrap();
    assert!(r.restarted && !r.containerd_config_changed, "{:?}", r.lines);
    assert_eq!(restarts(&s), 1);
    let r = install(&s.opts).unwrap();
    assert!(!r.restarted);
    assert_eq!(restarts(&s), 1);
}

#[test]
fn restart_timeout_kills_the_command() {
    let mut s = scratch(Some(V2));
    s.opts.restart_cmd = "sleep 30".into();
    s.opts.restart_timeout_secs = 1;
    let t = Instant::now();
    let e = install(&s.opts).unwrap_err();
    assert!(matches!(e, Error::RestartTimeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn empty_restart_cmd_never_restarts() {
    let mut s = scratch(Some(V2));
    s.opts.restart_cmd = " ".into();
    let r = install(&s.opts).unwrap();
    assert!(r.containerd_config_changed && !r.restarted);
    assert!(r.lines.iter().any(|l| l.contains("NOT restarted")));
    assert!(!restart_pending(&s));
}

#[test]
fn dry_run_changes_nothing() {
    let s = scratch(Some(V2));
    let before = tree(s.dir.path());
    let mut o = s.opts.clone();
    o.dry_run = true;
    let r = install(&o).unwrap();
    assert!(r.containerd_config_changed && !r.restarted);
    assert!(r.files_changed >= 4, "{:?}", r.lines);
    assert!(r
        .lines
        .iter()
        .any(|l| l.starts_with("containerd: would restart")));
    assert_eq!(tree(s.dir.path()), before);
    assert_eq!(restarts(&s), 0);
}

#[test]
fn shim_is_copied_when_shipped_and_binaries_only_when_changed() {
    let s = scratch(Some(V2));
    std::fs::write(&s.opts.shim_src, b"fake shim").unwrap();
    install(&s.opts).unwrap();
    assert_eq!(
        host_file(&s, "usr/local/bin/containerd-shim-runsc-v1").as_deref(),
        Some("fake shim")
    );
    std::fs::write(&s.opts.runsc_src, b"new runsc").unwrap();
    let r = install(&s.opts).unwrap();
    assert_eq!(r.files_changed, 1, "{:?}", r.lines);
    assert!(!r.restarted);
    assert!(r.lines[0].starts_with("runsc handler: gVisor's shim"));
    assert!(r.lines[1].starts_with("runsc: copied to /usr/local/bin/runsc"));
    assert!(r.lines[2].starts_with("containerd-shim-runsc-v1: unchanged"));
    assert_eq!(restarts(&s), 1);
}

#[test]
fn paths_may_not_escape_the_host_root() {
    let mut s = scratch(Some(V2));
    s.opts.bin_dir = "/usr/../../bin".into();
    assert!(matches!(install(&s.opts), Err(Error::Escape { .. })));
    let mut s = scratch(Some(V2));
    s.opts.runsc_config = "etc/runsc.toml".into();
    assert!(matches!(install(&s.opts), Err(Error::NotAbsolute { .. })));
    // A link to an absolute path lands inside the host root, never outside it.
    let s = scratch(None);
    let outside = s.dir.path().join("outside");
    std::fs::create_dir_all(s.opts.host_root.join("usr/local")).unwrap();
    std::os::unix::fs::symlink(&outside, s.opts.host_root.join("usr/local/bin")).unwrap();
    install(&s.opts).unwrap();
    assert!(!outside.exists());
    let rerooted = s.opts.host_root.join(outside.strip_prefix("/").unwrap());
    assert!(rerooted.join("runsc").is_file());
}

/// Every path under `dir` with its bytes (files) or link target.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p.clone());
                out.push((p, vec![]));
            } else if m.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((p, t.as_os_str().as_encoded_bytes().to_vec()));
            } else {
                let b = std::fs::read(&p).unwrap();
                out.push((p, b));
            }
        }
    }
    out.sort();
    out
}
