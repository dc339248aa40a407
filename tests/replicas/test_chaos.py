"""A cluster operator's bad day, checked against a history.

Three replicas behind round-robin nginx (deploy/nginx-round-robin.conf)
share one redis-server; a command tool writes one marker line per task it
runs. Flows run concurrently: start a two-task plan through nginx, read it
to its pause (some re-attach through another replica first), decide it
(confirm, modify then confirm, or cancel) with replies sent to a random
replica or to nginx, and read the run to its one final chunk, re-attaching
whenever a stream breaks. Meanwhile faults hit the cluster, each for a
bounded time:

- Redis SIGSTOPped for 3.5 s: longer than the owner TTL (2 s) and the
  command timeout (2 s);
- an owner killed with kill -9 while runs work on it, then started again;
- a replica frozen (SIGSTOP) for 10 s, past the forwarding wait (9 s);
- Redis restarted with its data (append-only file, synced);
- then, in a second phase, Redis restarted without its data.

Every history must hold, on every run:

1. no task ran without a confirm that was answered 200, or whose outcome
   was told unknown (504, or a proxy's 502: it may have been taken);
2. no task ran twice;
3. every 200 is honoured: a confirm's run completes (or ends
   `interrupted`, when its owner died mid-work), a cancel's ends cancelled
   with nothing run;
4. every stream has exactly one final chunk;
5. no paused run is lost while Redis keeps its data: every flow reads its
   run's end;
6. never two 200s for one pause.

Bounded: the workload runs for a fixed time and every flow gives up after a
deadline (which the checker counts as a lost run). Seeded: CHAOS_SEED.
"""

import http.client
import json
import os
import random
import re
import signal
import threading
import time
import unittest
import uuid

from test_round_robin import Cluster

#: Tasks each flow's plan has.
TASKS = 2
#: Flows running at once.
WORKERS = 16
#: How long a flow may take before it counts as lost.
FLOW_DEADLINE = 75.0
SEED = int(os.environ.get("CHAOS_SEED", "20261124"))
T0 = time.monotonic()
FAULTS = []  # (seconds, what), for the report


def fault(what):
    FAULTS.append((round(time.monotonic() - T0, 2), what))


class Flow:
    """One flow's history: what it was told, and how its run ended."""

    def __init__(self, number):
        self.number = number
        self.session = "chaos-%d-%s" % (number, uuid.uuid4().hex[:6])
        self.replies = []  # (action, confirmation_id, status, error_type)
        self.finals = []  # final chunks read (one, if all is well)
        self.problems = []  # what went wrong, for the report
        self.timeline = []  # (seconds, port, status, error_type) of each reply
        self.started = False

    def note(self, problem):
        self.problems.append(problem)


class Stream:
    """A run's stream, read in a thread, re-attached through nginx whenever
    it breaks until its final chunk; tells the latest pending pause."""

    def __init__(self, flow, nginx_port, response, last_seen=0):
        self.flow = flow
        self.nginx_port = nginx_port
        self.last_seen = last_seen
        self.pending = None  # the latest confirmation_request's data
        self.finished = threading.Event()
        self.stop = threading.Event()  # this reader gives the run up to another
        self.changed = threading.Condition()
        self.deadline = time.monotonic() + FLOW_DEADLINE
        self.thread = threading.Thread(target=self.run, args=(response,), daemon=True)
        self.thread.start()

    def done(self):
        return self.finished.is_set() or self.stop.is_set()

    def run(self, response):
        while not self.done() and time.monotonic() < self.deadline:
            if response is None:
                response = self.reattach()
                if response is None:
                    return
            self.read(response)
            response = None
            if not self.done():
                time.sleep(0.3)

    def reattach(self):
        """A re-attach that answered 200, or None when the run is gone."""
        while time.monotonic() < self.deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.nginx_port, timeout=30)
                conn.request(
                    "POST", "/api/v1/chat/stream",
                    body=json.dumps({"session_id": self.flow.session}),
                    headers={"Content-Type": "application/json",
                             "Last-Event-ID": str(self.last_seen)},
                )
                response = conn.getresponse()
            except OSError:
                time.sleep(0.5)
                continue
            self.flow.timeline.append(
                (round(time.monotonic() - T0, 2), "attach", response.status, self.last_seen))
            if response.status == 200:
                return response
            body = response.read()
            conn.close()
            if response.status in (502, 503, 504):
                time.sleep(min(float(response.getheader("Retry-After") or 0.5), 3.0))
                continue
            self.flow.note("re-attach answered %d: %s" % (response.status, body[:300]))
            return None
        return None

    def read(self, response):
        buffer = b""
        try:
            while True:
                piece = response.read1(65536)
                if not piece:
                    return
                buffer += piece
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    if self.stop.is_set():
                        return
                    self.event(event)
                    if self.finished.is_set():
                        return
        except (OSError, http.client.HTTPException):
            return
        finally:
            response.close()

    def event(self, event):
        data = [line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")]
        if not data:
            return
        chunk = json.loads(data[0])
        sequence = chunk["sequence"]
        if sequence <= self.last_seen:
            self.flow.note("a chunk again: %d after %d" % (sequence, self.last_seen))
            return
        self.last_seen = sequence
        if chunk["chunk_type"] in ("confirmation_request", "confirmation_received", "completion",
                                   "cancelled", "error"):
            self.flow.timeline.append((round(time.monotonic() - T0, 2), chunk["chunk_type"],
                                       sequence, chunk["metadata"].get("gap")))
        with self.changed:
            if chunk["chunk_type"] == "confirmation_request":
                self.pending = chunk["confirmation_data"]
            if chunk["finished"]:
                self.flow.finals.append(chunk)
                self.finished.set()
            self.changed.notify_all()

    def wait_for_pause(self, not_id):
        """The pending pause other than `not_id`, or None once the run ended."""
        with self.changed:
            while time.monotonic() < self.deadline:
                if self.finished.is_set():
                    return None
                if self.pending and self.pending["confirmation_id"] != not_id:
                    return self.pending
                self.changed.wait(timeout=0.5)
        return None


class ChaosTest(unittest.TestCase):
    def setUp(self):
        self.random = random.Random(SEED)
        self.cluster = None
        self.dir = None
        tools, self.marks = self.tools_file()
        self.cluster = Cluster(
            replicas=3, nginx=True,
            extra=["--tools", tools, "--confirm-timeout", "60s", "--step-delay", "0"],
        )
        self.nginx_port = self.cluster.nginx.port
        self.targets = [r.port for r in self.cluster.replicas] + [self.nginx_port]

    def tearDown(self):
        if self.cluster:
            for process in [self.cluster.redis.process] + [r.process for r in self.cluster.replicas]:
                try:
                    os.kill(process.pid, signal.SIGCONT)
                except (ProcessLookupError, TypeError):
                    pass
            self.cluster.stop()

    def tools_file(self):
        import tempfile
        self.tmp = tempfile.mkdtemp(prefix="chatgate-chaos-")
        marks = os.path.join(self.tmp, "marks")
        path = os.path.join(self.tmp, "tools.toml")
        with open(path, "w") as f:
            f.write(
                '[[tool]]\nname = "mark"\ndescription = "writes its task"\nrisk = "low"\n'
                'command = ["sh", "-c", "args=$(cat); sleep 0.3; echo \\"$args\\" >> %s"]\n'
                'parameters = { type = "object" }\n' % marks
            )
        return path, marks

    # -- the workload -----------------------------------------------------

    def flow(self, number):
        flow = Flow(number)
        rng = random.Random(SEED * 1000 + number)
        steps = "; ".join("mark f%d-%d" % (number, k) for k in range(1, TASKS + 1))
        stream = self.start(flow, steps)
        if stream is None:
            return flow
        pause = stream.wait_for_pause(None)
        if pause and rng.random() < 0.2:
            # Re-attach through another replica while paused.
            stream.stop.set()
            last_seen = stream.last_seen
            stream = Stream(flow, self.nginx_port, None, last_seen)
            pause = stream.wait_for_pause(None)
        # Think, as a person would: most runs are paused when a fault hits.
        time.sleep(rng.uniform(0.0, 2.5))
        roll = rng.random()
        plan = ["cancel"] if roll < 0.2 else ["modify", "confirm"] if roll < 0.35 else ["confirm"]
        decided = None
        for action in plan:
            pause = stream.wait_for_pause(decided)
            if pause is None:
                break
            decided = pause["confirmation_id"]
            self.decide(flow, rng, action, decided)
        stream.finished.wait(timeout=max(0.0, stream.deadline - time.monotonic()))
        if not stream.finished.is_set():
            flow.note("never read its run's end")
        return flow

    def start(self, flow, steps):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.nginx_port, timeout=30)
                conn.request("POST", "/api/v1/chat/stream",
                             body=json.dumps({"message": steps, "session_id": flow.session}),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
            except OSError:
                time.sleep(0.5)
                continue
            if response.status == 200:
                flow.started = True
                return Stream(flow, self.nginx_port, response)
            response.read()
            conn.close()
            if response.status in (502, 503, 504, 409):
                # Not taken, or not known: if a run started, re-attach to it.
                if response.status != 503:
                    stream = Stream(flow, self.nginx_port, None)
                    if stream.wait_for_pause(None) or stream.finished.is_set():
                        flow.started = True
                        return stream
                time.sleep(0.5)
                continue
            flow.note("start answered %d" % response.status)
            return None
        flow.note("could not start")
        return None

    def decide(self, flow, rng, action, confirmation_id):
        """Sends `action` until it is answered for good; records every answer."""
        message = "CONFIRM_ACTION:" + (action if action != "modify" else "modify:more")
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            port = rng.choice(self.targets)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("POST", "/api/v1/chat/stream",
                             body=json.dumps({"message": message, "session_id": flow.session,
                                              "confirmation_id": confirmation_id}),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                body = response.read()
                conn.close()
            except (OSError, http.client.HTTPException):
                time.sleep(0.3)  # never reached a replica: not sent
                continue
            match = re.search(rb'"error_type":"([a-z_]+)"', body)
            error_type = match.group(1).decode() if match else None
            flow.replies.append((action, confirmation_id, response.status, error_type))
            flow.timeline.append((round(time.monotonic() - T0, 2), port, response.status, error_type))
            if response.status in (502, 503, 504):
                time.sleep(min(float(response.getheader("Retry-After") or 0.5), 3.0))
                continue
            return
        flow.note("%s never answered for good" % action)

    def run_workload(self, seconds, faults):
        flows = []
        lock = threading.Lock()
        counter = [0]
        stop_at = time.monotonic() + seconds

        def worker():
            while time.monotonic() < stop_at:
                with lock:
                    counter[0] += 1
                    number = counter[0]
                flow = self.flow(number)
                with lock:
                    flows.append(flow)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        faults()
        for thread in threads:
            thread.join(timeout=seconds + FLOW_DEADLINE + 60)
        return flows

    # -- faults -------------------------------------------------------------

    def stall_redis(self, seconds):
        fault("redis SIGSTOP %gs" % seconds)
        pid = self.cluster.redis.process.pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)

    def kill_and_restart(self, replica):
        fault("kill -9 %s (port %d)" % (replica.name, replica.port))
        replica.kill()
        time.sleep(1.0)
        replica.start()

    def freeze(self, replica, seconds):
        fault("freeze %s (port %d) %gs" % (replica.name, replica.port, seconds))
        os.kill(replica.process.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(replica.process.pid, signal.SIGCONT)

    def restart_redis(self, keep_data):
        fault("redis restart, data %s" % ("kept" if keep_data else "lost"))
        redis = self.cluster.redis
        redis.stop()
        if not keep_data:
            for name in os.listdir(redis.dir):
                if "aof" in name or name.endswith(".rdb"):
                    path = os.path.join(redis.dir, name)
                    if os.path.isdir(path):
                        for inner in os.listdir(path):
                            os.remove(os.path.join(path, inner))
                    else:
                        os.remove(path)
        redis.start()

    # -- the checker ----------------------------------------------------------

    def markers(self):
        try:
            with open(self.marks) as f:
                lines = [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            return []
        return [json.loads(line)["step"] for line in lines]

    def check(self, flows, data_kept):
        marks = self.markers()
        by_number = {flow.number: flow for flow in flows}
        problems = []
        # 2. no task twice
        seen = set()
        for mark in marks:
            if mark in seen:
                problems.append("ran twice: %s" % mark)
            seen.add(mark)
        # 1. no task without a 200 (or an unknown outcome) confirm
        for mark in marks:
            number = int(re.match(r"mark f(\d+)-\d+", mark).group(1))
            flow = by_number.get(number)
            if flow is None:
                continue  # a flow still running when the workload ended
            confirmed = any(a == "confirm" and s in (200, 502, 504)
                            for a, _, s, _ in flow.replies)
            if not confirmed:
                problems.append("f%d ran %s without a confirm taken: %s"
                                % (number, mark, flow.replies))
        for flow in flows:
            ran = [m for m in marks if m.startswith("mark f%d-" % flow.number)]
            # 6. never two 200s for one pause
            per_pause = {}
            for action, cid, status, _ in flow.replies:
                if status == 200:
                    per_pause[cid] = per_pause.get(cid, 0) + 1
            for cid, count in per_pause.items():
                if count > 1:
                    problems.append("f%d: %d 200s for one pause" % (flow.number, count))
            # 4. one final chunk per stream
            if len(flow.finals) > 1:
                problems.append("f%d: %d final chunks" % (flow.number, len(flow.finals)))
            final = flow.finals[0] if flow.finals else None
            # 5. no paused run lost while Redis keeps its data
            if final is None:
                if data_kept and flow.started:
                    problems.append("f%d (%s) lost its run: %s %s; faults %s"
                                    % (flow.number, flow.session, flow.problems,
                                       flow.timeline, FAULTS))
                continue
            kind = final["chunk_type"]
            why = final["metadata"].get("reason") or final["metadata"].get("error_type")
            # 3. every 200 honoured
            last = flow.replies[-1] if flow.replies else None
            if last and last[2] == 200 and last[0] == "confirm":
                if not (kind == "completion" or (kind == "error" and why == "interrupted")
                        or (not data_kept and kind == "error" and why == "store_unavailable")):
                    problems.append("f%d: a 200 confirm ended %s/%s" % (flow.number, kind, why))
                expected = ["mark f%d-%d" % (flow.number, k) for k in range(1, TASKS + 1)]
                if kind == "completion" and sorted(ran) != expected:
                    problems.append("f%d completed with tasks %s" % (flow.number, ran))
            if last and last[2] == 200 and last[0] == "cancel":
                if kind != "cancelled" or why != "user":
                    problems.append("f%d: a 200 cancel ended %s/%s" % (flow.number, kind, why))
                if ran:
                    problems.append("f%d: cancelled, yet ran %s" % (flow.number, ran))
            if kind == "cancelled" and ran:
                problems.append("f%d: ended cancelled/%s, yet ran %s" % (flow.number, why, ran))
            for problem in flow.problems:
                if problem.startswith("re-attach answered 400") or problem.startswith("a chunk again"):
                    problems.append("f%d: %s" % (flow.number, problem))
        return problems, marks

    # -- the runs -----------------------------------------------------------

    def test_faults_with_redis_keeping_its_data(self):
        replicas = self.cluster.replicas

        def faults():
            time.sleep(4)
            self.stall_redis(3.5)
            time.sleep(4)
            self.kill_and_restart(self.random.choice(replicas))
            time.sleep(4)
            self.freeze(self.random.choice(replicas), 10)
            time.sleep(3)
            self.restart_redis(keep_data=True)

        flows = self.run_workload(34, faults)
        problems, marks = self.check(flows, data_kept=True)
        if problems and os.environ.get("CHAOS_LOGS"):
            for replica in replicas:
                print("\n--- %s (port %d)\n%s" % (replica.name, replica.port, replica.logs()))
        decided = sum(1 for flow in flows for r in flow.replies if r[2] == 200)

        self.assertGreater(len(flows), 40, "a workload of some size ran")
        self.assertGreater(len(marks), 20, "tasks ran")
        self.assertEqual(problems, [], "\n".join(problems[:30]))
        print("\nchaos: %d flows, %d accepted replies, %d tasks run" % (len(flows), decided, len(marks)))

    def test_redis_restarted_without_its_data_ends_runs_only_as_documented(self):
        def faults():
            time.sleep(5)
            self.restart_redis(keep_data=False)

        flows = self.run_workload(14, faults)
        problems, _ = self.check(flows, data_kept=False)

        self.assertGreater(len(flows), 10)
        self.assertEqual(problems, [], "\n".join(problems[:30]))


if __name__ == "__main__":
    unittest.main()
