//! Getting images into containerd: an OCI image-layout tarball, or a registry pull; both
//! store the blobs and unpack the layers into snapshots inside a lease.

use super::*;

/// Imports an OCI image-layout tarball. Returns the names it was imported under: `name` if
/// given, else the names the index annotates (`io.containerd.image.name`, then
/// `org.opencontainers.image.ref.name`).
pub async fn import_tar(ctr: &Containerd, path: &Path, name: Option<&str>) -> Result<Vec<String>> {
    import_tar_with(ctr, path, name, &no_progress).await
}

/// [`import_tar`] reporting progress.
pub async fn import_tar_with(
    ctr: &Containerd,
    path: &Path,
    name: Option<&str>,
    progress: Progress<'_>,
) -> Result<Vec<String>> {
    progress("reading tarball", 0, 1);
    let p = path.to_path_buf();
    let files = tokio::task::spawn_blocking(move || read_layout(&p))
        .await
        .map_err(|e| invalid("tarball", e))??;
    let what = path.display().to_string();
    let index_raw = files
        .get("index.json")
        .ok_or_else(|| invalid(&what, "no index.json (not an OCI image layout)"))?;
    let index: Index = serde_json::from_slice(index_raw).map_err(|e| invalid(&what, e))?;
    let top = index
        .manifests
        .first()
        .ok_or_else(|| invalid(&what, "index.json lists no manifest"))?
        .clone();
    let mut names: Vec<String> = match name {
        Some(n) => vec![n.to_string()],
        None => index
            .manifests
            .iter()
            .filter_map(|m| {
                m.annotations
                    .get("io.containerd.image.name")
                    .or_else(|| m.annotations.get("org.opencontainers.image.ref.name"))
                    .cloned()
            })
            .collect(),
    };
    names.dedup();
    if names.is_empty() {
        return Err(invalid(&what, "no image name given and none annotated"));
    }
    let blobs: Blobs = files
        .into_iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("blobs/")
                .and_then(|d| d.split_once('/'))
                .map(|(alg, hex)| (format!("{alg}:{hex}"), v))
        })
        .collect();
    store(ctr, &blobs, &top, &names, progress).await?;
    Ok(names)
}

/// Pulls `reference` from its registry (anonymously; plain HTTP for the `insecure` registries)
/// and unpacks it, under the name `reference`.
pub async fn pull(ctr: &Containerd, reference: &str, insecure: &[String]) -> Result<()> {
    pull_with(ctr, reference, insecure, &no_progress).await
}

/// [`pull`] reporting progress.
pub async fn pull_with(
    ctr: &Containerd,
    reference: &str,
    insecure: &[String],
    progress: Progress<'_>,
) -> Result<()> {
    progress("resolving", 0, 1);
    use oci_client::{client::ClientConfig, client::ClientProtocol, secrets::RegistryAuth};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r: oci_client::Reference = reference
        .parse()
        .map_err(|e| invalid(reference, format!("not an image reference: {e}")))?;
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(insecure.to_vec()),
        ..Default::default()
    });
    let auth = RegistryAuth::Anonymous;
    let accepted = [
        MT_OCI_INDEX,
        MT_DOCKER_LIST,
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ];
    let pull_err = |e: oci_client::errors::OciDistributionError| Error::Pull {
        reference: reference.to_string(),
        why: e.to_string(),
    };
    let (raw, digest) = client
        .pull_manifest_raw(&r, &auth, &accepted)
        .await
        .map_err(pull_err)?;
    let media_type = media_type_of(&raw);
    let top = OciDescriptor {
        media_type: media_type.clone(),
        digest: digest.clone(),
        size: raw.len() as i64,
        annotations: HashMap::new(),
        platform: None,
    };
    let mut blobs: Blobs = HashMap::from([(digest.clone(), raw.to_vec())]);
    let manifest_raw = if is_index(&media_type) {
        let idx: Index = serde_json::from_slice(&raw).map_err(|e| invalid(reference, e))?;
        let m = pick_platform(&idx.manifests, reference)?;
        let mr = r.clone_with_digest(m.digest.clone());
        let (mraw, mdigest) = client
            .pull_manifest_raw(&mr, &auth, &accepted)
            .await
            .map_err(pull_err)?;
        blobs.insert(mdigest, mraw.to_vec());
        mraw.to_vec()
    } else {
        raw.to_vec()
    };
    let manifest: Manifest =
        serde_json::from_slice(&manifest_raw).map_err(|e| invalid(reference, e))?;
    let total: u64 = std::iter::once(&manifest.config)
        .chain(manifest.layers.iter())
        .map(|d| d.size.max(0) as u64)
        .sum();
    let mut done = 0u64;
    for d in std::iter::once(&manifest.config).chain(manifest.layers.iter()) {
        progress("downloading", done, total);
        done += d.size.max(0) as u64;
        let mut data = Vec::with_capacity(d.size.max(0) as usize);
        client
            .pull_blob(&r, d.digest.as_str(), &mut data)
            .await
            .map_err(pull_err)?;
        blobs.insert(d.digest.clone(), data);
    }
    progress("downloading", total, total);
    store(ctr, &blobs, &top, &[reference.to_string()], progress).await
}

fn media_type_of(raw: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Head {
        #[serde(rename = "mediaType", default)]
        media_type: String,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Head>(raw) {
        Ok(h) if !h.media_type.is_empty() => h.media_type,
        Ok(h) if h.manifests.is_some() => MT_OCI_INDEX.into(),
        _ => "application/vnd.oci.image.manifest.v1+json".into(),
    }
}

/// Writes the blobs of one image into containerd and unpacks it, inside a lease.
async fn store(
    ctr: &Containerd,
    blobs: &Blobs,
    top: &OciDescriptor,
    names: &[String],
    progress: Progress<'_>,
) -> Result<()> {
    let lease = format!("compute-import-{}", uuid::Uuid::new_v4());
    ctr.create_lease(&lease).await?;
    let result = store_and_unpack(ctr, blobs, top, names, &lease, progress).await;
    let _ = ctr.delete_lease(&lease).await;
    result
}

async fn store_and_unpack(
    ctr: &Containerd,
    blobs: &Blobs,
    top: &OciDescriptor,
    names: &[String],
    lease: &str,
    progress: Progress<'_>,
) -> Result<()> {
    // Resolve an index to this platform's manifest, keeping the index as the image target.
    let (manifest_desc, index_blob) = if is_index(&top.media_type) {
        let raw = blob(blobs, &top.digest)?;
        let idx: Index = serde_json::from_slice(&raw).map_err(|e| invalid(&top.digest, e))?;
        (
            pick_platform(&idx.manifests, &top.digest)?,
            Some((raw, idx)),
        )
    } else {
        (top.clone(), None)
    };
    let manifest_raw = blob(blobs, &manifest_desc.digest)?;
    let manifest: Manifest =
        serde_json::from_slice(&manifest_raw).map_err(|e| invalid(&manifest_desc.digest, e))?;
    let config_raw = blob(blobs, &manifest.config.digest)?;
    let config: ImageConfig =
        serde_json::from_slice(&config_raw).map_err(|e| invalid(&manifest.config.digest, e))?;
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        return Err(invalid(
            &manifest_desc.digest,
            "layer count differs from the config's diff_ids",
        ));
    }
    let chains = chain_ids(&config.rootfs.diff_ids);

    let total: u64 = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
    let mut done = 0u64;
    for layer in &manifest.layers {
        progress("writing blobs", done, total);
        done += layer.size.max(0) as u64;
        let data = blob(blobs, &layer.digest)?;
        ctr.write_content(&layer.digest, data, HashMap::new(), lease)
            .await?;
    }
    let mut cfg_labels = HashMap::new();
    if let Some(top_chain) = chains.last() {
        cfg_labels.insert(
            format!("containerd.io/gc.ref.snapshot.{SNAPSHOTTER}"),
            top_chain.clone(),
        );
    }
    ctr.write_content(&manifest.config.digest, config_raw, cfg_labels, lease)
        .await?;
    let mut m_labels = HashMap::from([(
        "containerd.io/gc.ref.content.config".to_string(),
        manifest.config.digest.clone(),
    )]);
    for (i, l) in manifest.layers.iter().enumerate() {
        m_labels.insert(
            format!("containerd.io/gc.ref.content.l.{i}"),
            l.digest.clone(),
        );
    }
    ctr.write_content(&manifest_desc.digest, manifest_raw, m_labels, lease)
        .await?;
    if let Some((raw, idx)) = index_blob {
        let labels = idx
            .manifests
            .iter()
            .enumerate()
            .filter(|(_, m)| m.digest == manifest_desc.digest)
            .map(|(i, m)| {
                (
                    format!("containerd.io/gc.ref.content.m.{i}"),
                    m.digest.clone(),
                )
            })
            .collect();
        ctr.write_content(&top.digest, raw, labels, lease).await?;
    }

    unpack(
        ctr,
        &manifest.layers,
        &config.rootfs.diff_ids,
        &chains,
        lease,
        progress,
    )
    .await?;

    let mut target = to_descriptor(top);
    target.annotations.clear();
    for n in names {
        ctr.put_image(n, target.clone(), Some(lease)).await?;
    }
    Ok(())
}

async fn unpack(
    ctr: &Containerd,
    layers: &[OciDescriptor],
    diff_ids: &[String],
    chains: &[String],
    lease: &str,
    progress: Progress<'_>,
) -> Result<()> {
    let n = layers.len() as u64;
    for (i, layer) in layers.iter().enumerate() {
        progress("unpacking layers", i as u64, n);
        let chain = &chains[i];
        if ctr.snapshot_exists(chain).await? {
            continue;
        }
        let parent = if i == 0 { "" } else { &chains[i - 1] };
        let key = format!("compute-extract-{} {chain}", uuid::Uuid::new_v4());
        let mounts = ctr.prepare_snapshot(&key, parent, Some(lease)).await?;
        let applied = match ctr.apply_diff(to_descriptor(layer), mounts, lease).await {
            Ok(a) => a,
            Err(e) => {
                let _ = ctr.remove_snapshot(&key).await;
                return Err(e.into());
            }
        };
        if applied.digest != diff_ids[i] {
            let _ = ctr.remove_snapshot(&key).await;
            return Err(invalid(
                &layer.digest,
                format!(
                    "unpacked to {} but the config says {}",
                    applied.digest, diff_ids[i]
                ),
            ));
        }
        match ctr.commit_snapshot(chain, &key, lease).await {
            Ok(()) => {}
            Err(e) if e.kind() == containerd::ErrorKind::AlreadyExists => {
                let _ = ctr.remove_snapshot(&key).await;
            }
            Err(e) => {
                let _ = ctr.remove_snapshot(&key).await;
                return Err(e.into());
            }
        }
    }
    progress("unpacking layers", n, n);
    Ok(())
}

/// Reads every regular file of an image-layout tarball (plain or gzip-compressed) into memory.
fn read_layout(path: &Path) -> Result<HashMap<String, Vec<u8>>> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(io)?;
    let f = std::fs::File::open(path).map_err(io)?;
    let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let mut archive = tar::Archive::new(reader);
    let mut out = HashMap::new();
    for entry in archive.entries().map_err(io)? {
        let mut entry = entry.map_err(io)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()
            .map_err(io)?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let mut data = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut data).map_err(io)?;
        out.insert(name, data);
    }
    Ok(out)
}
