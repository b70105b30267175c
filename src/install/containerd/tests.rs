//! Unit tests of [`super`]: the runsc handler's edit of containerd's config, and the shim's config.

use super::*;

const CFG: &str = "/etc/containerd/runsc.toml";

fn edit(existing: Option<&str>) -> Result<Edit, Error> {
    add_runsc_runtime(
        Path::new("/etc/containerd/config.toml"),
        existing,
        Handler::RunscShim { config_path: CFG },
    )
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
    let text =
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.9\"\n";
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

#[test]
fn runc_shim_handler_names_the_binary_and_switching_kinds_leaves_no_stale_keys() {
    let path = Path::new("/etc/containerd/config.toml");
    let runc = Handler::RuncShim {
        binary: "/opt/gvisor/runsc-wrapper",
    };
    let text = add_runsc_runtime(path, Some(V2), runc).unwrap().text;
    let r = runtimes(&text);
    assert_eq!(r["runsc"]["runtime_type"].as_str(), Some(RUNC_RUNTIME_TYPE));
    assert_eq!(
        r["runsc"]["options"]["BinaryName"].as_str(),
        Some("/opt/gvisor/runsc-wrapper")
    );
    assert!(r["runsc"]["options"].get("TypeUrl").is_none(), "{text}");
    assert!(r["runsc"]["options"].get("ConfigPath").is_none(), "{text}");
    // runc, the default runtime, is untouched.
    assert_eq!(r["runc"]["runtime_type"].as_str(), Some(RUNC_RUNTIME_TYPE));
    assert_eq!(
        add_runsc_runtime(path, Some(&text), runc).unwrap().text,
        text
    );

    // Back to gVisor's shim: its keys return and BinaryName goes.
    let shim = edit(Some(&text)).unwrap().text;
    assert_runsc(&shim);
    assert!(runtimes(&shim)["runsc"]["options"]
        .get("BinaryName")
        .is_none());
    assert_idempotent(&shim);
}

#[test]
fn grpc_address_is_read_from_the_config_or_defaulted() {
    assert_eq!(
        grpc_address("version = 2\n[grpc]\n  address = \"/tmp/k1/containerd.sock\"\n"),
        "/tmp/k1/containerd.sock"
    );
    assert_eq!(grpc_address(V2), "/run/containerd/containerd.sock");
    assert_eq!(
        grpc_address("not toml ["),
        "/run/containerd/containerd.sock"
    );
}
