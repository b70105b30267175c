//! `computed`: the node daemon (`computed node`) and its maintenance commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use computed::cli::{self, image::ImageCmd};
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

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("computed: {e}");
            return ExitCode::from(64);
        }
    };
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
            Cmd::Install(opts) => computed::install::run(&opts),
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
                cli::image::run(cmd, &cfg.containerd_socket, &cfg.namespace).await
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

async fn run_node(cfg: Config) -> anyhow::Result<()> {
    let ctr = Containerd::connect(&cfg.containerd_socket, &cfg.namespace).await?;
    let choice = runtime::choose_runtime(&cfg)?;
    tracing::info!(runtime = %choice.name, kind = ?choice.kind, "runtime selected");
    let node = Node::new(cfg, Runtime { ctr, choice });
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
    let gc = node.spawn_gc_loop();
    let meter = node.spawn_meter_loop();
    let metrics = (!node.config().metrics_listen.is_empty()).then(|| {
        let addr = node.config().metrics_listen.clone();
        tokio::spawn(async move {
            if let Err(e) = computed::metrics::serve(addr).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        })
    });
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        tracing::info!("shutting down; sandboxes keep running");
    };
    computed::server::serve(node, shutdown).await?;
    if let Some(gc) = gc {
        gc.abort();
    }
    meter.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    Ok(())
}
