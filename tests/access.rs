//! Access control: the unix socket's mode and group, and mutual TLS on the TCP listener
//! (certificates made at test time with rcgen). That the admin service is not on TCP unless
//! `admin_tcp` is set is tested in tests/computectl.rs.

#[macro_use]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use common::pki::{write, Ca};
use common::*;
use computed::api::compute::v1::compute_service_client::ComputeServiceClient;
use rcgen::ExtendedKeyUsagePurpose;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A group made for one test and removed after it.
struct TempGroup(String);

impl TempGroup {
    fn new(name: &str) -> Self {
        let _ = Command::new("groupdel").arg(name).output();
        let o = Command::new("groupadd")
            .args(["--system", name])
            .output()
            .expect("groupadd (Debian's passwd package) is needed");
        assert!(
            o.status.success(),
            "groupadd: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        TempGroup(name.into())
    }

    fn gid(&self) -> u32 {
        nix::unistd::Group::from_name(&self.0)
            .unwrap()
            .expect("the group exists")
            .gid
            .as_raw()
    }
}

impl Drop for TempGroup {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.0).output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unix_socket_is_0660_and_owned_by_the_configured_group() {
    need!();
    let group = TempGroup::new(&format!("cmpt{}", std::process::id()));
    let d = start("sockgroup", &format!("socket_group = {:?}", group.0));
    let md = std::fs::metadata(&d.socket).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o660, "socket mode");
    assert_eq!(md.gid(), group.gid(), "socket group");
    assert_eq!(md.uid(), 0, "socket owner");
    // A numeric gid works too, and the default keeps root's group.
    let d2 = start("sockgid", &format!("socket_group = \"{}\"", group.gid()));
    assert_eq!(std::fs::metadata(&d2.socket).unwrap().gid(), group.gid());
    let d3 = start("sockdefault", "");
    let md3 = std::fs::metadata(&d3.socket).unwrap();
    assert_eq!(md3.permissions().mode() & 0o7777, 0o660);
    assert_eq!(md3.gid(), 0);
    // An unknown group is a startup error, not a socket left world-reachable.
    let dir = tempfile::tempdir().unwrap();
    let cfg = std::fs::read_to_string(&d3.config)
        .unwrap()
        .lines()
        .filter(|l| {
            !l.starts_with("listen") && !l.starts_with("socket") && !l.starts_with("metrics")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = dir.path().join("c.toml");
    let sock = dir.path().join("s.sock");
    std::fs::write(
        &path,
        format!("{cfg}\nlisten = \"\"\nmetrics_listen = \"\"\nsocket = {sock:?}\nsocket_group = \"no-such-group-xyz\"\n"),
    )
    .unwrap();
    let (status, _) = node_exit(&path);
    assert!(!status.success(), "the daemon refuses to start");
    assert!(!sock.exists() || std::fs::metadata(&sock).unwrap().permissions().mode() & 0o007 == 0);
}

/// Runs `computed --config CONFIG node`, which must exit within 30 s: its status and stderr.
fn node_exit(config: &std::path::Path) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_computed"))
        .arg("--config")
        .arg(config)
        .arg("node")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the daemon did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// Connects over TLS trusting `ca`, presenting `client` if given, and asks health and
/// ComputeService something: Ok only if both answered.
async fn call(addr: &str, ca: &str, client: Option<&(String, String)>) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let ch = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    health_and_compute(ch).await
}

async fn health_and_compute(ch: Channel) -> Result<(), String> {
    let h = HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|e| format!("health: {e:?}"))?
        .into_inner();
    if h.status != 1 {
        return Err(format!("health status {}", h.status));
    }
    // A ComputeService call that reaches the service: NOT_FOUND for an unknown sandbox.
    let unknown = uuid::Uuid::new_v4().to_string();
    match try_describe(&mut ComputeServiceClient::new(ch), &unknown).await {
        Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
        other => Err(format!("describe: {other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_on_the_tcp_listener() {
    need!();
    let certs = tempfile::tempdir().unwrap();
    let ca = Ca::new("compute test CA");
    let other_ca = Ca::new("someone else's CA");
    let (srv_cert, srv_key) = ca.leaf(
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client = ca.leaf(&["operator"], ExtendedKeyUsagePurpose::ClientAuth);
    let stranger = other_ca.leaf(&["stranger"], ExtendedKeyUsagePurpose::ClientAuth);
    let dir = certs.path();
    let cfg = format!(
        "tls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
        write(dir, "server.pem", &srv_cert),
        write(dir, "server.key", &srv_key),
        write(dir, "ca.pem", &ca.pem()),
    );
    let d = start("mtls", &cfg);

    // A client with a certificate from the CA: health and ComputeService answer.
    call(&d.addr, &ca.pem(), Some(&client)).await.unwrap();
    // No client certificate: refused.
    let e = call(&d.addr, &ca.pem(), None).await.unwrap_err();
    eprintln!("without a client certificate: {e}");
    // A certificate from another CA: refused.
    let e = call(&d.addr, &ca.pem(), Some(&stranger)).await.unwrap_err();
    eprintln!("with another CA's certificate: {e}");
    // Plain HTTP/2 to the TLS port: refused.
    let plain = async {
        let ch = Channel::from_shared(format!("http://{}", d.addr))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        health_and_compute(ch).await
    };
    assert!(plain.await.is_err(), "plaintext is refused");
    // A server certificate the client does not trust: the client refuses.
    assert!(call(&d.addr, &other_ca.pem(), Some(&client)).await.is_err());
    // Refused handshakes did not stop the listener.
    call(&d.addr, &ca.pem(), Some(&client)).await.unwrap();

    // computectl over TCP with the client certificate works, and without it does not.
    let id = uuid::Uuid::new_v4().to_string();
    let ctl = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_computectl"))
            .args([
                "--addr",
                &format!("localhost:{}", d.addr.rsplit(':').next().unwrap()),
            ])
            .args(extra)
            .args(["exec", &id, "--", "true"])
            .output()
            .unwrap()
    };
    let ca_path = dir.join("ca.pem").display().to_string();
    let cert_path = write(dir, "client.pem", &client.0);
    let key_path = write(dir, "client.key", &client.1);
    let o = ctl(&[
        "--tls-ca",
        &ca_path,
        "--tls-cert",
        &cert_path,
        "--tls-key",
        &key_path,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("NotFound"),
        "computectl with a client cert: {err}"
    );
    let o = ctl(&["--tls-ca", &ca_path]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        !err.contains("NotFound"),
        "computectl without a client cert: {err}"
    );

    // The unix socket stays plain (its file mode is its access control).
    health_and_compute(d.local_channel().await).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn server_only_tls_and_bad_tls_files() {
    need!();
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    let ca = Ca::new("compute test CA");
    let (srv_cert, srv_key) = ca.leaf(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    // TLS without client auth: any client that trusts the server gets in.
    let cfg = format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        write(dir, "server.pem", &srv_cert),
        write(dir, "server.key", &srv_key),
    );
    let d = start("tls", &cfg);
    call(&d.addr, &ca.pem(), None).await.unwrap();
    // A missing key file: the daemon exits instead of serving plaintext.
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"\"\nsocket = {:?}\n\
             containerd_socket = {:?}\nnamespace = \"{}-bad\"\nstate_dir = {:?}\nrun_dir = {:?}\n\
             tls_cert = {:?}\ntls_key = \"/nonexistent/key.pem\"\n",
            dir.join("s.sock"),
            containerd_socket(),
            d.namespace,
            dir.join("state"),
            dir.join("run"),
            dir.join("server.pem"),
        ),
    )
    .unwrap();
    let (status, err) = node_exit(&path);
    assert!(!status.success());
    assert!(err.contains("/nonexistent/key.pem"), "{err}");
    assert!(!dir.join("s.sock").exists(), "nothing was served");
}
