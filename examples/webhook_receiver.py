#!/usr/bin/env python3
"""A webhook receiver for chatgate's --webhook, with the standard library only.

    CHATGATE_WEBHOOK_SECRET=... python3 examples/webhook_receiver.py [--port 9000]

Checks each delivery's X-Chatgate-Signature (docs/operations.md, "Webhooks"),
prints one line per event, and answers 200 (401 for a bad signature, which
chatgate then retries: fix the secret and it goes through). A real receiver
would page someone, post to a chat, or open a ticket with the decide_url;
it should de-duplicate on X-Chatgate-Delivery, since delivery is at least once.
"""

import argparse
import hashlib
import hmac
import http.server
import json
import os
import sys
import time


def verify(secret: str, header: str, body: bytes, tolerance: int = 300) -> bool:
    """Whether ``header`` (``t=<unix seconds>,v1=<hex>``) signs ``body``."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, v1 = fields.get("t", ""), fields.get("v1", "")
    if not t.isdigit() or abs(time.time() - int(t)) > tolerance:
        return False
    expected = hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, v1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    secret = os.environ.get("CHATGATE_WEBHOOK_SECRET")
    if not secret:
        sys.exit("set CHATGATE_WEBHOOK_SECRET to the server's --webhook-secret")
    seen = set()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if not verify(secret, self.headers.get("X-Chatgate-Signature", ""), body):
                self.send_response(401)
                self.end_headers()
                return
            delivery = self.headers.get("X-Chatgate-Delivery")
            if delivery not in seen:
                seen.add(delivery)
                event = json.loads(body)
                line = "%s session=%s confirmation=%s key=%s" % (
                    event["type"], event["session_id"], event["confirmation_id"], event["key"])
                if event.get("decide_url"):
                    line += " decide at " + event["decide_url"]
                if event["type"] != "interaction.requested":
                    line += " " + json.dumps(event["data"])
                print(line, flush=True)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print("listening on http://127.0.0.1:%d/" % args.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
