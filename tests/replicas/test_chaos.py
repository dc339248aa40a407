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

Beside those plain flows, others exercise what governs a decision, under
the same faults (#40): a two-approval `deploy` decided by two approvers,
each by a chat reply or a decision link sent to any replica or nginx
(some cancelled by the agent between the approvals); a `note` confirmed
with a session grant of two calls, then started three times more; and a
`pager` nobody answers, whose pause reminds, escalates and, with
`on_timeout = "reject"`, times out rejected wherever its owner is.

Every history must hold, on every run:

1. no task ran without a confirm that was answered 200, or whose outcome
   was told unknown (504, or a proxy's 502: it may have been taken);
2. no task ran twice;
3. every 200 is honoured: a confirm's run completes (or ends
   `interrupted`, when its owner died mid-work), a cancel's ends cancelled
   with nothing run;
4. every stream has exactly one final chunk;
5. no paused run is lost while Redis keeps its data: every flow that saw
   its run pause reads its run's end (a run whose owner was killed before
   it paused lived only in that owner's memory and ends with it, as
   docs/operations.md says of a replica that dies);
6. never two 200s for one pause;
7. a `deploy` ran only after both approvers were answered 200 (or told
   the outcome was unknown), and never after a cancel answered 200;
8. a `note` after the first ran only through the grant: at most its two
   calls, and only when the confirm that made it was taken;
9. a `pager` never ran, and its run ended (nobody answered: its tasks are
   rejected and the run completes) while Redis keeps its data.

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
from test_replicated_grants import LINK_SECRET, link_path

AGENT = {"Authorization": "Bearer agent-key-0000001"}
APPROVERS = {"lead-1": "lead-key-00000001", "lead-2": "lead-key-00000002"}
KEYS = """agent-key-0000001 label=ci-bot
approver lead-key-00000001 label=lead-1 groups=leads
approver lead-key-00000002 label=lead-2 groups=leads,oncall
"""
#: Calls of `note` a flow's grant allows.
GRANT_CALLS = 2

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
        # It saw its run pause: from then on the run is in Redis.
        self.paused = False
        self.kind = "mark"
        self.approvals = []  # (label, via, status, error_type): deploy flows
        self.extra_finals = []  # final chunks of a grant flow's later runs
        self.extra_runs = 0

    def note(self, problem):
        self.problems.append(problem)


class Stream:
    """A run's stream, read in a thread, re-attached through nginx whenever
    it breaks until its final chunk; tells the latest pending pause."""

    def __init__(self, flow, nginx_port, response, last_seen=0, finals=None):
        self.flow = flow
        self.finals = flow.finals if finals is None else finals
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
                    headers=dict(AGENT, **{"Content-Type": "application/json",
                                           "Last-Event-ID": str(self.last_seen)}),
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
                self.flow.paused = True
            if chunk["finished"]:
                self.finals.append(chunk)
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
        keys = os.path.join(self.tmp, "keys.txt")
        with open(keys, "w") as f:
            f.write(KEYS)
        self.cluster = Cluster(
            replicas=3, nginx=True,
            extra=["--tools", tools, "--confirm-timeout", "60s", "--step-delay", "0",
                   "--api-keys-file", keys, "--public-url", "https://gate.example",
                   "--link-secret", LINK_SECRET],
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
        # Idempotent (#44): a run whose owner died mid-call goes on at
        # another replica, which calls it again with the same key; the
        # mark is written once per key.
        keys = os.path.join(self.tmp, "keys")
        command = ('command = ["sh", "-c", "args=$(cat); sleep 0.3; exec 9>>%s.lock; flock 9; '
                   'grep -qx \\"$CHATGATE_IDEMPOTENCY_KEY\\" %s 2>/dev/null || '
                   '{ echo \\"$CHATGATE_IDEMPOTENCY_KEY\\" >> %s; echo \\"$args\\" >> %s; }"]\n'
                   'idempotent = true' % (keys, keys, keys, marks))
        tool = '[[tool]]\nname = "%s"\ndescription = "writes its task"\n%s\n%s\n' \
            'parameters = { type = "object" }\n'
        with open(path, "w") as f:
            f.write(tool % ("mark", 'risk = "low"', command))
            f.write(tool % ("deploy", 'risk = "high"\napprovals = 2', command))
            f.write(tool % ("note", 'risk = "low"', command))
            f.write(tool % ("pager", 'risk = "low"\ntimeout = "5s"\non_timeout = "reject"\n'
                            'remind_after = "1s"\nescalate_after = "2s"\nescalate_to = "oncall"',
                            command))
        return path, marks

    # -- the workload -----------------------------------------------------

    def flow(self, number):
        flow = Flow(number)
        rng = random.Random(SEED * 1000 + number)
        kind = rng.random()
        if kind < 0.2:
            return self.deploy_flow(flow, rng)
        if kind < 0.3:
            return self.grant_flow(flow, rng)
        if kind < 0.37:
            return self.pager_flow(flow)
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

    def deploy_flow(self, flow, rng):
        """A two-approval deploy: each approver by chat or link, anywhere."""
        flow.kind = "deploy"
        stream = self.start(flow, "deploy f%d-1" % flow.number)
        if stream is None:
            return flow
        pause = stream.wait_for_pause(None)
        if pause is not None:
            time.sleep(rng.uniform(0.0, 2.0))
            labels = ["lead-1", "lead-2"]
            rng.shuffle(labels)
            cancels = rng.random() < 0.15
            self.approve(flow, rng, labels[0], pause["confirmation_id"])
            if cancels:
                self.decide(flow, rng, "cancel", pause["confirmation_id"])
            else:
                self.approve(flow, rng, labels[1], pause["confirmation_id"])
        self.wait_end(flow, stream)
        return flow

    def grant_flow(self, flow, rng):
        """A note confirmed with a session grant of GRANT_CALLS calls, then
        three more notes: those the grant covers run, the others are
        cancelled."""
        flow.kind = "note"
        stream = self.start(flow, "note f%d-1" % flow.number)
        if stream is None:
            return flow
        pause = stream.wait_for_pause(None)
        if pause is not None:
            grant = {"scope": "session", "tools": ["note"], "ttl": "10m", "max_calls": GRANT_CALLS}
            self.decide(flow, rng, "confirm", pause["confirmation_id"], grant=grant)
        self.wait_end(flow, stream)
        for k in range(2, 5):
            later = self.start(flow, "note f%d-%d" % (flow.number, k), flow.extra_finals)
            if later is None:
                continue
            flow.extra_runs += 1
            pause = later.wait_for_pause(None)
            if pause is not None:
                self.decide(flow, rng, "cancel", pause["confirmation_id"])
            later.finished.wait(timeout=max(0.0, later.deadline - time.monotonic()))
        return flow

    def pager_flow(self, flow):
        """Nobody answers: reminded, escalated, rejected at its timeout."""
        flow.kind = "pager"
        stream = self.start(flow, "pager f%d-1" % flow.number)
        if stream is not None:
            self.wait_end(flow, stream)
        return flow

    def wait_end(self, flow, stream):
        stream.finished.wait(timeout=max(0.0, stream.deadline - time.monotonic()))
        if not stream.finished.is_set():
            flow.note("never read its run's end")

    def approve(self, flow, rng, label, confirmation_id):
        """`label` approves, by a chat reply or its decision link, sent to a
        random replica or nginx until answered for good."""
        via = rng.choice(["chat", "link"])
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            port = rng.choice(self.targets)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                if via == "chat":
                    conn.request("POST", "/api/v1/chat/stream",
                                 body=json.dumps({"message": "CONFIRM_ACTION:confirm",
                                                  "session_id": flow.session,
                                                  "confirmation_id": confirmation_id}),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + APPROVERS[label]})
                else:
                    conn.request("POST", link_path(confirmation_id, label), body="action=confirm",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
                response = conn.getresponse()
                body = response.read()
                conn.close()
            except (OSError, http.client.HTTPException):
                time.sleep(0.3)
                continue
            match = re.search(rb'"error_type":"([a-z_]+)"', body)
            error_type = match.group(1).decode() if match else None
            flow.approvals.append((label, via, response.status, error_type))
            flow.timeline.append((round(time.monotonic() - T0, 2), port, via, label,
                                  response.status, error_type))
            if response.status in (502, 503, 504):
                time.sleep(min(float(response.getheader("Retry-After") or 0.5), 3.0))
                continue
            return
        flow.note("%s's approval never answered for good" % label)

    def start(self, flow, steps, finals=None):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.nginx_port, timeout=30)
                conn.request("POST", "/api/v1/chat/stream",
                             body=json.dumps({"message": steps, "session_id": flow.session}),
                             headers=dict(AGENT, **{"Content-Type": "application/json"}))
                response = conn.getresponse()
            except OSError:
                time.sleep(0.5)
                continue
            if response.status == 200:
                flow.started = True
                return Stream(flow, self.nginx_port, response, finals=finals)
            response.read()
            conn.close()
            if response.status in (502, 503, 504, 409):
                # Not taken, or not known: if a run started, re-attach to it.
                if response.status != 503:
                    stream = Stream(flow, self.nginx_port, None, finals=finals)
                    if stream.wait_for_pause(None) or stream.finished.is_set():
                        flow.started = True
                        return stream
                time.sleep(0.5)
                continue
            flow.note("start answered %d" % response.status)
            return None
        flow.note("could not start")
        return None

    def decide(self, flow, rng, action, confirmation_id, grant=None):
        """Sends `action` until it is answered for good; records every answer."""
        message = "CONFIRM_ACTION:" + (action if action != "modify" else "modify:more")
        sent = {"message": message, "session_id": flow.session, "confirmation_id": confirmation_id}
        if grant:
            sent["grant"] = grant
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            port = rng.choice(self.targets)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("POST", "/api/v1/chat/stream", body=json.dumps(sent),
                             headers=dict(AGENT, **{"Content-Type": "application/json"}))
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
        taken = (200, 502, 504)  # answered taken, or perhaps taken
        # 1. no task without a 200 (or an unknown outcome) confirm
        for mark in marks:
            tool, number, k = re.match(r"(\w+) f(\d+)-(\d+)", mark).groups()
            number, k = int(number), int(k)
            flow = by_number.get(number)
            if flow is None:
                continue  # a flow still running when the workload ended
            confirmed = any(a == "confirm" and s in taken for a, _, s, _ in flow.replies)
            if tool == "deploy":
                # 7. both approvers, and no cancel taken
                approvers = {label for label, _, s, _ in flow.approvals if s in taken}
                if approvers != {"lead-1", "lead-2"}:
                    problems.append("f%d ran %s with approvals %s" % (number, mark, flow.approvals))
                if any(a == "cancel" and s == 200 for a, _, s, _ in flow.replies):
                    problems.append("f%d ran %s after a cancel taken" % (number, mark))
            elif tool == "pager":
                # 9. nobody answers a pager
                problems.append("f%d: nobody answered, yet %s ran" % (number, mark))
            elif not confirmed:
                # 8. a note's later calls run only through the grant
                problems.append("f%d ran %s without a confirm taken: %s"
                                % (number, mark, flow.replies))
        for flow in flows:
            if flow.kind != "mark":
                problems += self.check_governed(flow, marks, data_kept)
                continue
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
                if data_kept and flow.paused:
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

    def check_governed(self, flow, marks, data_kept):
        """Rules 4, 5, 7, 8 and 9 for a deploy, note or pager flow."""
        problems = []
        n = flow.number
        ran = [m for m in marks if m.startswith("%s f%d-" % (flow.kind, n))]
        if len(flow.finals) > 1 or len(flow.extra_finals) > flow.extra_runs:
            problems.append("f%d: more final chunks than runs" % n)
        final = flow.finals[0] if flow.finals else None
        if final is None:
            if data_kept and flow.paused:
                problems.append("f%d (%s, %s) lost its run: %s %s; faults %s"
                                % (n, flow.kind, flow.session, flow.problems, flow.timeline, FAULTS))
            return problems
        kind = final["chunk_type"]
        why = final["metadata"].get("reason") or final["metadata"].get("error_type")
        ended_well = kind == "completion" or (kind == "error" and why == "interrupted") \
            or (not data_kept and kind == "error" and why == "store_unavailable")
        if flow.kind == "deploy":
            for label in ("lead-1", "lead-2"):
                if [lb for lb, _, s, _ in flow.approvals if s == 200].count(label) > 1:
                    problems.append("f%d: two 200s for %s's approval" % (n, label))
            cancelled = any(a == "cancel" and s == 200 for a, _, s, _ in flow.replies)
            approved = {lb for lb, _, s, _ in flow.approvals if s == 200}
            if cancelled and (kind != "cancelled" or why != "user"):
                problems.append("f%d: a 200 cancel ended %s/%s" % (n, kind, why))
            if approved == {"lead-1", "lead-2"} and not ended_well:
                problems.append("f%d: a quorum taken ended %s/%s" % (n, kind, why))
            if kind == "completion" and ran != ["deploy f%d-1" % n]:
                problems.append("f%d: completed with %s" % (n, ran))
        elif flow.kind == "note":
            later = [m for m in ran if m != "note f%d-1" % n]
            if len(later) > GRANT_CALLS:
                problems.append("f%d: the grant of %d calls ran %s" % (n, GRANT_CALLS, later))
            confirms = [s for a, _, s, _ in flow.replies if a == "confirm"]
            if confirms and confirms[-1] == 200 and not ended_well:
                problems.append("f%d: a 200 confirm ended %s/%s" % (n, kind, why))
        elif flow.kind == "pager" and data_kept and kind != "completion":
            # Rejected at its timeout wherever its owner is: the run goes on.
            problems.append("f%d: an unanswered pager ended %s/%s; %s"
                            % (n, kind, why, flow.timeline))
        return problems

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
        kinds = {k: sum(1 for f in flows if f.kind == k) for k in ("mark", "deploy", "note", "pager")}
        ran = {k: sum(1 for m in marks if m.startswith(k + " ")) for k in kinds}
        print("\nchaos: %d flows %s, %d accepted replies, tasks run %s"
              % (len(flows), kinds, decided, ran))
        self.assertGreater(ran["deploy"], 0, "a quorum completed under faults")
        self.assertGreater(ran["note"], kinds["note"], "grants covered later calls")

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
