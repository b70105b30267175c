#!/usr/bin/env bash
# The README's first screen, for real: `scripts/up` in the background, then every grpcurl
# command of the quickstart (compute-quickstart.md steps 1-3, 5, 6) verbatim against
# localhost:50051, with the example sandbox_id replaced by the one CreateSandbox returned.
# Then Ctrl-C (SIGINT) to scripts/up must leave no sandbox behind.
# No `set -e`: every check is counted, and a failed one does not stop the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
passed=0
failed=0
check() { # check NAME CONDITION-EXIT-CODE
  if [[ $2 == 0 ]]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}
# scripts/up stops what it started when it fails before serving: a private containerd on a
# socket of its own, then (1) the import step fails, (2) the daemon exits at once.
tmp=$(mktemp -d)
printf '#!/bin/sh\n[ "$1" = node ] && exit 3\nexit 0\n' >"$tmp/computed-exits"
chmod +x "$tmp/computed-exits"
: >"$tmp/image.tar"
scripts/image-tar --recipe >"$tmp/image.tar.recipe" # current: not rebuilt
for bin in /bin/false "$tmp/computed-exits"; do
  CONTAINERD_ADDRESS=$tmp/containerd.sock COMPUTE_CONTAINERD_ROOT=$tmp/root \
    COMPUTE_CONTAINERD_STATE=$tmp/state COMPUTE_IMAGE_TAR=$tmp/image.tar \
    COMPUTED_BIN=$bin COMPUTE_AGENT_BINARY=/bin/true scripts/up >"$tmp/up.log" 2>&1
  rc=$?
  ((rc != 0)); check "scripts/up fails with $(basename "$bin") (exit $rc)" $?
  grep -q "containerd" "$tmp/state.log" 2>/dev/null; check "  it had started its own containerd" $?
  ! ctr --address "$tmp/containerd.sock" version >/dev/null 2>&1; check "  its containerd no longer answers" $?
  ! pgrep -f "$tmp/state.toml" >/dev/null; check "  no containerd process left" $?
done
pkill -f "$tmp/state.toml" 2>/dev/null
rm -rf "$tmp"

log=$(mktemp)
setsid scripts/up >"$log" 2>&1 &
up=$!
stop_up() {
  # Ctrl-C in a terminal is SIGINT; a background job has SIGINT ignored (POSIX), so the
  # test sends SIGTERM, which scripts/up handles the same way.
  kill -TERM "$up" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$up" 2>/dev/null || break; sleep 0.1; done
}
trap 'stop_up; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  grpcurl -plaintext localhost:50051 grpc.health.v1.Health/Check >/dev/null 2>&1 && break
  kill -0 "$up" 2>/dev/null || { cat "$log"; echo "scripts/up exited"; exit 1; }
  sleep 0.5
done

# computectl doctor passes every check on the node scripts/up brought up, and checks what that
# daemon uses (its containerd socket), not computectl's defaults.
computectl=$(dirname "${COMPUTED_BIN:-target/release/computed}")/computectl
out=$("$computectl" --socket "${COMPUTE_SOCKET:-/run/compute/compute.sock}" -o json doctor 2>&1)
check "computectl doctor exits 0 on a scripts/up node" $?
python3 -c '
import json, sys
checks = json.load(sys.stdin)
bad = [c for c in checks if c["status"] not in ("ok", "warn")]
assert not bad, bad
names = {c["check"] for c in checks}
assert {"daemon", "containerd", "runsc", "runtime", "image", "agent"} <= names, names
ctr = next(c for c in checks if c["check"] == "containerd")
assert sys.argv[1] in ctr["detail"], ctr
' "${CONTAINERD_ADDRESS:-/run/compute/containerd.sock}" <<<"$out" || echo "$out"
check "doctor: every check ok or warn, on the daemon's containerd" $?
! "$computectl" --socket /nonexistent/compute.sock doctor >/dev/null 2>&1
check "doctor fails when there is no daemon" $?

# 1. Verify the server is up
out=$(grpcurl -plaintext localhost:50051 grpc.health.v1.Health/Check)
grep -q '"status": "SERVING"' <<<"$out"; check "health SERVING" $?

# 2. Create a sandbox
out=$(grpcurl -plaintext \
  -d '{
    "tenant_id": "acme-tenant-uuid",
    "session_id": "session-uuid-001",
    "image":      "ghcr.io/paper-board/sandbox-python:v0.1.0"
  }' \
  localhost:50051 \
  compute.v1.ComputeService/CreateSandbox)
grep -q '"status": "SANDBOX_STATUS_STARTING"' <<<"$out"; check "create returns STARTING" $?
id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxId"])' <<<"$out") || { echo "no sandbox id in: $out"; exit 1; }
short=${id:0:8}

# 3. Execute a command (right after create: ExecCommand waits for READY)
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id":  "f47ac10b-58cc-4372-a567-0e02b2c3d479",
    "command":     "python3",
    "args":        ["-c", "import socket, os; print(socket.gethostname()); print(42 * 2)"],
    "working_dir": "/workspace"
  }' \
  localhost:50051 \
  compute.v1.ComputeService/ExecCommand 2>&1 || true)
grep -q 'NotFound' <<<"$out"; check "the example's own id is NOT_FOUND here" $?
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id":  "'"$id"'",
    "command":     "python3",
    "args":        ["-c", "import socket, os; print(socket.gethostname()); print(42 * 2)"],
    "working_dir": "/workspace"
  }' \
  localhost:50051 \
  compute.v1.ComputeService/ExecCommand)
stdout=$(python3 tests/lib/exec_stdout.py <<<"$out")
[[ $stdout == "sandbox-$short"$'\n'"84" ]]; check "exec prints sandbox-$short and 84" $?
grep -q '"completed"' <<<"$out" && grep -q '"cpuMs"' <<<"$out" && grep -q '"memoryPeakBytes"' <<<"$out"
check "completed carries usage" $?

# 5. Write and read a workspace file
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id": "'"$id"'",
    "path":       "result.txt",
    "data":       "aGVsbG8gd29ybGQK"
  }' \
  localhost:50051 \
  compute.v1.ComputeService/WriteFile)
grep -q '"bytesWritten": "12"' <<<"$out"; check "write 12 bytes" $?
out=$(grpcurl -plaintext \
  -d '{
    "sandbox_id": "'"$id"'",
    "path":       "result.txt"
  }' \
  localhost:50051 \
  compute.v1.ComputeService/ReadFile)
grep -q '"data": "aGVsbG8gd29ybGQK"' <<<"$out"; check "read back hello world" $?

# The README's interactive exec (platform.v1 ExecInSandbox), as root on the unix socket: stdin
# in, the half-close at the end of -d as its end, the reversed line out, the exit.
out=$(grpcurl -plaintext -unix -authority localhost -d @ "${COMPUTE_SOCKET:-/run/compute/compute.sock}" \
  platform.v1.SandboxService/ExecInSandbox <<END
{"spec": {"sandbox_id": "$id", "argv": ["python3", "-c", "print(input()[::-1])"]}}
{"stdin": "aGVsbG8K"}
END
)
grep -q '"stdout": "b2xsZWgK"' <<<"$out" && grep -q TERMINATION_EXITED <<<"$out"
check "ExecInSandbox with stdin through grpcurl" $?

# 6. Destroy the sandbox
out=$(grpcurl -plaintext \
  -d '{"sandbox_id": "'"$id"'"}' \
  localhost:50051 \
  compute.v1.ComputeService/DestroySandbox)
grep -q "\"sandboxId\": \"$id\"" <<<"$out" && grep -q '"totalUsage"' <<<"$out"; check "destroy returns total usage" $?

# Reflection (v1alpha, as grpcurl 1.8 uses) lists the services.
out=$(grpcurl -plaintext localhost:50051 list)
grep -q compute.v1.ComputeService <<<"$out" && grep -q grpc.health.v1.Health <<<"$out"; check "reflection lists services" $?
grep -q platform.v1.AccessService <<<"$out" && grep -q platform.v1.SandboxService <<<"$out"; check "reflection lists the platform API" $?

# The platform API: no key on TCP is UNAUTHENTICATED; root on the unix socket is the platform admin.
out=$(grpcurl -plaintext localhost:50051 platform.v1.AccessService/WhoAmI 2>&1)
grep -q Unauthenticated <<<"$out"; check "platform API without a key: UNAUTHENTICATED" $?
out=$(grpcurl -plaintext -unix -authority localhost "${COMPUTE_SOCKET:-/run/compute/compute.sock}" platform.v1.AccessService/WhoAmI 2>&1)
grep -q '"principal": "local-root"' <<<"$out"; check "root on the socket is local-root" $?

# A sandbox left running is removed when scripts/up stops.
out=$(grpcurl -plaintext -d '{"tenant_id":"t","session_id":"left-running"}' localhost:50051 compute.v1.ComputeService/CreateSandbox)
left=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxId"])' <<<"$out")
sleep 1
stop_up
! kill -0 "$up" 2>/dev/null; check "scripts/up exits on SIGTERM" $?
! ctr --address "${CONTAINERD_ADDRESS:-/run/compute/containerd.sock}" -n compute containers ls -q | grep -q "$left"
check "no sandbox left after scripts/up stops" $?
! pgrep -f "$left" >/dev/null; check "no runsc process left after scripts/up stops" $?
[[ -n $left ]]; check "the left-running sandbox had been created" $?
! grep -q "$left" /proc/mounts; check "no workspace mount left after scripts/up stops" $?

echo "quickstart: $passed passed, $failed failed"
[[ $failed == 0 ]]
