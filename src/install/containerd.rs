//! containerd's config file: registering the `runsc` runtime handler with `toml_edit`, so
//! everything else in the file (comments, order, formatting, other plugins) stays as it was,
//! and the runsc shim's own config file.
//!
//! The handler lives under the CRI plugin, whose name depends on the config's `version`:
//!
//! | version | containerd | runtimes table |
//! | --- | --- | --- |
//! | 2 | 1.x (and 2.x, which migrates it) | `plugins."io.containerd.grpc.v1.cri".containerd.runtimes` |
//! | 3 | 2.x | `plugins."io.containerd.cri.v1.runtime".containerd.runtimes` |
//!
//! Version 1 (or no `version` key, which containerd reads as 1) uses other plugin names and is
//! refused with a hint rather than guessed at.

use std::path::Path;

use toml_edit::{DocumentMut, InlineTable, Item, Table, Value};

use super::Error;

/// containerd's runtime type for gVisor's shim (`containerd-shim-runsc-v1`).
pub const RUNSC_RUNTIME_TYPE: &str = "io.containerd.runsc.v1";
/// The options type URL gVisor's shim expects.
pub const RUNSC_OPTIONS_TYPE_URL: &str = "io.containerd.runsc.v1.options";
/// The name of the runtime handler (RuntimeClass `handler`).
pub const HANDLER: &str = "runsc";
/// containerd's built-in default runtime, which a `runtimes` table in the file replaces.
const RUNC_RUNTIME_TYPE: &str = "io.containerd.runc.v2";

/// The CRI plugin holding `containerd.runtimes` in a config of `version`.
pub fn cri_plugin(version: i64) -> Option<&'static str> {
    match version {
        2 => Some("io.containerd.grpc.v1.cri"),
        3 => Some("io.containerd.cri.v1.runtime"),
        _ => None,
    }
}

/// An edited containerd config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The whole new file. Equal to the input when the runtime was already registered.
    pub text: String,
    /// Things the operator should know that do not stop the install.
    pub warnings: Vec<String>,
}

/// How the `runsc` handler runs runsc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler<'a> {
    /// gVisor's shim: `runtime_type = "io.containerd.runsc.v1"`, `options.TypeUrl`,
    /// `options.ConfigPath` = this (the shim's config file).
    RunscShim {
        /// The shim's config file (host path).
        config_path: &'a str,
    },
    /// containerd's runc v2 shim: `runtime_type = "io.containerd.runc.v2"`,
    /// `options.BinaryName` = this (runsc, or a wrapper of it).
    RuncShim {
        /// The runtime binary (host path).
        binary: &'a str,
    },
}

/// Registers the `runsc` handler (see [`Handler`]; the keys of the other kind are removed, so
/// switching kinds leaves no stale option) in the containerd config `existing` (`None`: the file does not exist; a
/// minimal version-2 file is made). Keys already right are not touched, other keys of an
/// existing `runsc` entry are kept, and applying it twice gives the same text.
///
/// When the file had no runtimes at all, `runc` (`io.containerd.runc.v2`) is added too:
/// containerd decodes a `runtimes` table in the file *instead of* its built-in one, so a file
/// naming only `runsc` would lose `runc`, the default runtime, and the CRI plugin would refuse
/// to load ("no corresponding runtime configured in `containerd.runtimes` for `containerd`
/// `default_runtime_name = "runc"`", seen with containerd 1.6), taking the node's kubelet down.
/// `path` is only used in errors.
pub fn add_runsc_runtime(
    path: &Path,
    existing: Option<&str>,
    handler: Handler<'_>,
) -> Result<Edit, Error> {
    let original = existing.unwrap_or("");
    let mut doc: DocumentMut = original.parse().map_err(|source| Error::Parse {
        path: path.into(),
        source,
    })?;
    // A file with only comments (or nothing) is containerd's defaults: start a version-2
    // file after the comments.
    let prefix = if doc.as_table().is_empty() {
        doc = DocumentMut::new();
        doc.insert("version", toml_edit::value(2));
        let mut p = original.to_string();
        if !p.is_empty() && !p.ends_with('\n') {
            p.push('\n');
        }
        p
    } else {
        String::new()
    };
    let version = match doc.get("version") {
        None => return Err(unsupported(path, "1 (no `version` key)".into())),
        Some(v) => match v.as_integer() {
            Some(n) => n,
            None => return Err(unsupported(path, v.to_string().trim().to_string())),
        },
    };
    let plugin = cri_plugin(version).ok_or_else(|| unsupported(path, version.to_string()))?;

    let mut warnings = Vec::new();
    if let Some(disabled) = doc.get("disabled_plugins").and_then(Item::as_array) {
        let off = disabled
            .iter()
            .filter_map(Value::as_str)
            .any(|p| p == plugin || p == "io.containerd.grpc.v1.cri" || p == "cri");
        if off {
            warnings.push(format!(
                "{} disables the CRI plugin: Kubernetes pods cannot use the `{HANDLER}` handler \
                 (the node daemon itself does not need CRI)",
                path.display()
            ));
        }
    }

    let had_runtimes = doc
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(|c| c.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(Item::as_table_like)
        .is_some_and(|t| !t.is_empty());

    // Whether anything was added or changed: when nothing was, the input comes back byte for
    // byte, so the comparison that decides a containerd restart never depends on how
    // faithfully the document round-trips.
    let mut changed = false;
    let mut at = Vec::new();
    let root = doc.as_item_mut();
    let plugins = sub_table(root, "plugins", false, &mut at, path, &mut changed)?;
    let cri = sub_table(plugins, plugin, false, &mut at, path, &mut changed)?;
    let ctrd = sub_table(cri, "containerd", false, &mut at, path, &mut changed)?;
    let runtimes = sub_table(ctrd, "runtimes", false, &mut at, path, &mut changed)?;
    if !had_runtimes {
        let mut at = at.clone();
        let runc = sub_table(runtimes, "runc", true, &mut at, path, &mut changed)?;
        set_str(runc, "runtime_type", RUNC_RUNTIME_TYPE, &mut changed);
    }
    let runsc = sub_table(runtimes, HANDLER, true, &mut at, path, &mut changed)?;
    match handler {
        Handler::RunscShim { config_path } => {
            set_str(runsc, "runtime_type", RUNSC_RUNTIME_TYPE, &mut changed);
            let options = sub_table(runsc, "options", true, &mut at, path, &mut changed)?;
            set_str(options, "TypeUrl", RUNSC_OPTIONS_TYPE_URL, &mut changed);
            set_str(options, "ConfigPath", config_path, &mut changed);
            remove(options, "BinaryName", &mut changed);
        }
        Handler::RuncShim { binary } => {
            set_str(runsc, "runtime_type", RUNC_RUNTIME_TYPE, &mut changed);
            let options = sub_table(runsc, "options", true, &mut at, path, &mut changed)?;
            set_str(options, "BinaryName", binary, &mut changed);
            remove(options, "TypeUrl", &mut changed);
            remove(options, "ConfigPath", &mut changed);
        }
    }

    let text = if changed {
        format!("{prefix}{doc}")
    } else {
        original.to_string()
    };
    Ok(Edit { text, warnings })
}

fn unsupported(path: &Path, found: String) -> Error {
    Error::UnsupportedVersion {
        path: path.into(),
        found,
    }
}

/// The table `key` inside the table-like `item`, created when missing: a header table
/// (`explicit`) or an implicit one for intermediate keys, dotted when its parent is (so the
/// file keeps its style), inline inside an inline table.
fn sub_table<'a>(
    item: &'a mut Item,
    key: &str,
    explicit: bool,
    at: &mut Vec<String>,
    path: &Path,
    changed: &mut bool,
) -> Result<&'a mut Item, Error> {
    at.push(key.to_string());
    let not_a_table = |at: &[String]| Error::NotATable {
        path: path.into(),
        key: at.join("."),
    };
    let inline = item.is_inline_table();
    let Some(t) = item.as_table_like_mut() else {
        at.pop();
        return Err(not_a_table(at));
    };
    let dotted = t.is_dotted();
    if t.get(key).is_none() {
        let new = if inline {
            Item::Value(Value::InlineTable(InlineTable::new()))
        } else {
            let mut n = Table::new();
            n.set_implicit(!explicit);
            n.set_dotted(dotted);
            Item::Table(n)
        };
        t.insert(key, new);
        *changed = true;
    }
    match t.get_mut(key) {
        Some(child) if child.is_table_like() => {
            // A header table that existed only as the parent of others (e.g. just
            // `[...runtimes.runsc.options]`) gets its own header once it holds values.
            if explicit {
                if let Some(t) = child.as_table_mut() {
                    if !t.is_dotted() && t.is_implicit() {
                        t.set_implicit(false);
                        *changed = true;
                    }
                }
            }
            Ok(child)
        }
        _ => Err(not_a_table(at)),
    }
}

/// Sets the string `key` of the table-like `item` to `val`, leaving it untouched when it
/// already is `val` and keeping its decoration (comments, spacing) when it is replaced.
fn set_str(item: &mut Item, key: &str, val: &str, changed: &mut bool) {
    let Some(t) = item.as_table_like_mut() else {
        return;
    };
    if t.get(key).and_then(Item::as_str) == Some(val) {
        return;
    }
    *changed = true;
    match t.get_mut(key) {
        Some(Item::Value(v)) => {
            let decor = v.decor().clone();
            *v = Value::from(val);
            *v.decor_mut() = decor;
        }
        _ => {
            t.insert(key, toml_edit::value(val));
        }
    }
}

/// Removes `key` from the table-like `item` when it is there.
fn remove(item: &mut Item, key: &str, changed: &mut bool) {
    if let Some(t) = item.as_table_like_mut() {
        if t.remove(key).is_some() {
            *changed = true;
        }
    }
}

/// containerd's gRPC socket as its config `text` sets it (`[grpc] address`), else containerd's
/// default.
pub fn grpc_address(text: &str) -> String {
    text.parse::<DocumentMut>()
        .ok()
        .and_then(|d| {
            d.get("grpc")
                .and_then(|g| g.get("address"))
                .and_then(Item::as_str)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "/run/containerd/containerd.sock".into())
}

/// The config of gVisor's shim for containerd's `runsc` handler (`ConfigPath` points here):
/// the runsc binary the shim runs and, when given, runsc's `--platform`.
pub fn runsc_toml(runsc_binary: &str, platform: Option<&str>) -> String {
    let mut doc = DocumentMut::new();
    doc.insert("binary_name", toml_edit::value(runsc_binary));
    if let Some(p) = platform.filter(|p| !p.is_empty()) {
        let mut t = Table::new();
        t.insert("platform", toml_edit::value(p));
        doc.insert("runsc_config", Item::Table(t));
    }
    format!(
        "# Written by `computed install` for containerd's `{HANDLER}` handler; \
         rewritten by every install.\n{doc}"
    )
}

#[cfg(test)]
mod tests;
