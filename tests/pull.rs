//! Pulling an image from a registry for real: a local `docker-registry` (Debian's package) on
//! loopback, the default image pushed to it with skopeo, and a sandbox created from the
//! registry reference, which the node pulls through oci-client because it is not local.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;

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
            let msg = format!("missing {bin} (scripts/install-deps installs it)");
            if std::env::var_os("CI").is_some() {
                panic!("{msg}");
            }
            eprintln!("SKIPPED: {msg}");
            return None;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "registry did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Registry {
        child,
        _dir: dir,
        addr,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_image_that_is_not_local_is_pulled() {
    if !prerequisites() {
        return;
    }
    let Some(reg) = registry() else { return };
    let reference = format!("{}/sandbox/python:v1", reg.addr);
    let out = Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", image_tar().display()))
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&out.stderr)
    );

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
    let out = Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", image_tar().display()))
        .arg(format!("docker://{reference2}"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_computectl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["image", "pull", &reference2])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("pulled {reference2}")));
    assert!(d.ctr(&["images", "ls", "-q"]).contains(&reference2));

    // A reference the registry does not have fails the sandbox with the reason.
    let mut req = create_req("t", "missing");
    req.image = format!("{}/sandbox/none:v1", reg.addr);
    let id = c.create_sandbox(req).await.unwrap().into_inner().sandbox_id;
    let desc = wait_status(&mut c, &id, SandboxStatus::Failed, Duration::from_secs(30)).await;
    assert!(
        desc.failure_reason.contains("pull"),
        "{}",
        desc.failure_reason
    );
    c.destroy_sandbox(pb::DestroySandboxRequest { sandbox_id: id })
        .await
        .unwrap();
}
