"""Every answer tells the truth when an owner or Redis is slow: a reply
told "not taken" (503) is never taken later, and one whose outcome was not
known (504) is settled once, never lost.

Two replicas sharing a redis-server of their own; faults are SIGSTOP and
SIGCONT of a replica or of Redis. Run by .ci/run with the rest of
tests/replicas/.
"""

import os
import signal
import time
import unittest

from test_round_robin import Cluster, answer, chunk_types, new_session, pause_on, read_to_end


class SlowOwnerTests(unittest.TestCase):
    """The owner stalls longer than a forwarded reply may take."""

    def setUp(self):
        # The owner's lease outlives the stall: its runs are forwarded to
        # it, not taken over.
        self.cluster = Cluster(replicas=2, nginx=False, owner_ttl=60)

    def tearDown(self):
        for replica in self.cluster.replicas:
            try:
                os.kill(replica.process.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.cluster.stop()

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


if __name__ == "__main__":
    unittest.main()
