//! `image import|alias|ls`: manage the node's sandbox images directly in containerd.

use std::path::PathBuf;

use clap::Subcommand;

use crate::runtime::{image, Containerd};

/// Image commands.
#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Import an OCI image-layout tarball (plain or gzip).
    Import {
        /// The tarball.
        file: PathBuf,
        /// Name to import it under (default: the names annotated in its index).
        #[arg(long)]
        name: Option<String>,
    },
    /// Pull an image from its registry.
    Pull {
        /// The reference, e.g. `registry.example.com/team/image:tag`.
        reference: String,
        /// Reach this registry (`host:port`) over plain HTTP.
        #[arg(long)]
        insecure: Vec<String>,
    },
    /// Give an existing image another name.
    Alias {
        /// The existing name.
        existing: String,
        /// The new name.
        alias: String,
    },
    /// List images.
    Ls,
}

/// Runs an image command against containerd at `socket` in `namespace`.
pub async fn run(cmd: ImageCmd, socket: &std::path::Path, namespace: &str) -> anyhow::Result<()> {
    let ctr = Containerd::connect(socket, namespace).await?;
    match cmd {
        ImageCmd::Import { file, name } => {
            let started = std::time::Instant::now();
            let names = image::import_tar(&ctr, &file, name.as_deref()).await?;
            for n in names {
                println!("imported {n} ({:.1}s)", started.elapsed().as_secs_f64());
            }
        }
        ImageCmd::Pull {
            reference,
            insecure,
        } => {
            let started = std::time::Instant::now();
            image::pull(&ctr, &reference, &insecure).await?;
            println!(
                "pulled {reference} ({:.1}s)",
                started.elapsed().as_secs_f64()
            );
        }
        ImageCmd::Alias { existing, alias } => {
            image::alias(&ctr, &existing, &alias).await?;
            println!("{alias} -> {existing}");
        }
        ImageCmd::Ls => {
            println!("{:<60} {:<20} {:>8}", "NAME", "DIGEST", "SIZE");
            for i in image::list(&ctr).await? {
                let short: String = i.digest.chars().take(19).collect();
                println!("{:<60} {:<20} {:>8}", i.name, short, i.size);
            }
        }
    }
    Ok(())
}
