"""A quorum under a Redis stall (#40 item 13): an approval counts only once
it is kept. One whose fate the store could not tell is answered 504
outcome_unknown (never 503 "not taken"), no other approval completes the
quorum while it is unknown (503, retry), and once Redis moves again it is
kept, audited and counted: the deploy runs with both approvers, each told
the truth.

Run by .ci/run with the other replica suites (redis-server is started by
the harness on a free port; every process listens on 127.0.0.1).
"""

import json
import os
import re
import tempfile
import time
import unittest

from test_round_robin import Cluster, Replica, StallableProxy, answer, new_session, post, read_to_end  # noqa: E402
from harness import read_until  # noqa: E402

TOOLS = """
[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""

KEYS = """agent-key-0000001 label=ci-bot
approver lead-key-00000001 label=lead-1
approver lead-key-00000002 label=lead-2
"""

AGENT = {"Authorization": "Bearer agent-key-0000001"}
LEAD_1 = {"Authorization": "Bearer lead-key-00000001"}
LEAD_2 = {"Authorization": "Bearer lead-key-00000002"}


class StalledQuorumTests(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="chatgate-quorum-stall-")
        tools = os.path.join(self.dir, "tools.toml")
        keys = os.path.join(self.dir, "keys.txt")
        self.audit = os.path.join(self.dir, "audit.jsonl")
        with open(tools, "w") as f:
            f.write(TOOLS)
        with open(keys, "w") as f:
            f.write(KEYS)
        self.cluster = Cluster(replicas=0, nginx=False)
        self.proxy = StallableProxy(self.cluster.redis.port)
        self.addCleanup(self.proxy.close)
        extra = ["--tools", tools, "--api-keys-file", keys, "--audit-log", self.audit,
                 "--confirm-timeout", "60s"]
        self.a = Replica(self.proxy, "quorum-stall-a", extra, owner_ttl=30)
        self.cluster.replicas.append(self.a)

    def tearDown(self):
        self.cluster.stop()

    def records(self, event):
        with open(self.audit) as f:
            return [r for r in map(json.loads, f) if r["event"] == event]

    def test_an_approval_whose_fate_is_unknown_is_504_and_counts_only_once_kept(self):
        s = new_session("stalled-quorum")
        stream = post(self.a, {"message": "deploy web", "session_id": s}, AGENT)
        seen = read_until(stream, rb'"stream_paused":true')
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()

        self.proxy.stall()
        first = answer(self.a, s, "confirm", LEAD_1, confirmation_id=pause)
        self.assertEqual(first[0], 504, first[1])
        self.assertEqual(first[1]["metadata"]["error_type"], "outcome_unknown")
        # lead-1's approval is not known to be kept: lead-2's completes nothing.
        second = answer(self.a, s, "confirm", LEAD_2, confirmation_id=pause)
        self.assertEqual(second[0], 503, second[1])
        self.assertEqual(self.records("approved"), [], "nothing is on the record yet")

        self.proxy.flow()
        deadline = time.monotonic() + 30
        while second[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            second = answer(self.a, s, "confirm", LEAD_2, confirmation_id=pause)
        self.assertEqual(second[0], 200, second[1])
        self.assertEqual(second[1]["chunk_type"], "confirmation_received", second[1])
        self.assertEqual(second[1]["metadata"]["approved_by"], ["lead-1", "lead-2"])
        approved = self.records("approved")
        self.assertEqual([r["key"] for r in approved], ["lead-1"], approved)
        rest = read_to_end(stream)
        stream.conn.close()
        self.assertIn(b'"chunk_type":"completion"', rest)


if __name__ == "__main__":
    unittest.main()
