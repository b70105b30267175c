# A small web app for the preview tests (tests/egress.rs), run in a sandbox: static files from
# argv[1] on port argv[2], /ws a WebSocket echo ("echo: " + each message), /result?TEXT
# writes TEXT to ./result (how the test learns what a browser saw), /wait answers once
# ./result exists.
import base64, hashlib, http.server, os, socketserver, struct, sys, time, urllib.parse
os.chdir(sys.argv[1])
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith('/result?'):
            with open('result', 'w') as f: f.write(urllib.parse.unquote(self.path[8:]))
            self.send_response(204); self.send_header('Content-Length', '0'); self.end_headers(); return
        if self.path == '/wait':
            # Answers once a result is in (at most 30 s): a page that loads it finishes
            # loading only then, so a headless browser's screenshot shows the result.
            for _ in range(300):
                if os.path.exists('result'): break
                time.sleep(0.1)
            self.send_response(200); self.send_header('Content-Type', 'text/plain')
            self.send_header('Content-Length', '5'); self.end_headers(); self.wfile.write(b'done\n'); return
        if self.path == '/ws' and self.headers.get('Upgrade', '').lower() == 'websocket':
            acc = base64.b64encode(hashlib.sha1((self.headers['Sec-WebSocket-Key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
            self.send_response(101); self.send_header('Upgrade', 'websocket'); self.send_header('Connection', 'Upgrade')
            self.send_header('Sec-WebSocket-Accept', acc); self.end_headers(); self.wfile.flush()
            while True:
                h = self.rfile.read(2)
                if len(h) < 2: break
                op, n = h[0] & 15, h[1] & 127
                if n == 126: n = struct.unpack('>H', self.rfile.read(2))[0]
                elif n == 127: n = struct.unpack('>Q', self.rfile.read(8))[0]
                m = self.rfile.read(4) if h[1] & 128 else bytes(4)
                d = bytes(b ^ m[i % 4] for i, b in enumerate(self.rfile.read(n)))
                if op == 8: self.wfile.write(b'\x88\x00'); self.wfile.flush(); break
                if op in (1, 2):
                    d = b'echo: ' + d
                    l = bytes([len(d)]) if len(d) < 126 else b'\x7e' + struct.pack('>H', len(d))
                    self.wfile.write(bytes([0x80 | op]) + l + d); self.wfile.flush()
            self.close_connection = True
            return
        return super().do_GET()
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
S(('0.0.0.0', int(sys.argv[2])), H).serve_forever()
