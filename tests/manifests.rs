//! The Kubernetes manifests (the kustomize base `daemonset/base/*.yaml`, and
//! `runtimeclass/*.yaml`) read as the API server would read them: every document deserialized
//! into its k8s-openapi type (and serialized back, so a misspelt field, which the type would
//! drop silently, fails here), then checked for the references between objects that only show
//! up at run time in a cluster: selectors and labels, Service ports, RBAC subjects and rules,
//! the router's flags against the DaemonSet, images against the Dockerfile, the installer's
//! flags and config against the node's, probes. No cluster and no network needed; the overlays
//! (rendered by kustomize) and a real API server are `tests/kube_real.rs`'s.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::router::{assert_router_args_accepted, flag};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, PodTemplateSpec, Probe, Service, ServiceAccount,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;

const NAMESPACE: &str = "compute-system";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One document: where it came from (file order is `kubectl apply -f dir/` order).
#[derive(Debug, Clone)]
struct Origin {
    file: String,
    index: usize,
    kind: String,
    name: String,
}

#[derive(Default)]
struct Objects {
    origins: Vec<Origin>,
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    pdbs: Vec<PodDisruptionBudget>,
    runtime_classes: Vec<RuntimeClass>,
    crds: Vec<CustomResourceDefinition>,
}

/// Deserializes `v` as `T`, and checks that serializing it back gives the same document.
fn typed<T>(v: &serde_yaml::Value, origin: &Origin) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let t: T = serde_yaml::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{} {} ({}): {e}", origin.kind, origin.name, origin.file));
    let back = serde_json::to_value(&t).unwrap();
    let orig = serde_json::to_value(v).unwrap();
    if back != orig {
        panic!(
            "{} {} ({}) does not round-trip: a field is unknown or misspelt\nfile:  {}\ntyped: {}",
            origin.kind,
            origin.name,
            origin.file,
            serde_json::to_string(&orig).unwrap(),
            serde_json::to_string(&back).unwrap()
        );
    }
    t
}

/// The manifests of a directory (not its kustomization.yaml), in file-name order.
fn manifest_files(dir: &str) -> Vec<PathBuf> {
    let mut in_dir: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .filter(|p| p.file_stem().is_some_and(|s| s != "kustomization"))
        .collect();
    in_dir.sort();
    in_dir
}

fn load() -> Objects {
    let mut files = Vec::new();
    for dir in ["daemonset/base", "runtimeclass"] {
        files.extend(manifest_files(dir));
    }
    assert!(files.len() >= 5, "manifests missing: {files:?}");
    let mut o = Objects::default();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let file = f.strip_prefix(repo()).unwrap().display().to_string();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{file}: not YAML: {e}"));
            if v.is_null() {
                continue;
            }
            let kind = v["kind"].as_str().unwrap_or_default().to_string();
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let origin = Origin {
                file: file.clone(),
                index: o.origins.len(),
                kind: kind.clone(),
                name,
            };
            match kind.as_str() {
                "Namespace" => o.namespaces.push(typed(&v, &origin)),
                "ServiceAccount" => o.service_accounts.push(typed(&v, &origin)),
                "Role" => o.roles.push(typed(&v, &origin)),
                "RoleBinding" => o.role_bindings.push(typed(&v, &origin)),
                "ConfigMap" => o.config_maps.push(typed(&v, &origin)),
                "DaemonSet" => o.daemon_sets.push(typed(&v, &origin)),
                "Deployment" => o.deployments.push(typed(&v, &origin)),
                "Service" => o.services.push(typed(&v, &origin)),
                "PodDisruptionBudget" => o.pdbs.push(typed(&v, &origin)),
                "RuntimeClass" => o.runtime_classes.push(typed(&v, &origin)),
                "CustomResourceDefinition" => o.crds.push(typed(&v, &origin)),
                other => panic!("{file}: unexpected kind {other:?}"),
            }
            o.origins.push(origin);
        }
    }
    o
}

fn origin<'a>(o: &'a Objects, kind: &str, name: &str) -> &'a Origin {
    o.origins
        .iter()
        .find(|x| x.kind == kind && x.name == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn daemon_set(o: &Objects) -> &DaemonSet {
    assert_eq!(o.daemon_sets.len(), 1);
    &o.daemon_sets[0]
}

fn router(o: &Objects) -> &Deployment {
    assert_eq!(o.deployments.len(), 1);
    &o.deployments[0]
}

fn template_of_ds(ds: &DaemonSet) -> &PodTemplateSpec {
    &ds.spec.as_ref().unwrap().template
}

fn template_of_deploy(d: &Deployment) -> &PodTemplateSpec {
    &d.spec.as_ref().unwrap().template
}

fn pod_spec(t: &PodTemplateSpec) -> &PodSpec {
    t.spec.as_ref().unwrap()
}

fn pod_labels(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A selector's matchLabels (which it must have).
fn match_labels(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> BTreeMap<String, String> {
    s.match_labels.clone().unwrap()
}

/// The `app.kubernetes.io/KEY` label.
fn label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    labels
        .get(&format!("app.kubernetes.io/{key}"))
        .map(String::as_str)
}

fn subset(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k) == Some(v))
}

/// A label selector `k=v,k2=v2` as a map.
fn parse_selector(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("selector term {kv:?} is not k=v"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

/// The image reference the Dockerfile builds (`ARG IMAGE=...`, also its ref.name label).
fn dockerfile_image() -> String {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let image = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ARG IMAGE="))
        .expect("Dockerfile has no `ARG IMAGE=`")
        .trim()
        .to_string();
    assert!(
        text.contains("org.opencontainers.image.ref.name=\"${IMAGE}\""),
        "the Dockerfile's ref.name label is not ${{IMAGE}}"
    );
    image
}

/// The node's gRPC container port.
fn node_grpc_port(o: &Objects) -> i32 {
    let spec = pod_spec(template_of_ds(daemon_set(o)));
    container(spec, "computed")
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("grpc"))
        .expect("node container has no port named grpc")
        .container_port
}

/// The init container's args parsed with the installer's own flags.
fn install_opts(o: &Objects) -> computed::install::InstallOpts {
    let spec = pod_spec(template_of_ds(daemon_set(o)));
    let init = spec.init_containers.as_ref().expect("no init container");
    assert_eq!(init.len(), 1);
    common::install_opts_of(&init[0].args.clone().unwrap_or_default())
}

#[test]
fn every_object_lives_in_one_namespace_applied_first() {
    let o = load();
    assert_eq!(o.namespaces.len(), 1);
    assert_eq!(o.namespaces[0].metadata.name.as_deref(), Some(NAMESPACE));
    assert_eq!(
        o.origins[0].kind, "Namespace",
        "the Namespace must be applied first"
    );
    let namespaced = o
        .service_accounts
        .iter()
        .map(|x| &x.metadata)
        .chain(o.roles.iter().map(|x| &x.metadata))
        .chain(o.role_bindings.iter().map(|x| &x.metadata))
        .chain(o.config_maps.iter().map(|x| &x.metadata))
        .chain(o.daemon_sets.iter().map(|x| &x.metadata))
        .chain(o.deployments.iter().map(|x| &x.metadata))
        .chain(o.services.iter().map(|x| &x.metadata))
        .chain(o.pdbs.iter().map(|x| &x.metadata));
    for m in namespaced {
        assert_eq!(m.namespace.as_deref(), Some(NAMESPACE), "{:?}", m.name);
    }
    for r in &o.runtime_classes {
        assert!(
            r.metadata.namespace.is_none(),
            "RuntimeClass is cluster-scoped"
        );
    }
    // What a workload refers to is applied before it.
    for d in &o.deployments {
        let sa = pod_spec(template_of_deploy(d))
            .service_account_name
            .clone()
            .unwrap();
        let w = origin(&o, "Deployment", d.metadata.name.as_deref().unwrap());
        assert!(origin(&o, "ServiceAccount", &sa).index < w.index);
    }
    let ds = daemon_set(&o);
    let w = origin(&o, "DaemonSet", ds.metadata.name.as_deref().unwrap());
    let spec = pod_spec(template_of_ds(ds));
    let sa = spec.service_account_name.clone().unwrap();
    assert!(origin(&o, "ServiceAccount", &sa).index < w.index);
    for v in spec.volumes.as_ref().unwrap() {
        if let Some(cm) = &v.config_map {
            assert!(origin(&o, "ConfigMap", &cm.name).index < w.index);
        }
    }
}

#[test]
fn selectors_match_their_pods() {
    let o = load();
    let ds = daemon_set(&o);
    let ds_sel = match_labels(&ds.spec.as_ref().unwrap().selector);
    let node_labels = pod_labels(template_of_ds(ds));
    assert!(!ds_sel.is_empty() && subset(&ds_sel, &node_labels));
    assert_eq!(ds.metadata.name.as_deref(), Some("computed-node"));
    assert_eq!(label(&node_labels, "name"), Some("computed-node"));
    assert_eq!(label(&node_labels, "part-of"), Some("compute"));

    let d = router(&o);
    let d_sel = match_labels(&d.spec.as_ref().unwrap().selector);
    let router_labels = pod_labels(template_of_deploy(d));
    assert!(!d_sel.is_empty() && subset(&d_sel, &router_labels));
    assert_eq!(label(&router_labels, "name"), Some("computed-router"));
    // The two selectors never pick each other's pods.
    assert!(!subset(&ds_sel, &router_labels) && !subset(&d_sel, &node_labels));

    for p in &o.pdbs {
        let sel = match_labels(p.spec.as_ref().unwrap().selector.as_ref().unwrap());
        assert!(subset(&sel, &router_labels), "PDB selects no router pod");
    }
}

#[test]
fn the_service_reaches_the_router_grpc_port() {
    let o = load();
    assert_eq!(o.services.len(), 1);
    let s = &o.services[0];
    assert_eq!(s.metadata.name.as_deref(), Some("computed"));
    let spec = s.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref().unwrap_or("ClusterIP"), "ClusterIP");
    let sel = spec.selector.clone().unwrap();
    let d = router(&o);
    let t = template_of_deploy(d);
    assert!(!sel.is_empty() && subset(&sel, &pod_labels(t)));
    assert!(!subset(&sel, &pod_labels(template_of_ds(daemon_set(&o)))));
    let ports = spec.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, 50051);
    let cports: Vec<_> = pod_spec(t)
        .containers
        .iter()
        .flat_map(|c| c.ports.clone().unwrap_or_default())
        .collect();
    let target = ports[0].target_port.clone().expect("targetPort");
    let hit = cports.iter().find(|p| match &target {
        IntOrString::String(n) => p.name.as_deref() == Some(n.as_str()),
        IntOrString::Int(n) => p.container_port == *n,
    });
    let hit = hit.unwrap_or_else(|| panic!("targetPort {target:?} is no router container port"));
    assert_eq!(hit.container_port, 50051);
}

#[test]
fn the_platform_crd_is_the_one_the_kube_store_uses() {
    use computed::platform::kube_store;
    let o = load();
    assert_eq!(o.crds.len(), 1);
    let crd = &o.crds[0];
    let spec = &crd.spec;
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some(format!("{}.{}", kube_store::PLURAL, kube_store::GROUP).as_str())
    );
    assert_eq!(spec.group, kube_store::GROUP);
    assert_eq!(spec.names.kind, kube_store::KIND);
    assert_eq!(spec.names.plural, kube_store::PLURAL);
    assert_eq!(spec.scope, "Namespaced");
    let v: Vec<&str> = spec.versions.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(v, [kube_store::VERSION]);
    let schema = serde_json::to_value(&spec.versions[0].schema).unwrap();
    let props = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
    for field in ["kind", "key", "doc"] {
        assert_eq!(props[field]["type"], "string", "{field}");
    }
}

#[test]
fn router_rbac_is_pods_read_only_and_bound_to_its_service_account() {
    let o = load();
    let d = router(&o);
    let sa = pod_spec(template_of_deploy(d))
        .service_account_name
        .clone()
        .expect("the router names its ServiceAccount");
    assert_eq!(sa, "computed-router");
    assert!(o
        .service_accounts
        .iter()
        .any(|s| s.metadata.name.as_deref() == Some(&sa)));

    assert_eq!(o.roles.len(), 1);
    let role = &o.roles[0];
    let rules = role.rules.as_ref().unwrap();
    let mut granted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in rules {
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                granted
                    .entry(format!("{g}:{res}"))
                    .or_default()
                    .extend(r.verbs.iter().cloned());
            }
        }
    }
    let set = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
    let want = BTreeMap::from([
        (":pods".to_string(), set(&["get", "list", "watch"])),
        (
            "compute.dev:platformrecords".to_string(),
            set(&["get", "list", "watch", "create", "update", "delete"]),
        ),
    ]);
    assert_eq!(
        granted, want,
        "the Role must grant exactly pod reads and the platform's records"
    );

    assert_eq!(o.role_bindings.len(), 1);
    let rb = &o.role_bindings[0];
    assert_eq!(rb.role_ref.kind, "Role");
    assert_eq!(rb.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(
        Some(rb.role_ref.name.as_str()),
        role.metadata.name.as_deref()
    );
    let subjects = rb.subjects.as_ref().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, sa);
    assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));

    // The node daemon needs no API access.
    let spec = pod_spec(template_of_ds(daemon_set(&o)));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let node_sa = spec.service_account_name.clone().unwrap();
    assert!(o
        .role_bindings
        .iter()
        .all(|b| b.subjects.iter().flatten().all(|s| s.name != node_sa)));
}

#[test]
fn router_flags_point_at_the_node_daemonset() {
    let o = load();
    let d = router(&o);
    let t = template_of_deploy(d);
    let c = container(pod_spec(t), "router");
    let args = c.args.clone().unwrap();
    assert_eq!(args.first().map(String::as_str), Some("router"));
    assert_eq!(flag(&args, "--listen"), Some("0.0.0.0:50051"));
    assert_eq!(flag(&args, "--namespace"), Some(NAMESPACE));
    let sel = parse_selector(flag(&args, "--selector").expect("--selector"));
    assert!(subset(&sel, &pod_labels(template_of_ds(daemon_set(&o)))));
    assert!(
        !subset(&sel, &pod_labels(t)),
        "the router would find itself"
    );
    let node_port: i32 = flag(&args, "--node-port").unwrap().parse().unwrap();
    assert_eq!(node_port, node_grpc_port(&o));
    assert_eq!(node_port, 50051);
    assert!(
        flag(&args, "--nodes").is_none(),
        "in-cluster discovery, no static list"
    );
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(2));
}

#[test]
fn images_are_the_one_the_dockerfile_builds() {
    let o = load();
    let image = dockerfile_image();
    assert_eq!(image, "ghcr.io/paper-board/computed:0.1.0");
    let mut specs = vec![pod_spec(template_of_ds(daemon_set(&o)))];
    specs.extend(
        o.deployments
            .iter()
            .map(|d| pod_spec(template_of_deploy(d))),
    );
    let mut n = 0;
    for s in specs {
        for c in s
            .containers
            .iter()
            .chain(s.init_containers.iter().flatten())
        {
            assert_eq!(c.image.as_deref(), Some(image.as_str()), "{}", c.name);
            n += 1;
        }
    }
    assert_eq!(n, 3);
    // The installer's defaults find the gVisor binaries where the Dockerfile puts them.
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let defaults = computed::install::InstallOpts::default();
    assert!(text.contains("COPY --from=gvisor /gvisor/ /usr/local/bin/"));
    // runsc from Debian's bookworm-backports, no download site for it.
    assert!(text.contains("apt-get install -y --no-install-recommends -t bookworm-backports runsc"));
    assert!(text.contains("cp /usr/bin/runsc /gvisor/runsc"));
    assert_eq!(defaults.runsc_src, Path::new("/usr/local/bin/runsc"));
    assert_eq!(
        defaults.shim_src,
        Path::new("/usr/local/bin/containerd-shim-runsc-v1")
    );
}

#[test]
fn runtime_class_is_gvisor_on_the_nodes_the_installer_prepares() {
    let o = load();
    assert_eq!(o.runtime_classes.len(), 1);
    let rc = &o.runtime_classes[0];
    assert_eq!(rc.metadata.name.as_deref(), Some("gvisor"));
    assert_eq!(rc.handler, "runsc");
    assert_eq!(rc.handler, computed::install::containerd::HANDLER);
    // Pods of the class go where the DaemonSet runs (and so where runsc is registered).
    let ds_spec = pod_spec(template_of_ds(daemon_set(&o)));
    let sched = rc.scheduling.as_ref().expect("RuntimeClass scheduling");
    assert_eq!(sched.node_selector, ds_spec.node_selector);
    assert_eq!(sched.tolerations, ds_spec.tolerations);
}

#[test]
fn node_daemonset_installs_then_runs_the_daemon() {
    let o = load();
    let ds = daemon_set(&o);
    let dspec = ds.spec.as_ref().unwrap();
    let strategy = dspec.update_strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy
            .rolling_update
            .as_ref()
            .unwrap()
            .max_unavailable
            .clone(),
        Some(IntOrString::Int(1))
    );
    let spec = pod_spec(&dspec.template);
    assert_eq!(
        spec.host_pid,
        Some(true),
        "the installer's nsenter -t 1 needs hostPID"
    );
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(
        spec.node_selector.clone().unwrap(),
        BTreeMap::from([("compute.paper-board.io/gvisor".into(), "true".into())])
    );
    let tol = spec.tolerations.as_ref().unwrap();
    assert!(tol.iter().any(
        |t| t.key.as_deref() == Some("compute.paper-board.io/gvisor")
            && t.operator.as_deref() == Some("Equal")
            && t.value.as_deref() == Some("true")
            && t.effect.as_deref() == Some("NoSchedule")
    ));
    let volumes = spec.volumes.as_ref().unwrap();
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
    };

    // The init container: privileged `computed install` with the host's / at --host-root.
    let opts = install_opts(&o);
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        init.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let host_mount = init
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| Path::new(&m.mount_path) == opts.host_root)
        .expect("--host-root is not a mount of the init container");
    let hp = volume(&host_mount.name).host_path.as_ref().unwrap();
    assert_eq!(hp.path, "/");
    assert!(!opts.dry_run);

    // The daemon.
    let c = container(spec, "computed");
    assert_eq!(c.args.as_deref(), Some(&["node".to_string()][..]));
    assert_eq!(
        c.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let env: BTreeMap<_, _> = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.clone(), e))
        .collect();
    assert_eq!(
        env["CONTAINERD_ADDRESS"].value.as_deref(),
        Some("/run/containerd/containerd.sock")
    );
    assert_eq!(
        env["COMPUTE_NODE_NAME"]
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    let ports: BTreeMap<_, _> = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports["grpc"], 50051);
    assert_eq!(ports["metrics"], 9090);
    assert!(c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .all(|p| p.host_port.is_none()));
    assert_eq!(
        spec.host_network, None,
        "the router reaches nodes at their pod IPs"
    );

    // Every path the daemon hands to the host's containerd is the same path on the host.
    let mounts = c.volume_mounts.as_ref().unwrap();
    let mut by_path = BTreeMap::new();
    for m in mounts {
        let v = volume(&m.name);
        if let Some(hp) = &v.host_path {
            assert_eq!(
                hp.path, m.mount_path,
                "hostPath {} is mounted elsewhere",
                hp.path
            );
        }
        by_path.insert(m.mount_path.clone(), m);
    }
    for (p, prop) in [
        ("/run/containerd", None),
        ("/var/lib/compute", Some("Bidirectional")),
        ("/run/compute", Some("Bidirectional")),
        ("/sys/fs/cgroup", None),
        ("/dev", None),
    ] {
        let m = by_path
            .get(p)
            .unwrap_or_else(|| panic!("the daemon does not mount {p}"));
        assert_eq!(m.mount_propagation.as_deref(), prop, "{p}");
    }
    let sock = Path::new(env["CONTAINERD_ADDRESS"].value.as_deref().unwrap());
    assert!(by_path.contains_key(sock.parent().unwrap().to_str().unwrap()));

    // Its config: loads with the real loader, and runsc is where the installer puts it.
    let cfg_path = Path::new(env["COMPUTE_CONFIG"].value.as_deref().unwrap());
    let cfg_mount = by_path
        .get(cfg_path.parent().unwrap().to_str().unwrap())
        .expect("COMPUTE_CONFIG is not in a mounted volume");
    let cm_name = &volume(&cfg_mount.name).config_map.as_ref().unwrap().name;
    let cm = o
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(cm_name))
        .unwrap();
    let key = cfg_path.file_name().unwrap().to_str().unwrap();
    let text = &cm.data.as_ref().unwrap()[key];
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("config.toml");
    std::fs::write(&f, text).unwrap();
    let cfg = computed::config::Config::load(Some(&f)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.runsc_path, opts.bin_dir.join("runsc"));
    assert!(cfg.gc_interval_secs > 0, "GC runs inside the daemon");
    assert_eq!(cfg.state_dir, Path::new("/var/lib/compute"));
    assert_eq!(cfg.run_dir, Path::new("/run/compute"));
}

/// The port number of a probe's named or numbered port in `c`.
fn probe_port(c: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("{}: no port named {name}", c.name))
                .container_port
        }
    }
}

/// An HTTP GET of `path` on the container's `metrics` port (9090).
fn is_http_on_metrics(c: &Container, p: &Option<Probe>, path: &str) -> bool {
    let Some(get) = p.as_ref().and_then(|p| p.http_get.as_ref()) else {
        return false;
    };
    get.path.as_deref() == Some(path)
        && get.port == IntOrString::String("metrics".into())
        && probe_port(c, &get.port) == 9090
        && get.scheme.as_deref().is_none_or(|s| s == "HTTP")
}

#[test]
fn probes_are_http_on_the_metrics_listener() {
    // gRPC probes need Kubernetes 1.24 and cannot speak TLS; the metrics listener answers
    // /livez and /readyz (the gRPC health) in plain HTTP, on every version.
    let o = load();
    let node_spec = pod_spec(template_of_ds(daemon_set(&o)));
    let c = container(node_spec, "computed");
    assert!(is_http_on_metrics(c, &c.readiness_probe, "/readyz"));
    assert!(is_http_on_metrics(c, &c.liveness_probe, "/readyz"));
    assert!(is_http_on_metrics(c, &c.startup_probe, "/readyz"));
    // The node listens there: its config's metrics_listen is that port.
    let cm = &o.config_maps[0];
    let text = &cm.data.as_ref().unwrap()["config.toml"];
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("config.toml");
    std::fs::write(&f, text).unwrap();
    let cfg = computed::config::Config::load(Some(&f)).unwrap();
    assert_eq!(cfg.metrics_listen, "0.0.0.0:9090");

    let r = container(pod_spec(template_of_deploy(router(&o))), "router");
    assert!(is_http_on_metrics(r, &r.readiness_probe, "/readyz"));
    assert_eq!(
        flag(r.args.as_ref().unwrap(), "--metrics-listen"),
        Some("0.0.0.0:9090")
    );
    // Liveness of the router only asks that it listens (its health follows the nodes').
    let live = r.liveness_probe.as_ref().unwrap();
    assert!(live
        .tcp_socket
        .as_ref()
        .is_some_and(|t| t.port == IntOrString::Int(50051)));
    for p in [
        &c.readiness_probe,
        &c.liveness_probe,
        &c.startup_probe,
        &r.readiness_probe,
        &r.liveness_probe,
    ] {
        assert!(
            p.as_ref().unwrap().grpc.is_none(),
            "gRPC probes need Kubernetes 1.24"
        );
    }
}

#[test]
fn the_base_kustomization_lists_every_manifest_in_apply_order() {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Kustomization {
        api_version: String,
        kind: String,
        resources: Vec<String>,
    }
    let text = std::fs::read_to_string(repo().join("daemonset/base/kustomization.yaml")).unwrap();
    let k: Kustomization = serde_yaml::from_str(&text).unwrap();
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");
    let files: Vec<String> = manifest_files("daemonset/base")
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        k.resources, files,
        "kubectl apply -k daemonset/base would not apply what this test checks"
    );
}

#[test]
fn router_runs_unprivileged() {
    let o = load();
    let spec = pod_spec(template_of_deploy(router(&o)));
    assert_eq!(
        spec.security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    assert_ne!(spec.host_pid, Some(true));
    assert_ne!(spec.host_network, Some(true));
    // It mounts one thing: a small in-memory directory for its unix socket (the platform
    // API's bootstrap), where --socket points.
    let vols = spec.volumes.as_deref().unwrap_or_default();
    assert_eq!(vols.len(), 1, "{vols:?}");
    let ed = vols[0].empty_dir.as_ref().expect("an emptyDir");
    assert_eq!(ed.medium.as_deref(), Some("Memory"));
    assert!(vols[0].host_path.is_none() && vols[0].secret.is_none());
    let c = container(spec, "router");
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].name, vols[0].name);
    let args = c.args.clone().unwrap_or_default();
    let socket = flag(&args, "--socket").expect("--socket");
    assert!(
        Path::new(socket).starts_with(&mounts[0].mount_path),
        "{socket} is not in {}",
        mounts[0].mount_path
    );
    assert_eq!(flag(&args, "--platform-store"), Some("kube"));
    let sc = c.security_context.as_ref().unwrap();
    assert_ne!(sc.privileged, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
}

#[test]
fn dockerfile_copies_everything_cargo_builds_from() {
    let docker = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let copied: BTreeSet<String> = docker
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            parts[..parts.len().saturating_sub(1)]
                .iter()
                .map(|s| s.trim_end_matches('/').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(repo().join("Cargo.toml")).unwrap()).unwrap();
    let mut needed: BTreeSet<String> = ["Cargo.toml", "Cargo.lock", "build.rs", "src", "proto"]
        .map(String::from)
        .into();
    // Only binaries are built (`--bins`), but cargo checks every declared target's path.
    for kind in ["bin", "test", "bench", "example"] {
        for t in manifest
            .get(kind)
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(p) = t.get("path").and_then(toml::Value::as_str) {
                let first = Path::new(p).components().next().unwrap();
                needed.insert(first.as_os_str().to_str().unwrap().to_string());
            }
        }
    }
    let missing: Vec<_> = needed.difference(&copied).collect();
    assert!(
        missing.is_empty(),
        "the Dockerfile's build stage does not COPY {missing:?}"
    );
}

#[test]
fn router_args_are_accepted_by_the_binary() {
    let o = load();
    let args = container(pod_spec(template_of_deploy(router(&o))), "router")
        .args
        .clone()
        .unwrap();
    assert_router_args_accepted(&args, "the base");
}
