//! Pulling an image from a registry for real: a local `docker-registry` (Debian's package) on
//! loopback, the default image pushed to it with skopeo, and a sandbox created from the
//! registry reference, which the node pulls through oci-client because it is not local.

#[macro_use]
mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

struct Registry {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    addr: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry() -> Option<Registry> {
    for bin in ["docker-registry", "skopeo"] {
        if which(bin).is_none() {
            skip(&format!("missing {bin} (scripts/install-deps installs it)"));
            return None;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let cfg = dir.path().join("config.yml");
    std::fs::write(
        &cfg,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(&addr, Duration::from_secs(10), "registry", || None);
    Some(Registry {
        child,
        _dir: dir,
        addr,
    })
}

/// Pushes the default image tarball to `reference` with skopeo.
fn push(reference: &str) {
    let out = Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", image_tar().display()))
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap();
    assert_success(&out, "skopeo");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_image_that_is_not_local_is_pulled() {
    need!();
    let Some(reg) = registry() else { return };
    let reference = format!("{}/sandbox/python:v1", reg.addr);
    push(&reference);

    let d = start("pull", &format!("insecure_registries = [{:?}]", reg.addr));
    assert!(
        !d.ctr(&["images", "ls", "-q"]).contains(&reference),
        "not local before"
    );
    let mut c = d.client().await;
    let mut req = create_req("t", "pull");
    req.image = reference.clone();
    let id = ready_sandbox(&mut c, req).await;
    assert_eq!(sh(&mut c, &id, "python3 -c 'print(6 * 7)'").await, "42\n");
    assert!(
        d.ctr(&["images", "ls", "-q"]).contains(&reference),
        "pulled image is recorded"
    );
    assert!(d.log_text().contains("image not local: pulling"));

    // The operator's way: computectl image pull, through the node's admin service.
    let reference2 = format!("{}/sandbox/python:v2", reg.addr);
    push(&reference2);
    let out = assert_success(
        &d.computectl(&["image", "pull", &reference2]),
        "computectl image pull",
    );
    assert!(out.contains(&format!("pulled {reference2}")));
    assert!(d.ctr(&["images", "ls", "-q"]).contains(&reference2));

    // A reference the registry does not have fails the sandbox with the reason.
    let mut req = create_req("t", "missing");
    req.image = format!("{}/sandbox/none:v1", reg.addr);
    let id = create(&mut c, req).await.sandbox_id;
    wait_failed(&mut c, &id, Duration::from_secs(30), "pull").await;
    destroy(&mut c, &id).await;
}

/// Destroy of a sandbox whose image pull hangs (a registry that accepts connections and never
/// answers) answers at once: the pull runs outside the sandbox's lock and Destroy cancels it.
#[tokio::test(flavor = "multi_thread")]
async fn destroy_of_a_sandbox_stuck_in_a_pull_answers_at_once() {
    need!();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let h2 = held.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            h2.lock().unwrap().push(s);
        }
    });
    let d = start("slowpull", &format!("insecure_registries = [{addr:?}]"));
    let mut c = d.client().await;
    let mut req = create_req("t", "slow");
    req.image = format!("{addr}/sandbox/python:v1");
    let id = c.create_sandbox(req).await.unwrap().into_inner().sandbox_id;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while held.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never dialed the registry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status_of(&mut c, &id).await, SandboxStatus::Starting);
    let t0 = std::time::Instant::now();
    destroy(&mut c, &id).await;
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "Destroy waited for the pull: {:?}",
        t0.elapsed()
    );
    assert_eq!(status_of(&mut c, &id).await, SandboxStatus::Destroyed);
    assert!(
        !d.ctr(&["containers", "ls", "-q"]).contains(&id),
        "nothing left"
    );
    // The cancelled provisioning never comes back to start it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(d.ctr(&["tasks", "ls", "-q"]).trim().is_empty());
    assert!(!d.log_text().contains("sandbox ready"));
}
