"""Grants and quorums across three replicas sharing a Redis (docs/tools.md,
"Grants"; docs/protocol.md, "Who may decide"): a grant made on one replica
is used on another, its budget of calls is never exceeded by concurrent
runs spread over all three, and a revoke on a third is effective
everywhere at once; two approvals racing on two replicas complete a quorum
once.

Run by .ci/run with the other replica suites (redis-server is started by
the harness on a free port; every process listens on 127.0.0.1).
"""

import hashlib
import hmac
import http.client
import json
import os
import re
import tempfile
import threading
import time
import unittest
import uuid

from test_round_robin import OWNER_TTL, Cluster, answer, chunk_types, connect, post, read_to_end  # noqa: E402
from harness import read_until  # noqa: E402

TOOLS = """
[[tool]]
name = "note"
description = "A note"
risk = "low"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""


def session(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def confirm_granting(target, session_id, grant):
    response = post(target, {"message": "CONFIRM_ACTION:confirm", "session_id": session_id,
                             "grant": grant})
    body = response.read().decode()
    response.conn.close()
    return response.status, body


def request(target, method, path):
    conn = connect(target)
    conn.request(method, path)
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    return response.status, body


def grants(target):
    status, body = request(target, "GET", "/api/v1/grants")
    assert status == 200, body
    return json.loads(body)["grants"]


def paused_or_ended(target, session_id, message="note again"):
    """Starts a run; True when it paused (then the stream is returned open)."""
    stream = post(target, {"message": message, "session_id": session_id})
    assert stream.status == 200, stream.status
    seen = read_until(stream, rb'"stream_paused":true|"finished":true')
    if b'"stream_paused":true' in seen:
        return True, stream
    stream.conn.close()
    return False, None


class GrantTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="chatgate-grants-")
        tools = os.path.join(cls.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write(TOOLS)
        cls.cluster = Cluster(replicas=3, nginx=False, extra=["--tools", tools])
        cls.a, cls.b, cls.c = cls.cluster.replicas

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def grant_on(self, owner, decider, session_id, grant):
        """Pauses a run on ``owner``, confirms it with ``grant`` on ``decider``."""
        stream = post(owner, {"message": "note first", "session_id": session_id})
        read_until(stream, rb'"chunk_type":"confirmation_request"')
        status, body = confirm_granting(decider, session_id, grant)
        self.assertEqual(status, 200, body)
        seen = read_to_end(stream)
        stream.conn.close()
        self.assertEqual(chunk_types(seen)[-1], b"completion")
        return re.search(rb'\(grant ([0-9a-f-]{36})\)', seen).group(1).decode()

    def test_a_grant_made_on_one_replica_is_used_on_another_and_revoked_on_a_third(self):
        s = session("g")
        grant_id = self.grant_on(self.a, self.b, s, {"scope": "session", "tools": ["note"]})
        listed = [g for g in grants(self.c) if g["id"] == grant_id]
        self.assertEqual(len(listed), 1)
        self.assertEqual(listed[0]["calls_left"], 100)

        paused, _ = paused_or_ended(self.b, s)
        self.assertFalse(paused, "the grant made on a covers a run on b")

        status, body = request(self.c, "DELETE", "/api/v1/grants/" + grant_id)
        self.assertEqual(status, 204, body)
        self.assertEqual(request(self.a, "DELETE", "/api/v1/grants/" + grant_id)[0], 404)
        paused, stream = paused_or_ended(self.a, s)
        self.assertTrue(paused, "revoked on c: a asks again")
        answer(self.a, s, "cancel")
        read_to_end(stream)
        stream.conn.close()

    def test_max_calls_is_never_exceeded_by_twenty_concurrent_runs_on_three_replicas(self):
        key_grant = {"scope": "key", "tools": ["note"], "max_calls": 5}
        grant_id = self.grant_on(self.a, self.c, session("k"), key_grant)
        targets = [self.a, self.b, self.c]
        outcomes = [None] * 20
        streams = [None] * 20
        sessions = [session("race") for _ in range(20)]

        def one(i):
            outcomes[i], streams[i] = paused_or_ended(targets[i % 3], sessions[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

        covered = outcomes.count(False)
        self.assertEqual(covered, 5, outcomes)
        self.assertEqual(outcomes.count(True), 15)
        for i, stream in enumerate(streams):
            if stream is not None:
                answer(targets[i % 3], sessions[i], "cancel")
                read_to_end(stream)
                stream.conn.close()
        self.assertFalse([g for g in grants(self.b) if g["id"] == grant_id], "spent")


KEYS = """agent-key-0000001 label=ci-bot
approver lead-key-00000001 label=lead-1 slack=U0LEAD1 email=lead1@example.com
approver lead-key-00000002 label=lead-2 slack=U0LEAD2 email=lead2@example.com
"""

QUORUM_TOOLS = """
[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""


class QuorumTests(unittest.TestCase):
    """Two approvers confirming at the same instant on two replicas complete
    a quorum of two exactly once; the same label twice counts once."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="chatgate-quorum-")
        tools = os.path.join(cls.dir, "tools.toml")
        keys = os.path.join(cls.dir, "keys.txt")
        with open(tools, "w") as f:
            f.write(QUORUM_TOOLS)
        with open(keys, "w") as f:
            f.write(KEYS)
        cls.extra = ["--tools", tools, "--api-keys-file", keys,
                     "--public-url", "https://gate.example", "--link-secret", LINK_SECRET,
                     "--slack-signing-secret", SLACK_SECRET]
        cls.smtp = Smtp.start(cls.dir)
        if cls.smtp:
            cls.extra += ["--smtp", "smtp://127.0.0.1:%d" % cls.smtp.port,
                          "--mail-from", "gate@example.com"]
        cls.cluster = Cluster(replicas=3, nginx=False, extra=cls.extra)
        cls.a, cls.b, cls.c = cls.cluster.replicas

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        if cls.smtp:
            cls.smtp.stop()

    def test_mailed_links_decide_on_any_replica_and_each_person_gets_one_mail(self):
        if not self.smtp:
            self.skipTest("no tests/mcp/.venv with aiosmtpd (tests/mcp/setup.sh)")
        s = session("mail")
        agent = {"Authorization": "Bearer agent-key-0000001"}
        stream = post(self.a, {"message": "deploy web", "session_id": s}, agent)
        seen = read_until(stream, rb'"stream_paused":true')
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()
        mails = self.smtp.wait(lambda m: pause in m[1], 2)
        self.assertEqual(sorted(to for to, _ in mails), [["lead1@example.com"], ["lead2@example.com"]])
        link = {to[0]: mail_link(text) for to, text in mails}
        status, page = link_request(self.c, "POST", link["lead1@example.com"], "action=confirm")
        self.assertEqual(status, 200, page)
        status, page = link_request(self.b, "POST", link["lead2@example.com"], "action=confirm")
        self.assertEqual(status, 200, page)
        self.assertIn("Confirmed", page)
        self.assertEqual(chunk_types(read_to_end(stream))[-1], b"completion")
        stream.conn.close()
        time.sleep(0.5)
        self.assertEqual(len([m for m in self.smtp.mails() if pause in m[1]]), 2,
                         "one mail per person, whichever replica sent it")

    def race(self, first, second):
        """The agent pauses on a; ``first`` and ``second`` (approver keys)
        confirm at once on b and c: the statuses and chunk types, and the
        run's last chunk type."""
        s = session("quorum")
        agent = {"Authorization": "Bearer agent-key-0000001"}
        stream = post(self.a, {"message": "deploy web", "session_id": s}, agent)
        seen = read_until(stream, rb'"stream_paused":true')
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()
        results = [None, None]

        def reply(i, target, key):
            status, chunk, _ = answer(target, s, "confirm", {"Authorization": "Bearer " + key},
                                      confirmation_id=pause)
            results[i] = (status, chunk["chunk_type"])

        threads = [threading.Thread(target=reply, args=(0, self.b, first)),
                   threading.Thread(target=reply, args=(1, self.c, second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return results, stream, s

    def test_two_approvals_racing_on_two_replicas_complete_the_quorum_once(self):
        for _ in range(20):
            results, stream, _ = self.race("lead-key-00000001", "lead-key-00000002")
            kinds = sorted(kind for _, kind in results)
            self.assertEqual([status for status, _ in results], [200, 200], results)
            self.assertEqual(kinds, ["approval_recorded", "confirmation_received"], results)
            self.assertEqual(chunk_types(read_to_end(stream))[-1], b"completion")
            stream.conn.close()

    def test_the_same_label_on_two_replicas_counts_once(self):
        for _ in range(5):
            results, stream, s = self.race("lead-key-00000001", "lead-key-00000001")
            self.assertEqual(sorted(status for status, _ in results), [200, 409], results)
            status, chunk, _ = answer(self.a, s, "cancel",
                                      {"Authorization": "Bearer agent-key-0000001"})
            self.assertEqual(status, 200, chunk)
            self.assertEqual(chunk_types(read_to_end(stream))[-1], b"cancelled")
            stream.conn.close()

    def test_a_partial_quorum_survives_the_kill_9_of_its_owner(self):
        doomed = self.cluster.add("doomed-quorum", self.extra)
        s = session("takeover")
        agent = {"Authorization": "Bearer agent-key-0000001"}
        lead_1 = {"Authorization": "Bearer lead-key-00000001"}
        lead_2 = {"Authorization": "Bearer lead-key-00000002"}
        stream = post(doomed, {"message": "deploy web", "session_id": s}, agent)
        seen = read_until(stream, rb'"stream_paused":true')
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()
        status, chunk, _ = answer(self.b, s, "confirm", lead_1, confirmation_id=pause)
        self.assertEqual((status, chunk["chunk_type"]), (200, "approval_recorded"), chunk)

        doomed.kill()
        stream.conn.close()
        time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
        again, chunk, _ = answer(self.c, s, "confirm", lead_1, confirmation_id=pause)
        self.assertEqual((again, chunk["metadata"].get("error_type")), (409, "already_approved"),
                         "lead-1's approval was kept: %r" % (chunk,))
        status, chunk, _ = answer(self.b, s, "confirm", lead_2, confirmation_id=pause)
        self.assertEqual((status, chunk["chunk_type"]), (200, "confirmation_received"), chunk)
        self.assertEqual(chunk["metadata"]["approved_by"], ["lead-1", "lead-2"])

    def test_links_made_on_one_replica_decide_on_others(self):
        s = session("links")
        agent = {"Authorization": "Bearer agent-key-0000001"}
        stream = post(self.a, {"message": "deploy web", "session_id": s}, agent)
        seen = read_until(stream, rb'"stream_paused":true')
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()

        status, page = link_request(self.b, "POST", link_path(pause, "lead-1"), "action=confirm")
        self.assertEqual(status, 200, page)
        self.assertIn("1 of 2 approvals, as lead-1", page)
        status, page = link_request(self.c, "GET", link_path(pause, "lead-2"))
        self.assertEqual(status, 200, page)
        self.assertIn("1 of 2 approvals (lead-1)", page)
        status, page = link_request(self.c, "POST", link_path(pause, "lead-2"), "action=confirm")
        self.assertEqual(status, 200, page)
        self.assertIn("Confirmed", page)
        self.assertEqual(chunk_types(read_to_end(stream))[-1], b"completion")
        stream.conn.close()
        status, page = link_request(self.b, "POST", link_path(pause, "lead-1"), "action=cancel")
        self.assertEqual(status, 409, page)
        forged = link_path(pause, "lead-1")[:-1] + "0"
        status, page = link_request(self.c, "GET", forged)
        self.assertEqual(status, 404, page)
        for replica in (self.a, self.b, self.c):
            self.assertNotIn(pause + ".lead", replica.logs(), "no token in a log")
        self.assertIn("/d/<token>", self.b.logs() + self.c.logs(), "the access log has the path")

    def test_a_slack_button_pressed_on_one_replica_decides_the_run_another_holds(self):
        slack = SlackReceiver()
        try:
            s = session("slack")
            agent = {"Authorization": "Bearer agent-key-0000001"}
            stream = post(self.a, {"message": "deploy web", "session_id": s}, agent)
            seen = read_until(stream, rb'"stream_paused":true')
            pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()
            # A button's value: a token naming no one (signed as chatgate signs it).
            value = link_path(pause, "").split("/")[-1]
            for user, replica, expected in (("U0LEAD1", self.b, "Approval recorded: 1 of 2 (lead-1)"),
                                            ("U0LEAD2", self.c, "Approved by lead-1, lead-2")):
                status = press(replica, slack, user, value)
                self.assertEqual(status, 200)
                self.assertEqual(slack.wait(lambda r: r.get("text") == expected), expected)
            self.assertEqual(chunk_types(read_to_end(stream))[-1], b"completion")
            stream.conn.close()
        finally:
            slack.stop()


EXTENDING_TOOLS = """
[[tool]]
name = "restart"
description = "Restart"
risk = "low"
timeout = "2s"
escalate_after = "1s"
escalate_to = "leads"
escalate_extends = "1m"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""


class EscalationTests(unittest.TestCase):
    """An escalation that extends a pause keeps its records in Redis alive
    past the expiry it was asked with (a short --detach-grace makes them
    expire soon after it otherwise), so another replica decides it later."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="chatgate-extends-")
        tools = os.path.join(cls.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write(EXTENDING_TOOLS)
        cls.cluster = Cluster(replicas=2, nginx=False,
                              extra=["--tools", tools, "--detach-grace", "1s"])
        cls.a, cls.b = cls.cluster.replicas

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_an_extended_pause_outlives_its_first_expiry_and_is_decided_elsewhere(self):
        s = session("extends")
        stream = post(self.a, {"message": "restart api", "session_id": s})
        read_until(stream, rb'Escalated to leads')
        # Past the first expiry (2 s) and what the records had after it
        # (--detach-grace 1 s and the 2 s lease).
        time.sleep(6.5)
        status, chunk, _ = answer(self.b, s, "confirm")
        self.assertEqual(status, 200, chunk)
        self.assertEqual(chunk_types(read_to_end(stream))[-1], b"completion")
        stream.conn.close()


LINK_SECRET = "a-link-secret-shared-by-every-replica-01"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


class Smtp:
    """aiosmtpd (tests/mail/smtp_server.py) in the venv tests/mcp/setup.sh makes."""

    ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

    @classmethod
    def start(cls, dir):
        import socket
        import subprocess
        python = os.path.join(cls.ROOT, "tests", "mcp", ".venv", "bin", "python")
        if not os.path.exists(python):
            return None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = os.path.join(dir, "mail")
        os.makedirs(out, exist_ok=True)
        process = subprocess.Popen(
            [python, os.path.join(cls.ROOT, "tests", "mail", "smtp_server.py"), str(port), out, "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdout.readline().strip() == b"ready"
        smtp = cls()
        smtp.process, smtp.port, smtp.out = process, port, out
        return smtp

    def mails(self):
        found = []
        for name in sorted(os.listdir(self.out)):
            if name.endswith(".eml"):
                base = os.path.join(self.out, name[:-4])
                with open(base + ".rcpt") as f:
                    to = json.load(f)
                with open(base + ".eml") as f:
                    text = f.read().replace("=\r\n", "").replace("=\n", "").replace("=3D", "=")
                found.append((to, text))
        return found

    def wait(self, keep, n, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            mails = [m for m in self.mails() if keep(m)]
            if len(mails) >= n:
                return mails
            time.sleep(0.05)
        raise AssertionError("%d of %d mails" % (len(self.mails()), n))

    def stop(self):
        self.process.kill()
        self.process.wait()


def mail_link(text):
    """The path of the decision link in a mail."""
    found = re.search(r"https://gate\.example(/d/[0-9a-f-]{36}\.[A-Za-z0-9_-]*\.\d+\.[0-9a-f]{32})", text)
    return found.group(1)


class SlackReceiver:
    """Slack's side, locally: takes the response_url updates."""

    def __init__(self):
        import http.server
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                received.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/response" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, check, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for r in list(self.received):
                if check(r):
                    return r.get("text")
            time.sleep(0.02)
        raise AssertionError("no matching Slack update in %r" % (self.received,))

    def stop(self):
        self.server.shutdown()


def press(replica, slack, user, value, button="approve"):
    """A signed block_actions request: ``user`` pressed ``button``."""
    import urllib.parse
    payload = {"type": "block_actions", "user": {"id": user},
               "actions": [{"action_id": button, "value": value, "type": "button"}],
               "response_url": slack.url}
    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    ts = str(int(time.time()))
    sig = "v0=" + hmac.new(SLACK_SECRET.encode(), ("v0:%s:%s" % (ts, body)).encode(),
                           hashlib.sha256).hexdigest()
    conn = connect(replica)
    conn.request("POST", "/api/v1/slack/actions", body=body,
                 headers={"Content-Type": "application/x-www-form-urlencoded",
                          "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def link_path(confirmation_id, label, expires_at_ms=None):
    """A decision link's path, signed as chatgate signs it (docs/operations.md)."""
    expires_at_ms = expires_at_ms or int(time.time() * 1000) + 600_000
    signed = "chatgate-link-v1:%s.%s.%d" % (confirmation_id, label, expires_at_ms)
    mac = hmac.new(LINK_SECRET.encode(), signed.encode(), hashlib.sha256).hexdigest()[:32]
    if mac[-1] == "0":  # so that a forged one (last digit 0) differs
        return link_path(confirmation_id, label, expires_at_ms + 1)
    return "/d/%s.%s.%d.%s" % (confirmation_id, label, expires_at_ms, mac)


def link_request(target, method, path, form=None):
    conn = connect(target)
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if form else {}
    conn.request(method, path, body=form, headers=headers)
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    return response.status, body


if __name__ == "__main__":
    unittest.main()
