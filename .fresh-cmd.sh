#!/usr/bin/env bash
# Run inside fresh-machine: install-deps, release build, scripts/up until health is SERVING.
set -uo pipefail
t0=$(date +%s)
echo "== scripts/install-deps"; scripts/install-deps || { echo "RESULT install-deps failed"; exit 1; }
t1=$(date +%s); echo "install-deps: $((t1-t0)) s"
echo "== cargo build --release --bins"; cargo build --release --bins 2>&1 | tail -3; rc=${PIPESTATUS[0]}
t2=$(date +%s); echo "cargo build: rc=$rc $((t2-t1)) s"; ((rc == 0)) || { echo "RESULT build failed"; exit 1; }
echo "== scripts/up"
export COMPUTE_LISTEN=127.0.0.1:50061 COMPUTE_METRICS_LISTEN=127.0.0.1:9191
setsid scripts/up > /tmp/up.log 2>&1 &
up=$!
ok=0
for _ in $(seq 1 1200); do
  if grpcurl -plaintext 127.0.0.1:50061 grpc.health.v1.Health/Check 2>/dev/null | grep -q SERVING; then ok=1; break; fi
  kill -0 $up 2>/dev/null || break
  sleep 1
done
t3=$(date +%s)
grpcurl -plaintext 127.0.0.1:50061 grpc.health.v1.Health/Check
echo "scripts/up: serving=$ok after $((t3-t2)) s"
if ((ok)); then
  out=$(grpcurl -plaintext -d '{"tenant_id":"t","session_id":"fresh"}' 127.0.0.1:50061 compute.v1.ComputeService/CreateSandbox); echo "$out"
  id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxId"])' <<<"$out")
  grpcurl -plaintext -d '{"sandbox_id":"'$id'","command":"python3","args":["-c","print(6*7)"]}' 127.0.0.1:50061 compute.v1.ComputeService/ExecCommand | head -20
  target/release/computectl --socket /run/compute/compute.sock doctor; echo "doctor rc=$?"
fi
tail -30 /tmp/up.log
kill -TERM $up; for _ in $(seq 1 100); do kill -0 $up 2>/dev/null || break; sleep 0.2; done
echo "after stop: containerd procs: $(pgrep -c containerd)"
((ok)) && echo "RESULT ok" || echo "RESULT up failed"
