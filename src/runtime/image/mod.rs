//! Images: import of OCI image-layout tarballs, unpacking through containerd's snapshot and diff
//! services, aliases, and resolving an image name to the snapshot a sandbox starts from.
//!
//! containerd 1.6 has no server-side import, so the client does what `ctr import` does: write
//! the blobs (Content.Write) with the garbage-collection labels that tie manifest → config →
//! layers → snapshot together, create the image record, and unpack each layer
//! (Snapshots.Prepare → Diff.Apply → Snapshots.Commit under the layer's chain id), all inside a
//! lease so nothing is collected half-way.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use containerd_client::types::Descriptor;
use serde::Deserialize;
use sha2::{Digest, Sha256};

mod store;

use super::containerd::{self, Containerd, SNAPSHOTTER};
pub use store::{import_tar, import_tar_with, pull, pull_with};

const MT_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MT_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Errors of image handling.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image is not known to containerd.
    #[error("image {0} not found")]
    NotFound(String),
    /// The tarball or a blob in it is malformed.
    #[error("invalid image {what}: {why}")]
    Invalid {
        /// Which image or file.
        what: String,
        /// What is wrong.
        why: String,
    },
    /// Reading the tarball failed.
    #[error("read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Pulling from a registry failed.
    #[error("pull {reference}: {why}")]
    Pull {
        /// The reference.
        reference: String,
        /// What went wrong.
        why: String,
    },
    /// A containerd call failed.
    #[error(transparent)]
    Containerd(#[from] containerd::Error),
}

type Result<T> = std::result::Result<T, Error>;

fn invalid(what: &str, why: impl std::fmt::Display) -> Error {
    Error::Invalid {
        what: what.to_string(),
        why: why.to_string(),
    }
}

#[derive(Debug, Deserialize, Clone)]
struct OciDescriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize, Clone)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<OciDescriptor>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    config: OciDescriptor,
    layers: Vec<OciDescriptor>,
}

#[derive(Debug, Deserialize)]
struct ImageConfig {
    #[serde(default)]
    config: Option<ContainerConfig>,
    rootfs: RootFs,
}

#[derive(Debug, Deserialize, Default, Clone)]
struct ContainerConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// What a sandbox needs to know of its image.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// The name the image was resolved by.
    pub name: String,
    /// The chain id of the top layer: the parent snapshot of the sandbox's rootfs.
    pub chain_id: String,
    /// The image's default environment.
    pub env: Vec<String>,
    /// The image's ENTRYPOINT then CMD (the platform's last resort for a workload's argv).
    pub argv: Vec<String>,
    /// The image's WorkingDir (empty: none).
    pub working_dir: String,
    /// The digest of the image record's target (manifest or index): the same image under
    /// another name has the same one, a re-imported image another.
    pub digest: String,
}

/// An image as listed to operators.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageInfo {
    /// The image name.
    pub name: String,
    /// The digest of its target (manifest or index).
    pub digest: String,
    /// The size of the target blob.
    pub size: i64,
}

fn to_descriptor(d: &OciDescriptor) -> Descriptor {
    Descriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.clone(),
        size: d.size,
        annotations: d.annotations.clone(),
    }
}

fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// The chain ids of a stack of layers given their diff ids (OCI image spec).
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(prev) => sha256_digest(format!("{prev} {d}").as_bytes()),
        };
        out.push(next);
    }
    out
}

fn is_index(media_type: &str) -> bool {
    media_type == MT_OCI_INDEX || media_type == MT_DOCKER_LIST
}

fn pick_platform(manifests: &[OciDescriptor], what: &str) -> Result<OciDescriptor> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_none_or(|p| p.os == "linux" && p.architecture == arch)
        })
        .cloned()
        .ok_or_else(|| invalid(what, format!("no manifest for linux/{arch}")))
}

/// Blobs by digest.
type Blobs = HashMap<String, Vec<u8>>;

/// Reports import/pull progress: (phase, done, total).
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + Send + Sync);

fn no_progress(_: &str, _: u64, _: u64) {}

fn blob(blobs: &Blobs, digest: &str) -> Result<Vec<u8>> {
    let data = blobs
        .get(digest)
        .cloned()
        .ok_or_else(|| invalid(digest, "blob missing"))?;
    let actual = sha256_digest(&data);
    if actual != digest {
        return Err(invalid(digest, format!("content digest is {actual}")));
    }
    Ok(data)
}

/// What an image name points at (NotFound for a name containerd does not know).
async fn target(ctr: &Containerd, name: &str) -> Result<Descriptor> {
    let image = match ctr.get_image(name).await {
        Ok(i) => i,
        Err(e) if e.is_not_found() => return Err(Error::NotFound(name.to_string())),
        Err(e) => return Err(e.into()),
    };
    image
        .target
        .ok_or_else(|| invalid(name, "image record has no target"))
}

/// Resolves an image name to the snapshot its sandboxes start from.
pub async fn resolve(ctr: &Containerd, name: &str) -> Result<ResolvedImage> {
    let target = target(ctr, name).await?;
    let digest = target.digest.clone();
    let mut manifest_digest = target.digest.clone();
    if is_index(&target.media_type) {
        let raw = ctr.read_content(&target.digest).await?;
        let idx: Index = serde_json::from_slice(&raw).map_err(|e| invalid(name, e))?;
        manifest_digest = pick_platform(&idx.manifests, name)?.digest;
    }
    let manifest: Manifest = serde_json::from_slice(&ctr.read_content(&manifest_digest).await?)
        .map_err(|e| invalid(name, e))?;
    let config: ImageConfig =
        serde_json::from_slice(&ctr.read_content(&manifest.config.digest).await?)
            .map_err(|e| invalid(name, e))?;
    let chain_id = chain_ids(&config.rootfs.diff_ids)
        .pop()
        .ok_or_else(|| invalid(name, "image has no layers"))?;
    if !ctr.snapshot_exists(&chain_id).await? {
        return Err(invalid(name, "image is not unpacked; import it again"));
    }
    let cc = config.config.unwrap_or_default();
    Ok(ResolvedImage {
        name: name.to_string(),
        chain_id,
        env: cc.env.unwrap_or_default(),
        argv: cc
            .entrypoint
            .unwrap_or_default()
            .into_iter()
            .chain(cc.cmd.unwrap_or_default())
            .collect(),
        working_dir: cc.working_dir.unwrap_or_default(),
        digest,
    })
}

/// Gives an existing image another name.
pub async fn alias(ctr: &Containerd, existing: &str, alias: &str) -> Result<()> {
    let target = target(ctr, existing).await?;
    ctr.put_image(alias, target, None).await?;
    Ok(())
}

/// Lists the images of the namespace.
pub async fn list(ctr: &Containerd) -> Result<Vec<ImageInfo>> {
    Ok(ctr
        .list_images()
        .await?
        .into_iter()
        .map(|i| {
            let t = i.target.unwrap_or_default();
            ImageInfo {
                name: i.name,
                digest: t.digest,
                size: t.size,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_oci_rule() {
        let a = "sha256:aaaa".to_string();
        let b = "sha256:bbbb".to_string();
        let ids = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ids[0], a);
        assert_eq!(ids[1], sha256_digest(format!("{a} {b}").as_bytes()));
        assert!(chain_ids(&[]).is_empty());
    }
}
