"""A sandbox.v1 worker in Python (grpcio): proof that any language can attach to the relay.

Usage: python_worker.py RELAY_ADDR SANDBOX_ID   (stubs generated from proto/sandbox/v1 on
PYTHONPATH). Runs each command with /bin/sh -c, streaming stdout and stderr as Chunks when
streaming is set, else sending stdout once before End.

Environment:
  RELAY_TOKEN         the credential the operator issued (`computectl relay token ID`), sent as
                      `authorization: Bearer <token>`; unset = attach without one.
  WORKER_TRUST        Hello.trust (default "untrusted").
  WORKER_FAKE_OUTPUT  an impostor: answer every Exec with this output, running nothing.

If the relay refuses the Attach (or the stream fails), prints `ATTACH_ERROR <STATUS_CODE>` on
stdout and exits 3, so a test can see the code an independent client gets.
"""
import os
import queue
import subprocess
import sys
import threading
import time

import grpc
from sandbox.v1 import sandbox_pb2 as pb
from sandbox.v1 import sandbox_pb2_grpc as rpc

# As large as the relay accepts (17 MiB: 16 MiB payloads plus framing).
MAX_MESSAGE = 17 << 20


def main():
    relay, sandbox_id = sys.argv[1], sys.argv[2]
    token = os.environ.get("RELAY_TOKEN", "")
    fake = os.environ.get("WORKER_FAKE_OUTPUT")
    out = queue.Queue()
    out.put(pb.WorkerFrame(hello=pb.Hello(sandbox_id=sandbox_id, capacity_max=4,
                                          capabilities=["python3"], arch="amd64",
                                          trust=os.environ.get("WORKER_TRUST", "untrusted"))))

    def frames():
        while True:
            f = out.get()
            if f is None:
                return
            yield f

    def heartbeat():
        while True:
            time.sleep(1)
            out.put(pb.WorkerFrame(heartbeat=pb.Heartbeat()))

    def run(e):
        if fake is not None:
            out.put(pb.WorkerFrame(chunk=pb.Chunk(req_id=e.req_id, data=fake.encode(),
                                                  stream=pb.STREAM_STDOUT)))
            out.put(pb.WorkerFrame(end=pb.End(req_id=e.req_id, exit_code=0)))
            return
        p = subprocess.Popen(["/bin/sh", "-c", e.command], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        so, se = p.communicate(e.stdin, timeout=e.timeout_s or None)
        if se:
            out.put(pb.WorkerFrame(chunk=pb.Chunk(req_id=e.req_id, data=se,
                                                  stream=pb.STREAM_STDERR)))
        if so:
            out.put(pb.WorkerFrame(chunk=pb.Chunk(req_id=e.req_id, data=so,
                                                  stream=pb.STREAM_STDOUT)))
        code = p.returncode if p.returncode >= 0 else p.returncode
        out.put(pb.WorkerFrame(end=pb.End(req_id=e.req_id, exit_code=code)))

    threading.Thread(target=heartbeat, daemon=True).start()
    metadata = (("authorization", "Bearer " + token),) if token else ()
    options = [("grpc.max_receive_message_length", MAX_MESSAGE),
               ("grpc.max_send_message_length", MAX_MESSAGE)]
    try:
        with grpc.insecure_channel(relay, options=options) as ch:
            stub = rpc.SandboxWorkerStub(ch)
            for f in stub.Attach(frames(), metadata=metadata):
                if f.HasField("exec"):
                    threading.Thread(target=run, args=(f.exec,), daemon=True).start()
    except grpc.RpcError as e:
        print("ATTACH_ERROR", e.code().name, flush=True)
        print("attach failed:", e.code().name, e.details(), file=sys.stderr, flush=True)
        os._exit(3)
    os._exit(0)


if __name__ == "__main__":
    main()
