#!/usr/bin/env python3
"""A harmless HTTP endpoint for the `http_echo` tool of examples/tools.toml:
answers every POST with the JSON it received. Listens on 127.0.0.1:8099
unless given another port: python3 examples/tools/echo_server.py [PORT]"""

import http.server
import json
import sys


class Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 64 * 1024))
        try:
            received = json.loads(body or b"null")
        except ValueError:
            received = body.decode("utf-8", "replace")
        answer = json.dumps({"echo": received}).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8099
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Echo).serve_forever()
