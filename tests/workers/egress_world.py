#!/usr/bin/env python3
"""The fake internet of tests/egress.rs, run inside the test's own "world" network namespace
(addresses from 198.18.0.0/15 and the metadata address; nothing here reaches a real network).

Servers, each on every address given with --addr (the test puts them on the namespace's
interface first):
  * HTTP on port 8000 and 80: GET /blob sends --blob-bytes bytes, POST /upload reads the body
    and answers its length, anything else answers "world <Host header>";
  * TCP echo on ports 9000-9002 (one byte back for each byte in);
  * bulk TCP (the bench's throughput, 1 MiB buffers): port 9100 reads until the peer's end
    and answers how many bytes came; port 9101 sends --blob-bytes zero bytes and closes;
  * TLS on port 443 (a self-signed certificate): answers "tls <SNI>" and closes;
  * DNS on UDP and TCP port 53: A records from --name NAME=ADDR (TTL --ttl), an empty answer for
    other types of a known name, NXDOMAIN otherwise; every query is printed to stdout as
    "query NAME TYPE".
Prints "ready" once everything listens.
"""

import argparse
import http.server
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import tempfile
import threading


def serve_forever(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()


class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    blob = b""

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = Http.blob if self.path == "/blob" else ("world %s\n" % self.headers.get("Host", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        got = 0
        while got < n:
            chunk = self.rfile.read(min(1 << 20, n - got))
            if not chunk:
                break
            got += len(chunk)
        body = ("%d\n" % got).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ThreadingHTTP(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            try:
                b = self.request.recv(65536)
            except OSError:
                return
            if not b:
                return
            self.request.sendall(b)


class Sink(socketserver.BaseRequestHandler):
    def handle(self):
        buf = bytearray(1 << 20)
        got = 0
        while True:
            n = self.request.recv_into(buf)
            if not n:
                break
            got += n
        self.request.sendall(b"%d\n" % got)


class Source(socketserver.BaseRequestHandler):
    size = 0

    def handle(self):
        buf = bytes(1 << 20)
        left = Source.size
        while left > 0:
            left -= self.request.send(memoryview(buf)[: min(left, len(buf))])
        self.request.shutdown(socket.SHUT_WR)


class ThreadingTCP(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def tls_server(addr, ctx):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 443))
    s.listen(64)

    # The name the client asked for, kept on its socket.
    ctx.sni_callback = lambda sock, name, _: setattr(sock, "sni_seen", name or "")

    def one(c):
        try:
            t = ctx.wrap_socket(c, server_side=True)
            t.sendall(("tls %s\n" % getattr(t, "sni_seen", "")).encode())
            t.close()
        except (OSError, ssl.SSLError):
            c.close()

    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def dns_answer(query, names, ttl):
    """The response to one DNS query message."""
    if len(query) < 12:
        return None
    qid, flags, qd = struct.unpack(">HHH", query[:6])
    i = 12
    labels = []
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    i += 1
    qtype, qclass = struct.unpack(">HH", query[i : i + 4])
    question = query[12 : i + 4]
    name = ".".join(labels).lower()
    print("query %s %d" % (name, qtype), flush=True)
    addrs = names.get(name)
    rcode = 0 if addrs is not None else 3
    answers = b""
    count = 0
    if addrs is not None and qtype == 1:
        for a in addrs:
            answers += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, ttl, 4) + socket.inet_aton(a)
            count += 1
    hdr = struct.pack(">HHHHHH", qid, 0x8180 | rcode, 1, count, 0, 0)
    return hdr + question + answers


def dns_servers(addr, names, ttl):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, 53))

    def udp():
        while True:
            q, peer = u.recvfrom(4096)
            r = dns_answer(q, names, ttl)
            if r:
                u.sendto(r, peer)

    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((addr, 53))
    t.listen(16)

    def tcp_one(c):
        try:
            n = struct.unpack(">H", c.recv(2))[0]
            q = b""
            while len(q) < n:
                q += c.recv(n - len(q))
            r = dns_answer(q, names, ttl)
            c.sendall(struct.pack(">H", len(r)) + r)
        finally:
            c.close()

    def tcp():
        while True:
            c, _ = t.accept()
            threading.Thread(target=tcp_one, args=(c,), daemon=True).start()

    threading.Thread(target=udp, daemon=True).start()
    threading.Thread(target=tcp, daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", action="append", default=[])
    p.add_argument("--dns-addr", default="")
    p.add_argument("--name", action="append", default=[])
    p.add_argument("--ttl", type=int, default=300)
    p.add_argument("--blob-bytes", type=int, default=10 << 20)
    a = p.parse_args()
    Source.size = a.blob_bytes
    Http.blob = bytes(range(256)) * (a.blob_bytes // 256) + b"x" * (a.blob_bytes % 256)
    names = {}
    for n in a.name:
        k, v = n.split("=", 1)
        names.setdefault(k.lower(), []).append(v)
    d = tempfile.mkdtemp()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=world",
         "-keyout", d + "/k.pem", "-out", d + "/c.pem"],
        check=True, capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d + "/c.pem", d + "/k.pem")
    for addr in a.addr:
        for port in (8000, 80):
            serve_forever(ThreadingHTTP((addr, port), Http))
        for port in (9000, 9001, 9002):
            serve_forever(ThreadingTCP((addr, port), Echo))
        serve_forever(ThreadingTCP((addr, 9100), Sink))
        serve_forever(ThreadingTCP((addr, 9101), Source))
        tls_server(addr, ctx)
    if a.dns_addr:
        dns_servers(a.dns_addr, names, a.ttl)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
