//! `computed`: the node daemon (`computed node`) and its maintenance commands.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use computed::cli::{self, local_image::ImageCmd};
use computed::config::Config;
use computed::node::Node;
use computed::runtime::{self, Containerd, Runtime};

#[derive(Parser)]
#[command(name = "computed", version, about = "gVisor compute service daemon")]
struct Args {
    /// Config file (TOML); environment variables override it.
    #[arg(long, global = true, env = "COMPUTE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the node daemon in the foreground.
    Node,
    /// Hold a sandbox agent's FIFOs open (a writer on its input, a reader on its output)
    /// until the shim closes them (internal).
    #[command(hide = true)]
    FifoHold {
        /// The agent's input FIFO.
        input: PathBuf,
        /// The agent's output FIFO.
        output: PathBuf,
    },
    /// Join the host's namespaces and the given cgroups, then exec a command: the second half
    /// of `computed install --restart-mode reexec` (internal).
    #[command(hide = true)]
    InstallExec(computed::install::ExecArgs),
    /// Run the stateless cluster router in the foreground.
    Router(Box<RouterArgs>),
    /// Install runsc on the host and register it with containerd (the DaemonSet's init step).
    Install(computed::install::InstallOpts),
    /// One garbage-collection pass over expired soft-deleted workspaces (for a CronJob).
    Gc {
        /// Report what would be freed without deleting.
        #[arg(long)]
        dry_run: bool,
    },
    /// Manage sandbox images in the node's containerd.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
}

#[derive(clap::Args)]
struct RouterArgs {
    /// Address to serve ComputeService on.
    #[arg(long, env = "COMPUTE_ROUTER_LISTEN", default_value = "0.0.0.0:50051")]
    listen: String,
    /// Static node list (`host:port,host:port`); without it, nodes come from Kubernetes.
    #[arg(long, env = "COMPUTE_NODES", value_delimiter = ',')]
    nodes: Vec<String>,
    /// Namespace of the node DaemonSet's pods.
    #[arg(long, env = "COMPUTE_NODE_NAMESPACE", default_value = "compute-system")]
    namespace: String,
    /// Label selector of the node DaemonSet's pods.
    #[arg(
        long,
        env = "COMPUTE_NODE_SELECTOR",
        default_value = "app.kubernetes.io/name=computed-node"
    )]
    selector: String,
    /// Also watch Kubernetes Nodes: pods on cordoned nodes take no new sandboxes (needs
    /// get/list/watch on nodes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    watch_nodes: bool,
    /// The nodes' ComputeService port.
    #[arg(long, default_value_t = 50051)]
    node_port: u16,
    /// Prometheus metrics address; empty disables.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_listen: String,
    /// PEM CA bundle the nodes' certificates are verified against. Set, nodes are dialed with
    /// TLS (https) and never in plaintext; alone, server-verified TLS.
    #[arg(long, env = "COMPUTE_ROUTER_NODE_TLS_CA", value_parser = maybe_path)]
    node_tls_ca: Option<PathBuf>,
    /// PEM client certificate presented to the nodes (mutual TLS); needs --node-tls-key and
    /// --node-tls-ca.
    #[arg(long, env = "COMPUTE_ROUTER_NODE_TLS_CERT", value_parser = maybe_path)]
    node_tls_cert: Option<PathBuf>,
    /// PEM private key of --node-tls-cert.
    #[arg(long, env = "COMPUTE_ROUTER_NODE_TLS_KEY", value_parser = maybe_path)]
    node_tls_key: Option<PathBuf>,
    /// Verify every node's certificate against this DNS name (or IP) instead of the host it is
    /// dialed at (the pod IP under Kubernetes discovery).
    #[arg(long, env = "COMPUTE_ROUTER_NODE_TLS_SERVER_NAME")]
    node_tls_server_name: Option<String>,
    /// Where the platform API's records live: `kube` (PlatformRecord objects in --namespace,
    /// shared by every replica) or the path of an embedded database file (one replica only).
    /// Default: `kube` under Kubernetes discovery, /var/lib/computed-router/platform.redb with
    /// --nodes.
    #[arg(long, env = "COMPUTE_ROUTER_PLATFORM_STORE")]
    platform_store: Option<String>,
    /// A file holding the secret the router shares with its nodes (their `platform_peer_secret`):
    /// the router checks every platform call itself and hands the node the principal it found
    /// with this secret. Empty: nodes check the caller's key against their own records.
    #[arg(long, env = "COMPUTE_ROUTER_PLATFORM_PEER_SECRET", value_parser = maybe_path)]
    platform_peer_secret: Option<PathBuf>,
    /// A unix socket serving the same as --listen, where uid 0 or the router's own uid is the
    /// platform API's admin (how the first namespace and key are made); empty: none.
    #[arg(
        long,
        env = "COMPUTE_ROUTER_SOCKET",
        default_value = "/run/compute/router.sock"
    )]
    socket: PathBuf,
    /// PEM certificate chain of the router's own listener; with --tls-key it serves TLS.
    #[arg(long, env = "COMPUTE_ROUTER_TLS_CERT", value_parser = maybe_path)]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "COMPUTE_ROUTER_TLS_KEY", value_parser = maybe_path)]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle: callers must present a certificate signed by it (mutual TLS; needs
    /// --tls-cert and --tls-key).
    #[arg(long, env = "COMPUTE_ROUTER_TLS_CLIENT_CA", value_parser = maybe_path)]
    tls_client_ca: Option<PathBuf>,
    /// Where the router's preview proxy listens (plain HTTP/1.1 and HTTP/2 behind the TLS
    /// ingress of `*.{--preview-domain}`); empty: no preview proxy.
    #[arg(long, env = "COMPUTE_ROUTER_PREVIEW_LISTEN", default_value = "")]
    preview_listen: String,
    /// The preview domain, as the nodes' `[preview] domain`.
    #[arg(long, env = "COMPUTE_ROUTER_PREVIEW_DOMAIN", default_value = "")]
    preview_domain: String,
    /// The nodes' preview listener port (their `[preview] listen`).
    #[arg(long, env = "COMPUTE_ROUTER_NODE_PREVIEW_PORT", default_value_t = 8088)]
    node_preview_port: u16,
}

/// A path flag that may be empty: an environment variable set to "" (e.g. by an overlay
/// turning TLS off) counts as unset.
fn maybe_path(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// What the router's flags name, read and checked before anything starts.
struct RouterSetup {
    node_tls: Option<computed::router::tls::NodeTls>,
    listener_tls: Option<tonic::transport::ServerTlsConfig>,
    /// The `--nodes` list (empty: Kubernetes discovery).
    static_nodes: computed::router::NodeSet,
}

impl RouterSetup {
    fn load(a: &RouterArgs) -> Result<Self, computed::router::tls::Error> {
        use computed::router::{discovery, tls};
        let node_tls = tls::NodeTls::load(
            a.node_tls_ca.as_deref(),
            a.node_tls_cert.as_deref(),
            a.node_tls_key.as_deref(),
            a.node_tls_server_name.as_deref(),
        )?;
        let listener_tls = tls::listener(
            a.tls_cert.as_deref(),
            a.tls_key.as_deref(),
            a.tls_client_ca.as_deref(),
        )?;
        let static_nodes = discovery::static_nodes(&a.nodes, tls::scheme(node_tls.as_ref()))?;
        Ok(Self {
            node_tls,
            listener_tls,
            static_nodes,
        })
    }
}

/// Opens `output` read-write (so the shim's writer never lacks a reader, even while the daemon
/// restarts) and `input` for writing (waiting for the shim to open it), then sleeps until the
/// shim closes `input`.
fn fifo_hold(input: &std::path::Path, output: &std::path::Path) -> ExitCode {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let Ok(_out) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(output)
    else {
        return ExitCode::FAILURE;
    };
    // The agent's stderr: drained into agent.log beside the FIFOs.
    let errf = output.with_file_name("err");
    if let Ok(mut e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&errf)
    {
        let log = output.with_file_name("agent.log");
        std::thread::spawn(move || {
            if let Ok(mut l) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
            {
                let _ = std::io::copy(&mut e, &mut l);
            }
        });
    }
    // Wait for the shim to open its end (non-blocking opens fail with ENXIO until then); give
    // up after a minute: the task never came. When the reader goes away, wait again the same
    // way: after a daemon crash the shim of a cut-short Tasks.Create may be the reader, and the
    // retried Create's shim (which needs our reader on `output`) comes only after it is gone.
    use std::os::unix::fs::OpenOptionsExt;
    let mut held = false;
    loop {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let f = loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
                .open(input)
            {
                Ok(f) => break f,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50))
                }
                Err(_) if held => return ExitCode::SUCCESS,
                Err(_) => return ExitCode::FAILURE,
            }
        };
        held = true;
        loop {
            let mut fds = [PollFd::new(f.as_fd(), PollFlags::empty())];
            match poll(&mut fds, PollTimeout::from(1000u16)) {
                Ok(_) => {
                    let ev = fds[0].revents().unwrap_or(PollFlags::empty());
                    if ev.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
                    {
                        break;
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return ExitCode::FAILURE,
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Cmd::FifoHold { input, output } = &args.cmd {
        return fifo_hold(input, output);
    }
    // Before any thread starts: it joins a mount namespace.
    if let Cmd::InstallExec(a) = &args.cmd {
        eprintln!(
            "computed install-exec: {}",
            computed::install::exec_in_host(a)
        );
        return ExitCode::from(127);
    }
    let cfg = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("computed: {e}");
            return ExitCode::from(64);
        }
    };
    // The router's TLS files and node list: a bad one is one line and exit 64, before any port
    // is bound (as a bad node config).
    let mut router = None;
    if let Cmd::Router(a) = &args.cmd {
        match RouterSetup::load(a) {
            Ok(s) => router = Some(s),
            Err(e) => {
                eprintln!("computed: {e}");
                return ExitCode::from(64);
            }
        }
    }
    cli::init_tracing(cfg.log_json);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("computed: tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(async move {
        match args.cmd {
            Cmd::Node => run_node(cfg).await,
            Cmd::Router(args) => match router {
                Some(setup) => run_router(*args, setup).await,
                None => Ok(()), // loaded above for every router command
            },
            Cmd::Install(opts) => computed::install::run(&opts),
            Cmd::FifoHold { .. } | Cmd::InstallExec(_) => Ok(()),
            Cmd::Gc { dry_run } => {
                let dir = cfg.state_dir.clone();
                let freed = tokio::task::spawn_blocking(move || {
                    computed::node::gc::pass(&dir, std::time::SystemTime::now(), dry_run)
                })
                .await?;
                for f in &freed {
                    println!(
                        "{} {} tenant={} bytes={}",
                        if dry_run { "would free" } else { "freed" },
                        f.id,
                        f.tenant_id,
                        f.bytes
                    );
                }
                println!("{} workspace(s)", freed.len());
                Ok(())
            }
            Cmd::Image { cmd } => {
                cli::local_image::run(cmd, &cfg.containerd_socket, &cfg.namespace).await
            }
        }
    });
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("computed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down");
}

/// The platform API over PlatformRecord objects in `namespace`.
async fn kube_platform(namespace: &str) -> anyhow::Result<computed::platform::service::Platform> {
    let client = kube::Client::try_default().await?;
    tracing::info!(%namespace, "platform records in Kubernetes (PlatformRecord)");
    Ok(computed::platform::service::Platform::new(
        computed::platform::kube_store::shared(client, namespace),
    ))
}

/// The platform API over the embedded database at `path`.
async fn embedded_platform(path: PathBuf) -> anyhow::Result<computed::platform::service::Platform> {
    tracing::info!(path = %path.display(), "platform records in an embedded database");
    computed::platform::service::Platform::embedded(path.clone())
        .await
        .map_err(|e| anyhow::anyhow!("platform store {}: {e}", path.display()))
}

/// Binds the preview proxy on `listen` (a port taken is an error at start) and serves it with
/// `routes` among `tasks` until `stop`: the node's and the router's, which differ by routes.
async fn serve_preview(
    listen: &str,
    routes: Arc<dyn computed::preview::proxy::Routes>,
    settings: computed::preview::proxy::Settings,
    tasks: &computed::tasks::Tasks,
    stop: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("bind the preview proxy on {listen}: {e}"))?;
    tracing::info!(addr = %listen, "serving preview URLs");
    tasks.spawn(computed::preview::proxy::serve(
        listener,
        routes,
        settings,
        stop.clone(),
    ));
    Ok(())
}

async fn run_router(args: RouterArgs, setup: RouterSetup) -> anyhow::Result<()> {
    use computed::router::{discovery, service, tls, Router, Settings};
    match &setup.node_tls {
        Some(t) => tracing::info!(
            mutual = t.is_mutual(),
            server_name = t.server_name().unwrap_or("(the dialed host)"),
            "dialing nodes with TLS"
        ),
        None => tracing::info!("dialing nodes in plaintext (no --node-tls-ca)"),
    }
    let (nodes, watch_task) = if args.nodes.is_empty() {
        let client = kube::Client::try_default().await?;
        let (rx, task) = discovery::watch_pods(
            client,
            &args.namespace,
            &args.selector,
            args.node_port,
            tls::scheme(setup.node_tls.as_ref()),
            args.watch_nodes,
        );
        tracing::info!(namespace = %args.namespace, selector = %args.selector, "discovering nodes through Kubernetes");
        (rx, Some(task))
    } else {
        let set = setup.static_nodes;
        tracing::info!(nodes = set.len(), "static node list");
        let (tx, rx) = tokio::sync::watch::channel(set);
        // Keep the sender alive for the router's lifetime: the set never changes.
        std::mem::forget(tx);
        (rx, None)
    };
    let router = Router::new(
        nodes,
        Settings {
            node_tls: setup.node_tls,
            ..Settings::default()
        },
    );
    router.spawn_health_loop();
    if !args.metrics_listen.is_empty() {
        let addr = args.metrics_listen.clone();
        router.tasks().spawn(async move {
            if let Err(e) = computed::metrics::serve(addr).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
    }
    let platform = match args.platform_store.as_deref() {
        Some("kube") => kube_platform(&args.namespace).await?,
        None if args.nodes.is_empty() => kube_platform(&args.namespace).await?,
        Some(path) => embedded_platform(PathBuf::from(path)).await?,
        None => embedded_platform(PathBuf::from("/var/lib/computed-router/platform.redb")).await?,
    };
    let platform = match args.platform_peer_secret.as_deref() {
        Some(p) if !p.as_os_str().is_empty() => {
            platform.with_peer_secret(&computed::platform::keys::read_secret(p)?)
        }
        _ => platform,
    }
    .with_sandboxes(computed::platform::sandboxes::Backend::Cluster(Arc::new(
        router.clone(),
    )));
    let preview_stop = tokio_util::sync::CancellationToken::new();
    if !args.preview_listen.is_empty() {
        anyhow::ensure!(
            !args.preview_domain.trim_end_matches('.').is_empty(),
            "--preview-listen needs --preview-domain (the nodes' [preview] domain)"
        );
        tracing::info!(domain = %args.preview_domain, node_port = args.node_preview_port,
                       "preview URLs routed to the owning nodes");
        let routes = Arc::new(computed::router::preview::Routes::new(
            router.clone(),
            &args.preview_domain,
            args.node_preview_port,
        ));
        serve_preview(
            &args.preview_listen,
            routes,
            computed::preview::proxy::Settings::default(),
            router.tasks(),
            &preview_stop,
        )
        .await?;
    }
    let tasks = router.tasks().clone();
    let at = service::Listeners {
        listen: args.listen.clone(),
        tls: setup.listener_tls,
        socket: (!args.socket.as_os_str().is_empty()).then(|| args.socket.clone()),
    };
    service::serve(router, at, platform, shutdown_signal()).await?;
    preview_stop.cancel();
    if let Some(t) = watch_task {
        t.abort();
    }
    if !tasks.shutdown(std::time::Duration::from_secs(5)).await {
        tracing::warn!(
            tasks = tasks.len(),
            "some router tasks did not stop in time"
        );
    }
    Ok(())
}

async fn run_node(cfg: Config) -> anyhow::Result<()> {
    // Unreadable or unparsable TLS files stop the node before it touches anything.
    if let Some(tls) = computed::server::tls_config(&cfg)? {
        computed::server::check_server_tls(&tls)?;
    }
    let ctr = Containerd::connect(&cfg.containerd_socket, &cfg.namespace).await?;
    let choice = runtime::choose_runtime(&cfg)?;
    tracing::info!(runtime = %choice.name, kind = ?choice.kind, "runtime selected");
    if cfg.egress.is_some() && choice.kind == computed::config::RuntimeKind::RunscShim {
        anyhow::bail!(
            "[egress] needs runtime = \"runc-wrapper\": with gVisor's shim every sandbox gets \
             the network flag of its one TOML (networks per sandbox come with a second TOML)"
        );
    }
    // A preview signing key that cannot be read stops the node before it serves.
    if let Some(p) = &cfg.preview {
        computed::preview::token::Signer::from_file(&p.signing_key_file)?;
    }
    let images = runtime::ImagePolicy {
        pull_missing: cfg.pull_missing,
        insecure_registries: cfg.insecure_registries.clone(),
    };
    let node = Node::new(cfg, Arc::new(Runtime::new(ctr, choice, images)));
    // containerd may still be starting: retry recovery for a while before giving up.
    let mut tries = 0;
    let n = loop {
        match node.recover().await {
            Ok(n) => break n,
            Err(e) if tries < 30 => {
                tries += 1;
                tracing::warn!(error = %e, "recovery failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    tracing::info!(sandboxes = n, "recovered state from containerd");
    node.start_background();
    if !node.config().metrics_listen.is_empty() {
        let addr = node.config().metrics_listen.clone();
        node.tasks().spawn(async move {
            if let Err(e) = computed::metrics::serve(addr).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
    }
    let preview_stop = tokio_util::sync::CancellationToken::new();
    if let Some((listen, settings)) = node.preview_proxy_settings() {
        let routes = Arc::new(computed::node::preview::Routes(node.clone()));
        serve_preview(&listen, routes, settings, node.tasks(), &preview_stop).await?;
    }
    computed::server::serve(node.clone(), shutdown_signal()).await?;
    preview_stop.cancel();
    // Execs were cancelled when the signal came: they get their grace to stop.
    let grace = std::time::Duration::from_secs(node.config().cancel_grace_secs + 5);
    if !node.shutdown(grace).await {
        tracing::warn!(
            tasks = node.tasks().len(),
            "some tasks did not stop in time"
        );
    }
    tracing::info!("sandboxes keep running");
    Ok(())
}
