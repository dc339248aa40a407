"""The A2A face (#45) driven by the A2A Python SDK's own client (PyPI
`a2a-sdk`, pinned in requirements.txt): it resolves the agent card, starts
a task, sees INPUT_REQUIRED with the card's data part, answers it, sees
COMPLETED with artifacts; streams; cancels; receives push status updates
with its token; a pause decided elsewhere is refused here with chatgate's
error_type; a quorum's pause is AUTH_REQUIRED for the requester.

Run by .ci/run in its own venv:

    python3 -m venv tests/faces/.venv
    tests/faces/.venv/bin/pip install -r tests/faces/requirements.txt
    CHATGATE_BIN=target/debug/chatgate tests/faces/.venv/bin/python -m unittest discover -s tests/faces -p 'test_a2a.py'

Every server and receiver listens on 127.0.0.1 and is stopped at the end.
"""

import asyncio
import http.server
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request
import uuid

import httpx
from google.protobuf import json_format

from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    SendMessageRequest,
    TaskNotCancelableError,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("CHATGATE_BIN") or os.path.join(ROOT, "target", "debug", "chatgate")
WAIT = 20

KEYS = """\
agent-key-000001 label=ci-bot
approver lead-key-000001 label=lead-1 groups=leads
approver lead-key-000002 label=lead-2 groups=leads
"""

TOOLS = """
[[tool]]
name = "deploy"
description = "Deploy to production"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.process = subprocess.Popen(
            [BIN, "--bind", "127.0.0.1:%d" % self.port, "--workers", "1", "--step-delay", "0ms",
             *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("chatgate did not come up")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=15)


class Receiver(http.server.ThreadingHTTPServer):
    """Push notifications: every POST's token header and JSON body."""

    def __init__(self):
        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.seen.append((self.headers.get("x-a2a-notification-token"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/push" % self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


def message(text=None, data=None, task_id=None, context_id=None):
    part = {"text": text} if text is not None else {"data": data}
    body = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [part]}
    if task_id:
        body["taskId"] = task_id
    if context_id:
        body["contextId"] = context_id
    return json_format.ParseDict(body, Message())


def card_of(task):
    """The pause's card: the data part of the task's status message."""
    for part in task.status.message.parts:
        if part.HasField("data"):
            return json_format.MessageToDict(part)["data"]
    return None


def setUpModule():
    global SERVER, KEYED, DIR
    DIR = tempfile.mkdtemp(prefix="chatgate-a2a-")
    with open(os.path.join(DIR, "keys.txt"), "w") as f:
        f.write(KEYS)
    with open(os.path.join(DIR, "tools.toml"), "w") as f:
        f.write(TOOLS)
    SERVER = Server()
    KEYED = Server("--api-keys-file", os.path.join(DIR, "keys.txt"),
                   "--tools", os.path.join(DIR, "tools.toml"))


def tearDownModule():
    SERVER.stop()
    KEYED.stop()


class A2aTests(unittest.IsolatedAsyncioTestCase):
    async def client(self, streaming=False, key=None, server=None):
        server = server or SERVER
        headers = {"Authorization": "Bearer " + key} if key else {}
        http_client = httpx.AsyncClient(headers=headers, timeout=WAIT)
        self.addAsyncCleanup(http_client.aclose)
        config = ClientConfig(streaming=streaming, httpx_client=http_client)
        return await create_client(server.url, client_config=config)

    async def send(self, client, msg, **configuration):
        request = SendMessageRequest(message=msg)
        for name, value in configuration.items():
            getattr(request.configuration, name).CopyFrom(value)
        responses = [r async for r in client.send_message(request)]
        self.assertEqual(len(responses), 1)
        return responses[0].task

    async def test_a_task_waits_for_input_is_answered_and_completes_with_artifacts(self):
        client = await self.client()
        task = await self.send(client, message("create a report; email it"))
        self.assertEqual(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED)
        card = card_of(task)
        self.assertEqual(card["kind"], "approval")
        self.assertEqual(len(card["tasks"]), 2)
        self.assertIn("response_schema", card["tasks"][0])
        self.assertIn("expires_at", card)
        self.assertEqual(task.context_id, task.context_id.strip())

        answer = {"decisions": [{"index": 1, "decision": "approve"},
                                {"index": 2, "decision": "reject", "reason": "not now"}]}
        done = await self.send(client, message(data=answer, task_id=task.id))
        self.assertEqual(done.status.state, TaskState.TASK_STATE_COMPLETED)
        self.assertEqual([a.name for a in done.artifacts], ["create", "email"])
        self.assertIn("rejected: not now", done.artifacts[1].parts[0].text)

        fetched = await client.get_task(GetTaskRequest(id=task.id))
        self.assertEqual(fetched.status.state, TaskState.TASK_STATE_COMPLETED)
        listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
        self.assertEqual([t.id for t in listed.tasks], [task.id])

        with self.assertRaises(A2AError):
            await self.send(client, message(data={"action": "confirm"}, task_id=task.id))

    async def test_a_stream_shows_the_pause_and_goes_on_when_it_is_answered(self):
        streaming = await self.client(streaming=True)
        answering = await self.client()
        states = []
        stream = streaming.send_message(SendMessageRequest(message=message("create a report")))
        async for event in stream:
            if event.HasField("task"):
                task_id = event.task.id
                states.append(event.task.status.state)
            elif event.HasField("status_update"):
                states.append(event.status_update.status.state)
            if states[-1] == TaskState.TASK_STATE_INPUT_REQUIRED:
                await self.send(answering, message(data={"action": "confirm"}, task_id=task_id))
            if states[-1] == TaskState.TASK_STATE_COMPLETED:
                break
        self.assertIn(TaskState.TASK_STATE_INPUT_REQUIRED, states)
        self.assertEqual(states[-1], TaskState.TASK_STATE_COMPLETED)

    async def test_push_configs_get_the_status_updates_with_their_token(self):
        receiver = Receiver()
        self.addCleanup(receiver.shutdown)
        client = await self.client()
        push = json_format.ParseDict({"url": receiver.url, "token": "t-123"},
                                     TaskPushNotificationConfig())
        task = await self.send(client, message("create a report"),
                               task_push_notification_config=push)
        await self.send(client, message(data={"action": "confirm"}, task_id=task.id))
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            states = [b["statusUpdate"]["status"]["state"] for _, b in receiver.seen
                      if "statusUpdate" in b]
            if "TASK_STATE_COMPLETED" in states:
                break
            await asyncio.sleep(0.05)
        self.assertIn("TASK_STATE_INPUT_REQUIRED", states)
        self.assertEqual(states[-1], "TASK_STATE_COMPLETED")
        self.assertTrue(all(token == "t-123" for token, _ in receiver.seen))
        self.assertTrue(all(b["statusUpdate"]["taskId"] == task.id
                            for _, b in receiver.seen if "statusUpdate" in b))

    async def test_a_pause_decided_on_the_chat_endpoint_is_refused_here(self):
        client = await self.client()
        task = await self.send(client, message("create a report; email it"))
        cid = card_of(task)["confirmation_id"]
        body = json.dumps({"message": "CONFIRM_ACTION:decide", "session_id": task.context_id,
                           "confirmation_id": cid,
                           "decisions": [{"index": 1, "decision": "approve"}]}).encode()
        request = urllib.request.Request(SERVER.url + "/api/v1/chat/stream", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            self.assertEqual(response.status, 200)
        again = {"decisions": [{"index": 1, "decision": "reject"}]}
        with self.assertRaises(A2AError) as refused:
            await self.send(client, message(data=again, task_id=task.id))
        self.assertEqual(refused.exception.data, {"error_type": "already_decided"})

        cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
        self.assertEqual(cancelled.status.state, TaskState.TASK_STATE_CANCELED)
        with self.assertRaises(TaskNotCancelableError):
            await client.cancel_task(CancelTaskRequest(id=task.id))

    async def test_a_quorum_pause_is_auth_required_and_decided_by_two_others(self):
        requester = await self.client(key="agent-key-000001", server=KEYED)
        task = await self.send(requester, message("deploy web"))
        self.assertEqual(task.status.state, TaskState.TASK_STATE_AUTH_REQUIRED)
        with self.assertRaises(A2AError) as refused:
            await self.send(requester, message(data={"action": "confirm"}, task_id=task.id))
        self.assertEqual(refused.exception.data, {"error_type": "self_approval"})

        first = await self.client(key="lead-key-000001", server=KEYED)
        one = await self.send(first, message(data={"action": "confirm"}, task_id=task.id))
        self.assertEqual(one.status.state, TaskState.TASK_STATE_AUTH_REQUIRED)
        second = await self.client(key="lead-key-000002", server=KEYED)
        done = await self.send(second, message(data={"action": "confirm"}, task_id=task.id))
        self.assertEqual(done.status.state, TaskState.TASK_STATE_COMPLETED)


if __name__ == "__main__":
    unittest.main()
