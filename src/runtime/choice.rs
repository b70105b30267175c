//! Which containerd runtime launches sandboxes (gVisor's shim, or the runc v2 shim driving a
//! runsc wrapper), and what it needs on disk.

use std::path::{Path, PathBuf};

use prost::Message;
use prost_types::Any;

use super::runsc::RunscInfo;
use super::{io_err, spec, Error, Result};
use crate::config::{Config, RuntimeKind};

/// Options of the runc v2 shim (`containerd.runc.v1.Options`), the fields we set.
#[derive(Clone, PartialEq, Message)]
struct RuncOptions {
    #[prost(string, tag = "6")]
    binary_name: String,
    #[prost(string, tag = "7")]
    root: String,
    /// Where a task created with these options restores from (empty: a fresh start).
    #[prost(string, tag = "10")]
    criu_image_path: String,
}

/// Checkpoint options of the runc v2 shim (`containerd.runc.v1.CheckpointOptions`), the
/// fields we set.
#[derive(Clone, PartialEq, Message)]
struct RuncCheckpointOptions {
    /// The task exits once checkpointed.
    #[prost(bool, tag = "1")]
    exit: bool,
    /// Where the image goes (containerd then writes nothing to its content store).
    #[prost(string, tag = "8")]
    image_path: String,
}

/// Options of gVisor's shim (`runtimeoptions.v1.Options`).
#[derive(Clone, PartialEq, Message)]
struct RunscShimOptions {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(string, tag = "2")]
    config_path: String,
}

/// The resolved runtime: which containerd runtime, with which options.
#[derive(Debug, Clone)]
pub struct RuntimeChoice {
    /// `runsc-shim` or `runc-wrapper`.
    pub kind: RuntimeKind,
    /// The containerd runtime name.
    pub name: String,
    /// The options Any sent with every container.
    pub options: Any,
    /// What containerd's shim runs: the runsc wrapper (runc-wrapper) or the shim's config
    /// file (runsc-shim). `computectl doctor` checks it.
    pub binary: PathBuf,
    /// The runsc binary: its version and features.
    pub runsc: RunscInfo,
    /// The platform sandboxes run on (`runsc_platform`, else runsc's own default).
    pub platform: String,
}

impl RuntimeChoice {
    /// The checkpoint options that put a memory checkpoint in `dir` and end the task, when
    /// this runtime can suspend through containerd (the runc v2 shim; gVisor's shim would go
    /// through containerd's content store, which is not built).
    pub fn checkpoint_options(&self, dir: &Path) -> Option<Any> {
        (self.kind == RuntimeKind::RuncWrapper).then(|| Any {
            type_url: "containerd.runc.v1.CheckpointOptions".into(),
            value: RuncCheckpointOptions {
                exit: true,
                image_path: dir.display().to_string(),
            }
            .encode_to_vec(),
        })
    }

    /// The task options that make a new task restore from the checkpoint in `dir`.
    pub fn restore_options(&self, dir: &Path) -> Option<Any> {
        if self.kind != RuntimeKind::RuncWrapper {
            return None;
        }
        let mut o = RuncOptions::decode(self.options.value.as_slice()).ok()?;
        o.criu_image_path = dir.display().to_string();
        Some(Any {
            type_url: self.options.type_url.clone(),
            value: o.encode_to_vec(),
        })
    }
}

/// The platform for `runsc_platform` = `wanted` on `runsc`: empty is runsc's own default;
/// one the binary does not offer is an error (a node must not silently run another one).
pub fn platform_for(wanted: &str, runsc: &RunscInfo) -> Result<String> {
    if wanted.is_empty() {
        return Ok(runsc.default_platform.clone());
    }
    if !runsc.platforms.is_empty() && !runsc.has_platform(wanted) {
        return Err(Error::Unsupported(format!(
            "runsc_platform {wanted:?}: {} offers {}",
            if runsc.version.is_empty() {
                "runsc"
            } else {
                &runsc.version
            },
            runsc.platforms.join(", ")
        )));
    }
    Ok(wanted.to_string())
}

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

/// Picks the runtime and writes what it needs on disk (the runsc wrapper or the shim's TOML).
pub fn choose_runtime(cfg: &Config) -> Result<RuntimeChoice> {
    let kind = match cfg.runtime {
        RuntimeKind::Auto => {
            if on_path("containerd-shim-runsc-v1").is_some() {
                RuntimeKind::RunscShim
            } else {
                RuntimeKind::RuncWrapper
            }
        }
        k => k,
    };
    let bin_dir = cfg.state_dir.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(io_err("create", &bin_dir))?;
    // The wrapper adds the network flag per container; gVisor's shim takes it from its TOML.
    let mut flags: Vec<String> = Vec::new();
    // Writes to the image's root filesystem stay in the sandbox's memory (counted against its
    // memory limit), not in the snapshot on the host's disk, where nothing would cap them.
    // The workspace bind mount is not overlaid: it stays shared with the host.
    if !cfg.runsc_flags.iter().any(|f| f.starts_with("--overlay")) {
        flags.push("--overlay2=root:memory".into());
    }
    let runsc = RunscInfo::probe(&cfg.runsc_path);
    let platform = platform_for(&cfg.runsc_platform, &runsc)?;
    if !cfg.runsc_platform.is_empty() {
        flags.push(format!("--platform={platform}"));
    }
    flags.extend(cfg.runsc_flags.iter().cloned());
    match kind {
        RuntimeKind::RunscShim => {
            let toml_path = bin_dir.join("runsc.toml");
            let mut toml = String::from("# Written by computed.\nbinary_name = ");
            let flags: Vec<String> = std::iter::once("--network=none".to_string())
                .chain(flags.iter().cloned())
                .collect();
            toml.push_str(&format!(
                "{:?}\n[runsc_config]\n",
                cfg.runsc_path.display().to_string()
            ));
            for f in &flags {
                let f = f.trim_start_matches("--");
                let (k, v) = f.split_once('=').unwrap_or((f, "true"));
                toml.push_str(&format!("  {k} = {v:?}\n"));
            }
            write_if_changed(&toml_path, toml.as_bytes(), 0o644)?;
            let opts = RunscShimOptions {
                type_url: "io.containerd.runsc.v1.options".into(),
                config_path: toml_path.display().to_string(),
            };
            Ok(RuntimeChoice {
                kind,
                name: "io.containerd.runsc.v1".into(),
                binary: toml_path.clone(),
                runsc,
                platform,
                options: Any {
                    type_url: "runtimeoptions.v1.Options".into(),
                    value: opts.encode_to_vec(),
                },
            })
        }
        _ => {
            let wrapper = bin_dir.join("runsc-compute");
            // A sandbox with a network may hold connections when it is suspended; it may run
            // on a platform of its own (after the node's flags: the last one counts).
            let mut net_flags: Vec<String> = runsc
                .features
                .iter()
                .any(|f| f == "net-disconnect-ok")
                .then(|| "--net-disconnect-ok".to_string())
                .into_iter()
                .collect();
            if let Some(e) = &cfg.egress {
                if !e.runsc_platform.is_empty() {
                    let p = platform_for(&e.runsc_platform, &runsc)?;
                    net_flags.push(format!("--platform={p}"));
                }
            }
            // A runsc without `checkpoint --compression` (20221219, which cannot suspend with
            // the agent anyway) writes its one kind of image.
            let checkpoint_flags: Vec<String> = (!cfg.checkpoint_compression.is_empty()
                && runsc.has("checkpoint-compression"))
            .then(|| format!("--compression={}", cfg.checkpoint_compression))
            .into_iter()
            .collect();
            let script = spec::wrapper_script(
                &cfg.runsc_path,
                &flags,
                &net_flags,
                &checkpoint_flags,
                &cfg.run_dir.join("net"),
                cfg.egress.as_ref().map_or("sandbox", |e| &e.runsc_network),
            );
            write_if_changed(&wrapper, script.as_bytes(), 0o755)?;
            let opts = RuncOptions {
                binary_name: wrapper.display().to_string(),
                root: cfg.run_dir.join("runsc").display().to_string(),
                criu_image_path: String::new(),
            };
            Ok(RuntimeChoice {
                kind: RuntimeKind::RuncWrapper,
                name: "io.containerd.runc.v2".into(),
                binary: wrapper.clone(),
                runsc,
                platform,
                options: Any {
                    type_url: "containerd.runc.v1.Options".into(),
                    value: opts.encode_to_vec(),
                },
            })
        }
    }
}

fn write_if_changed(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::read(path).ok().as_deref() == Some(data) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(io_err("write", &tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err("rename", path))?;
    Ok(())
}
