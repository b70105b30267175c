//! `computectl`: the operator CLI for one node, over its unix socket (or `--addr`).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use computed::cli::{
    self, doctor::DoctorArgs, exec::ExecArgs, image::ImageCmd, ls::LsArgs, platform,
    relay::RelayCmd, shell::ShellArgs, top::TopArgs, trash::TrashCmd, Target,
};

#[derive(Parser)]
#[command(
    name = "computectl",
    version,
    about = "Inspect and manage the sandboxes of one node",
    after_help = "Examples:\n  computectl ls\n  computectl describe 3f2a…\n  computectl exec 3f2a… -- python3 -c 'print(42)'\n  computectl shell 3f2a…\n  computectl cp ./data.csv 3f2a…:data.csv\n  computectl top\n  computectl doctor\n  computectl ns create team-a\n  computectl key create ci -n team-a --role operator\n  computectl --addr router:50051 --api-key $KEY env ls team-a"
)]
struct Args {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List sandboxes (table, -o wide, -o json).
    Ls(LsArgs),
    /// Show one sandbox.
    Describe {
        /// Sandbox id.
        id: String,
    },
    /// Run a command in a sandbox; exits with its code.
    Exec(ExecArgs),
    /// An interactive shell in a sandbox (`exec -i -t ID -- /bin/sh`).
    Shell(ShellArgs),
    /// Copy a file to or from a workspace: `cp LOCAL ID:PATH` or `cp ID:PATH LOCAL`.
    Cp {
        /// Source.
        src: String,
        /// Destination.
        dst: String,
    },
    /// Live CPU and memory per sandbox.
    Top(TopArgs),
    /// Suspend sandboxes with their memory (checkpointed to the node's disk).
    Suspend {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Resume suspended sandboxes (restored with their memory, else started afresh).
    Resume {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Destroy sandboxes (workspaces go to the trash).
    Destroy {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Delete expired soft-deleted workspaces now.
    Gc {
        /// Show what would be freed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Soft-deleted workspaces.
    Trash {
        #[command(subcommand)]
        cmd: TrashCmd,
    },
    /// Sandbox images.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// Credentials of external sandbox.v1 workers, and the attached workers.
    Relay {
        #[command(subcommand)]
        cmd: RelayCmd,
    },
    /// Platform API namespaces.
    #[command(alias = "ns")]
    Namespace {
        #[command(subcommand)]
        cmd: platform::NamespaceCmd,
    },
    /// Platform API keys (the secret is shown once, at creation).
    Key {
        #[command(subcommand)]
        cmd: platform::KeyCmd,
    },
    /// Roles of keys in namespaces (viewer < operator < admin).
    Binding {
        #[command(subcommand)]
        cmd: platform::BindingCmd,
    },
    /// Platform environments: sandbox templates of a namespace.
    Env {
        #[command(subcommand)]
        cmd: platform::EnvCmd,
    },
    /// Who the platform API sees (the key, or local-root on the unix socket) and its roles.
    Whoami,
    /// The platform API's audit log: every write and every denied call.
    Audit(platform::AuditArgs),
    /// A platform sandbox's run log: its workload's output and lifecycle markers (-f follows).
    Logs(platform::LogsArgs),
    /// A platform sandbox's state changes, until it is TERMINATED.
    Watch {
        /// Sandbox id.
        id: String,
    },
    /// Check containerd, runsc, cgroups, KVM, disk, config and the daemon.
    Doctor(DoctorArgs),
    /// Print a shell completion script.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Cmd::Completion { shell } = &args.cmd {
        clap_complete::generate(
            *shell,
            &mut Args::command(),
            "computectl",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("computectl: {e}");
            return ExitCode::FAILURE;
        }
    };
    let t = args.target;
    let res: anyhow::Result<i32> = rt.block_on(async move {
        match args.cmd {
            Cmd::Ls(a) => cli::ls::run(&t, a).await.map(|_| 0),
            Cmd::Describe { id } => cli::describe::run(&t, &id).await.map(|_| 0),
            Cmd::Exec(a) => cli::exec::run(&t, a).await,
            Cmd::Shell(a) => cli::shell::run(&t, a).await,
            Cmd::Cp { src, dst } => cli::cp::run(&t, &src, &dst).await.map(|_| 0),
            Cmd::Top(a) => cli::top::run(&t, a).await.map(|_| 0),
            Cmd::Destroy { ids } => cli::destroy::run(&t, &ids).await.map(|_| 0),
            Cmd::Suspend { ids } => cli::suspend::run(&t, &ids, false).await.map(|_| 0),
            Cmd::Resume { ids } => cli::suspend::run(&t, &ids, true).await.map(|_| 0),
            Cmd::Gc { dry_run } => cli::gc::run(&t, dry_run).await.map(|_| 0),
            Cmd::Trash { cmd } => cli::trash::run(&t, cmd).await.map(|_| 0),
            Cmd::Image { cmd } => cli::image::run(&t, cmd).await.map(|_| 0),
            Cmd::Relay { cmd } => cli::relay::run(&t, cmd).await.map(|_| 0),
            Cmd::Namespace { cmd } => platform::namespace(&t, cmd).await.map(|_| 0),
            Cmd::Key { cmd } => platform::key(&t, cmd).await.map(|_| 0),
            Cmd::Binding { cmd } => platform::binding(&t, cmd).await.map(|_| 0),
            Cmd::Env { cmd } => platform::env(&t, cmd).await.map(|_| 0),
            Cmd::Whoami => platform::whoami(&t).await.map(|_| 0),
            Cmd::Audit(a) => platform::audit(&t, a).await.map(|_| 0),
            Cmd::Logs(a) => platform::logs(&t, a).await.map(|_| 0),
            Cmd::Watch { id } => platform::watch(&t, &id).await.map(|_| 0),
            Cmd::Doctor(a) => cli::doctor::run(&t, a).await.map(|_| 0),
            Cmd::Completion { .. } => Ok(0),
        }
    });
    match res {
        Ok(code) => ExitCode::from((code & 0xff) as u8),
        Err(e) => {
            eprintln!("computectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
