//! Both gVisor releases the node supports: the node on bookworm-backports' runsc (20240729, on
//! PATH after scripts/install-deps) and on bookworm's own 20221219 (kept by install-deps at
//! OLD_RUNSC), each running a sandbox and saying which runsc and platform it uses; a platform
//! the binary does not offer stops the node.

#[macro_use]
mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use computed::api::admin::v1 as admin;
use computed::api::admin::v1::node_admin_client::NodeAdminClient;

/// Where scripts/install-deps keeps bookworm's runsc.
const OLD_RUNSC: &str = "/usr/local/lib/compute/runsc-20221219/runsc";

fn old_runsc() -> Option<&'static Path> {
    let p = Path::new(OLD_RUNSC);
    if p.is_file() {
        return Some(p);
    }
    let msg = format!("missing {OLD_RUNSC} (scripts/install-deps keeps it)");
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

async fn node_info(d: &Daemon) -> admin::GetNodeResponse {
    NodeAdminClient::new(d.local_channel().await)
        .get_node(admin::GetNodeRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// A sandbox on `d` runs Python under gVisor, and coreutils on named paths (statx with
/// AT_NO_AUTOMOUNT); the image's statx shim is preloaded only where runsc needs it (`shim`).
async fn runs_python(d: &Daemon, session: &str, shim: bool) {
    let mut c = d.client().await;
    let id = ready_sandbox(&mut c, create_req("t", session)).await;
    let out = sh(&mut c, &id, "python3 -c 'print(6 * 7)'; dmesg | head -1").await;
    assert!(out.starts_with("42\n"), "{out}");
    assert!(out.contains("gVisor"), "{out}");
    let out = sh(
        &mut c,
        &id,
        "ls -ld /proc | cut -c1-10; (cat /etc/ld.so.preload 2>/dev/null || true) | grep -c statx-compat || true",
    )
    .await;
    assert_eq!(
        out,
        format!("dr-xr-xr-x\n{}\n", u8::from(shim)),
        "{session}"
    );
    destroy(&mut c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_backports_runsc_runs_ptrace_by_default_and_systrap_when_asked() {
    need!();
    let d = start("runsc-new", "");
    let n = node_info(&d).await;
    assert!(n.runsc_version.contains("20240729"), "{}", n.runsc_version);
    assert_eq!(n.runsc_platform_in_use, "ptrace", "the measured default");
    assert!(n.runsc_platforms.contains(&"systrap".to_string()), "{n:?}");
    for f in ["systrap", "checkpoint-compression", "restore-direct"] {
        assert!(
            n.runsc_features.contains(&f.to_string()),
            "{f}: {:?}",
            n.runsc_features
        );
    }
    runs_python(&d, "new", false).await;
    // systrap, when a node's config says so (runsc's own default: empty).
    let d = start("runsc-new-systrap", "runsc_platform = \"\"");
    assert_eq!(node_info(&d).await.runsc_platform_in_use, "systrap");
    runs_python(&d, "new-systrap", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_on_runsc_20221219_still_works() {
    need!();
    let Some(old) = old_runsc() else { return };
    let d = start("runsc-old", &format!("runsc_path = {old:?}"));
    let n = node_info(&d).await;
    assert!(n.runsc_version.contains("20221219"), "{}", n.runsc_version);
    assert_eq!(n.runsc_platform_in_use, "ptrace");
    assert!(!n.runsc_features.contains(&"systrap".to_string()));
    runs_python(&d, "old", true).await;
    // doctor says which runsc it is, and that it works but is old.
    let o = d.computectl(&["doctor", "-o", "json"]);
    let text = String::from_utf8_lossy(&o.stdout);
    let checks: serde_json::Value = serde_json::from_str(&text).unwrap();
    let runsc = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "runsc")
        .unwrap();
    assert_eq!(runsc["status"], "warn", "{runsc}");
    let detail = runsc["detail"].as_str().unwrap();
    assert!(
        detail.contains("20221219") && detail.contains("platform ptrace"),
        "{detail}"
    );
}

#[test]
fn a_platform_the_binary_lacks_stops_the_node() {
    need!();
    let Some(old) = old_runsc() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = {:?}\nsocket = {:?}\nmetrics_listen = \"\"\nstate_dir = {:?}\nrun_dir = {:?}\n\
             containerd_socket = {:?}\nnamespace = \"runsc-bad\"\nrunsc_path = {old:?}\n\
             runsc_platform = \"systrap\"\n",
            free_addr(),
            dir.path().join("s.sock"),
            dir.path().join("state"),
            dir.path().join("run"),
            containerd_socket(),
        ),
    )
    .unwrap();
    let mut child = computed_command()
        .arg("--config")
        .arg(&cfg)
        .arg("node")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("runsc_platform \"systrap\"") && err.contains("ptrace") && err.contains("kvm"),
        "{err}"
    );
    // An unknown word is a config error, before anything starts.
    std::fs::write(&cfg, "runsc_platform = \"fast\"\n").unwrap();
    let o = computed_command()
        .arg("--config")
        .arg(&cfg)
        .arg("node")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A sandbox on `d` is suspended and resumed with its memory: a background process (and the
/// file it wrote in the sandbox's in-memory root) is the same after the resume.
async fn keeps_memory_across_suspend(d: &Daemon, session: &str) {
    let mut c = d.client().await;
    let id = ready_sandbox(&mut c, create_req("t", session)).await;
    sh(
        &mut c,
        &id,
        "setsid sh -c 'echo $$ > /tmp/pid; exec sleep 1000' </dev/null >/dev/null 2>&1 & sleep 0.3",
    )
    .await;
    let before = sh(&mut c, &id, "cat /tmp/pid").await;
    let o = d.computectl(&["suspend", &id]);
    assert_success(&o, "computectl suspend");
    let o = d.computectl(&["resume", "-o", "json", &id]);
    let text = assert_success(&o, "computectl resume");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v[0]["memory_lost"], "", "{session}: {v}");
    let after = sh(
        &mut c,
        &id,
        "cat /tmp/pid; kill -0 $(cat /tmp/pid) && echo alive",
    )
    .await;
    assert_eq!(after, format!("{before}alive\n"), "{session}");
    destroy(&mut c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn suspend_keeps_memory_on_both_releases_and_both_platforms() {
    need!();
    let d = start("runsc-suspend-new", "");
    keeps_memory_across_suspend(&d, "new-ptrace").await;
    drop(d);
    let d = start("runsc-suspend-systrap", "runsc_platform = \"systrap\"");
    keeps_memory_across_suspend(&d, "new-systrap").await;
    drop(d);
    // 20221219 restores a sandbox without its stdio (the agent would be cut off): the node
    // says so, and refuses to suspend rather than lose the sandbox.
    let Some(old) = old_runsc() else { return };
    let d = start("runsc-suspend-old", &format!("runsc_path = {old:?}"));
    let n = node_info(&d).await;
    assert!(
        n.suspend_unsupported.contains("20221219"),
        "{}",
        n.suspend_unsupported
    );
    let o = d.computectl(&["doctor", "-o", "json"]);
    let checks: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let check = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "suspend")
        .unwrap()
        .clone();
    assert_eq!(check["status"], "warn", "{check}");
    let mut c = d.client().await;
    let id = ready_sandbox(&mut c, create_req("t", "old-ptrace")).await;
    let o = d.computectl(&["suspend", &id]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not suspendable here"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(sh(&mut c, &id, "echo still").await, "still\n");
    destroy(&mut c, &id).await;
}
