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

/// Registers the `runsc` handler (`runtime_type`, `options.TypeUrl`, `options.ConfigPath =
/// runsc_config`) in the containerd config `existing` (`None`: the file does not exist; a
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
    runsc_config: &str,
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
    set_str(runsc, "runtime_type", RUNSC_RUNTIME_TYPE, &mut changed);
    let options = sub_table(runsc, "options", true, &mut at, path, &mut changed)?;
    set_str(options, "TypeUrl", RUNSC_OPTIONS_TYPE_URL, &mut changed);
    set_str(options, "ConfigPath", runsc_config, &mut changed);

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
mod tests {
    use super::*;

    const CFG: &str = "/etc/containerd/runsc.toml";

    fn edit(existing: Option<&str>) -> Result<Edit, Error> {
        add_runsc_runtime(Path::new("/etc/containerd/config.toml"), existing, CFG)
    }

    /// Parses `text` and returns the runtimes table of its CRI plugin.
    fn runtimes(text: &str) -> toml::Table {
        let v: toml::Table = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let version = v["version"].as_integer().unwrap();
        let plugin = cri_plugin(version).unwrap();
        v["plugins"][plugin]["containerd"]["runtimes"]
            .as_table()
            .unwrap()
            .clone()
    }

    fn assert_runsc(text: &str) {
        let r = runtimes(text);
        let runsc = &r["runsc"];
        assert_eq!(runsc["runtime_type"].as_str(), Some(RUNSC_RUNTIME_TYPE));
        assert_eq!(
            runsc["options"]["TypeUrl"].as_str(),
            Some(RUNSC_OPTIONS_TYPE_URL)
        );
        assert_eq!(runsc["options"]["ConfigPath"].as_str(), Some(CFG));
    }

    fn assert_idempotent(text: &str) {
        let again = edit(Some(text)).unwrap();
        assert_eq!(again.text, text, "a second edit changed the file");
    }

    const V2: &str = r#"# kind's containerd config (abridged)
version = 2

[proxy_plugins]
# fuse-overlayfs is used for rootless
[proxy_plugins."fuse-overlayfs"]
  type = "snapshot"
  address = "/run/containerd-fuse-overlayfs.sock"

[plugins."io.containerd.grpc.v1.cri".containerd]
  # save disk space when using a single snapshotter
  discard_unpacked_layers = true
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  # set default runtime handler to v2, which has a per-pod shim
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true   # keep this comment

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.7"
"#;

    const V3: &str = r#"version = 3
root = '/var/lib/containerd'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true
"#;

    #[test]
    fn v2_gets_runsc_and_keeps_everything_else() {
        let e = edit(Some(V2)).unwrap();
        assert_runsc(&e.text);
        // Every original line is still there, in order, comments included.
        let mut lines = e.text.lines();
        for l in V2.lines() {
            assert!(
                lines.any(|x| x == l),
                "lost or reordered: {l:?}\n{}",
                e.text
            );
        }
        assert!(e.text.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc]\n\
             runtime_type = \"io.containerd.runsc.v1\"\n"
        ));
        assert!(e.text.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc.options]\n\
             TypeUrl = \"io.containerd.runsc.v1.options\"\n\
             ConfigPath = \"/etc/containerd/runsc.toml\"\n"
        ));
        // runc is kept as the file had it, not re-added.
        let r = runtimes(&e.text);
        assert_eq!(r["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert!(e.warnings.is_empty());
        assert_idempotent(&e.text);
    }

    #[test]
    fn v3_uses_the_cri_runtime_plugin() {
        let e = edit(Some(V3)).unwrap();
        assert_runsc(&e.text);
        assert!(e.text.starts_with(V3), "{}", e.text);
        assert!(e
            .text
            .contains("[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]"));
        let v: toml::Table = toml::from_str(&e.text).unwrap();
        assert!(v["plugins"].get("io.containerd.grpc.v1.cri").is_none());
        assert_idempotent(&e.text);
    }

    #[test]
    fn missing_file_gets_a_minimal_v2_with_runc_kept() {
        let e = edit(None).unwrap();
        assert_eq!(
            e.text,
            "version = 2\n\
             \n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
             runtime_type = \"io.containerd.runc.v2\"\n\
             \n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc]\n\
             runtime_type = \"io.containerd.runsc.v1\"\n\
             \n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc.options]\n\
             TypeUrl = \"io.containerd.runsc.v1.options\"\n\
             ConfigPath = \"/etc/containerd/runsc.toml\"\n"
        );
        assert_runsc(&e.text);
        assert_idempotent(&e.text);
    }

    #[test]
    fn comment_only_file_keeps_its_comments() {
        let e = edit(Some("# managed by cloud-init\n# (defaults)")).unwrap();
        assert!(e
            .text
            .starts_with("# managed by cloud-init\n# (defaults)\nversion = 2\n"));
        assert_runsc(&e.text);
        assert_idempotent(&e.text);
    }

    #[test]
    fn a_file_without_runtimes_keeps_runc() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.9\"\n";
        let e = edit(Some(text)).unwrap();
        let r = runtimes(&e.text);
        assert_eq!(r["runc"]["runtime_type"].as_str(), Some(RUNC_RUNTIME_TYPE));
        assert_runsc(&e.text);
        assert!(e.text.starts_with(text));
        assert_idempotent(&e.text);
    }

    #[test]
    fn v1_and_unknown_versions_are_refused() {
        for (text, found) in [
            (
                "[plugins.cri]\n  sandbox_image = \"x\"\n",
                "1 (no `version` key)",
            ),
            ("version = 1\n", "1"),
            ("version = 4\n", "4"),
            ("version = \"2\"\n", "\"2\""),
        ] {
            let e = edit(Some(text)).unwrap_err();
            match &e {
                Error::UnsupportedVersion { found: f, .. } => assert_eq!(f, found, "{text}"),
                other => panic!("{text}: {other}"),
            }
            assert!(e.to_string().contains("only versions 2 and 3"), "{e}");
        }
        assert!(matches!(
            edit(Some("version = 2\n[plugins\n")),
            Err(Error::Parse { .. })
        ));
    }

    #[test]
    fn a_wrong_existing_entry_is_corrected_keeping_its_other_keys() {
        let text = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
  runtime_type = "io.containerd.runsc.v1"
  pod_annotations = ["dev.gvisor.*"]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
  TypeUrl = "io.containerd.runsc.v1.options"
  ConfigPath = "/etc/old/runsc.toml"   # the old place
"#;
        let e = edit(Some(text)).unwrap();
        assert_runsc(&e.text);
        assert_eq!(
            e.text,
            text.replace("/etc/old/runsc.toml", "/etc/containerd/runsc.toml")
        );
        assert_idempotent(&e.text);
        // Already right: the very same bytes come back.
        assert_eq!(edit(Some(&e.text)).unwrap().text, e.text);
    }

    #[test]
    fn dotted_and_inline_styles_are_followed() {
        let dotted = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  runtimes.runc.runtime_type = \"io.containerd.runc.v2\"\n";
        let e = edit(Some(dotted)).unwrap();
        assert_runsc(&e.text);
        assert!(e.text.starts_with(dotted), "{}", e.text);
        assert_idempotent(&e.text);

        let inline = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  runtimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n";
        let e = edit(Some(inline)).unwrap();
        assert_runsc(&e.text);
        assert_eq!(
            runtimes(&e.text)["runc"]["runtime_type"].as_str(),
            Some(RUNC_RUNTIME_TYPE)
        );
        assert_idempotent(&e.text);

        // Only the options table existed.
        let half = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc.options]\n  TypeUrl = \"io.containerd.runsc.v1.options\"\n";
        let e = edit(Some(half)).unwrap();
        assert_runsc(&e.text);
        assert_idempotent(&e.text);
    }

    #[test]
    fn non_tables_in_the_way_are_errors() {
        let e = edit(Some("version = 2\nplugins = 3\n")).unwrap_err();
        assert!(
            matches!(&e, Error::NotATable { key, .. } if key == "plugins"),
            "{e}"
        );
        let e = edit(Some(
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  runtimes = \"x\"\n",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("plugins.io.containerd.grpc.v1.cri.containerd.runtimes"),
            "{e}"
        );
    }

    #[test]
    fn disabled_cri_is_a_warning() {
        let e = edit(Some(
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        ))
        .unwrap();
        assert_eq!(e.warnings.len(), 1);
        assert_runsc(&e.text);
    }

    #[test]
    fn runsc_toml_names_the_binary_and_platform() {
        let t = runsc_toml("/usr/local/bin/runsc", None);
        let v: toml::Table = toml::from_str(&t).unwrap();
        assert_eq!(v["binary_name"].as_str(), Some("/usr/local/bin/runsc"));
        assert!(v.get("runsc_config").is_none());
        let t = runsc_toml("/opt/bin/runsc", Some("systrap"));
        let v: toml::Table = toml::from_str(&t).unwrap();
        assert_eq!(v["runsc_config"]["platform"].as_str(), Some("systrap"));
        assert_eq!(runsc_toml("/x", Some("")), runsc_toml("/x", None));
    }
}
