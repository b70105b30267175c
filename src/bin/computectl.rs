//! `computectl`: the operator CLI for one node.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use computed::cli::{self, image::ImageCmd, trash::TrashCmd};

#[derive(Parser)]
#[command(
    name = "computectl",
    version,
    about = "Inspect and manage the sandboxes of one node"
)]
struct Args {
    /// containerd socket.
    #[arg(
        long,
        global = true,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    containerd: PathBuf,
    /// The node's state directory (workspaces and their tombstones).
    #[arg(
        long,
        global = true,
        env = "COMPUTE_STATE_DIR",
        default_value = "/var/lib/compute"
    )]
    state_dir: PathBuf,
    /// containerd namespace.
    #[arg(
        long,
        global = true,
        env = "COMPUTE_NAMESPACE",
        default_value = "compute"
    )]
    namespace: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Soft-deleted workspaces, until GC.
    Trash {
        #[command(subcommand)]
        cmd: TrashCmd,
    },
    /// Manage sandbox images.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    cli::init_tracing(false);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("computectl: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(async move {
        match args.cmd {
            Cmd::Image { cmd } => cli::image::run(cmd, &args.containerd, &args.namespace).await,
            Cmd::Trash { cmd } => cli::trash::run(cmd, &args.state_dir),
        }
    });
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("computectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
