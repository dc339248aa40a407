#!/usr/bin/env python3
"""Takeover time after kill -9 of a replica, for a few `--owner-ttl`s.

Two replicas share a redis-server of their own (the harness of
tests/replicas, loopback only). A run pauses on replica A; A is killed with
SIGKILL; replica B is sent the confirm every 50 ms (ignoring Retry-After, to
measure finely) until one is answered 200. The figure is the time from the
kill to that 200: what a user waits, at worst, before a paused run of a dead
replica can be decided elsewhere.

    cargo build --release
    CHATGATE_BIN=target/release/chatgate python3 bench/takeover.py [--runs 3] [--ttl 4 --ttl 15 --ttl 2]

Bounded: each attempt gives up 3 TTLs after the kill.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "replicas"))

from test_round_robin import Cluster, answer, new_session, pause_on  # noqa: E402

POLL = 0.05


def one(ttl):
    cluster = Cluster(replicas=2, nginx=False, owner_ttl=ttl)
    try:
        a, b = cluster.replicas
        session = new_session("takeover")
        stream = pause_on(a, session)
        # Let a few heartbeats pass, as in a replica that has been up a while.
        time.sleep(min(ttl, 3.0))
        killed = time.monotonic()
        a.kill()
        stream.conn.close()
        refused = 0
        while time.monotonic() - killed < 3 * ttl:
            status, chunk, _ = answer(b, session, "confirm")
            if status == 200:
                return time.monotonic() - killed, refused
            if status != 503:
                raise SystemExit("unexpected %d: %r" % (status, chunk))
            refused += 1
            time.sleep(POLL)
        raise SystemExit("no takeover within %g s" % (3 * ttl))
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ttl", type=float, action="append", help="--owner-ttl in seconds")
    args = parser.parse_args()
    for ttl in args.ttl or [4.0, 15.0, 2.0]:
        times = []
        for _ in range(args.runs):
            seconds, refused = one(ttl)
            times.append(seconds)
            print("--owner-ttl %gs: first 200 on another replica %.2f s after kill -9 "
                  "(%d replies refused 503 before)" % (ttl, seconds, refused), flush=True)
        print("--owner-ttl %gs: min %.2f s, median %.2f s, max %.2f s over %d runs"
              % (ttl, min(times), statistics.median(times), max(times), len(times)), flush=True)


if __name__ == "__main__":
    main()
