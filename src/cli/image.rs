//! `computectl image ls|import|pull|alias`: the node's sandbox images, through the node daemon,
//! with a progress bar for import and pull.

use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

use super::{human_bytes, print_list, status_error, Answer, Target};
use crate::api::admin::v1 as pb;

/// Image commands.
#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// List images.
    Ls,
    /// Import an OCI image-layout tarball that is on the node.
    Import {
        /// Path of the tarball on the node.
        file: String,
        /// Name to import it under (default: the names annotated in its index).
        #[arg(long)]
        name: Option<String>,
    },
    /// Pull an image from its registry.
    Pull {
        /// The reference, e.g. `registry.example.com/team/image:tag`.
        reference: String,
    },
    /// Give an existing image another name.
    Alias {
        /// The existing name.
        existing: String,
        /// The new name.
        alias: String,
    },
}

async fn follow(
    mut s: tonic::Streaming<pb::ImageProgress>,
    what: &str,
) -> anyhow::Result<Vec<String>> {
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::new(1)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:20} [{bar:30}] {percent:>3}%")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    loop {
        match s.message().await.map_err(|e| status_error(what, e))? {
            Some(p) if p.phase == "done" => {
                bar.finish_and_clear();
                return Ok(p.names);
            }
            Some(p) => {
                bar.set_message(p.phase.clone());
                bar.set_length(p.total.max(1));
                bar.set_position(p.done);
            }
            None => anyhow::bail!("{what}: the node closed the stream early"),
        }
    }
}

/// Runs an image command.
pub async fn run(t: &Target, cmd: ImageCmd) -> anyhow::Result<()> {
    let mut admin = t.admin().await?;
    match cmd {
        ImageCmd::Ls => {
            let images = admin
                .list_images(pb::ListImagesRequest {})
                .await
                .answer("list images")?
                .images;
            print_list(
                t,
                &images,
                |i| serde_json::json!({"name": i.name, "digest": i.digest, "size": i.size}),
                &["NAME", "DIGEST", "SIZE"],
                |i| {
                    let short: String = i.digest.chars().take(19).collect();
                    vec![i.name.clone(), short, human_bytes(i.size.max(0) as u64)]
                },
            )?;
        }
        ImageCmd::Import { file, name } => {
            let path = std::fs::canonicalize(&file)
                .map(|p| p.display().to_string())
                .unwrap_or(file.clone());
            let s = admin
                .import_image(pb::ImportImageRequest {
                    path,
                    name: name.unwrap_or_default(),
                })
                .await
                .answer("import")?;
            for n in follow(s, "import").await? {
                println!("imported {n}");
            }
        }
        ImageCmd::Pull { reference } => {
            let s = admin
                .pull_image(pb::PullImageRequest { reference })
                .await
                .answer("pull")?;
            for n in follow(s, "pull").await? {
                println!("pulled {n}");
            }
        }
        ImageCmd::Alias { existing, alias } => {
            admin
                .alias_image(pb::AliasImageRequest {
                    existing: existing.clone(),
                    alias: alias.clone(),
                })
                .await
                .answer("alias")?;
            println!("{alias} -> {existing}");
        }
    }
    Ok(())
}
