"""Two chatgate replicas behind nginx, configured by deploy/nginx.conf.

Run by .ci/run (nginx is not on a fresh machine, so `cargo test` does not):

    CHATGATE_BIN=target/debug/chatgate python3 -m unittest discover -s tests/replicas

Everything listens on 127.0.0.1 ports picked at start; nginx and both
replicas are stopped when the tests end.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chatgate_client import ChatGateClient  # noqa: E402
from harness import free_port, read_until, start_nginx, wait_for  # noqa: E402

DEPLOY_CONF = os.path.join(ROOT, "deploy", "nginx.conf")
STREAM_PATH = "/api/v1/chat/stream"






class Deployment:
    """Two replicas and nginx in front of them, on free loopback ports."""

    def __init__(self):
        binary = os.environ.get("CHATGATE_BIN") or os.path.join(ROOT, "target", "debug", "chatgate")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(binary):
            raise RuntimeError("no chatgate binary at %s: run `cargo build` or set CHATGATE_BIN" % binary)
        if not os.path.exists(nginx):
            raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
        self.dir = tempfile.mkdtemp(prefix="chatgate-replicas-")
        self.processes = []
        self.replicas = []
        for _ in range(2):
            port = free_port()
            self.replicas.append("127.0.0.1:%d" % port)
            self.processes.append(subprocess.Popen(
                [binary, "--bind", "127.0.0.1:%d" % port, "--step-delay-ms", "0",
                 "--keep-alive-secs", "1", "--workers", "1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        for replica in self.replicas:
            wait_for("http://%s/healthz" % replica)

        self.port = free_port()
        with open(DEPLOY_CONF) as f:
            site = f.read()
        site = (site.replace("127.0.0.1:8080", self.replicas[0])
                    .replace("127.0.0.1:8081", self.replicas[1])
                    .replace("listen 127.0.0.1:8000;", "listen 127.0.0.1:%d;" % self.port))
        self.processes.append(start_nginx(self.dir, site))
        self.url = "http://127.0.0.1:%d" % self.port
        wait_for(self.url + "/healthz")

    def decisions(self, replica):
        """Confirmations accepted by one replica, from its /metrics."""
        with urllib.request.urlopen("http://%s/metrics" % replica, timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("chatgate_confirmation_decisions_total") and 'outcome="accepted"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def setUpModule():
    global DEPLOYMENT
    DEPLOYMENT = Deployment()


def tearDownModule():
    DEPLOYMENT.stop()


def raw_post(conn, body, headers=()):
    conn.request("POST", STREAM_PATH, body=json.dumps(body),
                 headers=dict({"Content-Type": "application/json"}, **dict(headers)))
    return conn.getresponse()




class ReplicaTests(unittest.TestCase):
    def test_sessions_spread_over_both_replicas_and_every_reply_finds_its_run(self):
        client = ChatGateClient(DEPLOYMENT.url)
        before = [DEPLOYMENT.decisions(r) for r in DEPLOYMENT.replicas]
        outcomes = []
        for _ in range(24):
            replies = ["modify:add a check", "confirm"]
            result = client.run("build; ship", on_confirmation=lambda chunk: replies.pop(0))
            outcomes.append((result.outcome, [c["chunk_type"] for c in result.chunks].count("confirmation_request")))

        after = [DEPLOYMENT.decisions(r) for r in DEPLOYMENT.replicas]
        self.assertEqual(outcomes, [("completed", 2)] * 24)
        per_replica = [a - b for a, b in zip(after, before)]
        self.assertEqual(sum(per_replica), 48, "two decisions per run")
        self.assertTrue(all(n > 0 for n in per_replica), "both replicas served runs: %r" % per_replica)

    def test_clients_without_the_session_header_stay_on_one_replica(self):
        for _ in range(10):
            session = "curl-" + uuid.uuid4().hex[:8]
            stream_conn = http.client.HTTPConnection("127.0.0.1", DEPLOYMENT.port, timeout=30)
            reply_conn = http.client.HTTPConnection("127.0.0.1", DEPLOYMENT.port, timeout=30)
            stream = raw_post(stream_conn, {"message": "build; ship", "session_id": session})
            self.assertEqual(stream.status, 200)
            read_until(stream, rb'"chunk_type":"confirmation_request"')

            reply = raw_post(reply_conn, {"message": "CONFIRM_ACTION:confirm", "session_id": session})
            reply.read()

            self.assertEqual(reply.status, 200, "the reply reached the replica holding the run")
            read_until(stream, rb'"finished":true,"chunk_type":"completion"')
            stream_conn.close()
            reply_conn.close()

    def test_a_paused_stream_reaches_the_client_unbuffered_with_keep_alives(self):
        conn = http.client.HTTPConnection("127.0.0.1", DEPLOYMENT.port, timeout=30)
        session = "ka-" + uuid.uuid4().hex[:8]
        stream = raw_post(conn, {"message": "wait for me", "session_id": session},
                          {"X-Chatgate-Session": session})

        # Both arrive while the run is paused: nothing is held back by nginx.
        seen = read_until(stream, rb'"chunk_type":"confirmation_request"[\s\S]*: keep-alive\n\n')

        self.assertEqual(stream.getheader("Content-Type"), "text/event-stream; charset=utf-8")
        self.assertIn(b"id: 2\n", seen)
        ChatGateClient(DEPLOYMENT.url).reply(session, "cancel")
        read_until(stream, rb'"finished":true,"chunk_type":"cancelled"')
        conn.close()


if __name__ == "__main__":
    unittest.main()
