//! `computectl relay token|tokens|revoke|workers`: credentials of external sandbox.v1 workers
//! and the workers attached now.

use std::io::{IsTerminal, Read};

use clap::Subcommand;

use super::{print_list, Answer, Output, Target};
use crate::api::admin::v1 as pb;

/// Relay commands.
#[derive(Debug, Subcommand)]
pub enum RelayCmd {
    /// Issue the credential of an external worker for SANDBOX_ID (replacing an earlier one)
    /// and print it, once. The worker sends it as `authorization: Bearer <token>`.
    Token {
        /// The sandbox_id the worker will attach for.
        sandbox_id: String,
        /// Install the token read from stdin instead of making one (e.g. the same credential
        /// on every node behind a router).
        #[arg(long)]
        stdin: bool,
    },
    /// List the sandbox_ids that have a credential (never the secrets).
    #[command(alias = "ls")]
    Tokens,
    /// Remove the credential of SANDBOX_ID; a worker attached with it is disconnected.
    Revoke {
        /// The sandbox_id.
        sandbox_id: String,
    },
    /// The workers attached now: in-sandbox agents and external workers, with their trust.
    Workers,
}

/// Runs a relay command.
pub async fn run(t: &Target, cmd: RelayCmd) -> anyhow::Result<()> {
    let mut admin = t.admin().await?;
    match cmd {
        RelayCmd::Token { sandbox_id, stdin } => {
            let token = if stdin {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s.trim().to_string()
            } else {
                String::new()
            };
            let r = admin
                .issue_worker_token(pb::IssueWorkerTokenRequest {
                    sandbox_id: sandbox_id.clone(),
                    token,
                })
                .await
                .answer(&format!("issue a credential for {sandbox_id}"))?;
            if t.output == Output::Json {
                println!(
                    "{}",
                    serde_json::json!({"sandbox_id": sandbox_id, "token": r.token, "replaced": r.replaced})
                );
                return Ok(());
            }
            // The token alone on stdout (scripts capture it); the advice on stderr.
            if !r.token.is_empty() {
                println!("{}", r.token);
            }
            if std::io::stderr().is_terminal() || r.token.is_empty() {
                eprintln!(
                    "{} for {sandbox_id}{}; the node keeps only its hash: it is not shown again",
                    if r.token.is_empty() {
                        "credential installed"
                    } else {
                        "credential issued"
                    },
                    if r.replaced {
                        " (the previous one no longer works)"
                    } else {
                        ""
                    },
                );
            }
        }
        RelayCmd::Tokens => {
            let tokens = admin
                .list_worker_tokens(pb::ListWorkerTokensRequest {})
                .await
                .answer("list credentials")?
                .tokens;
            print_list(
                t,
                &tokens,
                |e| serde_json::json!({"sandbox_id": e.sandbox_id, "issued_at": e.issued_at}),
                &["SANDBOX", "ISSUED"],
                |e| vec![e.sandbox_id.clone(), e.issued_at.clone()],
            )?;
        }
        RelayCmd::Revoke { sandbox_id } => {
            let r = admin
                .revoke_worker_token(pb::RevokeWorkerTokenRequest {
                    sandbox_id: sandbox_id.clone(),
                })
                .await
                .answer(&format!("revoke {sandbox_id}"))?;
            eprintln!(
                "revoked the credential of {sandbox_id}{}",
                if r.disconnected {
                    "; its worker was disconnected"
                } else {
                    ""
                }
            );
        }
        RelayCmd::Workers => {
            let workers = admin
                .list_workers(pb::ListWorkersRequest {})
                .await
                .answer("list workers")?
                .workers;
            print_list(
                t,
                &workers,
                |w| {
                    serde_json::json!({
                        "sandbox_id": w.sandbox_id, "origin": w.origin, "trust": w.trust,
                        "capacity_max": w.capacity_max, "inflight": w.inflight,
                        "labels": w.labels, "capabilities": w.capabilities,
                        "image": w.image, "arch": w.arch, "attached_at": w.attached_at,
                    })
                },
                &["SANDBOX", "ORIGIN", "TRUST", "INFLIGHT", "ATTACHED"],
                |w| {
                    vec![
                        w.sandbox_id.clone(),
                        w.origin.clone(),
                        w.trust.clone(),
                        format!("{}/{}", w.inflight, w.capacity_max),
                        w.attached_at.clone(),
                    ]
                },
            )?;
        }
    }
    Ok(())
}
