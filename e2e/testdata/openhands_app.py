"""A tiny stand-in for OpenHands' agent-server, run as a lease's app by
TestOpenHandsApp (python3 -c, with berth/base's python3): it listens on
port 8000, answers /api/conversations when X-Session-API-Key is its
SESSION_API_KEY, and serves the WebSocket /sockets/events/{id}, whose first
frame must carry that key, as the SDK sends it. Standard library only."""
import base64
import getpass
import hashlib
import http.server
import json
import os
import struct
import sys

KEY = os.environ.get("SESSION_API_KEY", "")
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stdout.write("app: " + (fmt % args) + "\n")
        sys.stdout.flush()

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def info(self):
        return {"app": "test-app", "path": self.path, "cwd": os.getcwd(), "user": getpass.getuser(),
                "keys_agree": os.environ.get("OH_SESSION_API_KEYS_0") == KEY and KEY != "",
                "saw_authorization": "Authorization" in self.headers}

    def do_GET(self):
        if self.path.startswith("/sockets/events/"):
            return self.websocket()
        if self.headers.get("X-Session-API-Key") != KEY:
            return self.send_json(401, {"detail": "bad session key"})
        self.send_json(200, dict(self.info(), items=[]))

    def do_POST(self):
        if self.headers.get("X-Session-API-Key") != KEY:
            return self.send_json(401, {"detail": "bad session key"})
        n = int(self.headers.get("Content-Length", "0"))
        self.send_json(200, dict(self.info(), body=json.loads(self.rfile.read(n) or b"null")))

    def websocket(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        first = json.loads(self.read_frame())
        ok = first.get("session_api_key") == KEY and KEY != ""
        reply = {"ok": ok, "conversation": self.path.rsplit("/", 1)[-1],
                 "saw_key_header": "X-Session-API-Key" in self.headers,
                 "saw_authorization": "Authorization" in self.headers}
        self.write_frame(json.dumps(reply).encode())
        self.close_connection = True

    def read_frame(self):
        b1, b2 = self.rfile.read(2)
        n = b2 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self.rfile.read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self.rfile.read(8))[0]
        mask = self.rfile.read(4) if b2 & 0x80 else b"\0\0\0\0"
        data = self.rfile.read(n)
        return bytes(c ^ mask[i % 4] for i, c in enumerate(data)).decode()

    def write_frame(self, payload):
        head = bytes([0x81])
        if len(payload) < 126:
            head += bytes([len(payload)])
        else:
            head += bytes([126]) + struct.pack(">H", len(payload))
        self.wfile.write(head + payload)
        self.wfile.flush()


print("test app listening on 8000", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
