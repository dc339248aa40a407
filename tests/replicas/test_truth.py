"""Every answer tells the truth when an owner or Redis is slow: a reply
told "not taken" (503) is never taken later, and one whose outcome was not
known (504) is settled once, never lost.

Two replicas sharing a redis-server of their own; faults are SIGSTOP and
SIGCONT of a replica or of Redis. Run by .ci/run with the rest of
tests/replicas/.
"""

import os
import re
import signal
import tempfile
import time
import unittest

from harness import read_until
from test_round_robin import Cluster, answer, chunk_types, new_session, pause_on, post, read_to_end
from test_replicated_grants import LINK_SECRET, link_path, link_request

LINK_TOOLS = """
[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""

LINK_KEYS = """agent-key-0000001 label=ci-bot
approver lead-key-00000001 label=lead-1
"""

AGENT = {"Authorization": "Bearer agent-key-0000001"}


def thaw_and_stop(cluster):
    """Stops ``cluster``, its replicas first let go of any SIGSTOP."""
    for replica in cluster.replicas:
        try:
            os.kill(replica.process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    cluster.stop()


def link_cluster():
    """Two replicas whose deploy is decided by lead-1's decision links."""
    dir = tempfile.mkdtemp(prefix="chatgate-truth-links-")
    tools, keys = os.path.join(dir, "tools.toml"), os.path.join(dir, "keys.txt")
    with open(tools, "w") as f:
        f.write(LINK_TOOLS)
    with open(keys, "w") as f:
        f.write(LINK_KEYS)
    extra = ["--tools", tools, "--api-keys-file", keys,
             "--public-url", "https://gate.example", "--link-secret", LINK_SECRET]
    return Cluster(replicas=2, nginx=False, owner_ttl=60, extra=extra)


def pause_deploy(replica, session):
    """Starts a deploy on ``replica``: its open stream and its pause's id."""
    stream = post(replica, {"message": "deploy web", "session_id": session}, AGENT)
    seen = read_until(stream, rb'"stream_paused":true')
    return stream, re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()


class SlowOwnerTests(unittest.TestCase):
    """The owner stalls longer than a forwarded reply may take."""

    def setUp(self):
        # The owner's lease outlives the stall: its runs are forwarded to
        # it, not taken over.
        self.cluster = Cluster(replicas=2, nginx=False, owner_ttl=60)

    def tearDown(self):
        thaw_and_stop(self.cluster)

    def test_a_reply_its_forwarder_gave_up_on_is_never_taken(self):
        a, b = self.cluster.replicas
        session = new_session("slow")
        stream = pause_on(a, session)

        os.kill(a.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        given_up = answer(b, session, "confirm")
        waited = time.monotonic() - started
        os.kill(a.process.pid, signal.SIGCONT)
        # The stalled owner now reads the forwarded confirm, past its
        # deadline; then a cancel comes.
        time.sleep(1)
        cancelled = answer(b, session, "cancel")
        rest = read_to_end(stream)

        self.assertEqual(given_up[0], 504, given_up[1])
        self.assertEqual(given_up[1]["metadata"]["error_type"], "outcome_unknown")
        self.assertLess(waited, 20)
        self.assertEqual(cancelled[0], 200, cancelled[1])
        types = chunk_types(rest)
        self.assertEqual(types.count(b"confirmation_received"), 1, rest)
        self.assertEqual(types[-1], b"cancelled", rest)
        self.assertIn(b'"reason":"user"', rest)
        self.assertNotIn(b'"chunk_type":"status"', rest, "nothing ran")


class SlowOwnerLinkTests(unittest.TestCase):
    """A decision link pressed on a replica that does not own the run is
    forwarded with the chat path's deadline (#40 item 14): an owner frozen
    past it is told "Not known yet" (504), and the decision it then reads
    late is never taken."""

    def setUp(self):
        self.cluster = link_cluster()

    def tearDown(self):
        thaw_and_stop(self.cluster)

    def test_a_link_its_forwarder_gave_up_on_is_never_taken(self):
        a, b = self.cluster.replicas
        session = new_session("slow-link")
        stream, pause = pause_deploy(a, session)

        os.kill(a.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        status, page = link_request(b, "POST", link_path(pause, "lead-1"), "action=confirm")
        waited = time.monotonic() - started
        os.kill(a.process.pid, signal.SIGCONT)
        time.sleep(1)
        cancelled = answer(b, session, "cancel", AGENT)
        rest = read_to_end(stream)

        self.assertEqual(status, 504, page)
        self.assertIn("Not known yet", page)
        self.assertLess(waited, 20)
        self.assertEqual(cancelled[0], 200, cancelled[1])
        types = chunk_types(rest)
        self.assertEqual(types.count(b"confirmation_received"), 1, rest)
        self.assertEqual(types[-1], b"cancelled", rest)
        self.assertNotIn(b"lead-1", rest, "the late link decided nothing")


class RedisStallTests(unittest.TestCase):
    """Redis stalls while a decision is being recorded."""

    def setUp(self):
        self.cluster = Cluster(replicas=2, nginx=False, owner_ttl=60)

    def tearDown(self):
        if self.cluster.redis.process.poll() is None:
            os.kill(self.cluster.redis.process.pid, signal.SIGCONT)
        self.cluster.stop()

    def test_an_approval_whose_outcome_was_unknown_is_settled_once_and_not_lost(self):
        a, _ = self.cluster.replicas
        session = new_session("stall")
        stream = pause_on(a, session)

        os.kill(self.cluster.redis.process.pid, signal.SIGSTOP)
        unknown = answer(a, session, "confirm")
        retry_meanwhile = answer(a, session, "confirm")
        os.kill(self.cluster.redis.process.pid, signal.SIGCONT)
        # Redis runs what was queued: the decision, or the settling that
        # voids it, whichever reached it first. A retry is then honoured
        # (200), or told the first one stands (409): once, either way.
        deadline = time.monotonic() + 15
        retry = answer(a, session, "confirm")
        while retry[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            retry = answer(a, session, "confirm")
        rest = read_to_end(stream)

        self.assertEqual(unknown[0], 504, unknown[1])
        self.assertEqual(unknown[1]["metadata"]["error_type"], "outcome_unknown")
        # Not taken while the first is being settled: told to retry.
        self.assertEqual(retry_meanwhile[0], 503, retry_meanwhile[1])
        self.assertIn(retry[0], (200, 409), retry[1])
        types = chunk_types(rest)
        self.assertEqual(types.count(b"confirmation_received"), 1, rest)
        self.assertEqual(types[-1], b"completion", rest)

    def test_a_link_decision_under_a_stall_is_not_known_yet_and_settles_once(self):
        self.cluster.stop()
        self.cluster = link_cluster()
        a, _ = self.cluster.replicas
        session = new_session("stall-link")
        stream, pause = pause_deploy(a, session)
        path = link_path(pause, "lead-1")

        os.kill(self.cluster.redis.process.pid, signal.SIGSTOP)
        unknown = link_request(a, "POST", path, "action=confirm")
        os.kill(self.cluster.redis.process.pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        retry = link_request(a, "POST", path, "action=confirm")
        while retry[0] in (503, 504) and time.monotonic() < deadline:
            time.sleep(0.2)
            retry = link_request(a, "POST", path, "action=confirm")
        rest = read_to_end(stream)

        # Not "Nothing was decided" (403): the page says it is not known.
        self.assertEqual(unknown[0], 504, unknown[1])
        self.assertIn("Not known yet", unknown[1])
        self.assertIn(retry[0], (200, 409), retry[1])
        types = chunk_types(rest)
        self.assertEqual(types.count(b"confirmation_received"), 1, rest)
        self.assertEqual(types[-1], b"completion", rest)


if __name__ == "__main__":
    unittest.main()
