"""Exactly once after a crash, with replicas (#44): the owner of a run at
work is `kill -9`ed mid-call; nobody touches the session, and another
replica's sweep takes the run over within the lease (--owner-ttl) and goes
on where the execution journal (in Redis) says: the idempotent tool is
called again with the same idempotency key, its key-deduped effect happens
once, the run ends with one final chunk, and only one replica resumes it.
A tool that declares neither `idempotent` nor `reconcile` is put to a
person on a reconcile pause instead, which every replica lists and whose
decision link works on any replica.

Run by .ci/run with the other replica suites (redis-server is started by
the harness on a free port; every process listens on 127.0.0.1).
"""

import json
import os
import tempfile
import time
import unittest
import uuid

from harness import read_until
from test_round_robin import (OWNER_TTL, WEBHOOK_SECRET, Cluster, Receiver, answer, connect, post,
                             read_to_end)

TOOL = """
[[tool]]
name = "mark"
description = "Marks once per key"
risk = "low"
idempotent = true
command = ["sh", "-c", "echo \\"$CHATGATE_IDEMPOTENCY_KEY\\" >> {starts}; if [ -f {slow} ]; then sleep 30; fi; grep -qx \\"$CHATGATE_IDEMPOTENCY_KEY\\" {effects} 2>/dev/null || echo \\"$CHATGATE_IDEMPOTENCY_KEY\\" >> {effects}"]
parameters = {{ type = "object" }}

[[tool]]
name = "note"
description = "Notes once per start, declares nothing"
risk = "low"
command = ["sh", "-c", "echo \\"$CHATGATE_IDEMPOTENCY_KEY\\" >> {notes}; if [ -f {slow} ]; then sleep 30; fi"]
parameters = {{ type = "object" }}
"""


def interactions(replica):
    """The inbox as ``replica`` lists it."""
    conn = connect(replica)
    conn.request("GET", "/api/v1/interactions")
    body = json.loads(conn.getresponse().read())
    conn.close()
    return body["interactions"]


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def wait_lines(path, count, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(lines(path)) >= count:
            return lines(path)
        time.sleep(0.05)
    raise AssertionError("%s never had %d lines: %r" % (path, count, lines(path)))


class ResumeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="chatgate-resume-")
        self.starts = os.path.join(self.dir, "starts")
        self.effects = os.path.join(self.dir, "effects")
        self.slow = os.path.join(self.dir, "slow")
        self.notes = os.path.join(self.dir, "notes")
        tools = os.path.join(self.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write(TOOL.format(starts=self.starts, effects=self.effects, slow=self.slow,
                                notes=self.notes))
        # Decision links, announced to a receiver.
        self.receiver = Receiver()
        self.extra = ["--tools", tools, "--webhook", self.receiver.url,
                      "--webhook-secret", WEBHOOK_SECRET, "--public-url", "https://gate.example",
                      "--link-secret", "a-link-secret-shared-by-every-replica-01"]
        self.cluster = Cluster(replicas=2, nginx=False, extra=self.extra)

    def tearDown(self):
        self.cluster.stop()
        self.receiver.stop()

    def test_a_killed_owner_s_run_at_work_is_resumed_by_another_replica_once(self):
        doomed = self.cluster.add("doomed-resume", self.extra)
        s = "resume-%s" % uuid.uuid4().hex[:8]
        open(self.slow, "w").close()
        stream = post(doomed, {"message": "mark it", "session_id": s})
        read_until(stream, rb'"stream_paused":true')
        status, ack, _ = answer(doomed, s, "confirm")
        self.assertEqual(status, 200, ack)
        first = wait_lines(self.starts, 1, 15)
        doomed.kill()
        stream.conn.close()
        os.remove(self.slow)
        killed_at = time.time()

        # Nobody touches the session: a sweep takes the run over.
        starts = wait_lines(self.starts, 2, OWNER_TTL + 15)
        took = time.time() - killed_at
        self.assertEqual(starts[0], first[0])
        self.assertEqual(starts[0], starts[1], "the same key on both attempts")
        self.assertEqual(len(starts[0]), 43)
        deadline = time.time() + 10
        while not lines(self.effects) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(lines(self.effects), [starts[0]], "its effect once")

        # Its stream, from any replica: one final chunk, the completion.
        back = post(self.cluster.replicas[0], {"session_id": s}, [("Last-Event-ID", "0")])
        self.assertEqual(back.status, 200)
        raw = read_to_end(back).decode()
        chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
        finals = [c for c in chunks if c.get("finished")]
        self.assertEqual(len(finals), 1, raw)
        self.assertEqual(finals[0]["chunk_type"], "completion", raw)
        time.sleep(OWNER_TTL + 1.5)
        self.assertEqual(len(lines(self.starts)), 2, "resumed once, by one replica")
        resumed = [r.name for r in self.cluster.replicas[:2]
                   if "resumes after a crash" in r.logs()]
        self.assertEqual(len(resumed), 1, resumed)
        print("resumed by %s %.1f s after the kill (owner TTL %g s)" % (resumed[0], took, OWNER_TTL))

    def test_a_call_nobody_can_know_is_put_to_a_person_on_the_replica_that_took_it_over(self):
        doomed = self.cluster.add("doomed-reconcile", self.extra)
        s = "reconcile-%s" % uuid.uuid4().hex[:8]
        open(self.slow, "w").close()
        stream = post(doomed, {"message": "note it", "session_id": s})
        read_until(stream, rb'"stream_paused":true')
        status, ack, _ = answer(doomed, s, "confirm")
        self.assertEqual(status, 200, ack)
        first = wait_lines(self.notes, 1, 15)
        doomed.kill()
        stream.conn.close()
        os.remove(self.slow)

        # A sweep takes the run over; its tool declares neither
        # `idempotent` nor `reconcile`: a reconcile pause, not a call.
        deadline = time.time() + OWNER_TTL + 15
        owner = None
        while owner is None and time.time() < deadline:
            owner = next((r for r in self.cluster.replicas[:2]
                          if "resumes after a crash" in r.logs()), None)
            time.sleep(0.1)
        self.assertIsNotNone(owner, "nobody took the run over")
        other = next(r for r in self.cluster.replicas[:2] if r is not owner)
        back = post(other, {"session_id": s}, [("Last-Event-ID", "0")])
        self.assertEqual(back.status, 200)
        seen = read_until(back, rb'"kind":"reconcile"').decode()
        self.assertIn('"idempotency_key":"%s"' % first[0], seen)
        self.assertEqual(lines(self.notes), first, "not called again without a person")
        # Every replica's inbox lists it (listed aside: the run's record
        # keeps its decided plan).
        for replica in (owner, other):
            listed = [i for i in interactions(replica) if i["session_id"] == s]
            self.assertEqual([i["kind"] for i in listed], ["reconcile"], listed)
            self.assertEqual(listed[0]["tasks"][0]["tool"], "note", listed)

        # Its link, pressed on the replica that does not hold it: located
        # there (listed aside) and passed to the owner.
        deadline = time.time() + 30
        links = []
        while not links and time.time() < deadline:
            links = [link["url"] for body in self.receiver.delivered().values()
                     if body.get("type") == "interaction.requested"
                     and (body.get("data") or {}).get("kind") == "reconcile"
                     for link in body.get("links") or []]
            time.sleep(0.05)
        self.assertTrue(links, self.receiver.delivered())
        path = links[0].replace("https://gate.example", "")
        conn = connect(other)
        conn.request("POST", path, body="action=run_again",
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        pressed = conn.getresponse()
        page = pressed.read().decode()
        conn.close()
        self.assertEqual(pressed.status, 200, page)
        rest = read_to_end(back).decode()
        chunks = [json.loads(line[6:]) for line in (seen + rest).splitlines()
                  if line.startswith("data: ")]
        finals = [c for c in chunks if c.get("finished")]
        self.assertEqual(len(finals), 1, rest)
        self.assertEqual(finals[0]["chunk_type"], "completion", rest)
        self.assertEqual(lines(self.notes), [first[0], first[0]], "run again once, same key")
        for replica in (owner, other):
            self.assertEqual([i for i in interactions(replica) if i["session_id"] == s], [],
                             "no longer listed once decided")


if __name__ == "__main__":
    unittest.main()
