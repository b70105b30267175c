//! `computed router` processes for tests: a static node list, a log file, restartable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use computed::api::compute::v1::compute_service_client::ComputeServiceClient;
use tonic::transport::Channel;

use super::{append_log, channel, free_addr, kill_child, wait_listening};

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
    "COMPUTE_ROUTER_PLATFORM_STORE",
    "COMPUTE_ROUTER_SOCKET",
    "COMPUTE_ROUTER_PREVIEW_LISTEN",
    "COMPUTE_ROUTER_PREVIEW_DOMAIN",
    "COMPUTE_ROUTER_NODE_PREVIEW_PORT",
];

/// `router --listen LISTEN --nodes NODES --metrics-listen "" --platform-store DB --socket SOCK`:
/// the arguments of every router the tests start (no metrics listener; its platform records
/// and unix socket in a directory of its own, named after its listen address, so that
/// routers side by side never share the database file or the socket).
pub fn router_args(listen: &str, nodes: &str) -> Vec<String> {
    let dir = router_dir(listen);
    let _ = std::fs::create_dir_all(&dir);
    [
        "router",
        "--listen",
        listen,
        "--nodes",
        nodes,
        "--metrics-listen",
        "",
        "--platform-store",
        &dir.join("platform.redb").display().to_string(),
        "--socket",
        &dir.join("router.sock").display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// The directory of the router listening on `listen`: its records and its socket.
fn router_dir(listen: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "computed-test-router-{}",
        listen.replace([':', '.', '/'], "_")
    ))
}

/// The platform socket of the router listening on `listen` (see [`router_args`]).
pub fn router_socket(listen: &str) -> PathBuf {
    router_dir(listen).join("router.sock")
}

/// The value of `--flag V` or `--flag=V` in `args`.
pub fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(&eq)
        }
    })
}

/// The binary accepts the router's `args` (clap exits 2 on an unknown flag), TLS flags
/// included. No cluster here: with no kubeconfig and no in-cluster environment the router
/// stops at Kubernetes discovery, after clap has accepted (or refused) every flag. `what`
/// names the manifests in the message.
pub fn assert_router_args_accepted(args: &[String], what: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_computed"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("COMPUTE_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(2),
        "{what}: router args refused: {err}"
    );
    assert!(
        !err.contains("Usage:"),
        "{what}: router args refused: {err}"
    );
}

/// A running `computed router`.
pub struct RouterProc {
    child: Option<Child>,
    /// Its listen address.
    pub addr: String,
    nodes: String,
    extra: Vec<String>,
    env: Vec<(String, String)>,
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
        Self::start_env(nodes, dir, name, extra, &[])
    }

    /// Like [`RouterProc::start_with`], with environment variables for the process.
    pub fn start_env(
        nodes: &str,
        dir: &Path,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut r = RouterProc {
            child: None,
            addr: free_addr(),
            nodes: nodes.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: dir.join(format!("router-{name}.log")),
        };
        r.spawn();
        r
    }

    /// Starts (or restarts) the process and waits until it listens.
    pub fn spawn(&mut self) {
        let log = append_log(&self.log);
        let mut child = router_command()
            .args(router_args(&self.addr, &self.nodes))
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_listening(&self.addr, Duration::from_secs(20), "router", || {
            let status = child.try_wait().ok()??;
            Some(format!(
                "router exited with {status}; log:\n{}",
                self.log_text()
            ))
        });
        self.child = Some(child);
    }

    /// Kills the process.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A plaintext ComputeService client.
    pub async fn client(&self) -> ComputeServiceClient<Channel> {
        ComputeServiceClient::new(channel(&self.addr).await)
    }

    /// Its unix socket (where this test process, root, is the platform admin).
    pub fn socket(&self) -> PathBuf {
        router_socket(&self.addr)
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
