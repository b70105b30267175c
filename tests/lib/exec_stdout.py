#!/usr/bin/env python3
"""Prints the stdout bytes of a compute.v1 ExecCommand stream as grpcurl shows it (a sequence of
JSON messages on stdin; each `stdout` frame's base64 `data`), for the shell e2e scripts
(tests/quickstart_up.sh, tests/k1/run.sh, tests/kind/run.sh)."""
import base64
import json
import sys

dec = json.JSONDecoder()
s = sys.stdin.read()
i = 0
out = b""
while True:
    while i < len(s) and s[i].isspace():
        i += 1
    if i >= len(s):
        break
    obj, i = dec.raw_decode(s, i)
    if "stdout" in obj:
        out += base64.b64decode(obj["stdout"]["data"])
print(out.decode(), end="")
