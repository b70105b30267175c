//! `computed router` processes for tests: a static node list, a log file, restartable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use computed::api::compute::v1::compute_service_client::ComputeServiceClient;
use tonic::transport::Channel;

/// The router's flags read from the environment, removed so that the test's flags are all of
/// its configuration.
pub const ROUTER_ENV: &[&str] = &[
    "COMPUTE_ROUTER_LISTEN",
    "COMPUTE_NODES",
    "COMPUTE_NODE_NAMESPACE",
    "COMPUTE_NODE_SELECTOR",
    "COMPUTE_ROUTER_NODE_TLS_CA",
    "COMPUTE_ROUTER_NODE_TLS_CERT",
    "COMPUTE_ROUTER_NODE_TLS_KEY",
    "COMPUTE_ROUTER_NODE_TLS_SERVER_NAME",
    "COMPUTE_ROUTER_TLS_CERT",
    "COMPUTE_ROUTER_TLS_KEY",
    "COMPUTE_ROUTER_TLS_CLIENT_CA",
];

/// A running `computed router`.
pub struct RouterProc {
    child: Option<Child>,
    /// Its listen address.
    pub addr: String,
    nodes: String,
    extra: Vec<String>,
    /// Its log (stderr, appended across restarts).
    pub log: PathBuf,
}

/// `computed router` with none of the router's environment variables.
pub fn router_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_computed"));
    for k in ROUTER_ENV {
        c.env_remove(k);
    }
    c
}

impl RouterProc {
    /// A router over the comma-separated `nodes`, logging to `dir/router-NAME.log`.
    pub fn start(nodes: &str, dir: &Path, name: &str) -> Self {
        Self::start_with(nodes, dir, name, &[])
    }

    /// Like [`RouterProc::start`], with extra flags.
    pub fn start_with(nodes: &str, dir: &Path, name: &str, extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut r = RouterProc {
            child: None,
            addr: format!("127.0.0.1:{port}"),
            nodes: nodes.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            log: dir.join(format!("router-{name}.log")),
        };
        r.spawn();
        r
    }

    /// Starts (or restarts) the process and waits until it listens.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = router_command()
            .args([
                "router",
                "--listen",
                &self.addr,
                "--nodes",
                &self.nodes,
                "--metrics-listen",
                "",
            ])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&self.addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("router exited with {status}; log:\n{}", self.log_text());
            }
            assert!(Instant::now() < deadline, "router did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// Kills the process.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A plaintext ComputeService client.
    pub async fn client(&self) -> ComputeServiceClient<Channel> {
        let ch = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        ComputeServiceClient::new(ch)
    }

    /// Waits until the router has polled every node once.
    pub async fn wait_nodes(&self) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- router log {} ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}
