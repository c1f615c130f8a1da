# A web server the portal tests start inside a sandbox: downloads with
# Range, uploads, chunked and SSE responses, a WebSocket echo, redirects and
# a mirror of the request's headers. Standard library only.
import base64, hashlib, json, os, socket, struct, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer



class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body, ctype="application/octet-stream", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def access(self):
        with open("/tmp/access-%d.log" % self.server.server_address[1], "a") as f:
            f.write("%s %s origin=%s site=%s\n" % (self.command, self.path, self.headers.get("Origin"), self.headers.get("Sec-Fetch-Site")))

    def do_GET(self):
        self.access()
        p = self.path.split("?")[0]
        if p == "/headers" or p.startswith("/echo/"):
            body = json.dumps({"port": self.server.server_address[1], "path": self.path, "headers": {k: v for k, v in self.headers.items()}}).encode()
            return self.send(200, body, "application/json")
        if p == "/big":
            return self.big()
        if p == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                part = ("chunk-%d\n" % i).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if p == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            n = int(self.path.split("n=")[1]) if "n=" in self.path else 3
            for i in range(n):
                self.wfile.write(b"data: tick %d\n\n" % i)
                self.wfile.flush()
                time.sleep(1)
            self.close_connection = True
            return
        if p == "/cut":
            # A body that breaks off: a chunk header, part of it, then EOF.
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b'b\r\n{"rows":[1,\r\n')
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if p == "/redirect":
            return self.send(302, b"", extra=[("Location", "/target?x=1")])
        if p == "/setcookie":
            return self.send(200, b"ok", "text/plain", [("Set-Cookie", "sandboxd_portal=forged; Path=/"), ("Set-Cookie", "app=1; Path=/")])
        if p == "/ws":
            return self.websocket()
        if p.startswith("/static/") and ".." not in p:
            try:
                with open("/workspace" + p, "rb") as f:
                    body = f.read()
            except OSError:
                return self.send(404, b"no file\n", "text/plain")
            ctype = "text/html; charset=utf-8" if p.endswith(".html") else "application/octet-stream"
            return self.send(200, body, ctype)
        if p == "/page":
            return self.send(200, b"<!doctype html><title>in the sandbox</title><h1 id=h>Hello from the sandbox</h1>", "text/html")
        self.send(404, b"not here on port %d\n" % self.server.server_address[1], "text/plain")

    def big(self):
        BIG = "/workspace/big-%d.bin" % self.server.server_address[1]
        size = os.path.getsize(BIG)
        start, end, code = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, b = rng[6:].split("-")
            start, end, code = int(a), int(b) if b else size - 1, 206
        self.send_response(code)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if code == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        with open(BIG, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                b = f.read(min(left, 1 << 20))
                self.wfile.write(b)
                left -= len(b)

    def do_POST(self):
        self.access()
        h = hashlib.sha256()
        n = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                b = self.rfile.read(size)
                h.update(b)
                n += len(b)
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left > 0:
                b = self.rfile.read(min(left, 1 << 20))
                h.update(b)
                n += len(b)
                left -= len(b)
        self.send(200, json.dumps({"bytes": n, "sha256": h.hexdigest()}).encode(), "application/json")

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            hdr = r.read(2)
            if len(hdr) < 2:
                return
            op, ln = hdr[0] & 0x0F, hdr[1] & 0x7F
            if ln == 126:
                ln = struct.unpack(">H", r.read(2))[0]
            elif ln == 127:
                ln = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if hdr[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(ln)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                return
            if op in (1, 2):
                out = b"echo: " + data
                if len(out) < 126:
                    head = bytes([0x80 | op, len(out)])
                else:
                    head = bytes([0x80 | op, 126]) + struct.pack(">H", len(out))
                self.wfile.write(head + out)
                self.wfile.flush()


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
