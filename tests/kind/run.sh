#!/usr/bin/env bash
# tests/kind/run.sh: the Kubernetes deployment end to end on a throwaway kind cluster.
#
# Builds the image, loads it into a two-node kind cluster (a control plane, and a worker
# labelled and tainted as a gVisor node), applies runtimeclass/ and the kustomize overlay
# daemonset/overlays/kind (the base, the image never pulled, the router watching Nodes), waits for the
# node DaemonSet and the router, proves an ordinary pod with runtimeClassName: gvisor runs under
# gVisor, then runs the quickstart's grpcurl commands through `kubectl port-forward
# svc/computed`, and deletes the cluster. See tests/kind/README.md.
#
# Needs: docker (with a running engine), kind, kubectl, grpcurl, python3. Run from anywhere.
#
# Environment:
#   KIND_CLUSTER       cluster name (default computed-e2e)
#   KIND_NODE_IMAGE    kindest/node image (default: kind's own)
#   KEEP_CLUSTER=1     keep the cluster afterwards (default: delete it, also on failure)
#   IMAGE              image reference (default: the Dockerfile's ARG IMAGE)
#   SKIP_BUILD=1       use an IMAGE already in the local docker
#   GVISOR_SHIM_VERSION  the gVisor release whose containerd-shim-runsc-v1 the image ships
#                      (default 20240729, the runsc the image has)
#   SANDBOX_TAR        the sandbox image tarball (OCI layout) to import on the node; default: built
#                      with scripts/build-image inside a debian:bookworm container
#   E2E_STORAGE_CLASS  set PVC_STORAGE_CLASS on the node daemon (e.g. `local`, plain directories,
#                      if the kind node cannot attach loop devices)
#   LOCAL_PORT         local port of the port-forward (default 50051)
#   TIMEOUT            rollout/wait timeout (default 300s)
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER:-computed-e2e}
NODE_IMAGE=${KIND_NODE_IMAGE:-}
KEEP=${KEEP_CLUSTER:-0}
IMAGE=${IMAGE:-$(sed -n 's/^ARG IMAGE=//p' Dockerfile)}
SKIP_BUILD=${SKIP_BUILD:-0}
SANDBOX_TAR=${SANDBOX_TAR:-}
STORAGE_CLASS=${E2E_STORAGE_CLASS:-}
PORT=${LOCAL_PORT:-50051}
TIMEOUT=${TIMEOUT:-300s}
NS=compute-system
GVISOR_NODE=$CLUSTER-worker
SANDBOX_IMAGE=ghcr.io/paper-board/sandbox-python:v0.1.0
PROBE_IMAGE=busybox:1.36

log() { printf '==> %s\n' "$*" >&2; }
die() {
  printf 'run.sh: %s\n' "$*" >&2
  exit 1
}

for bin in docker kind kubectl grpcurl python3; do
  command -v "$bin" >/dev/null || die "$bin is required"
done
docker info >/dev/null 2>&1 || die "docker has no running engine"
[[ -n $IMAGE ]] || die "no ARG IMAGE= in the Dockerfile"

work=$(mktemp -d)
pf_pid=
created=0
KUBECTL=(kubectl --context "kind-$CLUSTER")
k() { "${KUBECTL[@]}" "$@"; }

diagnostics() {
  log "diagnostics"
  k get nodes -o wide || true
  k -n "$NS" get all -o wide || true
  k -n "$NS" describe daemonset/computed-node || true
  local pod
  for pod in $(k -n "$NS" get pods -o name 2>/dev/null); do
    echo "--- $pod" >&2
    k -n "$NS" logs "$pod" --all-containers --tail=80 >&2 || true
  done
  k describe pod gvisor-check >&2 || true
}

cleanup() {
  local status=$?
  if [[ -n $pf_pid ]]; then
    kill "$pf_pid" 2>/dev/null || true
  fi
  if [[ $status -ne 0 && $created == 1 ]]; then
    diagnostics
  fi
  if [[ $created == 1 && $KEEP != 1 ]]; then
    log "deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" || true
  fi
  rm -rf "$work"
  if [[ $status -eq 0 ]]; then
    log "kind e2e: passed"
  else
    log "kind e2e: FAILED (exit $status)"
  fi
  exit "$status"
}
trap cleanup EXIT

# --- cluster and image ----------------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  die "kind cluster $CLUSTER exists already; delete it or set KIND_CLUSTER"
fi
cat >"$work/kind.yaml" <<'YAML'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
YAML
log "creating kind cluster $CLUSTER"
create=(kind create cluster --name "$CLUSTER" --config "$work/kind.yaml" --wait 180s)
if [[ -n $NODE_IMAGE ]]; then
  create+=(--image "$NODE_IMAGE")
fi
created=1
"${create[@]}"

if [[ $SKIP_BUILD != 1 ]]; then
  log "building $IMAGE"
  # With gVisor's shim: the installer's `--runtime auto` then registers it (the runc shim,
  # what it picks without one, cannot run a pod's app container under runsc by itself).
  docker build --build-arg "GVISOR_SHIM_VERSION=${GVISOR_SHIM_VERSION:-20240729}" -t "$IMAGE" .
fi
log "loading $IMAGE and $PROBE_IMAGE into the cluster"
kind load docker-image "$IMAGE" --name "$CLUSTER"
# Best effort: if it cannot be loaded (some docker image stores), the node pulls it.
if ! { docker pull -q "$PROBE_IMAGE" >/dev/null && kind load docker-image "$PROBE_IMAGE" --name "$CLUSTER"; }; then
  log "could not load $PROBE_IMAGE; the node will pull it"
fi

# The worker is the gVisor node; ordinary pods (the router) go to the control plane.
log "labelling and tainting $GVISOR_NODE as a gVisor node"
k label node "$GVISOR_NODE" compute.paper-board.io/gvisor=true --overwrite
k taint node "$GVISOR_NODE" compute.paper-board.io/gvisor=true:NoSchedule --overwrite
k taint node "$CLUSTER-control-plane" node-role.kubernetes.io/control-plane:NoSchedule- ||
  true

# --- apply, in order ------------------------------------------------------------------------
log "kubectl apply -f runtimeclass/; kubectl apply -k daemonset/overlays/kind"
k apply -f runtimeclass/
k apply -k daemonset/overlays/kind
if [[ -n $STORAGE_CLASS ]]; then
  k -n "$NS" set env daemonset/computed-node "PVC_STORAGE_CLASS=$STORAGE_CLASS"
fi
log "waiting for the node DaemonSet"
k -n "$NS" rollout status daemonset/computed-node --timeout="$TIMEOUT"

node_pod() {
  k -n "$NS" get pods -l app.kubernetes.io/name=computed-node \
    --field-selector "spec.nodeName=$GVISOR_NODE,status.phase=Running" -o name |
    sed -n '1s|^pod/||p'
}
pod=$(node_pod)
[[ -n $pod ]] || die "no running computed-node pod on $GVISOR_NODE"
install_log=$(k -n "$NS" logs "$pod" -c install)
printf '%s\n' "$install_log" >&2
grep -q '^containerd: restarted' <<<"$install_log" ||
  die "the first install did not restart containerd"
docker exec "$GVISOR_NODE" grep -q 'io.containerd.runsc.v1' /etc/containerd/config.toml ||
  die "the runsc handler is not in the node's containerd config"
docker exec "$GVISOR_NODE" test -f /etc/containerd/config.toml.bak-computed ||
  die "no backup of the node's containerd config"

# A second install (a new pod) changes nothing and does not restart containerd.
log "restarting the node pod: the installer must find nothing to do"
k -n "$NS" delete pod "$pod" --wait=true
k -n "$NS" rollout status daemonset/computed-node --timeout="$TIMEOUT"
pod=$(node_pod)
install_log=$(k -n "$NS" logs "$pod" -c install)
printf '%s\n' "$install_log" >&2
grep -q '^containerd config: unchanged' <<<"$install_log" || die "the second install changed the config"
grep -q '^containerd: not restarted' <<<"$install_log" || die "the second install restarted containerd"

# --- the sandbox image ------------------------------------------------------------------------
if [[ -z $SANDBOX_TAR ]]; then
  log "building the sandbox image with scripts/build-image (in debian:bookworm)"
  docker run --rm -e BUILD_IMAGE_RUNSC=0 \
    -v "$PWD/scripts:/scripts:ro" -v "$work:/out" \
    debian:bookworm /scripts/build-image /out/sandbox-python.tar >/dev/null
  SANDBOX_TAR=$work/sandbox-python.tar
fi
log "importing $SANDBOX_TAR on $pod as $SANDBOX_IMAGE"
k -n "$NS" cp "$SANDBOX_TAR" "$pod:/tmp/sandbox-python.tar" -c computed
k -n "$NS" exec "$pod" -c computed -- \
  computed image import /tmp/sandbox-python.tar --name compute.local/sandbox-python:latest
k -n "$NS" exec "$pod" -c computed -- \
  computed image alias compute.local/sandbox-python:latest "$SANDBOX_IMAGE"
k -n "$NS" exec "$pod" -c computed -- rm -f /tmp/sandbox-python.tar

log "waiting for the router"
k -n "$NS" rollout status deployment/computed-router --timeout="$TIMEOUT"

# --- an ordinary pod under RuntimeClass gvisor ------------------------------------------------
log "a pod with runtimeClassName: gvisor"
k apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: gvisor-check
  namespace: default
spec:
  runtimeClassName: gvisor
  restartPolicy: Never
  containers:
    - name: dmesg
      image: $PROBE_IMAGE
      imagePullPolicy: IfNotPresent
      command: ["dmesg"]
YAML
k wait pod/gvisor-check --for=jsonpath='{.status.phase}'=Succeeded --timeout="$TIMEOUT"
dmesg_out=$(k logs gvisor-check)
printf '%s\n' "$dmesg_out" | head -5 >&2
grep -q 'gVisor' <<<"$dmesg_out" || die "dmesg in the gvisor pod does not show gVisor"
[[ $(k get pod gvisor-check -o jsonpath='{.spec.nodeName}') == "$GVISOR_NODE" ]] ||
  die "the gvisor pod did not land on the gVisor node"
k delete pod gvisor-check --wait=false

# --- the quickstart through the router --------------------------------------------------------
log "port-forward svc/computed to localhost:$PORT"
k -n "$NS" port-forward svc/computed "$PORT:50051" >"$work/port-forward.log" 2>&1 &
pf_pid=$!
addr=localhost:$PORT
for _ in $(seq 1 60); do
  if grpcurl -plaintext "$addr" grpc.health.v1.Health/Check >/dev/null 2>&1; then
    break
  fi
  kill -0 "$pf_pid" 2>/dev/null || {
    cat "$work/port-forward.log" >&2
    die "port-forward exited"
  }
  sleep 1
done

# 1. Verify the server is up
out=$(grpcurl -plaintext "$addr" grpc.health.v1.Health/Check)
grep -q '"status": "SERVING"' <<<"$out" || die "health: $out"
log "ok   health SERVING"

# 2. Create a sandbox
out=$(grpcurl -plaintext \
  -d '{
    "tenant_id": "acme-tenant-uuid",
    "session_id": "session-uuid-001",
    "image":      "ghcr.io/paper-board/sandbox-python:v0.1.0"
  }' \
  "$addr" \
  compute.v1.ComputeService/CreateSandbox)
grep -q '"status": "SANDBOX_STATUS_STARTING"' <<<"$out" || die "create: $out"
id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxId"])' <<<"$out")
log "ok   create returns STARTING ($id)"

# 3. Execute a command (ExecCommand waits for READY)
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id":  "'"$id"'",
    "command":     "python3",
    "args":        ["-c", "import socket, os; print(socket.gethostname()); print(42 * 2)"],
    "working_dir": "/workspace"
  }' \
  "$addr" \
  compute.v1.ComputeService/ExecCommand)
stdout=$(python3 tests/lib/exec_stdout.py <<<"$out")
[[ $(tail -n 1 <<<"$stdout") == 84 ]] || die "exec printed: $stdout ($out)"
{ grep -q '"completed"' <<<"$out" && grep -q '"cpuMs"' <<<"$out"; } || die "exec usage: $out"
log "ok   exec prints $(head -n 1 <<<"$stdout") and 84, with usage"

# 5. Write and read a workspace file
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id": "'"$id"'",
    "path":       "result.txt",
    "data":       "aGVsbG8gd29ybGQK"
  }' \
  "$addr" \
  compute.v1.ComputeService/WriteFile)
grep -q '"bytesWritten": "12"' <<<"$out" || die "write: $out"
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id": "'"$id"'",
    "path":       "result.txt"
  }' \
  "$addr" \
  compute.v1.ComputeService/ReadFile)
grep -q '"data": "aGVsbG8gd29ybGQK"' <<<"$out" || die "read: $out"
log "ok   write and read back hello world"

# 6. Destroy the sandbox
out=$(grpcurl -plaintext \
  -d '{"sandbox_id": "'"$id"'"}' \
  "$addr" \
  compute.v1.ComputeService/DestroySandbox)
{ grep -q "\"sandboxId\": \"$id\"" <<<"$out" && grep -q '"totalUsage"' <<<"$out"; } ||
  die "destroy: $out"
log "ok   destroy returns total usage"
