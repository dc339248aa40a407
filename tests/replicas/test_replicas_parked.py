"""Parked pauses across replicas (#46): two replicas sharing a real
redis-server, each started with ``--park-after 0s``. A paused run whose
client left is handed back (owned by nobody, nothing of it in the memory of
either replica), and the replica that gets the next request about it, or
whose sweep finds it expired, takes it over and goes on.
"""

import re
import time
import unittest

from test_round_robin import (Cluster, Replica, answer, chunk_types, new_session, post,
                              read_to_end, read_until)

CONFIRM_TIMEOUT_S = 4


EXTRA = ["--park-after", "0s", "--confirm-timeout", "%ds" % CONFIRM_TIMEOUT_S]


def setUpModule():
    global CLUSTER, JSON
    CLUSTER = Cluster(replicas=2, nginx=False, extra=EXTRA)
    # A third replica keeping records as JSON (`--redis-records json`, as in
    # a rolling upgrade); not in CLUSTER.replicas, which the tests unpack.
    JSON = Replica(CLUSTER.redis, "rjson", EXTRA + ["--redis-records", "json"])


def tearDownModule():
    if JSON.process.poll() is None:
        JSON.process.kill()
        JSON.process.wait()
    CLUSTER.stop()


def first_byte_of_record(session):
    """The first byte of the record Redis keeps for ``session``'s run."""
    script = ("EVAL \"local r = redis.call('HGET', KEYS[1], 'run') "
              "return string.byte(redis.call('HGET', 'chatgate:run:' .. r, 'record'), 1)\" "
              "1 chatgate:session:-:" + session)
    return CLUSTER.redis.command(script.encode())


def parked_on(replica, session):
    """Pauses a run on ``replica`` and leaves; returns the pause's
    ``confirmation_id`` once the replica holds no paused run (it parked
    it)."""
    stream = post(replica, {"message": "build; ship", "session_id": session})
    assert stream.status == 200, stream.status
    seen = read_until(stream, rb'"chunk_type":"confirmation_request"')
    pause = re.search(rb'"confirmation_id":"([0-9a-f-]+)"', seen).group(1).decode()
    stream.conn.close()  # the client leaves
    deadline = time.monotonic() + 15
    while replica.metric("chatgate_paused_runs") != 0:
        assert time.monotonic() < deadline, "never parked: %s" % replica.logs()[-2000:]
        time.sleep(0.05)
    return pause


class ParkedAcrossReplicasTests(unittest.TestCase):
    def test_a_pause_parked_on_a_is_decided_on_b_and_its_run_goes_on_there(self):
        a, b = CLUSTER.replicas
        session = new_session("parked")
        parked_on(a, session)
        decided = b.decisions()

        status, chunk, _ = answer(b, session, "confirm")

        self.assertEqual(status, 200, chunk)
        self.assertEqual(chunk["chunk_type"], "confirmation_received")
        self.assertEqual(b.decisions(), decided + 1, "decided where it was woken")
        again = post(a, {"session_id": session}, {"Last-Event-ID": "2"})
        self.assertEqual(again.status, 200)
        self.assertEqual(chunk_types(read_to_end(again))[-1], b"completion")

    def test_every_replica_counts_a_parked_pause_until_it_is_woken(self):
        a, b = CLUSTER.replicas
        before = a.metric("chatgate_parked_runs")
        session = new_session("counted")
        parked_on(a, session)

        def counted(replica, expected):
            deadline = time.monotonic() + 15
            while replica.metric("chatgate_parked_runs") != expected:
                self.assertLess(time.monotonic(), deadline,
                                "%s: %s parked, not %s" % (
                                    replica.url, replica.metric("chatgate_parked_runs"),
                                    expected))
                time.sleep(0.05)

        counted(a, before + 1)
        counted(b, before + 1)
        status, _, _ = answer(b, session, "confirm")
        self.assertEqual(status, 200)
        counted(a, before)
        counted(b, before)

    def test_a_re_attach_on_b_wakes_a_pause_parked_on_a(self):
        a, b = CLUSTER.replicas
        session = new_session("reattach")
        parked_on(a, session)

        again = post(b, {"session_id": session}, {"Last-Event-ID": "1"})
        replayed = read_until(again, rb'"chunk_type":"confirmation_request"')
        status, _, _ = answer(a, session, "confirm")
        rest = read_to_end(again)

        self.assertEqual(again.status, 200)
        self.assertIn(b"id: 2\n", replayed)
        self.assertEqual(status, 200)
        self.assertEqual(chunk_types(rest)[-1], b"completion")

    def test_two_replies_at_once_on_two_replicas_have_one_winner(self):
        import threading
        a, b = CLUSTER.replicas
        session = new_session("race")
        pause = parked_on(a, session)
        results = []

        # Each names the pause: the loser may reach the winner only once the
        # run has ended, and a reply naming its pause is told who decided it
        # (409) for as long as the run's end is kept; one naming no pause
        # would be told 404 then (docs/protocol.md, "A reply sent again").
        def reply(replica, action):
            results.append(answer(replica, session, action, confirmation_id=pause)[0])

        threads = [threading.Thread(target=reply, args=(a, "confirm")),
                   threading.Thread(target=reply, args=(b, "cancel"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        self.assertEqual(sorted(results), [200, 409], results)

    def test_a_parked_pause_nobody_asks_about_expires_and_its_end_is_read_anywhere(self):
        a, b = CLUSTER.replicas
        session = new_session("expire")
        parked_on(a, session)

        # Past its expiry, a sweep takes it over and ends it.
        time.sleep(CONFIRM_TIMEOUT_S + 2)
        again = post(b, {"session_id": session}, {"Last-Event-ID": "2"})
        rest = read_to_end(again)

        self.assertEqual(again.status, 200)
        self.assertEqual(chunk_types(rest)[-1], b"cancelled")
        self.assertIn(b'"reason":"timeout"', rest)
        self.assertEqual(answer(a, session, "confirm")[0], 404)



class RecordFormatsTests(unittest.TestCase):
    def test_replicas_keeping_records_compressed_and_as_json_take_over_each_other_s(self):
        a, _ = CLUSTER.replicas
        for parker, decider, kept in ((JSON, a, b":123"), (a, JSON, b":1")):
            session = new_session("formats")
            parked_on(parker, session)
            first_byte = first_byte_of_record(session)

            status, chunk, _ = answer(decider, session, "confirm")
            again = post(parker, {"session_id": session}, {"Last-Event-ID": "2"})

            # `{` for JSON; a compressed record's format byte, 1.
            self.assertEqual(first_byte, kept, parker.name)
            self.assertEqual(status, 200, chunk)
            self.assertEqual(chunk["chunk_type"], "confirmation_received")
            self.assertEqual(chunk_types(read_to_end(again))[-1], b"completion")


if __name__ == "__main__":
    unittest.main()
