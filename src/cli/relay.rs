//! `computectl relay token|tokens|revoke|workers`: credentials of external sandbox.v1 workers
//! and the workers attached now.

use std::io::{IsTerminal, Read};

use clap::Subcommand;

use super::{status_error, table, Output, Target};
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
                .map_err(|s| status_error(&format!("issue a credential for {sandbox_id}"), s))?
                .into_inner();
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
                .map_err(|s| status_error("list credentials", s))?
                .into_inner()
                .tokens;
            if t.output == Output::Json {
                let v: Vec<_> = tokens
                    .iter()
                    .map(|e| serde_json::json!({"sandbox_id": e.sandbox_id, "issued_at": e.issued_at}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = tokens
                .iter()
                .map(|e| vec![e.sandbox_id.clone(), e.issued_at.clone()])
                .collect();
            table(&["SANDBOX", "ISSUED"], &rows);
        }
        RelayCmd::Revoke { sandbox_id } => {
            let r = admin
                .revoke_worker_token(pb::RevokeWorkerTokenRequest {
                    sandbox_id: sandbox_id.clone(),
                })
                .await
                .map_err(|s| status_error(&format!("revoke {sandbox_id}"), s))?
                .into_inner();
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
                .map_err(|s| status_error("list workers", s))?
                .into_inner()
                .workers;
            if t.output == Output::Json {
                let v: Vec<_> = workers
                    .iter()
                    .map(|w| {
                        serde_json::json!({
                            "sandbox_id": w.sandbox_id, "origin": w.origin, "trust": w.trust,
                            "capacity_max": w.capacity_max, "inflight": w.inflight,
                            "labels": w.labels, "capabilities": w.capabilities,
                            "image": w.image, "arch": w.arch, "attached_at": w.attached_at,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = workers
                .iter()
                .map(|w| {
                    vec![
                        w.sandbox_id.clone(),
                        w.origin.clone(),
                        w.trust.clone(),
                        format!("{}/{}", w.inflight, w.capacity_max),
                        w.attached_at.clone(),
                    ]
                })
                .collect();
            table(
                &["SANDBOX", "ORIGIN", "TRUST", "INFLIGHT", "ATTACHED"],
                &rows,
            );
        }
    }
    Ok(())
}
