"""A sandbox.v1 worker in Python (grpcio): proof that any language can attach to the relay.

Usage: python_worker.py RELAY_ADDR SANDBOX_ID   (stubs generated from proto/sandbox/v1 on
PYTHONPATH). Runs each command with /bin/sh -c, streaming stdout and stderr as Chunks when
streaming is set, else sending stdout once before End.
"""
import queue
import subprocess
import sys
import threading
import time

import grpc
from sandbox.v1 import sandbox_pb2 as pb
from sandbox.v1 import sandbox_pb2_grpc as rpc


def main():
    relay, sandbox_id = sys.argv[1], sys.argv[2]
    out = queue.Queue()
    out.put(pb.WorkerFrame(hello=pb.Hello(sandbox_id=sandbox_id, capacity_max=4,
                                          capabilities=["python3"], arch="amd64",
                                          trust="untrusted")))

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
    with grpc.insecure_channel(relay) as ch:
        stub = rpc.SandboxWorkerStub(ch)
        for f in stub.Attach(frames()):
            if f.HasField("exec"):
                threading.Thread(target=run, args=(f.exec,), daemon=True).start()


if __name__ == "__main__":
    main()
