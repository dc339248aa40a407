"""Chaos for exactly once after a crash (#44): one chatgate on a real SQLite
file is `kill -9`ed at random moments, and started again at once, while 100
runs of three-task plans are started, confirmed (every third with its second
task rejected) and carried out by an idempotent counting tool that dedupes
its effect by the idempotency key it is given. Afterwards:

- every approved task's effect happened exactly once;
- no rejected task's effect happened at all;
- every run's stream ends with exactly one final chunk, a completion.

A run whose start was answered but that was killed before it paused lived
only in memory and is lost (docs/operations.md): it is started again under
a new session, and only runs that paused count. The kills are paced by
progress (a few calls finished since the last restart), not by the clock, so
the test holds on a machine of any speed. Bounded: 100 runs, at most 30
kills, a 10-minute deadline; everything on 127.0.0.1.
"""

import http.client
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

from harness import free_port, wait_for
from test_round_robin import binary

COUNT = """import json, os, sys, time, fcntl
args = json.load(sys.stdin)
key = os.environ["CHATGATE_IDEMPOTENCY_KEY"]
step = args.get("step", "")
with open({starts!r}, "a") as f:
    f.write("%s %s\\n" % (step, key))
time.sleep(0.1)
with open({effects!r}, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    if not any(line.rsplit(" ", 1)[-1] == key for line in f.read().splitlines()):
        f.write("%s %s\\n" % (step, key))
with open({finished!r}, "a") as f:
    f.write("%s %s\\n" % (step, key))
print("counted", step)
"""

TOOL = """
[[tool]]
name = "count"
description = "Counts once per key"
risk = "low"
idempotent = true
command = ["python3", {script!r}]
parameters = {{ type = "object" }}
"""

RUNS = int(os.environ.get("CHAOS_RUNS", "100"))
AT_ONCE = 10
#: Kills in one run of the test (each after some progress).
MAX_KILLS = 30


class Server:
    """One chatgate on `store`, started again after every kill."""

    def __init__(self, dir, tools):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = open(os.path.join(dir, "server.log"), "ab")
        self.args = [binary(), "--bind", "127.0.0.1:%d" % self.port,
                     "--store", "sqlite:" + os.path.join(dir, "runs.db"),
                     "--tools", tools, "--step-delay", "0", "--detach-grace", "10m"]
        self.lock = threading.Lock()
        self.kills = 0
        self.start()

    def start(self):
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for(self.url + "/readyz", deadline=30)

    def kill_and_restart(self):
        with self.lock:
            self.process.kill()
            self.process.wait()
            self.kills += 1
            self.start()

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.log.close()


def post(url, body, last_event_id=None, timeout=30):
    request = urllib.request.Request(
        url + "/api/v1/chat/stream", data=json.dumps(body).encode(),
        headers=dict({"Content-Type": "application/json"},
                     **({"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {})))
    return urllib.request.urlopen(request, timeout=timeout)


def chunks_of(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


class Flow:
    def __init__(self, n):
        self.n = n
        self.session = None
        self.rejects = n % 3 == 0
        self.tries = 0
        #: Every session a confirm was sent for (a retry after a kill may
        #: have found its run gone and started anew): what each approved.
        self.sent = []

    def steps(self):
        return ["count %s-%d" % (self.session, i) for i in (1, 2, 3)]

    def approved(self):
        steps = self.steps()
        return [steps[0], steps[2]] if self.rejects else steps

    def rejected(self):
        return [self.steps()[1]] if self.rejects else []


class CrashLoopTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="chatgate-resume-chaos-")
        self.starts = os.path.join(self.dir, "starts")
        self.effects = os.path.join(self.dir, "effects")
        self.finished = os.path.join(self.dir, "finished")
        script = os.path.join(self.dir, "count.py")
        with open(script, "w") as f:
            f.write(COUNT.format(starts=self.starts, effects=self.effects,
                                 finished=self.finished))
        tools = os.path.join(self.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write(TOOL.format(script=script))
        self.server = Server(self.dir, tools)

    def tearDown(self):
        self.server.stop()
        if os.environ.get("CHAOS_KEEP"):
            print("kept", self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def run_flow(self, flow, deadline):
        """Starts `flow` until it pauses, then confirms it (until the
        decision is recorded); returns once it is."""
        while time.time() < deadline:
            flow.tries += 1
            flow.session = "chaos-%d-%d" % (flow.n, flow.tries)
            try:
                stream = post(self.server.url, {"message": "; ".join(flow.steps()),
                                                "session_id": flow.session})
                seen = b""
                while b'"stream_paused":true' not in seen:
                    piece = stream.read1(65536)
                    if not piece:
                        break
                    seen += piece
                stream.close()
                if b'"stream_paused":true' not in seen:
                    continue  # killed before it paused: lost, started anew
            except (OSError, ValueError, http.client.HTTPException):
                # Killed mid-read (a chunk cut short): started anew.
                time.sleep(0.05)
                continue
            flow.sent.append((flow.approved(), flow.rejected()))
            body = {"message": "CONFIRM_ACTION:confirm", "session_id": flow.session}
            if flow.rejects:
                body["decisions"] = [{"index": 2, "decision": "reject"}]
            while time.time() < deadline:
                try:
                    with post(self.server.url, body) as answer:
                        answer.read()
                        return
                except urllib.error.HTTPError as err:
                    if err.code == 409:
                        return  # decided already (a retry after a kill)
                    if err.code == 404:
                        break  # gone: its run is lost; start anew
                    time.sleep(0.05)
                except (OSError, ValueError, http.client.HTTPException):
                    time.sleep(0.05)
        raise AssertionError("flow %d never got decided" % flow.n)

    def test_random_kill_9_during_execution_every_approved_effect_exactly_once(self):
        random.seed(44)
        flows = [Flow(n) for n in range(RUNS)]
        deadline = time.time() + 600
        began = time.time()
        done = threading.Event()

        def finished():
            try:
                with open(self.finished) as f:
                    return sum(1 for _ in f)
            except FileNotFoundError:
                return 0

        def killer():
            # Paced by progress, not by the clock: each kill waits until a
            # few calls finished since the last restart, then lands a
            # random moment later (often while another call runs), so that
            # the runs get on whatever this machine's speed. At most
            # MAX_KILLS.
            while not done.is_set() and self.server.kills < MAX_KILLS:
                since = finished()
                while not done.is_set() and finished() < since + random.randint(2, 6):
                    time.sleep(0.02)
                time.sleep(random.uniform(0.0, 0.15))
                if not done.is_set():
                    self.server.kill_and_restart()

        chaos = threading.Thread(target=killer)
        chaos.start()
        try:
            for at in range(0, RUNS, AT_ONCE):
                batch = [threading.Thread(target=self.run_flow, args=(flow, deadline))
                         for flow in flows[at:at + AT_ONCE]]
                for thread in batch:
                    thread.start()
                for thread in batch:
                    thread.join()
        finally:
            done.set()
            chaos.join()

        # Calm: every decided run goes on to its end.
        ends = {}
        for flow in flows:
            end = time.time() + 60
            while True:
                try:
                    with post(self.server.url, {"session_id": flow.session},
                              last_event_id=0) as back:
                        seen = chunks_of(back.read().decode())
                except urllib.error.HTTPError as err:
                    seen = [{"finished": False, "status": err.code}]
                finals = [c for c in seen if c.get("finished")]
                if finals or time.time() > end:
                    break
                time.sleep(0.2)
            ends[flow.session] = finals
        effects = {}
        for line in open(self.effects).read().splitlines():
            step, key = line.rsplit(" ", 1)
            effects.setdefault(step, []).append(key)
        for flow in flows:
            finals = ends[flow.session]
            self.assertEqual(len(finals), 1, (flow.session, finals))
            self.assertEqual(finals[0]["chunk_type"], "completion", (flow.session, finals))
            for step in flow.approved():
                self.assertEqual(len(effects.get(step, [])), 1, (step, effects.get(step)))
            for step in flow.rejected():
                self.assertNotIn(step, effects, "a rejected task ran")
        # Nothing unapproved ran, and nothing ran twice, in any run a
        # confirm was sent for.
        approved = {step for flow in flows for sent in flow.sent for step in sent[0]}
        rejected = {step for flow in flows for sent in flow.sent for step in sent[1]}
        for step, keys in effects.items():
            self.assertIn(step, approved, "ran without a yes")
            self.assertNotIn(step, rejected, "a rejected task ran")
            self.assertEqual(len(keys), 1, (step, keys))
        calls = len(open(self.starts).read().splitlines())
        with open(os.path.join(self.dir, "server.log"), "rb") as log:
            resumed = log.read().count(b"resumes after a crash")
        print("%d runs, %d kills, %d runs resumed, %d calls for %d effects, %.0f s"
              % (RUNS, self.server.kills, resumed, calls,
                 sum(len(v) for v in effects.values()), time.time() - began))
        self.assertGreater(self.server.kills, 5)
        self.assertGreater(resumed, 5, "kills landed while runs were at work")


if __name__ == "__main__":
    unittest.main()
