"""Timers with replicas (#40 item 16): a pause's reminder and escalation
fire even when its owner was killed and nobody touches the session: any
replica's sweep finds them in the store's index of due timers, takes the
run over and fires what came due, once, before anyone decides.

Run by .ci/run with the other replica suites (redis-server is started by
the harness on a free port; every process listens on 127.0.0.1).
"""

import os
import tempfile
import time
import unittest
import uuid

from test_round_robin import (  # noqa: E402
    OWNER_TTL, WEBHOOK_SECRET, Cluster, Receiver, answer, chunk_types, post, read_to_end)
from harness import read_until  # noqa: E402

TOOLS = """
[[tool]]
name = "restart"
description = "Restart a service"
risk = "low"
remind_after = "3s"
escalate_after = "5s"
escalate_to = "oncall"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""


class DeadOwnerTimerTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="chatgate-timers-")
        tools = os.path.join(cls.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write(TOOLS)
        cls.receiver = Receiver()
        cls.extra = ["--tools", tools, "--webhook", cls.receiver.url,
                     "--webhook-secret", WEBHOOK_SECRET, "--public-url", "https://gate.example"]
        cls.cluster = Cluster(replicas=2, nginx=False, extra=cls.extra)
        cls.a, cls.b = cls.cluster.replicas

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        cls.receiver.stop()

    def events_of(self, session_id):
        return sorted((body for body in self.receiver.delivered().values()
                       if body.get("session_id") == session_id), key=lambda b: b["at"])

    def wait_for_event(self, session_id, kind, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            seen = [b["type"] for b in self.events_of(session_id)]
            if kind in seen:
                return seen
            time.sleep(0.1)
        raise AssertionError("no %s for %s: %r" % (kind, session_id, self.events_of(session_id)))

    def test_a_killed_owner_s_pause_is_reminded_and_escalated_by_another_replica(self):
        doomed = self.cluster.add("doomed-timers", self.extra)
        s = "timers-%s" % uuid.uuid4().hex[:8]
        stream = post(doomed, {"message": "restart api", "session_id": s})
        read_until(stream, rb'"stream_paused":true')
        self.wait_for_event(s, "interaction.requested")
        # The owner dies before its timers are due; nobody touches the session.
        doomed.kill()
        stream.conn.close()

        seen = self.wait_for_event(s, "interaction.escalated")
        self.assertEqual(seen.count("interaction.reminder"), 1, seen)
        self.assertEqual(seen.count("interaction.escalated"), 1, seen)
        self.assertLess(seen.index("interaction.reminder"), seen.index("interaction.escalated"))
        escalated = next(b for b in self.events_of(s) if b["type"] == "interaction.escalated")
        self.assertEqual(escalated["data"]["escalated_to"], "oncall")

        # The run lives on, taken over: a reply decides it, and nothing fires twice.
        status, chunk, _ = answer(self.a, s, "confirm")
        self.assertEqual(status, 200, chunk)
        time.sleep(OWNER_TTL)
        seen = [b["type"] for b in self.events_of(s)]
        self.assertEqual(seen.count("interaction.reminder"), 1, seen)
        self.assertEqual(seen.count("interaction.escalated"), 1, seen)
        self.assertIn("interaction.decided", seen)


if __name__ == "__main__":
    unittest.main()
