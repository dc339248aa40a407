"""Three chatgate replicas sharing a Redis, behind nginx with plain
round-robin (deploy/nginx-round-robin.conf): a reply, a supersede or a
re-attach may land on any replica.

Run by .ci/run (redis-server and nginx are not on a fresh machine, so
`cargo test` does not):

    CHATGATE_BIN=target/debug/chatgate python3 -m unittest discover -s tests/replicas

The harness starts its own redis-server on a free port, and every process
listens on 127.0.0.1; all of them are stopped when the tests end.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chatgate_client import ChatGateClient  # noqa: E402
from harness import free_port, read_until, start_nginx, wait_for  # noqa: E402

ROUND_ROBIN_CONF = os.path.join(ROOT, "deploy", "nginx-round-robin.conf")
STREAM_PATH = "/api/v1/chat/stream"
SECRET = "test-cluster-secret-0123456789"
OWNER_TTL = 2.0




def status_of(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")




def binary():
    path = os.environ.get("CHATGATE_BIN") or os.path.join(ROOT, "target", "debug", "chatgate")
    if not os.path.exists(path):
        raise RuntimeError("no chatgate binary at %s: run `cargo build` or set CHATGATE_BIN" % path)
    return path


class Redis:
    """A redis-server of our own, on a free port, its data in ``dir``."""

    def __init__(self, dir):
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(server):
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.server = server
        self.dir = dir
        self.port = free_port()
        self.url = "redis://127.0.0.1:%d/0" % self.port
        self.process = None
        self.start()

    def start(self):
        # Append-only, synced: stopped and started again, it keeps its data.
        self.process = subprocess.Popen(
            [self.server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not come up")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)

    def command(self, line):
        """Sends one inline command; returns the first line of the answer."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(line + b"\r\n")
            return sock.recv(256).split(b"\r\n")[0]


class Replica:
    """One chatgate process of the cluster."""

    def __init__(self, redis, name, extra=(), owner_ttl=None):
        self.name = name
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.url = "http://" + self.address
        self.log = tempfile.TemporaryFile()
        self.args = (
            [binary(), "--bind", self.address, "--store", redis.url, "--replica-id", name,
             "--advertise-url", self.url, "--cluster-secret", SECRET,
             "--owner-ttl", "%gs" % (owner_ttl or OWNER_TTL), "--keep-alive", "1s",
             "--workers", "1"]
            + ([] if "--step-delay" in extra else ["--step-delay", "0"]) + list(extra)
        )
        self.start()

    def start(self):
        """Starts (or starts again, after a kill) this replica's process."""
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=self.log,
            env=dict(os.environ, RUST_LOG=os.environ.get("CHATGATE_LOG", "warn,chatgate=info")),
        )
        wait_for(self.url + "/readyz")

    def kill(self):
        self.process.kill()
        self.process.wait()

    def terminate(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)

    def logs(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def metric(self, name, having=""):
        """The sum of a counter's samples on this replica's /metrics."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and having in line)

    def decisions(self):
        """Confirmations this replica accepted."""
        return self.metric("chatgate_confirmation_decisions_total", 'outcome="accepted"')

    def forwarded(self):
        """Requests this replica forwarded to a run's owner."""
        return self.metric("chatgate_forwarded_requests_total")


class Nginx:
    def __init__(self, dir, replicas):
        self.port = free_port()
        with open(ROUND_ROBIN_CONF) as f:
            site = f.read()
        for default, replica in zip(["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"], replicas):
            site = site.replace("server %s " % default, "server %s " % replica.address)
        site = site.replace("listen 127.0.0.1:8000;", "listen 127.0.0.1:%d;" % self.port)
        self.process = start_nginx(dir, site)
        self.url = "http://127.0.0.1:%d" % self.port
        wait_for(self.url + "/healthz")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=15)


class Cluster:
    def __init__(self, replicas=3, nginx=True, extra=(), owner_ttl=None):
        self.dir = tempfile.mkdtemp(prefix="chatgate-cluster-")
        self.redis = Redis(self.dir)
        self.replicas = []
        self.nginx = None
        try:
            for i in range(replicas):
                self.replicas.append(Replica(self.redis, "r%d" % (i + 1), extra, owner_ttl))
            if nginx:
                self.nginx = Nginx(self.dir, self.replicas)
        except Exception:
            self.stop()
            raise

    def add(self, name, extra=()):
        replica = Replica(self.redis, name, extra)
        self.replicas.append(replica)
        return replica

    def stop(self):
        if self.nginx:
            self.nginx.stop()
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait()
        self.redis.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def connect(target):
    """A connection to ``target``: a Replica, or the nginx in front."""
    return http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)


def post(target, body, headers=()):
    conn = connect(target)
    conn.request("POST", STREAM_PATH, body=json.dumps(body),
                 headers=dict({"Content-Type": "application/json"}, **dict(headers)))
    response = conn.getresponse()
    response.conn = conn
    return response


def answer(target, session, action, headers=(), confirmation_id=None, answers=None):
    """A reply's status and its one chunk."""
    body = {"message": "CONFIRM_ACTION:" + action, "session_id": session}
    if confirmation_id:
        body["confirmation_id"] = confirmation_id
    if answers is not None:
        body["answers"] = answers
    response = post(target, body, headers)
    body = response.read().decode()
    response.conn.close()
    data = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    return response.status, json.loads(data[0]), response




def read_to_end(response):
    seen = b""
    while True:
        piece = response.read1(65536)
        if not piece:
            return seen
        seen += piece


def chunk_types(raw):
    return re.findall(rb'"chunk_type":"([a-z_]+)"', raw)


def new_session(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def pause_on(replica, session, message="build; ship"):
    """Starts a run on ``replica`` and reads it to its confirmation request."""
    stream = post(replica, {"message": message, "session_id": session})
    assert stream.status == 200, stream.status
    read_until(stream, rb'"chunk_type":"confirmation_request"')
    return stream


def agui(target, body):
    """An AG-UI run on ``target``: its status and its events."""
    conn = connect(target)
    conn.request("POST", "/api/v1/agui", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read().decode()
    conn.close()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    return response.status, events


def a2a(target, method, params):
    """One A2A JSON-RPC call on ``target``: its HTTP status and its body."""
    conn = connect(target)
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    conn.request("POST", "/a2a", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "A2A-Version": "1.0"})
    response = conn.getresponse()
    raw = response.read().decode()
    conn.close()
    return response.status, json.loads(raw)


def a2a_task_at_end(target, task_id):
    """The task ``task_id`` once it has ended: its stream (SubscribeToTask)
    read until it closes, then the task as ``target`` gives it."""
    conn = connect(target)
    body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
    conn.request("POST", "/a2a", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "A2A-Version": "1.0"})
    conn.getresponse().read()  # ends with the task (or at once: it has ended)
    conn.close()
    return a2a(target, "GetTask", {"id": task_id})[1]["result"]


def a2a_paused_task(target, prefix):
    """A task started on ``target`` on a new session, paused on its plan:
    its session, the task, and the card its status message carries."""
    context = new_session(prefix)
    status, body = a2a(target, "SendMessage",
                       a2a_message([{"text": "build; ship"}], context_id=context))
    assert status == 200, body
    task = body["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", body
    return context, task, task["status"]["message"]["parts"][1]["data"]


def a2a_message(parts, task_id=None, context_id=None):
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": parts}
    if task_id:
        message["taskId"] = task_id
    if context_id:
        message["contextId"] = context_id
    return {"message": message}


def setUpModule():
    global CLUSTER
    CLUSTER = Cluster()


def tearDownModule():
    CLUSTER.stop()


class RoundRobinTests(unittest.TestCase):
    def test_an_agui_pause_opened_on_a_is_resumed_on_b_and_refused_on_c(self):
        a, b, c = CLUSTER.replicas[:3]
        thread = new_session("agui")
        status, events = agui(a, {"threadId": thread, "runId": "r1", "messages": [
            {"id": "1", "role": "user", "content": "build; ship"}]})
        self.assertEqual(status, 200)
        self.assertEqual(events[-1]["outcome"]["type"], "interrupt", events)
        interrupts = events[-1]["outcome"]["interrupts"]
        self.assertEqual(len(interrupts), 2)
        cid = interrupts[0]["metadata"]["confirmation_id"]

        # Resumed on another replica: passed to the owner, the run goes on there.
        forwarded = b.forwarded()
        resume = [{"interruptId": i["id"], "status": "resolved", "payload": {"approved": True}}
                  for i in interrupts]
        status, events = agui(b, {"threadId": thread, "runId": "r2", "messages": [],
                                  "resume": resume})
        self.assertEqual(status, 200)
        self.assertEqual(events[-1]["type"], "RUN_FINISHED", events)
        self.assertEqual(events[-1]["outcome"], {"type": "success"})
        self.assertEqual([e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"],
                         [i["id"] for i in interrupts])
        # (With --park-after 0s the run was parked, and B took it over.)
        if os.environ.get("CHATGATE_PARK_AFTER") != "0s":
            self.assertGreater(b.forwarded(), forwarded)

        # The loser on the chat face, on a third replica, and on AG-UI again.
        status, chunk, _ = answer(c, thread, "confirm", confirmation_id=cid)
        self.assertEqual(status, 409, chunk)
        self.assertEqual(chunk["metadata"]["error_type"], "already_decided")
        status, events = agui(c, {"threadId": thread, "runId": "r3", "messages": [],
                                  "resume": resume[:1]})
        self.assertEqual(events[-1]["type"], "RUN_ERROR", events)
        self.assertEqual(events[-1]["code"], "already_decided")

    def test_an_a2a_task_started_on_a_is_read_and_answered_on_b_and_refused_on_c(self):
        a, b, c = CLUSTER.replicas[:3]
        context = new_session("a2a")
        status, body = a2a(a, "SendMessage",
                           a2a_message([{"text": "build; ship"}], context_id=context))
        self.assertEqual(status, 200, body)
        task = body["result"]["task"]
        self.assertEqual(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", body)
        card = task["status"]["message"]["parts"][1]["data"]
        cid, interrupts = card["confirmation_id"], [t["task_id"] for t in card["tasks"]]

        # Read on another replica: passed to the owner, the same task.
        forwarded = b.forwarded()
        status, body = a2a(b, "GetTask", {"id": task["id"]})
        self.assertEqual(status, 200)
        self.assertEqual(body["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED", body)
        self.assertEqual(body["result"]["contextId"], context)
        self.assertGreater(b.forwarded(), forwarded)
        status, body = a2a(c, "ListTasks", {"contextId": context})
        self.assertEqual([t["id"] for t in body["result"]["tasks"]], [task["id"]], body)

        # Answered on another replica: the run goes on at its owner, to its end.
        status, body = a2a(b, "SendMessage",
                           a2a_message([{"data": {"action": "confirm"}}], task_id=task["id"]))
        self.assertEqual(status, 200)
        done = body["result"]["task"]
        self.assertEqual(done["status"]["state"], "TASK_STATE_COMPLETED", body)
        self.assertEqual(len(done["artifacts"]), 2, body)

        # The losers: chat, AG-UI and A2A, each on another replica.
        status, chunk, _ = answer(c, context, "confirm", confirmation_id=cid)
        self.assertEqual(status, 409, chunk)
        self.assertEqual(chunk["metadata"]["error_type"], "already_decided")
        resume = [{"interruptId": i, "status": "resolved", "payload": {"approved": True}}
                  for i in interrupts]
        status, events = agui(a, {"threadId": context, "runId": "r2", "messages": [],
                                  "resume": resume})
        self.assertEqual(events[-1]["type"], "RUN_ERROR", events)
        self.assertEqual(events[-1]["code"], "already_decided")
        status, body = a2a(c, "SendMessage",
                           a2a_message([{"data": {"action": "cancel"}}], task_id=task["id"]))
        self.assertEqual(body["error"]["code"], -32004, body)

    def test_an_a2a_subscription_through_another_replica_streams_the_task_to_its_end(self):
        a, b, c = CLUSTER.replicas[:3]
        context = new_session("a2a-sub")
        status, body = a2a(a, "SendMessage",
                           a2a_message([{"text": "build; ship"}], context_id=context))
        task = body["result"]["task"]
        conn = connect(b)
        request = {"jsonrpc": "2.0", "id": 9, "method": "SubscribeToTask",
                   "params": {"id": task["id"]}}
        conn.request("POST", "/a2a", body=json.dumps(request),
                     headers={"Content-Type": "application/json", "A2A-Version": "1.0",
                              "Accept": "text/event-stream"})
        stream = conn.getresponse()
        self.assertEqual(stream.status, 200)
        seen = read_until(stream, rb"TASK_STATE_INPUT_REQUIRED[^\n]*\n\n")
        status, body = a2a(c, "SendMessage",
                           a2a_message([{"data": {"action": "confirm"}}], task_id=task["id"]))
        self.assertEqual(status, 200, body)
        seen += read_until(stream, rb"TASK_STATE_COMPLETED[^\n]*\n\n")
        conn.close()
        events = [json.loads(line[6:]) for line in seen.decode().splitlines()
                  if line.startswith("data: ")]
        self.assertTrue(all(e["id"] == 9 for e in events), events)
        self.assertEqual(events[0]["result"]["task"]["id"], task["id"])
        self.assertEqual(sum(1 for e in events if "artifactUpdate" in e["result"]), 2, events)

    def test_a_pause_an_a2a_task_waits_on_is_decided_by_agui_elsewhere_and_refused_on_a2a(self):
        a, b, c = CLUSTER.replicas[:3]
        context, task, card = a2a_paused_task(a, "a2a-agui")
        resume = [{"interruptId": t["task_id"], "status": "resolved", "payload": {"approved": True}}
                  for t in card["tasks"]]
        status, events = agui(b, {"threadId": context, "runId": "r1", "messages": [],
                                  "resume": resume})
        self.assertEqual(status, 200)
        self.assertEqual(events[-1]["type"], "RUN_FINISHED", events)
        # The A2A answer on a third replica loses: the task has moved on.
        status, body = a2a(c, "SendMessage",
                           a2a_message([{"data": {"action": "confirm"}}], task_id=task["id"]))
        self.assertIn("error", body, body)
        self.assertIn(body["error"]["code"], (-32004,), body)
        ended = a2a_task_at_end(c, task["id"])
        self.assertEqual(ended["status"]["state"], "TASK_STATE_COMPLETED", ended)

    def test_a_pause_an_a2a_task_waits_on_is_decided_by_chat_elsewhere_and_refused_on_the_faces(self):
        a, b, c = CLUSTER.replicas[:3]
        context, task, card = a2a_paused_task(a, "a2a-chat")
        status, chunk, _ = answer(b, context, "confirm", confirmation_id=card["confirmation_id"])
        self.assertEqual(status, 200, chunk)
        resume = [{"interruptId": t["task_id"], "status": "resolved", "payload": {"approved": True}}
                  for t in card["tasks"]]
        status, events = agui(c, {"threadId": context, "runId": "r1", "messages": [],
                                  "resume": resume})
        self.assertEqual(events[-1]["type"], "RUN_ERROR", events)
        self.assertEqual(events[-1]["code"], "already_decided")
        status, body = a2a(c, "SendMessage",
                           a2a_message([{"text": "CONFIRM_ACTION:confirm"}], task_id=task["id"]))
        self.assertEqual(body["error"]["code"], -32004, body)
        # The task saw the decision and followed its run to the end.
        ended = a2a_task_at_end(b, task["id"])
        self.assertEqual(ended["status"]["state"], "TASK_STATE_COMPLETED", ended)
        self.assertEqual(len(ended["artifacts"]), 2, ended)

    def test_an_a2a_task_on_a_killed_replica_is_found_and_answered_elsewhere(self):
        doomed = CLUSTER.add("doomed-a2a")
        a = CLUSTER.replicas[0]
        context = new_session("a2a-kill9")
        status, body = a2a(doomed, "SendMessage",
                           a2a_message([{"text": "build; ship"}], context_id=context))
        task = body["result"]["task"]
        self.assertEqual(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", body)

        doomed.kill()
        time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
        status, body = a2a(a, "GetTask", {"id": task["id"]})
        self.assertEqual(status, 200, body)
        found = body["result"]
        self.assertEqual(found["status"]["state"], "TASK_STATE_INPUT_REQUIRED", body)
        self.assertEqual(found["status"]["message"]["parts"][1]["data"]["confirmation_id"],
                         task["status"]["message"]["parts"][1]["data"]["confirmation_id"])
        status, body = a2a(a, "SendMessage",
                           a2a_message([{"data": {"action": "confirm"}}], task_id=task["id"]))
        self.assertEqual(body["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", body)

    def test_stream_on_a_modify_on_b_confirm_on_c(self):
        a, b, c = CLUSTER.replicas[:3]
        session = new_session("abc")
        stream = pause_on(a, session)

        modified = answer(b, session, "modify:add a check")
        read_until(stream, rb'"chunk_type":"confirmation_request","metadata":'
                           rb'\{"confirmation_id":"[^"]+","confirmation_round":2')
        confirmed = answer(c, session, "confirm")
        rest = read_to_end(stream)

        self.assertEqual(modified[0], 200, modified[1])
        self.assertEqual(modified[1]["metadata"]["action"], "modify")
        self.assertEqual(confirmed[0], 200, confirmed[1])
        self.assertEqual(chunk_types(rest)[-1], b"completion")
        stream.conn.close()

    def test_a_question_asked_on_a_is_answered_on_b_and_its_plan_confirmed_on_c(self):
        a, b, c = CLUSTER.replicas[:3]
        session = new_session("ask")
        stream = post(a, {"message": "ask region: where? eu | us; ask n: how many?; "
                                     "deploy {n} to {region}", "session_id": session})
        read_until(stream, rb'"chunk_type":"input_request"')

        refused = answer(b, session, "answer:eu")
        answered = answer(b, session, "answer", answers={"region": "US", "n": "3"})
        plan = read_until(stream, rb'"stream_paused":true,"sequence":4')
        confirmed = answer(c, session, "confirm")
        rest = read_to_end(stream)

        self.assertEqual(refused[0], 422, refused[1])
        self.assertEqual(refused[1]["metadata"]["error_type"], "invalid_answer")
        self.assertEqual(answered[0], 200, answered[1])
        self.assertEqual(answered[1]["metadata"]["answers"], {"region": "us", "n": "3"})
        self.assertIn(b'"description":"deploy 3 to us"', plan)
        self.assertEqual(confirmed[0], 200, confirmed[1])
        self.assertEqual(chunk_types(rest)[-1], b"completion")
        stream.conn.close()

    def test_kill_9_of_the_owner_while_asking_an_answer_elsewhere_resumes_the_run(self):
        doomed = CLUSTER.add("doomed-q")
        a, b = CLUSTER.replicas[:2]
        session = new_session("kill9q")
        stream = post(doomed, {"message": "ask region: where? eu | us; deploy to {region}",
                               "session_id": session})
        read_until(stream, rb'"chunk_type":"input_request"')

        doomed.kill()
        stream.conn.close()
        time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
        status, chunk, _ = answer(a, session, "answer:eu")
        again = post(b, {"session_id": session}, {"Last-Event-ID": "1"})
        plan = read_until(again, rb'"stream_paused":true,"sequence":4')
        confirmed = answer(b, session, "confirm")
        rest = read_to_end(again)
        second = answer(a, session, "answer:us")

        self.assertEqual(status, 200, chunk)
        self.assertEqual(chunk["metadata"]["answers"], {"region": "eu"})
        self.assertIn(b'"description":"deploy to eu"', plan)
        self.assertEqual(confirmed[0], 200, confirmed[1])
        self.assertEqual(chunk_types(rest)[-1], b"completion")
        self.assertEqual(second[0], 404, "answered once; the run is over: %r" % (second[1],))

    def test_the_inbox_lists_the_whole_cluster_s_pauses_from_any_replica(self):
        a, b, c = CLUSTER.replicas[:3]
        tag = uuid.uuid4().hex[:6]
        streams = []
        for i, replica in enumerate((a, b, c)):
            message = "ask which? x | y; go {q1}" if i == 1 else "inbox %s %d" % (tag, i)
            stream = post(replica, {"message": message, "session_id": "inbox-%s-%d" % (tag, i)})
            read_until(stream, rb'"stream_paused":true')
            streams.append(stream)

        def listing(target, query=""):
            conn = connect(target)
            conn.request("GET", "/api/v1/interactions" + query)
            response = conn.getresponse()
            body = json.loads(response.read())
            conn.close()
            self.assertEqual(response.status, 200, body)
            return [i for i in body["interactions"] if i["session_id"].startswith("inbox-" + tag)]

        seen = [listing(r) for r in (a, b, c, CLUSTER.nginx)]
        mine = seen[0]
        self.assertEqual(sorted(i["session_id"] for i in mine),
                         ["inbox-%s-%d" % (tag, i) for i in range(3)])
        for other in seen[1:]:
            self.assertEqual([i["confirmation_id"] for i in other],
                             [i["confirmation_id"] for i in mine], "the same from every replica")
        self.assertEqual([i["kind"] for i in mine if i["session_id"].endswith("-1")], ["question"])
        # Paging through the cluster's listing, two at a time.
        everything = listing(c, "?limit=500")
        ids = [i["confirmation_id"] for i in everything]
        first = listing(b, "?limit=2")
        self.assertEqual([i["confirmation_id"] for i in first], ids[:2])
        # Decided from the listing, on a replica that does not hold the run.
        target = mine[0]
        status, chunk, _ = answer(c if target["session_id"].endswith("-0") else a,
                                  target["session_id"], "cancel",
                                  confirmation_id=target["confirmation_id"])
        self.assertEqual(status, 200, chunk)
        left = [i["confirmation_id"] for i in listing(b)]
        self.assertNotIn(target["confirmation_id"], left)
        self.assertEqual(len(left), 2)
        for stream in streams:
            stream.conn.close()

    def test_runs_through_round_robin_all_complete_with_replies_landing_anywhere(self):
        client = ChatGateClient(CLUSTER.nginx.url)
        before = [(r.decisions(), r.forwarded()) for r in CLUSTER.replicas[:3]]
        outcomes = []
        for i in range(12):
            # One or two rounds: the runs' streams then land on every replica.
            replies = ["modify:add a check", "confirm"] if i % 2 else ["confirm"]
            expected = len(replies)
            result = client.run("build; ship", on_confirmation=lambda chunk: replies.pop(0))
            rounds = [c["chunk_type"] for c in result.chunks].count("confirmation_request")
            outcomes.append((result.outcome, rounds == expected))

        after = [(r.decisions(), r.forwarded()) for r in CLUSTER.replicas[:3]]
        self.assertEqual(outcomes, [("completed", True)] * 12)
        decided = [x[0] - y[0] for x, y in zip(after, before)]
        forwarded = sum(x[1] - y[1] for x, y in zip(after, before))
        # Decisions are taken by the replica that owns each run, wherever
        # the reply landed: 6 runs of two rounds, 6 of one.
        self.assertEqual(sum(decided), 18, decided)
        self.assertTrue(all(n > 0 for n in decided), "runs on every replica: %r" % decided)
        self.assertGreater(forwarded, 0, "replies landed on replicas not holding the run")

    def test_fifty_racing_replies_spread_over_three_replicas_have_one_winner(self):
        a = CLUSTER.replicas[0]
        session = new_session("race")
        stream = post(a, {"message": "build; ship", "session_id": session})
        seen = read_until(stream, rb'"chunk_type":"confirmation_request"')
        # Each reply names the pause it answers, as a careful client's does:
        # a modify that wins opens a new round, which no late reply may take.
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]+)"', seen).group(1).decode()
        results = [None] * 50
        start = threading.Barrier(50)

        def reply(i):
            start.wait()
            action = ["confirm", "cancel", "modify:x"][i % 3]
            status, chunk, _ = answer(CLUSTER.replicas[i % 3], session, action,
                                      confirmation_id=pause)
            results[i] = (status, chunk["chunk_type"], (chunk.get("metadata") or {}).get("error_type"))

        threads = [threading.Thread(target=reply, args=(i,)) for i in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        raw = read_until(stream, rb'"finished":true')

        winners = [r for r in results if r[0] == 200]
        losers = [r for r in results if r[0] != 200]
        self.assertEqual(len(winners), 1, results)
        self.assertEqual(winners[0][1], "confirmation_received")
        # Too late: decided (409) while the run lives, no pause (404) once it
        # has ended, or (after a modify) a round that is not the one named.
        # Or not taken at all: on a loaded machine a forwarder may not reach
        # the owner for a moment (503 owner_unavailable, Retry-After), which
        # says truthfully that nothing was taken.
        late = {(409, "error", "already_decided"), (404, "error", "no_pending_confirmation"),
                (409, "error", "stale_confirmation"), (503, "error", "owner_unavailable")}
        self.assertTrue(all(r in late for r in losers), losers)
        self.assertEqual(chunk_types(raw).count(b"confirmation_received"), 1)
        stream.conn.close()

    def test_decides_of_different_tasks_on_two_replicas_at_once_both_count_once(self):
        """#42: two people decide different tasks of one pause at the same
        instant on two replicas (neither the owner, twenty times): each is
        taken (a 503 while the other is being kept is sent again, as the
        clients do), neither is lost or counted twice, and the confirm that
        follows runs the plan with both."""
        owner, b, c = CLUSTER.replicas[:3]
        for trial in range(20):
            session = new_session("tasks")
            stream = pause_on(owner, session, "one; two; three")
            results = [None, None]
            start = threading.Barrier(2)

            def decide(slot, replica, index, decision):
                body = {"message": "CONFIRM_ACTION:decide", "session_id": session,
                        "decisions": [{"index": index, "decision": decision}]}
                start.wait()
                deadline = time.monotonic() + 30
                while True:
                    response = post(replica, body)
                    raw = response.read()
                    response.conn.close()
                    # 503: the other decide is being kept; sent again.
                    if response.status != 503 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                data = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
                results[slot] = (response.status, json.loads(data[0]))

            threads = [threading.Thread(target=decide, args=(0, b, 1, "reject")),
                       threading.Thread(target=decide, args=(1, c, 3, "approve"))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            statuses = [r[0] for r in results]
            self.assertEqual(statuses, [200, 200], (trial, results))
            kinds = sorted(r[1]["chunk_type"] for r in results)
            self.assertEqual(kinds, ["decision_recorded", "decision_recorded"], (trial, results))
            pending = sorted(tuple(r[1]["metadata"]["pending"]) for r in results)
            # Whichever came second saw the first: only task 2 is left.
            self.assertIn((2,), pending, (trial, results))

            again = post(b, {"message": "CONFIRM_ACTION:decide", "session_id": session,
                             "decisions": [{"index": 3, "decision": "reject"}]})
            again.read()
            again.conn.close()
            self.assertEqual(again.status, 409, trial)
            status, received, _ = answer(c, session, "confirm")
            self.assertEqual(status, 200, (trial, received))
            verdicts = [d["decision"] for d in received["metadata"]["decisions"]]
            self.assertEqual(verdicts, ["reject", "approve", "approve"], trial)
            raw = read_to_end(stream)
            self.assertEqual(chunk_types(raw).count(b"decision_recorded"), 2, trial)
            self.assertEqual(chunk_types(raw)[-1], b"completion", trial)
            stream.conn.close()

    def test_a_run_s_outcome_is_read_from_any_replica(self):
        a, b = CLUSTER.replicas[:2]
        session = new_session("outcome")
        stream = pause_on(a, session)
        status, _, _ = answer(a, session, "confirm")
        read_to_end(stream)

        read = status_of("%s/api/v1/runs/%s" % (b.url, session))

        self.assertEqual(status, 200)
        self.assertEqual(read[0], 200, read[1])
        self.assertEqual(read[1]["outcome"], "completion")
        self.assertEqual(read[1]["pauses"][0]["action"], "confirm")
        self.assertEqual(len(read[1]["ran"]), 2)

    def test_a_re_attach_through_another_replica_replays_and_goes_on(self):
        a, b, c = CLUSTER.replicas[:3]
        session = new_session("reattach")
        first = pause_on(a, session)
        first.conn.close()  # the client's connection breaks

        again = post(b, {"session_id": session}, {"Last-Event-ID": "1"})
        replayed = read_until(again, rb'"chunk_type":"confirmation_request"')
        status, _, _ = answer(c, session, "confirm")
        rest = read_to_end(again)

        self.assertEqual(again.status, 200)
        self.assertIn(b"id: 2\n", replayed)
        self.assertNotIn(b"id: 1\n", replayed)
        self.assertEqual(status, 200)
        self.assertEqual(chunk_types(rest)[-1], b"completion")

    def test_a_new_message_on_another_replica_supersedes_the_paused_run(self):
        a, b, _ = CLUSTER.replicas[:3]
        session = new_session("supersede")
        old = pause_on(a, session)

        new = post(b, {"message": "again; anew", "session_id": session})
        read_until(new, rb'"chunk_type":"confirmation_request"')
        ended = read_to_end(old)

        self.assertIn(b'"reason":"superseded"', ended)
        self.assertEqual(answer(CLUSTER.replicas[2], session, "cancel")[0], 200)
        self.assertIn(b'"reason":"user"', read_to_end(new))

    def test_a_client_posing_as_a_replica_is_refused(self):
        a = CLUSTER.replicas[0]
        for secret in ["guess", SECRET + "x"]:
            response = post(a, {"message": "hi"}, {"X-Chatgate-Cluster-Secret": secret})
            body = response.read().decode()
            self.assertEqual(response.status, 403)
            self.assertIn('"error_type":"forbidden_replica"', body)

    def test_kill_9_of_the_owner_while_paused_a_reply_elsewhere_resumes_the_run(self):
        doomed = CLUSTER.add("doomed")
        a, b = CLUSTER.replicas[:2]
        session = new_session("kill9")
        stream = pause_on(doomed, session)

        doomed.kill()
        stream.conn.close()
        time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
        status, chunk, _ = answer(a, session, "confirm")
        again = post(b, {"session_id": session}, {"Last-Event-ID": "2"})
        rest = read_to_end(again)
        second = answer(b, session, "confirm")

        self.assertEqual(status, 200, chunk)
        self.assertEqual(again.status, 200)
        self.assertEqual(chunk_types(rest), [b"confirmation_received", b"status", b"tool_output",
                                             b"status", b"tool_output", b"completion"])
        self.assertEqual(second[0], 404, "nothing runs twice: %r" % (second[1],))

    def test_replies_racing_a_takeover_are_forwarded_or_told_to_wait_never_404(self):
        # #40 item 18: while a dead owner's paused run is being taken over,
        # a reply elsewhere is taken, forwarded, told the pause was decided
        # (409), or told 503 with Retry-After: never 404. Each names the
        # pause, so a loser is told 409 even once the run has ended.
        a, b = CLUSTER.replicas[:2]
        for round in range(3):
            doomed = CLUSTER.add("doomed-race-%d" % round)
            session = new_session("race-takeover")
            stream = post(doomed, {"message": "build; ship", "session_id": session})
            seen = read_until(stream, rb'"chunk_type":"confirmation_request"')
            pause = re.search(rb'"confirmation_id":"([0-9a-f-]+)"', seen).group(1).decode()
            doomed.kill()
            stream.conn.close()
            time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
            barrier = threading.Barrier(6)
            results = []

            def reply(target):
                barrier.wait()
                status, chunk, response = answer(target, session, "confirm",
                                                 confirmation_id=pause)
                results.append((status, chunk, response.getheader("Retry-After")))

            threads = [threading.Thread(target=reply, args=(t,)) for t in (a, b) * 3]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)

            self.assertEqual(len(results), 6, results)
            for status, chunk, retry_after in results:
                self.assertIn(status, (200, 409, 503), chunk)
                if status == 503:
                    self.assertIsNotNone(retry_after, chunk)
            taken = [r[0] for r in results].count(200)
            deadline = time.monotonic() + 20
            while taken == 0 and time.monotonic() < deadline:
                # Every racer was told to wait: a retry is then taken once.
                time.sleep(0.3)
                status, chunk, _ = answer(a, session, "confirm", confirmation_id=pause)
                self.assertIn(status, (200, 409, 503), chunk)
                taken += status == 200
                if status == 409:
                    break
            self.assertEqual(taken, 1, results)

    def test_a_run_that_ended_on_a_killed_replica_shows_its_end_elsewhere(self):
        # Redis keeps an ended run's end (its final chunk) and of its record
        # only who the run was: a replica that takes the session over shows
        # the final chunk alone, the chunks before it announced as a gap.
        doomed = CLUSTER.add("doomed-ended")
        b = CLUSTER.replicas[1]
        session = new_session("ended-elsewhere")
        stream = pause_on(doomed, session)
        stream.conn.close()  # the client is gone before the end
        time.sleep(0.2)  # a pause a person could have left during
        status, chunk, _ = answer(doomed, session, "confirm")
        # Its end is in Redis (the run's hash has `ended`) before the kill.
        ended = (b"EVAL \"local r = redis.call('HGET', KEYS[1], 'run') "
                 b"if not r then return 0 end "
                 b"return redis.call('HEXISTS', 'chatgate:run:' .. r, 'ended')\" 1 "
                 b"chatgate:session:-:" + session.encode())
        end = time.monotonic() + 10
        while CLUSTER.redis.command(ended) != b":1":
            self.assertLess(time.monotonic(), end, "the run's end was never stored")
            time.sleep(0.05)

        doomed.kill()
        time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
        again = post(b, {"session_id": session}, {"Last-Event-ID": "2"})
        rest = read_to_end(again)

        self.assertEqual(status, 200, chunk)
        self.assertEqual(again.status, 200, rest)
        self.assertEqual(chunk_types(rest), [b"completion"])
        self.assertIn(b'"gap":true', rest)

    def test_a_reply_before_a_dead_owners_heartbeat_expires_is_told_how_long_to_wait(self):
        doomed = CLUSTER.add("doomed-early")
        a = CLUSTER.replicas[0]
        session = new_session("early")
        stream = pause_on(doomed, session)

        doomed.kill()
        stream.conn.close()
        early = answer(a, session, "confirm")
        wait = int(early[2].getheader("Retry-After"))
        time.sleep(wait + 0.3)  # what it said: the heartbeat has expired
        later = answer(a, session, "confirm")

        self.assertEqual(early[0], 503, early[1])
        self.assertEqual(early[1]["metadata"]["error_type"], "owner_unavailable")
        # What the dead owner's heartbeat had left, in whole seconds.
        self.assertTrue(1 <= wait <= OWNER_TTL, wait)
        self.assertEqual(later[0], 200, later[1])

    def test_a_decision_whose_work_a_kill_9_cut_short_goes_on_elsewhere(self):
        # Slow steps: the run is still working when its owner dies.
        doomed = CLUSTER.add("doomed-slow", ["--step-delay", "5s"])
        a, b = CLUSTER.replicas[:2]
        session = new_session("interrupted")
        stream = pause_on(doomed, session)

        status, _, _ = answer(a, session, "confirm")  # forwarded, recorded, acknowledged
        read_until(stream, rb'"chunk_type":"status"')
        doomed.kill()
        stream.conn.close()
        time.sleep(OWNER_TTL + 0.5)
        again = post(b, {"session_id": session}, {"Last-Event-ID": "2"})
        rest = read_to_end(again)
        late = answer(a, session, "confirm")

        self.assertEqual(status, 200)
        # The replica that takes it over goes on with it (#44): its steps
        # (simulated: no tool, nothing journaled) run on to the end.
        self.assertNotIn(b'"error_type":"interrupted"', rest)
        self.assertEqual(chunk_types(rest)[-1], b"completion", rest)
        self.assertIn(late[0], (404, 409), "its confirmation is never accepted again")

    def test_a_run_at_work_on_a_replica_thought_dead_finishes_there(self):
        # Two slow steps: the run is at work while its replica is frozen
        # past its TTL and another replica takes the session over.
        frozen = CLUSTER.add("frozen", ["--step-delay", "3s"])
        a, b = CLUSTER.replicas[:2]
        session = new_session("frozen")
        stream = pause_on(frozen, session)
        status, _, _ = answer(a, session, "confirm")
        read_until(stream, rb'"chunk_type":"status"')

        frozen.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(OWNER_TTL + 0.7)  # its heartbeat expires
            taken = post(b, {"session_id": session}, {"Last-Event-ID": "2"})
            taken_rest = read_to_end(taken)
        finally:
            frozen.process.send_signal(signal.SIGCONT)
        rest = read_to_end(stream)

        self.assertEqual(status, 200)
        # The taker goes on with it from its journal (#44); its steps are
        # simulated (no tool: nothing a second owner could do twice).
        self.assertEqual(chunk_types(taken_rest)[-1], b"completion", taken_rest)
        # Its own replica, back, finds its heartbeat lapsed, yet the run it
        # decided goes on to its end there: no stop that is no shutdown.
        self.assertEqual(chunk_types(rest)[-1], b"completion", rest)
        self.assertNotIn(b'"reason":"shutdown"', rest)

    def test_a_replica_stopping_hands_its_paused_run_over_at_once(self):
        leaving = CLUSTER.add("leaving")
        a, b = CLUSTER.replicas[:2]
        session = new_session("deploy")
        stream = pause_on(leaving, session)

        leaving.terminate()
        tail = read_to_end(stream)
        # No wait for the owner TTL: a stopping replica hands its runs back.
        again = post(a, {"session_id": session}, {"Last-Event-ID": "2"})
        status, _, _ = answer(b, session, "confirm")
        rest = read_to_end(again)

        self.assertIn(b"retry: ", tail)
        self.assertNotIn(b'"finished":true', tail)
        self.assertEqual(again.status, 200)
        self.assertEqual(status, 200)
        self.assertEqual(chunk_types(rest)[0], b"confirmation_received")
        self.assertEqual(chunk_types(rest)[-1], b"completion")


class SampleClientTests(unittest.TestCase):
    """The sample client behind round-robin rides out the kill -9 of the
    replica that holds its run: a cluster of its own, since one of the
    replicas behind nginx dies."""

    def setUp(self):
        self.cluster = Cluster()

    def tearDown(self):
        self.cluster.stop()

    def owner_of_the_paused_run(self):
        owners = [r for r in self.cluster.replicas if r.metric("chatgate_paused_runs") == 1]
        self.assertEqual(len(owners), 1, "one replica holds the paused run")
        return owners[0]

    def test_the_python_client_resumes_its_run_after_the_owner_is_killed(self):
        client = ChatGateClient(self.cluster.nginx.url)
        killed = []

        def on_confirmation(chunk):
            if not killed:
                owner = self.owner_of_the_paused_run()
                owner.kill()  # its stream breaks; its heartbeat lives on for the TTL
                killed.append(owner.name)
            return "confirm"

        started = time.monotonic()
        result = client.run("build; ship", on_confirmation=on_confirmation)
        took = time.monotonic() - started

        types = [c["chunk_type"] for c in result.chunks]
        self.assertEqual(len(killed), 1)
        self.assertEqual(result.outcome, "completed", result.final)
        self.assertEqual(types.count("confirmation_request"), 1)
        self.assertEqual(types.count("confirmation_received"), 1)
        self.assertEqual(types[-1], "completion")
        self.assertLess(took, OWNER_TTL + 15, "waited about the TTL, not more")
        survivors = [r for r in self.cluster.replicas if r.name not in killed]
        self.assertEqual(sum(r.decisions() for r in survivors), 1, "decided once, elsewhere")


    def test_the_python_client_re_attaches_after_the_owner_is_killed(self):
        client = ChatGateClient(self.cluster.nginx.url)
        session = new_session("sample")
        killed = []

        def on_confirmation(chunk):
            owner = self.owner_of_the_paused_run()
            owner.kill()
            killed.append(owner.name)
            # Somebody else answers, once another replica may take the run.
            later = threading.Timer(OWNER_TTL + 1.5, lambda: answer(self.cluster.nginx, session, "confirm"))
            later.start()
            return None  # stay silent here

        result = client.run("build; ship", session_id=session, on_confirmation=on_confirmation)

        types = [c["chunk_type"] for c in result.chunks]
        self.assertEqual(len(killed), 1)
        self.assertEqual(result.outcome, "completed", result.final)
        self.assertEqual(types.count("confirmation_request"), 1)
        self.assertEqual(types.count("confirmation_received"), 1)
        self.assertEqual(types[-1], "completion")


class ApiKeyTests(unittest.TestCase):
    """Replicas whose API keys are listed in different orders: a run stays
    in its own key's namespace wherever a request lands."""

    def setUp(self):
        self.cluster = Cluster(replicas=0, nginx=False)
        self.a = self.cluster.add("keys-a", ["--api-key", "first-key-0000", "--api-key", "second-key-000",
                                             "--approver-key", "approver-key-0"])
        self.b = self.cluster.add("keys-b", ["--api-key", "second-key-000", "--api-key", "first-key-0000",
                                             "--approver-key", "approver-key-0"])

    def tearDown(self):
        self.cluster.stop()

    def test_a_run_of_one_key_is_not_another_keys_on_a_replica_that_lists_them_differently(self):
        session = new_session("keys")
        second = {"Authorization": "Bearer second-key-000"}
        first = {"Authorization": "Bearer first-key-0000"}
        stream = post(self.a, {"message": "build; ship", "session_id": session}, second)
        read_until(stream, rb'"chunk_type":"confirmation_request"')

        # On b, first-key is where second-key is on a: it must find nothing.
        intruder = answer(self.b, session, "confirm", first)
        peek = post(self.b, {"session_id": session}, dict(first, **{"Last-Event-ID": "0"}))
        peek_status = peek.status
        peek.read()
        owner = answer(self.b, session, "confirm", second)

        self.assertEqual(intruder[0], 404, intruder[1])
        self.assertEqual(peek_status, 404)
        self.assertEqual(owner[0], 200, owner[1])
        self.assertEqual(chunk_types(read_to_end(stream))[-1], b"completion")


    def test_a_decided_pause_s_id_finds_its_run_on_any_replica_and_a_retry_is_told_who_decided(self):
        session = new_session("ids")
        first = {"Authorization": "Bearer first-key-0000"}
        approver = {"Authorization": "Bearer approver-key-0"}
        stream = post(self.a, {"message": "build; ship", "session_id": session}, first)
        seen = read_until(stream, rb'"stream_paused":true')
        first_id = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()

        # Round 1 decided on b (a modify): round 2 waits on a.
        status, chunk, _ = answer(self.b, session, "modify:more", approver, confirmation_id=first_id)
        self.assertEqual(status, 200, chunk)
        seen = read_until(stream, rb'"stream_paused":true')
        second_id = re.findall(rb'"confirmation_id":"([0-9a-f-]{36})"', seen)[-1].decode()
        self.assertNotEqual(first_id, second_id)

        # The decided round's id still finds the run from b, to re-attach...
        conn = connect(self.b)
        conn.request("POST", STREAM_PATH, body=json.dumps({"session_id": session, "confirmation_id": first_id}),
                     headers=dict({"Content-Type": "application/json", "Last-Event-ID": "0"}, **approver))
        attached = conn.getresponse()
        replay = read_until(attached, rb'"stream_paused":true(.|\n)*"stream_paused":true')
        conn.close()
        self.assertEqual(attached.status, 200)
        self.assertIn(b'"action":"modify"', replay)
        # ...and the same reply sent again, on either replica, is told what
        # was decided and by whom.
        for replica in (self.b, self.a):
            status, chunk, _ = answer(replica, session, "modify:more", approver, confirmation_id=first_id)
            self.assertEqual(status, 409, chunk)
            self.assertEqual(chunk["metadata"]["error_type"], "already_decided")
            self.assertEqual(chunk["metadata"]["action"], "modify")
            self.assertEqual(chunk["metadata"]["decided_by"], "approver-1")
        # (The approver's re-attach took the run's one stream over.)
        status, chunk, _ = answer(self.b, session, "confirm", approver, confirmation_id=second_id)
        self.assertEqual(status, 200, chunk)
        stream.conn.close()

    def test_an_approver_on_another_replica_lists_and_decides_each_key_s_pause(self):
        session = new_session("appr")
        first = {"Authorization": "Bearer first-key-0000"}
        second = {"Authorization": "Bearer second-key-000"}
        approver = {"Authorization": "Bearer approver-key-0"}
        streams, ids = [], []
        for key in (first, second):
            stream = post(self.a, {"message": "build; ship", "session_id": session}, key)
            seen = read_until(stream, rb'"stream_paused":true')
            ids.append(re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode())
            streams.append(stream)

        conn = connect(self.b)
        conn.request("GET", "/api/v1/interactions", headers=approver)
        response = conn.getresponse()
        listing = [i for i in json.loads(response.read())["interactions"] if i["session_id"] == session]
        conn.close()
        # Key labels are places in each replica's own list: b calls the
        # second key key-1. The pause is named by its id.
        status, chunk, _ = answer(self.b, session, "confirm", approver, confirmation_id=ids[1])
        refused = post(self.b, {"message": "build", "session_id": new_session("no")}, approver)
        refused_status = refused.status
        refused.read()

        self.assertEqual(response.status, 200)
        self.assertEqual(sorted(i["confirmation_id"] for i in listing), sorted(ids))
        self.assertEqual(sorted(i["key"] for i in listing), ["key-1", "key-2"])
        self.assertEqual(status, 200, chunk)
        self.assertEqual(refused_status, 403)
        # The approved run went on; the other still waits for its yes.
        done = chunk_types(read_to_end(streams[1]))
        self.assertEqual(done[-1], b"completion")
        still = answer(self.b, session, "confirm", first)
        self.assertEqual(still[0], 200, still[1])
        self.assertEqual(chunk_types(read_to_end(streams[0]))[-1], b"completion")


WEBHOOK_SECRET = "replicas-webhook-secret-0123"


sys.path.insert(0, os.path.join(ROOT, "examples"))
from webhook_receiver import verify  # noqa: E402  (the documented check, tested here)


class Receiver:
    """A webhook receiver on loopback: checks every signature, answers 500
    to the first ``fail_first`` deliveries, records the rest."""

    def __init__(self, fail_first=0):
        import http.server
        receiver = self
        self.lock = threading.Lock()
        self.attempts = []  # (delivery id, status answered)
        self.bodies = {}    # delivery id -> body, for those answered 200
        self.unsigned = 0
        self.fail_left = fail_first

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                signed = verify(WEBHOOK_SECRET, self.headers.get("X-Chatgate-Signature", ""), body)
                delivery = self.headers.get("X-Chatgate-Delivery")
                with receiver.lock:
                    if not signed:
                        receiver.unsigned += 1
                    status = 200
                    if receiver.fail_left > 0:
                        receiver.fail_left -= 1
                        status = 500
                    receiver.attempts.append((delivery, status))
                    if status == 200:
                        receiver.bodies.setdefault(delivery, json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/hook" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivered(self):
        with self.lock:
            return dict(self.bodies)

    def wait_for(self, count, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(self.delivered()) >= count:
                return self.delivered()
            time.sleep(0.05)
        raise AssertionError("%d of %d events delivered: %r" % (len(self.delivered()), count, self.attempts))

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class WebhookTests(unittest.TestCase):
    """Three replicas announce to one receiver: each event once per cluster
    (a second delivery only after a failed one), whoever holds the run."""

    def setUp(self):
        self.receiver = Receiver(fail_first=2)
        extra = ["--webhook", self.receiver.url, "--webhook-secret", WEBHOOK_SECRET,
                 "--public-url", "https://gate.example"]
        self.cluster = Cluster(extra=extra)

    def tearDown(self):
        self.cluster.stop()
        self.receiver.stop()

    def test_each_event_is_delivered_once_per_cluster_in_order_per_session(self):
        nginx = self.cluster.nginx
        sessions = [new_session("hook") for _ in range(6)]
        streams = [pause_on(nginx, session) for session in sessions]
        # Decided through nginx: each reply lands on any replica.
        for i, session in enumerate(sessions):
            status, chunk, _ = answer(nginx, session, "confirm" if i % 2 else "cancel")
            self.assertEqual(status, 200, chunk)
        for stream in streams:
            read_to_end(stream)
        delivered = self.receiver.wait_for(18)
        time.sleep(1.5)  # anything sent twice would arrive by now

        with self.receiver.lock:
            attempts = list(self.receiver.attempts)
        self.assertEqual(self.receiver.unsigned, 0)
        self.assertEqual(len(self.receiver.delivered()), 18)
        # Each id answered 200 exactly once; repeats only after a 500.
        ok = [d for d, status in attempts if status == 200]
        self.assertEqual(len(ok), len(set(ok)), attempts)
        self.assertEqual(len(attempts), 20, attempts)
        for i, session in enumerate(sessions):
            events = [b for b in delivered.values() if b["session_id"] == session]
            order = [d for d, status in attempts if status == 200 and delivered[d]["session_id"] == session]
            types = [delivered[d]["type"] for d in order]
            self.assertEqual(types, ["interaction.requested", "interaction.decided", "run.ended"], session)
            decided = next(b for b in events if b["type"] == "interaction.decided")
            self.assertEqual(decided["data"]["action"], "confirm" if i % 2 else "cancel")
            self.assertEqual(decided["decide_url"], "https://gate.example/#session=" + session)
            self.assertEqual(len({b["confirmation_id"] for b in events}), 1)
        failed = sum(r.metric("chatgate_webhook_deliveries_total", 'outcome="failed"')
                     for r in self.cluster.replicas)
        self.assertEqual(failed, 2)

    def test_events_a_killed_replica_queued_are_sent_by_the_others(self):
        owner = self.cluster.replicas[0]
        session = new_session("hook-k9")
        stream = pause_on(owner, session)
        # Its requested event may be sent already, or not yet: either way
        # it is in Redis, and another replica sends what is left.
        owner.kill()
        stream.conn.close()
        time.sleep(OWNER_TTL + 0.5)  # its heartbeat expires
        status, chunk, _ = answer(self.cluster.replicas[1], session, "confirm")
        self.assertEqual(status, 200, chunk)
        try:
            # The killed replica may have taken the first event to send:
            # the others send it once its lease (15 s) is over.
            delivered = self.receiver.wait_for(3, timeout=45)
        except AssertionError:
            for r in self.cluster.replicas:
                print(r.name, r.logs()[-3000:])
            raise
        types = sorted(b["type"] for b in delivered.values() if b["session_id"] == session)
        self.assertEqual(types, ["interaction.decided", "interaction.requested", "run.ended"])


class DeadOwnerExpiryTests(unittest.TestCase):
    """A pause whose owner died, and that nobody asks about, still expires:
    a live replica takes it over at its expiry and announces it, once."""

    def setUp(self):
        self.receiver = Receiver()
        extra = ["--webhook", self.receiver.url, "--webhook-secret", WEBHOOK_SECRET,
                 "--confirm-timeout", "4s"]
        self.cluster = Cluster(nginx=False, extra=extra)

    def tearDown(self):
        self.cluster.stop()
        self.receiver.stop()

    def test_a_dead_owner_s_pause_expires_on_a_live_replica_and_is_announced_once(self):
        owner = self.cluster.replicas[0]
        session = new_session("expire-k9")
        stream = pause_on(owner, session)
        owner.kill()
        stream.conn.close()

        # requested (sent by the owner, or by another replica from Redis),
        # then expired and ended from whichever replica took the pause over.
        delivered = self.receiver.wait_for(3)
        time.sleep(2)  # a second announcement, from another sweeper, would arrive by now
        events = [b for b in self.receiver.delivered().values() if b["session_id"] == session]
        types = sorted(b["type"] for b in events)
        attached = post(self.cluster.replicas[1], {"session_id": session}, {"Last-Event-ID": "0"})
        rest = read_to_end(attached)

        self.assertEqual(len(delivered), 3)
        self.assertEqual(types, ["interaction.expired", "interaction.requested", "run.ended"])
        expired = next(b for b in events if b["type"] == "interaction.expired")
        self.assertEqual(expired["data"]["reason"], "timeout")
        self.assertEqual(expired["data"]["timeout_seconds"], 4)
        ended = next(b for b in events if b["type"] == "run.ended")
        self.assertEqual(ended["data"]["reason"], "timeout")
        # Its end is there to read, on any replica.
        self.assertEqual(attached.status, 200)
        self.assertIn(b'"reason":"timeout"', rest)


MCP_PYTHON = os.path.join(ROOT, "tests", "mcp", ".venv", "bin", "python")


@unittest.skipUnless(os.path.exists(MCP_PYTHON), "needs tests/mcp/setup.sh (run by .ci/run first)")
class McpTests(unittest.TestCase):
    """Each replica runs its own copy of an MCP server: a call runs on the
    replica that holds its run, and the server's question is answered
    through another one (forwarded to the holder)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="chatgate-mcp-")
        self.log = os.path.join(self.dir, "asker.log")
        tools = os.path.join(self.dir, "tools.toml")
        with open(tools, "w") as f:
            f.write('[[mcp]]\nname = "ask"\ncommand = [%s, %s, "--log", %s]\n' % (
                json.dumps(MCP_PYTHON), json.dumps(os.path.join(ROOT, "tests", "mcp", "servers", "asker.py")),
                json.dumps(self.log)))
        self.cluster = Cluster(nginx=False, extra=["--tools", tools, "--approver-key", "approver-key-0",
                                                   "--api-key", "requester-key0"])
        self.key = {"Authorization": "Bearer requester-key0"}
        self.approver = {"Authorization": "Bearer approver-key-0"}

    def tearDown(self):
        self.cluster.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_a_server_s_question_asked_on_a_is_answered_on_b(self):
        a, b, c = self.cluster.replicas[:3]
        session = new_session("mcp")
        stream = post(a, {"message": 'ask__deploy {"service": "web"}', "session_id": session}, self.key)
        read_until(stream, rb'"chunk_type":"confirmation_request"')
        confirmed = answer(c, session, "confirm", self.key)
        seen = read_until(stream, rb'"chunk_type":"input_request"[^\n]*"stream_paused":true')
        question = re.findall(rb'"confirmation_id":"([0-9a-f-]{36})"', seen)[-1].decode()
        # The server's question is in memory on a, and every replica lists it.
        listings = []
        for replica in (b, c):
            conn = connect(replica)
            conn.request("GET", "/api/v1/interactions", headers=self.approver)
            listings.append([i["confirmation_id"] for i in json.loads(conn.getresponse().read())["interactions"]
                             if i["session_id"] == session])
            conn.close()
        refused = answer(b, session, "answer", self.key, answers={"region": "mars", "replicas": 2})
        # An approver names it by its id, on another replica.
        answered = answer(c, session, "answer", self.approver, confirmation_id=question,
                          answers={"region": "us-east", "replicas": 2})
        rest = read_to_end(stream)
        self.assertEqual(listings, [[question], [question]])

        self.assertEqual(confirmed[0], 200, confirmed[1])
        self.assertEqual(refused[0], 422, refused[1])
        self.assertEqual(answered[0], 200, answered[1])
        self.assertEqual(answered[1]["metadata"]["answers"], {"region": "us-east", "replicas": 2})
        self.assertEqual(chunk_types(rest)[-1], b"completion")
        self.assertIn(b"deployed web to us-east x2", rest)
        with open(self.log) as f:
            self.assertEqual(f.read().splitlines(), ["deployed web to us-east x2"])
        stream.conn.close()


    def test_a_server_s_question_whose_owner_dies_ends_interrupted_where_it_is_taken_over(self):
        a, b = self.cluster.replicas[:2]
        session = new_session("mcp-dead")
        stream = post(a, {"message": 'ask__deploy {"service": "web"}', "session_id": session}, self.key)
        read_until(stream, rb'"chunk_type":"confirmation_request"')
        self.assertEqual(answer(b, session, "confirm", self.key)[0], 200)
        read_until(stream, rb'"chunk_type":"input_request"')
        a.kill()
        stream.conn.close()

        # Once a's heartbeat runs out, b takes the run over: the question
        # lived in a's memory, so the run ends `interrupted` there.
        deadline = time.monotonic() + 30
        reply = answer(b, session, "answer", self.key, answers={"region": "us-east", "replicas": 2})
        while reply[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            reply = answer(b, session, "answer", self.key, answers={"region": "us-east", "replicas": 2})
        attached = post(b, {"session_id": session}, dict(self.key, **{"Last-Event-ID": "0"}))
        rest = read_to_end(attached)

        self.assertEqual(reply[0], 404, reply[1])
        self.assertEqual(attached.status, 200)
        self.assertEqual(chunk_types(rest)[-1], b"error")
        self.assertIn(b'"error_type":"interrupted"', rest)
        self.assertFalse(os.path.exists(self.log) and open(self.log).read().strip())


class ReplicaIdTests(unittest.TestCase):
    def test_two_replicas_given_one_id_are_told_in_the_log(self):
        cluster = Cluster(replicas=0, nginx=False)
        self.addCleanup(cluster.stop)
        first = cluster.add("twin")
        second = cluster.add("twin")

        deadline = time.monotonic() + 10
        said = []
        while time.monotonic() < deadline and not said:
            time.sleep(0.2)
            said = [r for r in (first, second) if "share --replica-id" in r.logs()]

        self.assertTrue(said, first.logs() + second.logs())
        # Said once, not at every beat.
        time.sleep(1.5)
        self.assertEqual(said[0].logs().count("share --replica-id"), 1)


class RedisOutageTests(unittest.TestCase):
    """Redis stopped and started again (its data kept), two replicas."""

    def setUp(self):
        self.cluster = Cluster(replicas=2, nginx=False, extra=["--confirm-timeout", "6s"])

    def tearDown(self):
        self.cluster.stop()

    def test_decisions_wait_for_redis_and_runs_go_on_when_it_is_back(self):
        a, b = self.cluster.replicas
        session = new_session("outage")
        stream = pause_on(a, session)

        self.cluster.redis.stop()
        here = answer(a, session, "confirm")
        there = answer(b, session, "confirm")
        readyz = status_of(a.url + "/readyz")
        # The stream stays open meanwhile: keep-alives go on.
        read_until(stream, rb": keep-alive\n\n")
        self.cluster.redis.start()
        for replica in (a, b):
            wait_for(replica.url + "/readyz")
        # Not taken, or not known yet and settled once Redis is back: either
        # way a retry is answered once that is done.
        after = answer(b, session, "confirm")
        deadline = time.monotonic() + 10
        while after[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            after = answer(b, session, "confirm")
        rest = read_to_end(stream)

        # The owner's connection to Redis broke under the reply: whether
        # Redis ran the command is not known (504); the other replica could
        # not even look the run up (503, not taken).
        self.assertIn(here[0], (503, 504), here[1])
        self.assertIn(
            here[1]["metadata"]["error_type"], ("store_unavailable", "outcome_unknown")
        )
        self.assertEqual(there[0], 503, there[1])
        self.assertEqual(there[1]["metadata"]["error_type"], "store_unavailable")
        self.assertEqual(there[2].getheader("Retry-After"), "1")
        self.assertEqual(readyz[0], 503)
        self.assertEqual(readyz[1]["status"], "store_unavailable")
        self.assertIn("redis://", readyz[1]["store"])
        # Redis stopped before it could run the first reply: it never took
        # effect, and the retry is the one decision.
        self.assertEqual(after[0], 200, after[1])
        self.assertEqual(chunk_types(rest).count(b"confirmation_received"), 1)
        self.assertEqual(chunk_types(rest)[-1], b"completion")

    def test_a_run_whose_record_redis_lost_ends_with_one_error_and_nothing_runs(self):
        a, b = self.cluster.replicas
        session = new_session("lost")
        stream = pause_on(a, session)

        self.cluster.redis.command(b"FLUSHALL")  # as a Redis restarted without its data
        elsewhere = answer(b, session, "confirm")  # no record tells b where the run is
        lost = answer(a, session, "confirm")
        rest = read_to_end(stream)
        again = answer(a, session, "confirm")

        self.assertEqual(elsewhere[0], 404, elsewhere[1])
        self.assertEqual(lost[0], 503, lost[1])
        self.assertEqual(lost[1]["metadata"]["error_type"], "store_unavailable")
        self.assertIn("no longer has this run's record", lost[1]["chunk"])
        finals = [t for t in re.findall(rb'"finished":(true|false)', rest) if t == b"true"]
        self.assertEqual(len(finals), 1, rest)
        self.assertEqual(chunk_types(rest)[-1], b"error")
        self.assertIn(b'"error_type":"store_unavailable"', rest)
        self.assertNotIn(b"tool_output", rest, "nothing ran")
        self.assertEqual(again[0], 404, again[1])

    def test_a_pause_times_out_as_usual_while_redis_is_down(self):
        a, _ = self.cluster.replicas
        session = new_session("timeout")
        stream = pause_on(a, session)

        self.cluster.redis.stop()
        rest = read_to_end(stream)
        self.cluster.redis.start()

        self.assertIn(b'"reason":"timeout"', rest)
        self.assertEqual(chunk_types(rest)[-1], b"cancelled")


if __name__ == "__main__":
    unittest.main()


class StallableProxy:
    """A TCP proxy in front of Redis that the test can stall: what a
    replica sends waits in it, as in a network that stops moving bytes,
    while the other replicas reach Redis directly."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = "redis://127.0.0.1:%d/0" % self.port
        self.flowing = threading.Event()
        self.flowing.set()
        self.sockets = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(source, sink), daemon=True).start()

    def pump(self, source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stall(self):
        self.flowing.clear()

    def flow(self):
        self.flowing.set()

    def close(self):
        self.flowing.set()
        self.listener.close()
        for s in self.sockets:
            s.close()


class StalledOwnerTests(unittest.TestCase):
    """An owner whose link to Redis stalls past its lease, while another
    replica reaches Redis: the other takes the run over, and the old owner
    must never wait on, list or serve that pause again."""

    def setUp(self):
        self.cluster = Cluster(replicas=0, nginx=False)
        self.proxy = StallableProxy(self.cluster.redis.port)
        self.addCleanup(self.proxy.close)
        extra = ["--confirm-timeout", "30s"]
        self.a = Replica(self.proxy, "stall-a", extra)
        self.b = Replica(self.cluster.redis, "stall-b", extra)
        self.cluster.replicas += [self.a, self.b]

    def tearDown(self):
        self.cluster.stop()

    def test_a_reply_taken_over_during_a_stall_leaves_no_zombie_pause_on_the_old_owner(self):
        session = new_session("zombie")
        stream = post(self.a, {"message": "build; ship", "session_id": session})
        seen = read_until(stream, rb'"stream_paused":true')
        pause = re.search(rb'"confirmation_id":"([0-9a-f-]{36})"', seen).group(1).decode()

        self.proxy.stall()
        here = answer(self.a, session, "confirm", confirmation_id=pause)
        # The owner cannot be reached through Redis' eyes once its heartbeat
        # runs out: until then the other replica says when to retry.
        deadline = time.monotonic() + 30
        there = answer(self.b, session, "confirm", confirmation_id=pause)
        while there[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            there = answer(self.b, session, "confirm", confirmation_id=pause)
        self.proxy.flow()
        rest = read_to_end(stream)
        conn = connect(self.a)
        conn.request("GET", "/api/v1/interactions")
        listed = json.loads(conn.getresponse().read())["interactions"]
        conn.close()
        again = answer(self.a, session, "confirm", confirmation_id=pause)

        self.assertEqual(here[0], 504, here[1])
        self.assertEqual(there[0], 200, there[1])
        # The old owner handed its copy over: its stream ends with `retry:`
        # (no final chunk of its own), it lists nothing, and a reply sent
        # to it again goes to the new owner, which says it was decided.
        self.assertIn(b"retry:", rest)
        self.assertNotIn(b'"finished":true', rest)
        self.assertEqual([i for i in listed if i["session_id"] == session], [])
        self.assertEqual(again[0], 409, again[1])
        self.assertEqual(again[1]["metadata"]["error_type"], "already_decided")
