//! Kubernetes for real: a kube-apiserver (v1.20.2) with etcd on loopback, started by the shared
//! tools' `kube-up` (`COMPUTE_KUBE_TOOLS`, else `../shared/tools/kube` beside the checkout), and
//! kubectl 1.32 (with kustomize) from `get-kubectl`, cached in `target/kube-tools/`.
//!
//! One control plane for the whole binary, started once and stopped at the end (also on failure)
//! by a guard; the scenarios run in sequence in one test and each failure is reported with its
//! name:
//!
//! * manifests: `kubectl apply --server-side --dry-run=server` of `runtimeclass/` and of
//!   `-k daemonset/base`, `overlays/kind` and `overlays/production` (the namespace created for
//!   real first). 1.20 has no `policy/v1`, so the PodDisruptionBudget must be the one object it
//!   refuses, and it passes as `policy/v1beta1` (same fields); the API versions used put the
//!   minimum Kubernetes version at 1.21, as the docs say.
//! * overlays: what each overlay changes, read from `kubectl kustomize` into k8s-openapi types
//!   (the production node config loads with the real loader and keeps every base setting, TLS
//!   files are in the mounted Secrets, the router's flags are accepted by the binary).
//! * overlays/k1 (the one `tests/k1/run.sh` deploys): every object, its `policy/v1beta1`
//!   PodDisruptionBudget included, taken by 1.20; the installer's args parse and name k1's
//!   containerd (reexec, runc shim, its pid file), never the host's paths; the node config loads,
//!   its state and runtime dirs are Bidirectional hostPaths at the same path and its own.
//! * rbac: the router's own ServiceAccount token (TokenRequest) and the RBAC of `daemonset/`,
//!   applied for real: SelfSubjectAccessReviews say it may read pods in its namespace (and
//!   Nodes, with the watch-nodes component) and nothing else (no secrets, no pod writes, no node
//!   writes, no other namespace), SelfSubjectRulesReview lists exactly those rules, and real
//!   calls beyond them are refused; the node's ServiceAccount may do nothing.
//! * discovery: the router's watcher, with that token, against Node and Pod objects made here
//!   (no kubelet runs, so pod status is written through the status subresource): readiness,
//!   pods added, other labels and namespaces ignored, cordon and uncordon, a node going
//!   NotReady, a node going away (its pod Terminating, then gone), a pod replaced by a rollout.
//! * router: the real `computed router` binary with that token as its kubeconfig finds a pod
//!   whose IP is a fake node daemon here, and its `/readyz` (the manifests' probe) follows it.
//! * platform store: two stores with that token over the same PlatformRecords (records, the
//!   watch, the authenticator's cache, one audit sequence); then two real router processes
//!   (`--platform-store kube`) in front of two real node daemons: the first namespace and keys
//!   made as root on one router's socket with `computectl`, an environment made through the
//!   other, every key and revocation honoured by both without a restart, one audit log.
//!
//! What a bare control plane cannot show (watch streams cut and resumed at a given
//! resourceVersion, a re-list that drops objects) stays in `tests/discovery.rs` (mock API).
//!
//! Under `CI` missing tools fail the test; elsewhere it is skipped with the reason.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::router::{assert_router_args_accepted, flag, router_args, router_command};
use common::{free_port, Killed};
use computed::api::node::v1 as nodepb;
use computed::router::discovery::watch_pods;
use computed::router::NodeSet;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, PodSpec, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

const NS: &str = "compute-system";
const SELECTOR: &str = "app.kubernetes.io/name=computed-node";
const OVERLAYS: [&str; 3] = ["base", "overlays/kind", "overlays/production"];
/// The minimum Kubernetes version the docs state (minor of 1.x).
const MIN_MINOR: u32 = 21;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shared Kubernetes tools (`kube-up`, `kube-down`, `get-kubectl`).
fn tools_dir() -> PathBuf {
    match std::env::var_os("COMPUTE_KUBE_TOOLS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => repo().join("../shared/tools/kube"),
    }
}

/// `target/kube-tools`: kubectl, fetched once and kept across runs.
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR has a parent")
        .join("kube-tools")
}

/// Fails (under CI) or skips (elsewhere) with `msg`.
fn missing(msg: String) -> Option<PathBuf> {
    common::skip(&format!("kube_real: {msg}"));
    None
}

/// Checks the tools; returns kubectl's path, fetching it into `target/kube-tools` the first time.
fn prerequisites() -> Option<PathBuf> {
    let tools = tools_dir();
    let mut lacking: Vec<String> = ["kube-up", "kube-down", "get-kubectl"]
        .iter()
        .filter(|t| !tools.join(t).is_file())
        .map(|t| format!("{}/{t}", tools.display()))
        .collect();
    lacking.extend(
        ["openssl", "curl", "xz", "python3"]
            .iter()
            .filter(|b| common::which(b).is_none())
            .map(|b| format!("{b} on PATH")),
    );
    if !lacking.is_empty() {
        return missing(format!(
            "missing {} (set COMPUTE_KUBE_TOOLS to the shared tools' kube directory)",
            lacking.join(", ")
        ));
    }
    let cache = cache_dir();
    let kubectl = cache.join("kubectl");
    let works = |k: &Path| {
        Command::new(k)
            .args(["version", "--client"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if kubectl.is_file() && !works(&kubectl) {
        // A copy cut short: fetch it again.
        let _ = std::fs::remove_file(&kubectl);
    }
    if !kubectl.is_file() {
        let t = Instant::now();
        let out = Command::new(tools.join("get-kubectl"))
            .arg(&cache)
            .output()
            .expect("run get-kubectl");
        if !out.status.success() || !works(&kubectl) {
            return missing(format!(
                "get-kubectl {} failed: {}",
                cache.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        eprintln!("kube_real: fetched kubectl in {:?}", t.elapsed());
    }
    Some(kubectl)
}

/// A control plane from `kube-up`, stopped with `kube-down` when dropped (also when a scenario
/// panics: the test's own unwinding drops it).
struct Cluster {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
}

impl Cluster {
    fn up(kubectl: PathBuf) -> Cluster {
        // Under /tmp: kube-up's etcd and the apiserver keep their data and certificates there.
        let dir = tempfile::Builder::new()
            .prefix("computed-kube-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let c = Cluster {
            kubeconfig: dir.path().join("kubeconfig"),
            dir,
            kubectl,
        };
        let t = Instant::now();
        let out = Command::new(tools_dir().join("kube-up"))
            .arg(c.dir.path())
            .output()
            .expect("run kube-up");
        if !out.status.success() || !c.kubeconfig.is_file() {
            panic!(
                "kube-up failed ({}): {}{}\napiserver.log: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                tail(&c.dir.path().join("apiserver.log"), 20)
            );
        }
        eprintln!("kube_real: kube-up in {:?}", t.elapsed());
        c
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs kubectl as the admin with `args` and `stdin`.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(&self.kubectl);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.path("kubectl-cache"))
            .args(args)
            .current_dir(repo())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// Runs kubectl and returns its stdout; panics with its stderr if it fails.
    fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl kustomize daemonset/<dir>`, as YAML documents.
    fn render(&self, dir: &str) -> Vec<serde_yaml::Value> {
        let text = self.kubectl_ok(&["kustomize", &format!("daemonset/{dir}")], None);
        docs(&text)
    }

    /// The API server's URL and CA file, from the admin kubeconfig.
    fn server(&self) -> (String, String) {
        let kc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&self.kubeconfig).unwrap()).unwrap();
        let cluster = &kc["clusters"][0]["cluster"];
        (
            cluster["server"].as_str().unwrap().to_string(),
            cluster["certificate-authority"]
                .as_str()
                .unwrap()
                .to_string(),
        )
    }

    /// Writes a kubeconfig that authenticates with `token` and returns its path.
    fn kubeconfig_with_token(&self, name: &str, token: &str) -> PathBuf {
        let (server, ca) = self.server();
        let path = self.path(&format!("{name}.kubeconfig"));
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name, "namespace": NS}}],
            "current-context": name,
        });
        std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();
        path
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = Command::new(tools_dir().join("kube-down"))
            .arg(self.dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "kube_real: kube-down {}: {}",
                self.dir.path().display(),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("kube_real: kube-down: {e}"),
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn docs(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_yaml::Value::deserialize(d).expect("YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kind_of(v: &serde_yaml::Value) -> &str {
    v["kind"].as_str().unwrap_or_default()
}

fn name_of(v: &serde_yaml::Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

/// How kubectl names an object: `deployment.apps/computed-router`, `namespace/compute-system`.
fn kubectl_name(v: &serde_yaml::Value) -> String {
    let api = v["apiVersion"].as_str().unwrap_or_default();
    let kind = kind_of(v).to_lowercase();
    match api.split_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{}", name_of(v)),
        None => format!("{kind}/{}", name_of(v)),
    }
}

fn to_yaml(objs: &[&serde_yaml::Value]) -> String {
    objs.iter()
        .map(|o| serde_yaml::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn typed<T: serde::de::DeserializeOwned>(v: &serde_yaml::Value) -> T {
    serde_yaml::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", kind_of(v), name_of(v)))
}

fn one<'a>(objs: &'a [serde_yaml::Value], kind: &str, name: &str) -> &'a serde_yaml::Value {
    objs.iter()
        .find(|o| kind_of(o) == kind && name_of(o) == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

// ---------------------------------------------------------------------------------------------
// The test.

#[test]
fn kubernetes_for_real() {
    let Some(kubectl) = prerequisites() else {
        return;
    };
    let started = Instant::now();
    let cluster = Cluster::up(kubectl);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // The namespace, for real: namespaced objects (also in a dry run) need it.
    let base = cluster.render("base");
    let namespace = one(&base, "Namespace", NS);
    let out = cluster.kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=computed-tests",
            "-f",
            "-",
        ],
        Some(&to_yaml(&[namespace])),
    );
    assert!(
        out.contains("namespace/compute-system serverside-applied"),
        "{out}"
    );

    let mut failures = Vec::new();
    let mut run = |name: &str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        match std::panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(()) => eprintln!("kube_real: {name}: ok ({:?})", t.elapsed()),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("kube_real: {name}: FAILED ({:?}): {msg}", t.elapsed());
                failures.push(format!("{name}: {msg}"));
            }
        }
    };

    run("manifests apply server-side (dry run)", &mut || {
        manifests_dry_run(&cluster)
    });
    run("overlays", &mut || overlays(&cluster));
    run("overlays/k1 applies whole on 1.20", &mut || {
        k1_overlay(&cluster)
    });
    // Everything below authenticates as the router: its RBAC must be in place (base first).
    let router_kubeconfig = rt.block_on(router_identity(&cluster));
    run("rbac: the base's Role is enough and no more", &mut || {
        rt.block_on(rbac_base(&cluster, &router_kubeconfig))
    });
    run(
        "platform store: two router replicas share records and watch them",
        &mut || {
            apply_platform_crd(&cluster);
            rt.block_on(platform_store(&router_kubeconfig))
        },
    );
    run(
        "platform API: two router processes in front of two nodes share keys and environments",
        &mut || {
            apply_platform_crd(&cluster);
            rt.block_on(platform_routers(&cluster, &router_kubeconfig))
        },
    );
    run("router binary: discovery and /readyz", &mut || {
        rt.block_on(router_binary(&cluster, &router_kubeconfig))
    });
    apply_rbac(&cluster, "overlays/production");
    run(
        "rbac: the watch-nodes component adds Node reads only",
        &mut || rt.block_on(rbac_nodes(&router_kubeconfig)),
    );
    run("discovery with the router's token", &mut || {
        rt.block_on(discovery(&cluster, &router_kubeconfig))
    });
    drop(rt);
    let t = Instant::now();
    drop(cluster);
    eprintln!("kube_real: kube-down in {:?}", t.elapsed());
    eprintln!("kube_real: {:?} in all", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Manifests.

/// Since which Kubernetes minor each API version the manifests use is served.
fn served_since(api_version: &str) -> u32 {
    match api_version {
        "v1" => 0,
        "apps/v1" => 9,
        "rbac.authorization.k8s.io/v1" => 8,
        "node.k8s.io/v1" => 20,
        "policy/v1" => 21,
        "apiextensions.k8s.io/v1" => 16,
        other => panic!("API version {other} is not in the test's table: add when it came"),
    }
}

/// Every probe under `v` (a JSON tree), with its path.
fn probes(v: &serde_json::Value, path: String, out: &mut Vec<(String, serde_json::Value)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if k.ends_with("Probe") {
                    out.push((format!("{path}.{k}"), x.clone()));
                }
                probes(x, format!("{path}.{k}"), out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                probes(x, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// `kubectl apply` as the API server would apply it, changing nothing.
const DRY_RUN: [&str; 4] = [
    "apply",
    "--server-side",
    "--dry-run=server",
    "--field-manager=computed-tests",
];

fn manifests_dry_run(c: &Cluster) {
    let versions = c.kubectl_ok(&["api-versions"], None);
    let has_policy_v1 = versions.lines().any(|l| l.trim() == "policy/v1");

    // runtimeclass/: every object, as is.
    let out = c.kubectl_ok(&[&DRY_RUN[..], &["-f", "runtimeclass/"]].concat(), None);
    assert!(
        out.contains("runtimeclass.node.k8s.io/gvisor serverside-applied (server dry run)"),
        "{out}"
    );
    let runtimeclass =
        docs(&std::fs::read_to_string(repo().join("runtimeclass/runtimeclass.yaml")).unwrap());

    let mut min_minor = 0;
    for o in &runtimeclass {
        min_minor = min_minor.max(served_since(o["apiVersion"].as_str().unwrap()));
    }
    for dir in OVERLAYS {
        let objs = c.render(dir);
        let want: BTreeSet<String> = objs.iter().map(kubectl_name).collect();
        for o in &objs {
            min_minor = min_minor.max(served_since(o["apiVersion"].as_str().unwrap()));
            let mut found = Vec::new();
            probes(
                &serde_json::to_value(o).unwrap(),
                kubectl_name(o),
                &mut found,
            );
            for (at, p) in found {
                assert!(
                    p.get("grpc").is_none(),
                    "{dir}: {at} is a gRPC probe (Kubernetes 1.24+; plaintext only)"
                );
            }
        }
        let kdir = format!("daemonset/{dir}");
        let out = c.kubectl(&[&DRY_RUN[..], &["-k", &kdir, "-o", "name"]].concat(), None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let applied: BTreeSet<String> = stdout.lines().map(|l| l.trim().to_string()).collect();
        if has_policy_v1 {
            assert!(out.status.success(), "{dir}: {stderr}");
            assert_eq!(applied, want, "{dir}: {stderr}");
            continue;
        }
        // 1.20: everything but the PodDisruptionBudget, which is refused for its API version.
        let pdbs: Vec<&serde_yaml::Value> = objs
            .iter()
            .filter(|o| kind_of(o) == "PodDisruptionBudget")
            .collect();
        assert_eq!(pdbs.len(), 1, "{dir}");
        let mut want_here = want.clone();
        want_here.remove(&kubectl_name(pdbs[0]));
        assert_eq!(
            applied, want_here,
            "{dir}: applied {applied:?}; stderr: {stderr}"
        );
        assert!(
            !out.status.success(),
            "{dir}: 1.20 took a policy/v1 PodDisruptionBudget?"
        );
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                line.contains(
                    r#"no matches for kind "PodDisruptionBudget" in version "policy/v1""#
                ) || line.contains("ensure CRDs are installed first")
                    || line.contains("version difference between client"),
                "{dir}: refused for another reason than the PodDisruptionBudget's version: {line}"
            );
        }
        // The same PodDisruptionBudget as policy/v1beta1 (its fields are the same there).
        let mut old = pdbs[0].clone();
        old["apiVersion"] = "policy/v1beta1".into();
        let out = c.kubectl_ok(
            &[&DRY_RUN[..], &["-f", "-"]].concat(),
            Some(&to_yaml(&[&old])),
        );
        assert!(
            out.contains("serverside-applied (server dry run)"),
            "{dir}: {out}"
        );
    }
    assert_eq!(
        min_minor, MIN_MINOR,
        "the manifests need Kubernetes 1.{min_minor}; update MIN_MINOR and the docs"
    );
    let want = format!("Kubernetes 1.{MIN_MINOR} or later");
    for doc in ["README.md", "docs/deployment.md", "daemonset/README.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        assert!(text.contains(&want), "{doc} does not say {want:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Overlays.

/// The overlay of the k1 cluster (`tests/k1/run.sh` deploys it for real): every object, the
/// PodDisruptionBudget included, is taken by a 1.20 API server; the installer's args parse with
/// its own flags and point at k1's containerd, never the host's; the node config loads and
/// every host path the daemon hands containerd is mounted at itself.
fn k1_overlay(c: &Cluster) {
    let objs = c.render("overlays/k1");
    let want: BTreeSet<String> = objs.iter().map(kubectl_name).collect();
    let out = c.kubectl(
        &[&DRY_RUN[..], &["-k", "daemonset/overlays/k1", "-o", "name"]].concat(),
        None,
    );
    let applied: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(applied, want);
    let pdb = one(&objs, "PodDisruptionBudget", "computed-router");
    assert_eq!(pdb["apiVersion"].as_str(), Some("policy/v1beta1"));

    let ds: DaemonSet = typed(one(&objs, "DaemonSet", "computed-node"));
    let spec = ds.spec.unwrap().template.spec.unwrap();
    let init = &spec.init_containers.as_ref().unwrap()[0];
    let opts = common::install_opts_of(&init.args.clone().unwrap());
    assert_eq!(
        opts.containerd_config,
        Path::new("/tmp/k1/containerd/config.toml")
    );
    assert_eq!(opts.restart_mode, computed::install::RestartMode::Reexec);
    assert_eq!(opts.runtime, computed::install::RuntimeMode::RuncShim);
    assert_eq!(
        opts.containerd_pid_file.as_deref(),
        Some(Path::new("/tmp/k1/containerd.pid"))
    );
    for p in [&opts.bin_dir, &opts.runsc_config] {
        assert!(
            !p.starts_with("/usr") && !p.starts_with("/etc"),
            "{}",
            p.display()
        );
    }

    let cm: ConfigMap = typed(one(&objs, "ConfigMap", "computed-node-config"));
    let cfg = node_config(&cm, "overlays/k1");
    assert_eq!(cfg.runsc_path, opts.bin_dir.join("runsc"));
    assert_eq!(cfg.cgroup_parent, "compute-k1");
    let nc = container(&spec, "computed");
    let host_path = |mount: &str| -> (String, Option<String>) {
        let m = nc
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == mount)
            .unwrap_or_else(|| panic!("{mount} is not mounted"));
        let v = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .unwrap();
        (
            v.host_path.as_ref().unwrap().path.clone(),
            m.mount_propagation.clone(),
        )
    };
    for dir in [&cfg.state_dir, &cfg.run_dir] {
        let d = dir.to_str().unwrap();
        assert!(d.ends_with("-k1"), "{d}: shared with another daemon");
        assert_eq!(host_path(d), (d.to_string(), Some("Bidirectional".into())));
    }
    assert!(cfg.runsc_path.starts_with(&cfg.state_dir));
    assert!(cfg.socket.starts_with(&cfg.run_dir));
    // containerd's socket: k1's directory, whatever path the pod sees it at.
    let addr = nc
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "CONTAINERD_ADDRESS")
        .and_then(|e| e.value.clone())
        .unwrap();
    let sock = Path::new(&addr);
    assert_eq!(sock.file_name().unwrap(), "containerd.sock");
    assert_eq!(
        host_path(sock.parent().unwrap().to_str().unwrap()).0,
        "/tmp/k1"
    );
}

/// The node config of a rendered overlay's ConfigMap, loaded with the daemon's own loader.
fn node_config(cm: &ConfigMap, dir: &str) -> computed::config::Config {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("config.toml");
    std::fs::write(&f, &cm.data.as_ref().unwrap()["config.toml"]).unwrap();
    computed::config::Config::load(Some(&f)).unwrap_or_else(|e| panic!("{dir}: {e}"))
}

fn config_table(cm: &ConfigMap) -> toml::Table {
    let text = &cm.data.as_ref().unwrap()["config.toml"];
    toml::from_str(text).unwrap_or_else(|e| panic!("config.toml: {e}"))
}

fn overlays(c: &Cluster) {
    let rendered: BTreeMap<&str, Vec<serde_yaml::Value>> =
        OVERLAYS.iter().map(|d| (*d, c.render(d))).collect();
    let base = &rendered["base"];
    let base_ds: DaemonSet = typed(one(base, "DaemonSet", "computed-node"));
    let base_cm: ConfigMap = typed(one(base, "ConfigMap", "computed-node-config"));
    let base_cfg = config_table(&base_cm);
    let image = "ghcr.io/paper-board/computed:0.1.0";

    for (dir, objs) in &rendered {
        let ds: DaemonSet = typed(one(objs, "DaemonSet", "computed-node"));
        let router: Deployment = typed(one(objs, "Deployment", "computed-router"));
        let dspec = ds.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let rspec = router.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let rc = container(&rspec, "router");
        let args = rc.args.clone().unwrap();
        assert_router_args_accepted(&args, dir);

        // The node config loads with the real loader, in every overlay.
        let cm: ConfigMap = typed(one(objs, "ConfigMap", "computed-node-config"));
        let cfg = node_config(&cm, dir);
        // Every base setting is kept (a ConfigMap key is replaced whole by an overlay).
        let table = config_table(&cm);
        for (k, v) in &base_cfg {
            assert_eq!(table.get(k), Some(v), "{dir}: node config key {k}");
        }
        let watch_nodes = flag(&args, "--watch-nodes");
        let has_cluster_role = objs.iter().any(|o| kind_of(o) == "ClusterRole");
        assert_eq!(
            watch_nodes == Some("true"),
            has_cluster_role,
            "{dir}: --watch-nodes={watch_nodes:?} but ClusterRole present: {has_cluster_role}"
        );

        match *dir {
            "base" => {
                assert_eq!(watch_nodes, Some("false"));
                assert!(cfg.tls_cert.as_os_str().is_empty());
            }
            "overlays/kind" => {
                assert_eq!(watch_nodes, Some("true"));
                let policies: Vec<_> = dspec
                    .containers
                    .iter()
                    .chain(dspec.init_containers.iter().flatten())
                    .chain(rspec.containers.iter())
                    .map(|c| (c.name.clone(), c.image.clone(), c.image_pull_policy.clone()))
                    .collect();
                assert_eq!(policies.len(), 3);
                for (name, img, policy) in policies {
                    assert_eq!(img.as_deref(), Some(image), "{name}");
                    assert_eq!(
                        policy.as_deref(),
                        Some("Never"),
                        "{name}: kind loads the image"
                    );
                }
                // Nothing else of the node changes.
                assert_eq!(
                    dspec.node_selector,
                    base_ds
                        .spec
                        .as_ref()
                        .unwrap()
                        .template
                        .spec
                        .as_ref()
                        .unwrap()
                        .node_selector
                );
            }
            "overlays/production" => {
                assert_eq!(watch_nodes, Some("true"));
                // The dedicated pool, as well as the gVisor label; both taints tolerated.
                let sel = dspec.node_selector.clone().unwrap();
                assert_eq!(
                    sel.get("compute.paper-board.io/gvisor").map(String::as_str),
                    Some("true")
                );
                assert_eq!(
                    sel.get("compute.paper-board.io/pool").map(String::as_str),
                    Some("gvisor")
                );
                let tol: BTreeSet<(String, String)> = dspec
                    .tolerations
                    .clone()
                    .unwrap()
                    .into_iter()
                    .map(|t| {
                        assert_eq!(t.effect.as_deref(), Some("NoSchedule"));
                        assert_eq!(t.operator.as_deref(), Some("Equal"));
                        (t.key.unwrap(), t.value.unwrap())
                    })
                    .collect();
                assert_eq!(
                    tol,
                    BTreeSet::from([
                        ("compute.paper-board.io/gvisor".into(), "true".into()),
                        ("compute.paper-board.io/pool".into(), "gvisor".into()),
                    ])
                );
                // The node's TLS files are in the Secret mounted into the daemon.
                let nc = container(&dspec, "computed");
                let secret_dir = |spec: &PodSpec, c: &Container, secret: &str| -> PathBuf {
                    let vol = spec
                        .volumes
                        .iter()
                        .flatten()
                        .find(|v| {
                            v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret)
                        })
                        .unwrap_or_else(|| panic!("no volume of Secret {secret}"));
                    let m = c
                        .volume_mounts
                        .iter()
                        .flatten()
                        .find(|m| m.name == vol.name)
                        .unwrap_or_else(|| panic!("Secret {secret} is not mounted in {}", c.name));
                    assert_eq!(m.read_only, Some(true));
                    PathBuf::from(&m.mount_path)
                };
                let node_tls = secret_dir(&dspec, nc, "computed-node-tls");
                assert_eq!(cfg.tls_cert, node_tls.join("tls.crt"));
                assert_eq!(cfg.tls_key, node_tls.join("tls.key"));
                assert_eq!(cfg.tls_client_ca, node_tls.join("ca.crt"));
                // Not inside another volume's mount (the ConfigMap's is read-only).
                for m in nc.volume_mounts.iter().flatten() {
                    assert!(
                        m.mount_path == node_tls.to_str().unwrap()
                            || !node_tls.starts_with(&m.mount_path),
                        "{} is inside {}",
                        node_tls.display(),
                        m.mount_path
                    );
                }
                // The router: its listener's and its node-client certificates.
                let listener = secret_dir(&rspec, rc, "computed-router-tls");
                let client = secret_dir(&rspec, rc, "computed-router-client-tls");
                for (f, want) in [
                    ("--tls-cert", listener.join("tls.crt")),
                    ("--tls-key", listener.join("tls.key")),
                    ("--tls-client-ca", listener.join("ca.crt")),
                    ("--node-tls-ca", client.join("ca.crt")),
                    ("--node-tls-cert", client.join("tls.crt")),
                    ("--node-tls-key", client.join("tls.key")),
                ] {
                    assert_eq!(flag(&args, f).map(PathBuf::from), Some(want), "{f}");
                }
                // The platform peer secret: one Secret, mounted into both.
                let node_peer = secret_dir(&dspec, nc, "computed-platform-peer");
                let router_peer = secret_dir(&rspec, rc, "computed-platform-peer");
                assert_eq!(cfg.platform_peer_secret, node_peer.join("secret"));
                assert_eq!(
                    flag(&args, "--platform-peer-secret").map(PathBuf::from),
                    Some(router_peer.join("secret"))
                );
                // One node certificate for all nodes: checked by name, not by pod IP.
                assert_eq!(
                    flag(&args, "--node-tls-server-name"),
                    Some("computed-node.compute-system.svc")
                );
                // Non-root: the keys' group is the router's.
                let psc = rspec.security_context.as_ref().unwrap();
                assert_eq!(psc.fs_group, psc.run_as_group);
                // The Service no longer claims cleartext HTTP/2.
                let svc = one(objs, "Service", "computed");
                assert!(svc["spec"]["ports"][0]["appProtocol"].is_null());
                // The probes do not touch the TLS listener.
                for p in [
                    &rc.readiness_probe,
                    &nc.readiness_probe,
                    &nc.liveness_probe,
                    &nc.startup_probe,
                ] {
                    let p = p.as_ref().unwrap();
                    assert!(p.http_get.is_some(), "{p:?}");
                }
            }
            other => panic!("unknown overlay {other}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The router's identity and RBAC.

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Applies (for real) the ServiceAccounts and RBAC objects of an overlay.
fn apply_rbac(c: &Cluster, dir: &str) {
    let objs = c.render(dir);
    let rbac: Vec<&serde_yaml::Value> = objs
        .iter()
        .filter(|o| {
            matches!(
                kind_of(o),
                "ServiceAccount" | "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
            )
        })
        .collect();
    c.kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=computed-tests",
            "-f",
            "-",
        ],
        Some(&to_yaml(&rbac)),
    );
}

/// Applies the base's RBAC and returns a kubeconfig with a token of the router's ServiceAccount.
async fn router_identity(c: &Cluster) -> PathBuf {
    apply_rbac(c, "base");
    let admin = client_from(&c.kubeconfig).await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin, NS);
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let tr = sas
        .create_token_request("computed-router", &PostParams::default(), &tr)
        .await
        .expect("TokenRequest for computed-router");
    let token = tr.status.expect("token").token;
    c.kubeconfig_with_token("computed-router", &token)
}

#[derive(Clone, Copy)]
struct Ask<'a> {
    verb: &'a str,
    resource: &'a str,
    subresource: &'a str,
    namespace: &'a str,
    group: &'a str,
}

const fn ask<'a>(verb: &'a str, resource: &'a str, namespace: &'a str) -> Ask<'a> {
    Ask {
        verb,
        resource,
        subresource: "",
        namespace,
        group: "",
    }
}

/// `a` on a subresource.
const fn sub<'a>(subresource: &'a str, a: Ask<'a>) -> Ask<'a> {
    Ask { subresource, ..a }
}

/// `a` in an API group.
const fn group<'a>(group: &'a str, a: Ask<'a>) -> Ask<'a> {
    Ask { group, ..a }
}

fn attrs(a: Ask) -> ResourceAttributes {
    let s = |x: &str| (!x.is_empty()).then(|| x.to_string());
    ResourceAttributes {
        verb: s(a.verb),
        resource: s(a.resource),
        subresource: s(a.subresource),
        namespace: s(a.namespace),
        group: Some(a.group.to_string()),
        ..Default::default()
    }
}

/// `kubectl auth can-i`, as the client's own identity.
async fn can_i(client: &kube::Client, a: Ask<'_>) -> bool {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let r = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attrs(a)),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &r)
        .await
        .expect("SelfSubjectAccessReview")
        .status
        .expect("status")
        .allowed
}

fn describe(a: Ask) -> String {
    let ns = if a.namespace.is_empty() {
        "cluster".to_string()
    } else {
        format!("ns {}", a.namespace)
    };
    let sub = if a.subresource.is_empty() {
        String::new()
    } else {
        format!("/{}", a.subresource)
    };
    let group = if a.group.is_empty() {
        String::new()
    } else {
        format!(".{}", a.group)
    };
    format!("{} {}{group}{sub} ({ns})", a.verb, a.resource)
}

/// What the router must never do, whatever overlay.
const NEVER: &[Ask] = &[
    ask("list", "secrets", NS),
    ask("get", "secrets", NS),
    ask("watch", "secrets", NS),
    ask("list", "secrets", ""),
    ask("list", "configmaps", NS),
    ask("create", "pods", NS),
    ask("delete", "pods", NS),
    ask("patch", "pods", NS),
    ask("update", "pods", NS),
    ask("deletecollection", "pods", NS),
    sub("status", ask("patch", "pods", NS)),
    sub("exec", ask("create", "pods", NS)),
    sub("eviction", ask("create", "pods", NS)),
    ask("list", "pods", "default"),
    ask("list", "pods", "kube-system"),
    ask("list", "pods", ""),
    ask("patch", "nodes", ""),
    ask("update", "nodes", ""),
    ask("delete", "nodes", ""),
    sub("status", ask("patch", "nodes", "")),
    ask("create", "serviceaccounts", NS),
    sub("token", ask("create", "serviceaccounts", NS)),
    group("apps", ask("list", "daemonsets", NS)),
    group("apps", ask("patch", "deployments", NS)),
    group("rbac.authorization.k8s.io", ask("create", "roles", NS)),
    group("rbac.authorization.k8s.io", ask("bind", "clusterroles", "")),
];

/// Asserts that the client may do each of `asks`; `who` names it in the message.
async fn assert_may(client: &kube::Client, asks: impl IntoIterator<Item = Ask<'_>>, who: &str) {
    for a in asks {
        assert!(can_i(client, a).await, "{who} may not {}", describe(a));
    }
}

/// Those of `asks` the client may do, described.
async fn allowed(client: &kube::Client, asks: impl IntoIterator<Item = Ask<'_>>) -> Vec<String> {
    let mut out = Vec::new();
    for a in asks {
        if can_i(client, a).await {
            out.push(describe(a));
        }
    }
    out
}

/// The resource rules the client has in `namespace`, minus what every authenticated user has
/// (system:basic-user: create self-subject reviews), as `resource -> verbs`.
async fn own_rules(client: &kube::Client, namespace: &str) -> BTreeMap<String, BTreeSet<String>> {
    let api: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let r = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.to_string()),
        },
        ..Default::default()
    };
    let st = api
        .create(&PostParams::default(), &r)
        .await
        .expect("SelfSubjectRulesReview")
        .status
        .expect("status");
    assert!(
        !st.incomplete,
        "rules review incomplete: {:?}",
        st.evaluation_error
    );
    let mut rules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in st.resource_rules {
        let groups = r.api_groups.unwrap_or_default();
        for res in r.resources.unwrap_or_default() {
            if groups == ["authorization.k8s.io"]
                && matches!(
                    res.as_str(),
                    "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
                )
            {
                continue;
            }
            assert!(r.resource_names.as_ref().is_none_or(|n| n.is_empty()));
            let key = format!("{}:{res}", groups.join(","));
            rules
                .entry(key)
                .or_default()
                .extend(r.verbs.iter().cloned());
        }
    }
    rules
}

fn read_only(resources: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    resources
        .iter()
        .map(|r| {
            (
                format!(":{r}"),
                ["get", "list", "watch"].map(String::from).into(),
            )
        })
        .collect()
}

/// `rules` plus what the router may do with the platform's records (in its namespace only).
fn with_platform_records(
    mut rules: BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    rules.insert(
        "compute.dev:platformrecords".into(),
        ["get", "list", "watch", "create", "update", "delete"]
            .map(String::from)
            .into(),
    );
    rules
}

async fn rbac_base(c: &Cluster, router_kubeconfig: &Path) {
    let router = client_from(router_kubeconfig).await;
    let reads = ["get", "list", "watch"].map(|verb| ask(verb, "pods", NS));
    assert_may(&router, reads, "the router").await;
    let nodes = [ask("list", "nodes", ""), ask("watch", "nodes", "")];
    let too_much = allowed(&router, NEVER.iter().copied().chain(nodes)).await;
    assert!(too_much.is_empty(), "the base's router may {too_much:?}");
    assert_eq!(
        own_rules(&router, NS).await,
        with_platform_records(read_only(&["pods"]))
    );
    assert_eq!(own_rules(&router, "default").await, BTreeMap::new());

    // Real calls: reading pods works, the rest is refused by the server.
    let pods: Api<Pod> = Api::namespaced(router.clone(), NS);
    pods.list(&Default::default())
        .await
        .expect("list pods as the router");
    let forbidden = |r: kube::Result<()>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what} as the router: {other:?}, not 403"),
    };
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(router.clone(), NS);
    forbidden(
        secrets.list(&Default::default()).await.map(drop),
        "list secrets",
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "router-made"},
        "spec": {"containers": [{"name": "x", "image": "x"}]}
    }))
    .unwrap();
    forbidden(
        pods.create(&PostParams::default(), &pod).await.map(drop),
        "create a pod",
    );
    let nodes: Api<Node> = Api::all(router.clone());
    forbidden(
        nodes.list(&Default::default()).await.map(drop),
        "list nodes (base)",
    );

    // The node daemon's ServiceAccount may do nothing (it never talks to the API).
    let node_sa = format!("system:serviceaccount:{NS}:computed-node");
    let admin = client_from(&c.kubeconfig).await;
    let sar: Api<SubjectAccessReview> = Api::all(admin);
    for a in [
        ask("list", "pods", NS),
        ask("get", "secrets", NS),
        ask("list", "nodes", ""),
    ] {
        let r = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(node_sa.clone()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{NS}"),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(attrs(a)),
                ..Default::default()
            },
            ..Default::default()
        };
        let st = sar
            .create(&PostParams::default(), &r)
            .await
            .expect("SubjectAccessReview")
            .status
            .unwrap();
        assert!(!st.allowed, "computed-node may {}", describe(a));
    }
}

async fn rbac_nodes(router_kubeconfig: &Path) {
    let router = client_from(router_kubeconfig).await;
    let reads = ["get", "list", "watch"].map(|verb| ask(verb, "nodes", ""));
    assert_may(&router, reads, "with watch-nodes the router").await;
    let too_much = allowed(&router, NEVER.iter().copied()).await;
    assert!(
        too_much.is_empty(),
        "with watch-nodes the router may {too_much:?}"
    );
    assert_eq!(
        own_rules(&router, NS).await,
        with_platform_records(read_only(&["nodes", "pods"]))
    );
    assert_eq!(own_rules(&router, "default").await, read_only(&["nodes"]));
    let nodes: Api<Node> = Api::all(router);
    nodes
        .list(&Default::default())
        .await
        .expect("list nodes with watch-nodes");
}

// ---------------------------------------------------------------------------------------------
// Discovery.

fn pod_json(name: &str, node: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "compute"}},
        "spec": {"nodeName": node, "containers": [{"name": "computed", "image": "ghcr.io/paper-board/computed:0.1.0"}]}
    }))
    .unwrap()
}

/// What the kubelet would report: the pod's IP and its Ready condition.
async fn set_ready(pods: &Api<Pod>, name: &str, ip: &str, ready: bool) {
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

/// Deletion with no grace period.
fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    }
}

/// Deletes the pod at once (no grace period: no kubelet runs to finish it).
async fn delete_now(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &now()).await.unwrap();
}

async fn make_node(nodes: &Api<Node>, name: &str) {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"compute.paper-board.io/gvisor": "true"}}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
}

async fn cordon(nodes: &Api<Node>, name: &str, on: bool) {
    let p = json!({"spec": {"unschedulable": on}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
}

/// `(node name, url, cordoned)` of each node in the set.
fn view(set: &NodeSet) -> Vec<(String, String, bool)> {
    set.values()
        .map(|n| (n.name.clone(), n.url.clone(), n.cordoned))
        .collect()
}

async fn wait_set(rx: &mut watch::Receiver<NodeSet>, want: &[(&str, &str, bool)], what: &str) {
    let want: Vec<(String, String, bool)> = want
        .iter()
        .map(|(n, u, c)| (n.to_string(), u.to_string(), *c))
        .collect();
    let r = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if view(&rx.borrow_and_update()) == want {
                return;
            }
            rx.changed().await.expect("watcher stopped");
        }
    })
    .await;
    if r.is_err() {
        panic!(
            "{what}: node set never became {want:?}; is {:?}",
            view(&rx.borrow())
        );
    }
}

async fn discovery(c: &Cluster, router_kubeconfig: &Path) {
    let admin = client_from(&c.kubeconfig).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    // A scenario before may have failed half-way: start with no pods.
    pods.delete_collection(&now(), &Default::default())
        .await
        .unwrap();
    for n in ["node-a", "node-b", "node-c"] {
        make_node(&nodes, n).await;
    }
    // Two daemon pods before the router starts (its first list), one not ready yet.
    for (pod, node) in [("computed-node-a", "node-a"), ("computed-node-b", "node-b")] {
        pods.create(
            &PostParams::default(),
            &pod_json(pod, node, "computed-node"),
        )
        .await
        .unwrap();
    }
    set_ready(&pods, "computed-node-a", "10.0.0.1", true).await;
    // Look-alikes that are not node daemons: the router's own pod, and a daemon pod in
    // another namespace (which the router may not even read).
    pods.create(
        &PostParams::default(),
        &pod_json("computed-router-x", "node-a", "computed-router"),
    )
    .await
    .unwrap();
    set_ready(&pods, "computed-router-x", "10.0.0.99", true).await;
    let other_ns: Api<Pod> = Api::namespaced(admin.clone(), "default");
    other_ns
        .create(
            &PostParams::default(),
            &pod_json("computed-node-z", "node-c", "computed-node"),
        )
        .await
        .unwrap();
    set_ready(&other_ns, "computed-node-z", "10.0.0.98", true).await;

    let router = client_from(router_kubeconfig).await;
    let (mut rx, task) = watch_pods(
        router,
        NS,
        SELECTOR,
        50051,
        computed::router::tls::Scheme::Http,
        true,
    );
    let a = ("node-a", "http://10.0.0.1:50051", false);
    let b = ("node-b", "http://10.0.0.2:50051", false);
    let cc = ("node-c", "http://10.0.0.3:50051", false);
    wait_set(&mut rx, &[a], "initial list: only the ready daemon pod").await;

    set_ready(&pods, "computed-node-b", "10.0.0.2", true).await;
    wait_set(&mut rx, &[a, b], "node-b's pod becomes ready").await;

    pods.create(
        &PostParams::default(),
        &pod_json("computed-node-c", "node-c", "computed-node"),
    )
    .await
    .unwrap();
    set_ready(&pods, "computed-node-c", "10.0.0.3", true).await;
    wait_set(&mut rx, &[a, b, cc], "a pod added while watching").await;

    cordon(&nodes, "node-a", true).await;
    wait_set(&mut rx, &[("node-a", a.1, true), b, cc], "node-a cordoned").await;
    cordon(&nodes, "node-a", false).await;
    wait_set(&mut rx, &[a, b, cc], "node-a uncordoned").await;

    // node-b stops answering: the node lifecycle controller marks its pods not ready.
    set_ready(&pods, "computed-node-b", "10.0.0.2", false).await;
    wait_set(&mut rx, &[a, cc], "node-b NotReady").await;
    set_ready(&pods, "computed-node-b", "10.0.0.2", true).await;
    wait_set(&mut rx, &[a, b, cc], "node-b back").await;

    // node-c goes away: its Node is deleted and its pod is being deleted (Terminating: with no
    // kubelet to confirm, it stays so), then removed.
    nodes
        .delete("node-c", &DeleteParams::default())
        .await
        .unwrap();
    let gone = pods
        .delete("computed-node-c", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        gone.is_left(),
        "the pod went at once; expected it Terminating"
    );
    wait_set(&mut rx, &[a, b], "node-c going away (pod Terminating)").await;
    delete_now(&pods, "computed-node-c").await;
    wait_set(&mut rx, &[a, b], "node-c's pod removed").await;

    // A rollout replaces node-b's pod: the new one has another IP.
    delete_now(&pods, "computed-node-b").await;
    wait_set(&mut rx, &[a], "node-b's old pod deleted").await;
    pods.create(
        &PostParams::default(),
        &pod_json("computed-node-b2", "node-b", "computed-node"),
    )
    .await
    .unwrap();
    set_ready(&pods, "computed-node-b2", "10.0.0.22", true).await;
    wait_set(
        &mut rx,
        &[a, ("node-b", "http://10.0.0.22:50051", false)],
        "node-b's new pod",
    )
    .await;
    task.abort();
}

// ---------------------------------------------------------------------------------------------
// The router binary.

/// A node daemon's NodeInfo, enough for the router's health poll.
#[derive(Clone)]
struct FakeNode;

#[tonic::async_trait]
impl nodepb::node_info_server::NodeInfo for FakeNode {
    async fn get_info(
        &self,
        _req: tonic::Request<nodepb::GetInfoRequest>,
    ) -> Result<tonic::Response<nodepb::GetInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(nodepb::GetInfoResponse {
            node_name: "node-local".into(),
            free_memory_bytes: 8 << 30,
            free_cpu_millis: 4000,
            max_sandboxes: 10,
            ..Default::default()
        }))
    }
}

/// The status code of `GET path` on `addr`, or None if it does not answer.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

async fn wait_status(addr: &str, path: &str, want: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = None;
    while Instant::now() < deadline {
        let (a, p) = (addr.to_string(), path.to_string());
        last = tokio::task::spawn_blocking(move || http_status(&a, &p))
            .await
            .unwrap();
        if last == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{what}: {path} is {last:?}, not {want}; router log:\n{}",
        tail(log, 30)
    );
}

async fn router_binary(c: &Cluster, router_kubeconfig: &Path) {
    // A fake node daemon on loopback; its pod's IP is 127.0.0.1 and the router's --node-port
    // is its port.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node_port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(nodepb::node_info_server::NodeInfoServer::new(FakeNode))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    // The base's router args, with loopback addresses.
    let base = c.render("base");
    let d: Deployment = typed(one(&base, "Deployment", "computed-router"));
    let spec = d.spec.unwrap().template.spec.unwrap();
    let mut args = container(&spec, "router").args.clone().unwrap();
    let (listen, metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    for (f, v) in [
        ("--listen", listen.clone()),
        ("--metrics-listen", metrics.clone()),
        ("--node-port", node_port.to_string()),
    ] {
        let i = args
            .iter()
            .position(|a| a == f)
            .unwrap_or_else(|| panic!("no {f}"));
        args[i + 1] = v;
    }
    assert_eq!(flag(&args, "--watch-nodes"), Some("false"));
    let log = c.path("router.log");
    let _router = Killed(spawn_router(&args, router_kubeconfig, &log));
    wait_status(&metrics, "/livez", 200, "router started", &log).await;
    assert_eq!(
        http_status(&metrics, "/readyz"),
        Some(503),
        "ready with no node"
    );

    let admin = client_from(&c.kubeconfig).await;
    let pods: Api<Pod> = Api::namespaced(admin, NS);
    pods.create(
        &PostParams::default(),
        &pod_json("computed-node-local", "node-local", "computed-node"),
    )
    .await
    .unwrap();
    set_ready(&pods, "computed-node-local", "127.0.0.1", true).await;
    wait_status(&metrics, "/readyz", 200, "the node's pod is ready", &log).await;
    set_ready(&pods, "computed-node-local", "127.0.0.1", false).await;
    wait_status(
        &metrics,
        "/readyz",
        503,
        "the node's pod is not ready",
        &log,
    )
    .await;
    delete_now(&pods, "computed-node-local").await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("discovering nodes through Kubernetes") && text.contains("node ready"),
        "router log:\n{text}"
    );
    assert!(
        // (Not a bare "403": the router's random port can contain it.)
        !text.contains("watch error")
            && !text.to_lowercase().contains("forbidden")
            && !text.contains("code: 403"),
        "the router's RBAC fell short:\n{text}"
    );
    server.abort();
}

// ---------------------------------------------------------------------------------------------
// The platform store.

/// Applies the base's PlatformRecord CRD for real and waits until it is served.
fn apply_platform_crd(c: &Cluster) {
    let base = c.render("base");
    let crd = one(
        &base,
        "CustomResourceDefinition",
        "platformrecords.compute.dev",
    );
    c.kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=computed-tests",
            "-f",
            "-",
        ],
        Some(&to_yaml(&[crd])),
    );
    c.kubectl_ok(
        &[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/platformrecords.compute.dev",
        ],
        None,
    );
}

/// Polls `f` until it is true (10 s).
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !f().await {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two replicas (two clients with the router's own token, as two router pods would have)
/// over the same PlatformRecords: what one writes the other reads, a key made or revoked
/// through one is accepted or refused by the other's authenticator without a restart, and
/// the audit log is one sequence.
async fn platform_store(router_kubeconfig: &Path) {
    use computed::platform::access::Role;
    use computed::platform::auth::{self, Authenticator, Credentials};
    use computed::platform::records::{
        ApiKey, AuditEvent, Binding, Environment, Namespace, Outcome,
    };
    use computed::platform::store::{Error, Kind, Records};
    use computed::platform::{keys, kube_store};

    let a_store = kube_store::shared(client_from(router_kubeconfig).await, NS);
    let b_store = kube_store::shared(client_from(router_kubeconfig).await, NS);
    let (a, b) = (Records::new(a_store.clone()), Records::new(b_store.clone()));
    let auth_b = Authenticator::new(b.clone());
    let mut b_changes = b_store.watch();
    let now = "2026-12-02T00:00:00Z".to_string();

    // A namespace and an environment through A, read back through B.
    let ns = Namespace {
        name: "team-a".into(),
        labels: Default::default(),
        created_at: now.clone(),
    };
    a.create(&ns).await.unwrap();
    assert!(matches!(
        a.create(&ns).await,
        Err(Error::AlreadyExists {
            kind: Kind::Namespace,
            ..
        })
    ));
    let env = Environment {
        namespace: "team-a".into(),
        name: "py".into(),
        image: "compute.local/sandbox-python:latest".into(),
        ..Default::default()
    };
    env.check().unwrap();
    a.create(&env).await.unwrap();
    assert_eq!(
        b.get::<Namespace>("team-a").await.unwrap(),
        Some(ns.clone())
    );
    assert_eq!(b.get::<Environment>("team-a/py").await.unwrap(), Some(env));
    // B's watch reports A's namespace (as an initial listing or as an event, whichever
    // came first).
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let c = b_changes.recv().await.unwrap();
            if c.kind == Kind::Namespace && c.key == "team-a" && c.present {
                return;
            }
        }
    })
    .await
    .expect("B's watch sees A's namespace");

    // A key made through A works through B at once, with the role A binds.
    let (id, token) = keys::mint().unwrap();
    a.create(&ApiKey {
        key_id: id.clone(),
        name: "ci".into(),
        sha256: keys::digest(&token),
        platform_admin: false,
        created_at: now.clone(),
        expires_at: None,
        revoked_at: None,
        created_by: "local-root".into(),
    })
    .await
    .unwrap();
    let bind_in_a = async |role: Role| {
        a.put(&Binding {
            namespace: "team-a".into(),
            key_id: id.clone(),
            role,
            created_at: now.clone(),
        })
        .await
        .unwrap()
    };
    let header = format!("Bearer {token}");
    let creds = Credentials {
        authorization: Some(&header),
        ..Default::default()
    };
    const GET: &str = "/platform.v1.SandboxService/GetSandbox";
    const CREATE: &str = "/platform.v1.SandboxService/CreateSandbox";
    assert!(matches!(
        auth_b.check(creds, GET, "team-a").await,
        Err(auth::Error::Hidden(_))
    ));
    bind_in_a(Role::Viewer).await;
    eventually("B sees A's viewer binding", async || {
        auth_b.check(creds, GET, "team-a").await.is_ok()
    })
    .await;
    assert!(matches!(
        auth_b.check(creds, CREATE, "team-a").await,
        Err(auth::Error::PermissionDenied(_))
    ));
    bind_in_a(Role::Operator).await;
    eventually("B sees the upgrade to operator", async || {
        auth_b.check(creds, CREATE, "team-a").await.is_ok()
    })
    .await;
    // Revoked through A: B refuses it without a restart.
    let mut k: ApiKey = a.get(&id).await.unwrap().unwrap();
    k.revoked_at = Some(now.clone());
    a.put(&k).await.unwrap();
    eventually("B refuses the key A revoked", async || {
        matches!(
            auth_b.check(creds, GET, "team-a").await,
            Err(auth::Error::Unauthenticated("key revoked"))
        )
    })
    .await;
    // The digest is stored, never the token.
    let stored: ApiKey = b.get(&id).await.unwrap().unwrap();
    assert_eq!(stored.sha256, keys::digest(&token));

    // Lists by prefix, deletes, and one audit sequence from both replicas.
    let bindings = b.list::<Binding>("team-a/").await.unwrap();
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0].role, Role::Operator);
    assert!(a.delete::<Binding>(&format!("team-a/{id}")).await.unwrap());
    assert!(!b.delete::<Binding>(&format!("team-a/{id}")).await.unwrap());
    let mut seqs = Vec::new();
    for (i, s) in [&a_store, &b_store, &a_store].into_iter().enumerate() {
        let ev = AuditEvent {
            seq: 0,
            time: now.clone(),
            principal: id.clone(),
            method: CREATE.into(),
            namespace: "team-a".into(),
            resource: format!("r{i}"),
            outcome: Outcome::Ok,
            code: String::new(),
            detail: String::new(),
        };
        seqs.push(s.audit(ev).await.unwrap());
    }
    let evs = b_store.audit_since(0, 100).await.unwrap();
    let got: Vec<u64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    assert_eq!(a_store.audit_since(got[0], 1).await.unwrap()[0].seq, got[1]);
    assert!(seqs.iter().all(|s| got.contains(s)));
}

/// `computed router ARGS` (none of the router's environment variables) with `kubeconfig`
/// as its identity and its log in `log`.
fn spawn_router(args: &[String], kubeconfig: &Path, log: &Path) -> std::process::Child {
    router_command()
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("COMPUTE_CONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// A `computed router` process with the router's token and `--platform-store kube`.
struct PlatformRouter {
    _child: Killed,
    addr: String,
    socket: PathBuf,
    log: PathBuf,
}

fn platform_router(
    c: &Cluster,
    kubeconfig: &Path,
    nodes: &str,
    name: &str,
    peer: &Path,
) -> PlatformRouter {
    let addr = common::free_addr();
    let mut args = router_args(&addr, nodes);
    args.extend([
        "--platform-peer-secret".to_string(),
        peer.display().to_string(),
    ]);
    let i = args.iter().position(|a| a == "--platform-store").unwrap();
    args[i + 1] = "kube".into();
    let socket = PathBuf::from(&args[args.iter().position(|a| a == "--socket").unwrap() + 1]);
    args.extend(["--namespace".to_string(), NS.to_string()]);
    let log = c.path(&format!("platform-router-{name}.log"));
    let mut child = spawn_router(&args, kubeconfig, &log);
    common::wait_listening(&addr, Duration::from_secs(20), "platform router", || {
        let st = child.try_wait().ok()??;
        Some(format!("router exited with {st}:\n{}", tail(&log, 30)))
    });
    PlatformRouter {
        _child: Killed(child),
        addr,
        socket,
        log,
    }
}

impl PlatformRouter {
    /// `computectl` as root on this router's socket.
    fn root(&self, args: &[&str]) -> String {
        let o = Command::new(env!("CARGO_BIN_EXE_computectl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env_remove("COMPUTE_API_KEY")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "computectl {args:?}: {}\nrouter log:\n{}",
            String::from_utf8_lossy(&o.stderr),
            tail(&self.log, 30)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// `computectl --addr ROUTER` with `key`; (success, stdout, stderr).
    fn with_key(&self, key: &str, args: &[&str]) -> (bool, String, String) {
        let o = Command::new(env!("CARGO_BIN_EXE_computectl"))
            .args(["--addr", &self.addr])
            .args(args)
            .env("COMPUTE_API_KEY", key)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }
}

/// Polls the blocking `f` until it is true (15 s).
async fn eventually_sync(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{what}: not within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn platform_routers(c: &Cluster, router_kubeconfig: &Path) {
    use computed::api::compute::v1 as cpb;
    use computed::api::platform::v1 as ppb;
    if !common::prerequisites() {
        return; // (under CI, a failure)
    }
    // The secret the routers share with the nodes: a node takes the principal (and a create's
    // environment) a router checked against the cluster's records.
    let peer = c.path("platform-peer-secret");
    std::fs::write(&peer, format!("{}\n", uuid::Uuid::new_v4().simple())).unwrap();
    let node_cfg = format!("platform_peer_secret = {peer:?}");
    let nodes = [
        common::start("kr-pa", &node_cfg),
        common::start("kr-pb", &node_cfg),
    ];
    let list = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let a = platform_router(c, router_kubeconfig, &list, "a", &peer);
    let b = platform_router(c, router_kubeconfig, &list, "b", &peer);

    // Bootstrap as root on A's socket: a namespace and three keys.
    assert!(a
        .root(&["whoami"])
        .starts_with("local-root (platform admin)"));
    a.root(&["ns", "create", "team-r"]);
    let key = |name: &str, role: &str| {
        let out = a.root(&[
            "key", "create", name, "-n", "team-r", "--role", role, "-o", "json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        (
            v["key_id"].as_str().unwrap().to_string(),
            v["secret"].as_str().unwrap().to_string(),
        )
    };
    let (_, admin) = key("r-admin", "admin");
    let (_, operator) = key("r-operator", "operator");
    let (viewer_id, viewer) = key("r-viewer", "viewer");

    // B honours A's keys, with their roles, without a restart.
    eventually_sync("B accepts the admin key A made", || {
        b.with_key(&admin, &["whoami"]).0
    })
    .await;
    let (ok, out, err) = b.with_key(
        &admin,
        &[
            "env",
            "create",
            "team-r",
            "py",
            "--image",
            common::IMAGE,
            "--memory",
            "256Mi",
        ],
    );
    assert!(ok, "admin through B: {err}");
    assert!(out.contains("py"), "{out}");
    // A serves the environment B made, to the viewer.
    let (ok, out, err) = a.with_key(&viewer, &["env", "get", "team-r", "py", "-o", "json"]);
    assert!(ok, "viewer through A: {err}");
    let env: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(env["resources"]["memory_bytes"], 256u64 << 20);
    // Roles on both: the operator may not make environments; nobody without a key may list.
    for r in [&a, &b] {
        let (ok, _, err) = r.with_key(
            &operator,
            &["env", "create", "team-r", "nope", "--image", common::IMAGE],
        );
        assert!(!ok && err.contains("PermissionDenied"), "{err}");
        let (ok, _, err) = r.with_key("", &["env", "ls", "team-r"]);
        assert!(!ok && err.contains("Unauthenticated"), "{err}");
        let (ok, out, err) = r.with_key(&operator, &["env", "ls", "team-r"]);
        assert!(ok && out.contains("py"), "{err}");
        // A namespace the key has no role in looks missing.
        let (ok, _, err) = r.with_key(&operator, &["env", "ls", "team-a"]);
        assert!(!ok && err.contains("NotFound"), "{err}");
    }
    // Sandboxes: the operator makes one through B (from the environment B's records hold) and
    // deletes it through A; the viewer may not create.
    let mut sb =
        ppb::sandbox_service_client::SandboxServiceClient::new(common::channel(&b.addr).await);
    let create = |t: &str| {
        let mut r = tonic::Request::new(ppb::CreateSandboxRequest {
            namespace: "team-r".into(),
            environment: "py".into(),
            ..Default::default()
        });
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
        r
    };
    let made = sb
        .create_sandbox(create(&operator))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(made.namespace, "team-r");
    let mut sa =
        ppb::sandbox_service_client::SandboxServiceClient::new(common::channel(&a.addr).await);
    let mut del = tonic::Request::new(ppb::DeleteSandboxRequest {
        sandbox_id: made.sandbox_id.clone(),
    });
    del.metadata_mut().insert(
        "authorization",
        format!("Bearer {operator}").parse().unwrap(),
    );
    sa.delete_sandbox(del).await.unwrap();
    let e = sb.create_sandbox(create(&viewer)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // compute.v1 through both routers reaches the nodes, unchanged.
    let mut c1 =
        cpb::compute_service_client::ComputeServiceClient::new(common::channel(&a.addr).await);
    let mut c2 =
        cpb::compute_service_client::ComputeServiceClient::new(common::channel(&b.addr).await);
    let id = c1
        .create_sandbox(common::create_req("t", "kube-real-platform"))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    let o = common::exec(&mut c2, common::exec_req(&id, "echo", &["both routers"]))
        .await
        .unwrap();
    assert_eq!(o.out(), "both routers\n");
    common::destroy(&mut c2, &id).await;

    // Revoked through A: B refuses the viewer key without a restart.
    a.root(&["key", "revoke", &viewer_id]);
    eventually_sync("B refuses the key A revoked", || {
        let (ok, _, err) = b.with_key(&viewer, &["whoami"]);
        !ok && err.contains("Unauthenticated")
    })
    .await;
    // One audit log: B's namespace admin reads A's and B's writes and denials in team-r.
    let (ok, out, err) = b.with_key(
        &admin,
        &["audit", "-n", "team-r", "-o", "json", "--limit", "1000"],
    );
    assert!(ok, "{err}");
    let evs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let has = |m: &str, outcome: &str, who: &str| {
        evs.iter().any(|e| {
            e["method"].as_str().unwrap().ends_with(m)
                && e["outcome"] == outcome
                && (who.is_empty() || e["principal"] == who)
        })
    };
    assert!(has("CreateNamespace", "ok", "local-root"), "{out}");
    assert!(has("CreateEnvironment", "ok", ""), "{out}");
    assert!(has("CreateEnvironment", "denied", ""), "{out}");
    assert!(has("CreateSandbox", "denied", &viewer_id), "{out}");
    assert!(evs.iter().all(|e| e["namespace"] == "team-r"), "{out}");
    // Root on B's socket reads the whole log, with A's revocation (a key names no namespace).
    let all = b.root(&["audit", "-o", "json", "--limit", "1000"]);
    assert!(
        all.lines().any(|l| {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            e["method"].as_str().unwrap().ends_with("RevokeApiKey")
                && e["resource"] == viewer_id.as_str()
                && e["outcome"] == "ok"
        }),
        "{all}"
    );
    // No secret in either router's log or the nodes'.
    let logs = [
        std::fs::read_to_string(&a.log).unwrap(),
        std::fs::read_to_string(&b.log).unwrap(),
        nodes[0].log_text(),
        nodes[1].log_text(),
        out,
    ];
    for s in [&admin, &operator, &viewer] {
        let secret = &s[s.len() - 64..];
        assert!(logs.iter().all(|l| !l.contains(secret)), "a key in a log");
    }
    for l in &logs[..2] {
        assert!(
            !l.to_lowercase().contains("forbidden") && !l.contains("code: 403"),
            "the router's RBAC fell short for the platform store:\n{l}"
        );
    }
}
