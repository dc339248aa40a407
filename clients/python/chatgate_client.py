#!/usr/bin/env python3
"""chatgate client: stream a chat message, answer confirmation requests and questions.

Standard library only, Python 3.9+. Use it as a module::

    from chatgate_client import ChatGateClient

    client = ChatGateClient("http://127.0.0.1:8080")
    result = client.run("create a report; then email it",
                        on_chunk=print,
                        on_confirmation=lambda chunk: "confirm",
                        on_question=lambda chunk: {"region": "eu-west"})
    print(result.outcome, result.final["chunk"])

or as a command line (see ``--help``)::

    python3 chatgate_client.py --url http://127.0.0.1:8080 --reply confirm "create a report"

Exit codes of the command line: 0 completed, 2 cancelled (user, timeout,
superseded, ...), 1 error (an HTTP error chunk, a failed task, a connection
failure). A one-line reason goes to stderr.
"""

import argparse
import codecs
import datetime
import http.client
import json
import os
import queue
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

__all__ = [
    "ChatGateClient",
    "ChatGateError",
    "StreamBroken",
    "ChunkStream",
    "RunResult",
    "SSEParser",
    "Event",
    "parse_reply",
    "decision",
    "ASK_AGAIN",
]

STREAM_PATH = "/api/v1/chat/stream"
INBOX_PATH = "/api/v1/interactions"
RUNS_PATH = "/api/v1/runs"
GRANTS_PATH = "/api/v1/grants"
CONFIRM_PREFIX = "CONFIRM_ACTION"
#: Seconds without any byte (chunk or keep-alive comment) before a stream is
#: considered dead. The server writes a keep-alive every 15 s by default.
DEFAULT_READ_TIMEOUT = 90.0
#: Seconds before the first re-attach; the n-th waits n times this.
REATTACH_BACKOFF = 0.2
#: Times :meth:`ChatGateClient.run` re-attaches to a run whose stream broke
#: before its final chunk, without a chunk arriving in between.
DEFAULT_REATTACH_ATTEMPTS = 3
#: Times a re-attach is tried, ``retry:`` apart, after the server said it was
#: restarting (a run suspended to a durable store).
RESTART_ATTEMPTS = 30
#: A reply refused with 503 and one of these was not taken (the server's
#: store or the replica holding the run was out of reach for a moment): it
#: is sent again, ``Retry-After`` apart, up to ``REPLY_ATTEMPTS`` times.
RETRYABLE_REPLY_ERRORS = ("store_unavailable", "owner_unavailable", "shutting_down")
#: A reply whose outcome is not known (504 ``outcome_unknown``, or a 502 or
#: 504 of a proxy in front) is sent again too: if the first was taken after
#: all, the server answers ``already_decided``, and the run's stream shows
#: the decision that stands.
UNKNOWN_OUTCOME_STATUSES = (502, 504)
REPLY_ATTEMPTS = 5
#: Seconds the cancel the command line sends on Ctrl-C may take.
CANCEL_TIMEOUT = 2.0
#: Times :meth:`ChatGateClient.run` asks ``on_question`` (or
#: ``on_confirmation``) again for one pause after the server refused its
#: answer as it stands (422).
QUESTION_ATTEMPTS = 3
#: The chunk types of a pause: a plan to confirm, or questions.
PAUSES = ("confirmation_request", "input_request")


class Event:
    """One Server-Sent Event: ``data`` joined by newlines, ``id``, ``event``."""

    __slots__ = ("data", "id", "event")

    def __init__(self, data, id=None, event="message"):
        self.data = data
        self.id = id
        self.event = event

    def __repr__(self):
        return "Event(data=%r, id=%r, event=%r)" % (self.data, self.id, self.event)


class SSEParser:
    """Incremental SSE parser following the WHATWG rules.

    Feed it bytes as they arrive, in pieces of any size; it yields complete
    events. It decodes UTF-8 itself (a character split across reads is kept
    until complete), accepts LF, CRLF and CR line ends (a CR at the end of one
    read and an LF at the start of the next are one line end), joins multiple
    ``data:`` lines with newlines, and skips comments (lines starting ``:``).
    """

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # text not yet ending in a line end
        self._skip_lf = False  # the previous piece ended in CR
        self._data = []
        self._id = None
        self._event = ""
        self.last_event_id = None
        #: The reconnection time the server asked for (``retry:``), in ms.
        self.retry = None
        self._first = True

    def feed(self, raw):
        """Consume ``raw`` bytes; return the list of events they completed."""
        text = self._decoder.decode(raw)
        if self._first and text:
            self._first = False
            if text.startswith("\ufeff"):
                text = text[1:]
        if self._skip_lf and text.startswith("\n"):
            text = text[1:]
        self._skip_lf = False
        events = []
        buf = self._pending + text
        start = 0
        i = 0
        n = len(buf)
        while i < n:
            ch = buf[i]
            if ch == "\n" or ch == "\r":
                line = buf[start:i]
                if ch == "\r":
                    if i + 1 < n:
                        if buf[i + 1] == "\n":
                            i += 1
                    else:
                        self._skip_lf = True
                event = self._line(line)
                if event is not None:
                    events.append(event)
                start = i + 1
            i += 1
        self._pending = buf[start:]
        return events

    def _line(self, line):
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "event":
            self._event = value
        elif field == "retry" and value.isdigit():
            self.retry = int(value)
        # Unknown fields are ignored.
        return None

    def _dispatch(self):
        if self._id is not None:
            self.last_event_id = self._id
        if not self._data:
            self._event = ""
            self._id = None
            return None
        event = Event("\n".join(self._data), self._id, self._event or "message")
        self._data = []
        self._event = ""
        self._id = None
        return event


class ChatGateError(Exception):
    """A request failed before or outside the stream (connection, bad response)."""


class StreamBroken(ChatGateError):
    #: Milliseconds the server asked to wait before coming back (its
    #: ``retry:`` line when it suspended the run for a restart), or None.
    retry = None

    """A stream ended before its final chunk: the connection broke, closed or
    went silent. The run itself may live on; it can be re-attached."""


class RunResult:
    """How a run ended: ``outcome`` is ``completed``, ``cancelled`` or ``error``."""

    def __init__(self, final, chunks, status, session_id):
        self.final = final
        self.chunks = chunks
        self.status = status
        self.session_id = session_id

    @property
    def outcome(self):
        kind = self.final.get("chunk_type") if self.final else None
        if kind == "completion":
            return "completed"
        if kind == "cancelled":
            return "cancelled"
        return "error"

    @property
    def reason(self):
        """The cancel reason or error_type, when there is one."""
        meta = (self.final or {}).get("metadata") or {}
        return meta.get("reason") or meta.get("error_type")

    @property
    def exit_code(self):
        return {"completed": 0, "cancelled": 2}.get(self.outcome, 1)


def parse_reply(reply):
    """Normalise a reply to ``(action, text)``.

    Accepts ``"confirm"``, ``"cancel"``, ``"modify:<text>"``, a tuple
    ``("modify", text)``, a dict ``{"action": ..., "text": ..., "decisions":
    [...]}``, or ``None`` (stay silent).
    """
    if reply is None:
        return None
    if isinstance(reply, dict):
        return str(reply.get("action", "")).strip().lower(), reply.get("text")
    if isinstance(reply, (tuple, list)):
        action, text = (list(reply) + [None])[:2]
    else:
        action, _, text = str(reply).partition(":")
        text = text if _ else None
    return action.strip().lower(), text


def reply_decisions(reply):
    """The per-task ``decisions`` of a reply given as a dict, else None."""
    return reply.get("decisions") if isinstance(reply, dict) else None


def reply_grant(reply):
    """The ``grant`` of a reply given as a dict, else None."""
    return reply.get("grant") if isinstance(reply, dict) else None


def grant(scope, tools, ttl=None, max_calls=None, args=None):
    """A confirm's grant: ``grant("session", ["deploy"], ttl="30m",
    max_calls=10)`` allows later calls of those tools (of tasks approved in
    the pause) without asking, in this session (``"key"``: every session
    of the key), for ``ttl``, at most ``max_calls`` times; ``args`` are rule
    matchers (``{"/env": "staging-*"}``)."""
    entry = {"scope": scope, "tools": list(tools)}
    if ttl is not None:
        entry["ttl"] = ttl
    if max_calls is not None:
        entry["max_calls"] = int(max_calls)
    if args is not None:
        entry["args"] = dict(args)
    return entry


def parse_grant_flag(text):
    """``SCOPE:TTL[:N]`` (``session:30m``, ``key:1h:10``) as (scope, ttl,
    max_calls or None); ValueError if malformed."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("session", "key") or not parts[1]:
        raise ValueError("--grant expects session:TTL[:N] or key:TTL[:N], got %r" % text)
    calls = None
    if len(parts) == 3:
        if not parts[2].isdigit():
            raise ValueError("--grant %s: N is a number of calls" % text)
        calls = int(parts[2])
    return parts[0], parts[1], calls


def granted_tools(chunk):
    """The tools a grant on this pause may name: those of its tasks that
    call a real tool, in order, once each."""
    tools = []
    for task in (chunk.get("confirmation_data") or {}).get("tasks", []):
        if not task.get("simulated") and task.get("tool") and task["tool"] not in tools:
            tools.append(task["tool"])
    return tools


def every_task(decisions, chunk):
    """``decisions`` with an ``approve`` for every task of the pause they do
    not name, in task order: a server with --explicit-decisions takes a
    decision for every task."""
    named = {d.get("index"): d for d in decisions}
    tasks = (chunk.get("confirmation_data") or {}).get("tasks", [])
    full = [named.pop(t.get("index"), None) or decision(t.get("index"), "approve") for t in tasks]
    return full + list(named.values())


def task_decisions(tasks):
    """Per-task decisions from a mapping of task (its index, or its
    ``task_id``) to a decision: ``"approve"``, ``("reject", "why")``,
    ``("edit", {...args})`` or ``("respond", "result")``, or already one
    decision dict (a list of decision dicts is taken as it is)."""
    if isinstance(tasks, list):
        return tasks
    carried = {"reject": "reason", "edit": "args", "respond": "result"}
    out = []
    for task, given in tasks.items():
        entry = ({"index": int(task)} if isinstance(task, int) or str(task).isdigit()
                 else {"task_id": str(task)})
        if isinstance(given, dict):
            entry.update(given)
        elif isinstance(given, (tuple, list)):
            kind = given[0]
            entry["decision"] = kind
            if len(given) > 1 and given[1] is not None:
                entry[carried.get(kind, "reason")] = given[1]
        else:
            entry["decision"] = str(given)
        out.append(entry)
    return out


def parse_task_flag(text):
    """``1=approve,3=reject:why,2=respond:text,4=edit:{"k":1}`` (a task by
    its index or task_id) as :func:`task_decisions` takes it. A reason or
    result may hold commas; a new task starts at ``,<task>=``."""
    tasks = {}
    for part in re.split(r",(?=\s*[\w.-]+=)", text):
        task, sep, given = part.partition("=")
        task, given = task.strip(), given.strip()
        if not sep or not task or not given:
            raise ValueError("expected TASK=DECISION[:TEXT], got %r" % part)
        kind, _, rest = given.partition(":")
        if kind not in ("approve", "reject", "edit", "respond"):
            raise ValueError("task %s: %r is not approve, reject, edit or respond" % (task, kind))
        key = int(task) if task.isdigit() else task
        if kind == "edit":
            try:
                tasks[key] = ("edit", json.loads(rest))
            except ValueError:
                raise ValueError("task %s: edit:JSON expects JSON arguments" % task) from None
        elif kind in ("reject", "respond") and rest:
            tasks[key] = (kind, rest)
        elif kind == "respond":
            raise ValueError("task %s: respond:TEXT expects the result" % task)
        else:
            tasks[key] = kind
    return tasks


def decision(index, kind, **fields):
    """One per-task decision: ``decision(2, "reject", reason="...")``,
    ``decision(3, "edit", args={...})``, ``decision(1, "respond", result="...")``."""
    entry = {"index": int(index), "decision": kind}
    entry.update(fields)
    return entry


class ChunkStream:
    """The chunks (dicts) of one response, read as they arrive.

    ``status`` is the HTTP status. Iteration ends after the chunk with
    ``finished: true``; a stream that closes before it raises
    :class:`ChatGateError`. Use it as a context manager, or call ``close()``.
    """

    def __init__(self, response):
        self._response = response
        self.status = getattr(response, "status", None) or getattr(response, "code", None)
        self.headers = response.headers

    def __iter__(self):
        parser = SSEParser()
        try:
            while True:
                try:
                    raw = self._response.read1(65536)
                except (OSError, http.client.HTTPException) as err:
                    # A cut chunked body surfaces as http.client.IncompleteRead.
                    raise StreamBroken("stream broke: %r" % err) from None
                if not raw:
                    broken = StreamBroken("stream closed before its final chunk")
                    broken.retry = parser.retry
                    raise broken
                for event in parser.feed(raw):
                    try:
                        chunk = json.loads(event.data)
                    except ValueError:
                        raise ChatGateError("not a JSON chunk: %r" % event.data[:200]) from None
                    yield chunk
                    if chunk.get("finished"):
                        return
        finally:
            self.close()

    def close(self):
        # Another thread may be blocked reading this response (see
        # _ReadAhead): closing its buffered reader would wait for that read
        # to end. Shutting the socket down first ends the read at once.
        raw = getattr(getattr(self._response, "fp", None), "raw", None)
        sock = getattr(raw, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._response.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


#: What ``on_confirmation`` returns when it gave up asking because the pause
#: stopped waiting for it (see :attr:`ChatGateClient.pause_interrupted`): if
#: the stream broke, the confirmation is asked again once re-attached (if it
#: still waits); if it was decided elsewhere or ended, this is silence.
ASK_AGAIN = object()


class _ReadAhead:
    """A stream's chunks, read in a thread of their own while a confirmation
    is being answered, so that whoever answers can tell when the pause
    stopped waiting for them (its stream broke or ended, or it was decided
    elsewhere): :attr:`interrupted` is set then."""

    _END = object()

    def __init__(self, chunks):
        self._chunks = chunks
        self._queue = None
        self.interrupted = threading.Event()
        self.broke = False

    def watch(self):
        """Reads ahead until the pause is over: a ``confirmation_received``,
        a final chunk, or the stream's end."""
        self.interrupted = threading.Event()
        self.broke = False
        ahead = self._queue = queue.Queue()

        def read():
            while True:
                try:
                    chunk = next(self._chunks)
                except StopIteration:
                    ahead.put(self._END)
                    self.interrupted.set()
                    return
                except BaseException as err:  # handed to the reader, raised there
                    self.broke = True
                    ahead.put(err)
                    self.interrupted.set()
                    return
                ahead.put(chunk)
                if chunk.get("finished") or chunk.get("chunk_type") == "confirmation_received":
                    self.interrupted.set()
                    return

        threading.Thread(target=read, daemon=True).start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._queue is None:
            return next(self._chunks)
        item = self._queue.get()
        if item is self._END:
            self._queue = None
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue = None
            raise item
        if item.get("finished") or item.get("chunk_type") == "confirmation_received":
            self._queue = None  # the reading thread has stopped: read here again
        return item


class ChatGateClient:
    """A client for ``POST /api/v1/chat/stream``.

    While ``run`` asks ``on_confirmation``, :attr:`pause_interrupted` (a
    ``threading.Event``) is set as soon as the pause stops waiting for that
    answer (the stream broke, or the confirmation was decided elsewhere), so
    a prompt can stop asking."""

    def __init__(self, base_url, api_key=None, read_timeout=DEFAULT_READ_TIMEOUT,
                 reattach_attempts=DEFAULT_REATTACH_ATTEMPTS):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.read_timeout = read_timeout
        self.reattach_attempts = reattach_attempts

    # -- low level -----------------------------------------------------------

    def _open(self, body, last_event_id=None):
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            # Lets a load balancer keep a session on one replica without
            # reading bodies (docs/operations.md). Percent-encoded: a session
            # id may be any text, a header value must be ASCII (the same
            # encoding as the JS client's encodeURIComponent).
            "X-Chatgate-Session": urllib.parse.quote(body["session_id"], safe="!~*'()"),
        }
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        request = urllib.request.Request(
            self.base_url + STREAM_PATH,
            data=json.dumps(body).encode("utf-8"),
            headers=headers,
            method="POST",
        )
        try:
            return urllib.request.urlopen(request, timeout=self.read_timeout)
        except urllib.error.HTTPError as err:
            # Error answers are SSE streams too: read them like any other.
            return err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ChatGateError("cannot reach %s: %s" % (self.base_url, reason)) from None

    def stream(self, message, session_id=None, confirmation_id=None, decisions=None,
               answers=None, grant=None):
        """Send ``message``; return a :class:`ChunkStream` to iterate over.

        Error answers (4xx/5xx) are streams of a single ``error`` chunk; the
        HTTP status is ``ChunkStream.status``.
        """
        # The client names the session (a fresh UUID unless given), so every
        # request of it can be routed to the same replica.
        body = {"message": message, "session_id": session_id or str(uuid.uuid4())}
        if confirmation_id is not None:
            body["confirmation_id"] = confirmation_id
        if decisions:
            body["decisions"] = list(decisions)
        if answers is not None:
            body["answers"] = dict(answers)
        if grant is not None:
            body["grant"] = dict(grant)
        return ChunkStream(self._open(body))

    def attach(self, session_id, last_event_id=0, confirmation_id=None):
        """Re-attach to the run of ``session_id`` after its stream broke.

        The server replays every chunk after ``last_event_id`` (the
        ``sequence`` of the last chunk received; 0 for all) that it still
        holds, then goes on live. A first chunk with ``metadata.gap`` true
        means some chunks in between were lost. With no run to re-attach to
        the stream is one ``error`` chunk, ``error_type`` ``no_such_run``.
        An approver key names the run by one of its pauses
        (``confirmation_id``). Once the run's log is gone, the server sends
        its kept outcome: the final chunk alone (``--keep-outcome``).
        """
        body = {"session_id": session_id}
        if confirmation_id is not None:
            body["confirmation_id"] = confirmation_id
        return ChunkStream(self._open(body, last_event_id))

    def _get_json(self, path):
        """GETs ``path``: (status, the JSON body)."""
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        request = urllib.request.Request(self.base_url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.read_timeout) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            try:
                return err.code, json.loads(err.read() or b"{}")
            finally:
                err.close()
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ChatGateError("cannot reach %s: %s" % (self.base_url, reason)) from None

    def interactions(self, limit=None, after=None):
        """The pending pauses this key may decide (``GET
        /api/v1/interactions``), oldest expiry first: a list of dicts
        (``session_id``, ``confirmation_id``, ``kind``, ``risk_level``,
        ``tasks``, ``expires_in_seconds``, ``confirmation_data``, ...).
        Raises :class:`ChatGateError` when refused."""
        query = {}
        if limit is not None:
            query["limit"] = str(limit)
        if after is not None:
            query["after"] = after
        path = INBOX_PATH + ("?" + urllib.parse.urlencode(query) if query else "")
        status, body = self._get_json(path)
        if status != 200:
            raise ChatGateError("the inbox answered %s: %s (%s)"
                                % (status, body.get("message"), body.get("error_type")))
        return body.get("interactions", [])

    def outcome(self, session_id):
        """How the session's latest run ended (``GET /api/v1/runs/ID``,
        for ``--keep-outcome``): a dict, or None when none is kept."""
        status, body = self._get_json(RUNS_PATH + "/" + urllib.parse.quote(session_id, safe=""))
        if status == 404:
            return None
        if status != 200:
            raise ChatGateError("the outcome answered %s: %s (%s)"
                                % (status, body.get("message"), body.get("error_type")))
        return body

    def confirm(self, session_id, confirmation_id=None, decisions=None, grant=None):
        """Confirm the pending pause of ``session_id`` (see :meth:`reply`);
        ``grant`` (see :func:`grant`) also allows later calls without
        asking, within its scope, time and calls."""
        return self.reply(session_id, "confirm", confirmation_id=confirmation_id,
                          decisions=decisions, grant=grant)

    def decide(self, session_id, tasks, confirmation_id=None):
        """Decide single tasks of the pending pause of ``session_id`` and
        leave the others pending (``CONFIRM_ACTION:decide``):
        ``decide(session, {1: "approve", 3: ("reject", "why")})`` (see
        :func:`task_decisions`). Returns the reply's chunk:
        ``decision_recorded`` (``metadata.pending``: the tasks still
        pending) or, once no task is left pending, ``confirmation_received``;
        an ``error`` chunk when refused (409 ``already_decided`` for a task
        decided before)."""
        return self.reply(session_id, "decide", confirmation_id=confirmation_id,
                          decisions=task_decisions(tasks))

    def grants(self):
        """The live grants this key may see (``GET /api/v1/grants``; an
        approver's: every namespace's), newest first: a list of dicts
        (``id``, ``scope``, ``tools``, ``expires_at``, ``calls_left``, ...)."""
        status, body = self._get_json(GRANTS_PATH)
        if status != 200:
            raise ChatGateError("the grants answered %s: %s (%s)"
                                % (status, body.get("message"), body.get("error_type")))
        return body.get("grants", [])

    def revoke_grant(self, grant_id):
        """Revokes a grant (``DELETE /api/v1/grants/ID``): True when it was
        revoked, False when there is no such grant for this key."""
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        request = urllib.request.Request(
            self.base_url + GRANTS_PATH + "/" + urllib.parse.quote(grant_id, safe=""),
            headers=headers, method="DELETE")
        try:
            with urllib.request.urlopen(request, timeout=self.read_timeout) as response:
                return response.status == 204
        except urllib.error.HTTPError as err:
            err.close()
            if err.code == 404:
                return False
            raise ChatGateError("the revoke answered %s" % err.code) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ChatGateError("cannot reach %s: %s" % (self.base_url, reason)) from None

    def reply(self, session_id, action, text=None, confirmation_id=None, decisions=None,
              answers=None, grant=None):
        """Answer the pending pause of ``session_id``.

        With ``confirm``, ``decisions`` may decide single tasks (see
        :func:`decision`): tasks not named are approved. With ``answer``,
        ``answers`` (``{"<question id>": value}``) or ``text`` answers
        questions. Returns the single chunk of the answer:
        ``confirmation_received`` when accepted (its ``metadata.decisions``
        says what was decided per task, ``metadata.answers`` what was
        answered), an ``error`` chunk (with ``metadata.error_type``) when not.
        """
        message = "%s:%s" % (CONFIRM_PREFIX, action)
        if text is not None:
            message += ":" + text
        for attempt in range(1, REPLY_ATTEMPTS + 1):
            with self.stream(message, session_id, confirmation_id, decisions,
                             answers, grant) as chunks:
                unknown = chunks.status in UNKNOWN_OUTCOME_STATUSES
                try:
                    chunk = next(iter(chunks), None)
                except ChatGateError:
                    # A proxy's own error page is not a stream of chunks.
                    if not unknown:
                        raise
                    chunk = None
                if chunk is None:
                    if not unknown:
                        raise ChatGateError("empty answer to a reply")
                    chunk = {"chunk": "the reply's outcome is not known (HTTP %d)" % chunks.status,
                             "session_id": session_id, "finished": True, "chunk_type": "error",
                             "metadata": {"error_type": "outcome_unknown"},
                             "confirmation_data": None, "requires_response": False,
                             "stream_paused": False, "sequence": 1}
                error_type = (chunk.get("metadata") or {}).get("error_type")
                retryable = unknown or (chunks.status == 503
                                        and error_type in RETRYABLE_REPLY_ERRORS)
                if not retryable or attempt == REPLY_ATTEMPTS:
                    return chunk
                # Not taken, or not known: send the same reply again, when told to.
                time.sleep(_retry_after(chunks.headers))
        return chunk

    def answer(self, session_id, answers=None, text=None, confirmation_id=None):
        """Answer the pending questions of ``session_id``: ``answers`` maps
        question ids to values (an option's id or label, a list of them for
        multi-select, other text, a number or boolean for a typed question);
        ``text`` answers a pause of one question. Returns the reply's chunk
        (``metadata.answers`` holds the answers as the run got them)."""
        if (answers is None) == (text is None):
            raise ValueError("answer with answers or with text (one of them)")
        return self.reply(session_id, "answer", text, confirmation_id, answers=answers)

    def skip(self, session_id, confirmation_id=None):
        """Decline to answer the pending questions of ``session_id``."""
        return self.reply(session_id, "skip", confirmation_id=confirmation_id)

    def run_again(self, session_id, confirmation_id=None):
        """Call again, with its idempotency key, the task a crash cut short
        (a ``reconcile`` pause); ``skip`` records it as not run."""
        return self.reply(session_id, "run_again", confirmation_id=confirmation_id)

    # -- high level ----------------------------------------------------------

    def run(self, message, session_id=None, on_chunk=None, on_confirmation=None,
            on_question=None):
        """Drive one run to its end and return a :class:`RunResult`.

        ``on_chunk(chunk)`` sees every chunk. ``on_confirmation(chunk)`` is
        called for each ``confirmation_request`` and returns the reply:
        ``"confirm"``, ``"cancel"``, ``"modify:<text>"``, ``("modify", text)``,
        ``{"action": "confirm", "decisions": [decision(2, "reject")]}``
        or ``None`` to stay silent (the server's timeout then decides). A
        refused reply is passed to ``on_chunk`` and the run goes on.

        ``on_question(chunk)`` is called for each ``input_request`` (its
        ``confirmation_data["questions"]``) and returns the reply: a dict
        ``{"<question id>": value}`` (the answers), ``"answer:<text>"`` or
        ``("answer", text)`` for a single question, ``"skip"``, ``"cancel"``,
        or ``None`` to stay silent. An answer the server refuses (422) is
        passed to ``on_chunk`` and ``on_question`` is asked again, up to
        ``QUESTION_ATTEMPTS`` times.

        If the stream breaks before its final chunk, the run is re-attached
        (``Last-Event-ID``) up to ``reattach_attempts`` times in a row, and
        goes on where it broke; every chunk is still seen exactly once, but
        for a ``confirmation_request`` whose ``on_confirmation`` returned
        :data:`ASK_AGAIN` because its stream broke meanwhile: it comes again,
        to be answered.
        """
        # Named here, not by the server, so a broken stream can be re-attached.
        session_id = session_id or str(uuid.uuid4())
        return self._follow(self.stream(message, session_id), session_id, on_chunk,
                            on_confirmation, on_question)

    def resume(self, session_id, on_chunk=None, on_confirmation=None, on_question=None):
        """As :meth:`run`, for the run that already lives on ``session_id``
        (re-attached from its first chunk; once its log is gone, its kept
        outcome): its pauses are answered the same way."""
        return self._follow(self.attach(session_id, 0), session_id, on_chunk,
                            on_confirmation, on_question)

    def _follow(self, stream, session_id, on_chunk, on_confirmation, on_question):
        chunks = []
        final = None
        last_seen = 0
        failures = 0
        status = stream.status
        while final is None:
            try:
                with stream:
                    reader = _ReadAhead(iter(stream))
                    for chunk in reader:
                        failures = 0
                        sequence = chunk.get("sequence")
                        if isinstance(sequence, int):
                            if sequence <= last_seen:
                                continue  # already seen before the break
                            last_seen = sequence
                        chunks.append(chunk)
                        session_id = chunk.get("session_id") or session_id
                        if on_chunk:
                            on_chunk(chunk)
                        if chunk.get("finished"):
                            final = chunk
                            break
                        kind = chunk.get("chunk_type")
                        answerer = {"confirmation_request": on_confirmation,
                                    "input_request": on_question}.get(kind)
                        if answerer:
                            reader.watch()
                            self.pause_interrupted = reader.interrupted
                            if kind == "input_request":
                                again = self._answer_questions(chunk, session_id, on_chunk,
                                                               answerer, reader.interrupted)
                            else:
                                again = self._answer(chunk, session_id, on_chunk, answerer,
                                                     reader.interrupted)
                            if again and reader.broke and isinstance(sequence, int):
                                # Given up on because the stream broke: the
                                # re-attach replays this request, to ask again
                                # if it still waits.
                                last_seen = min(last_seen, sequence - 1)
            except StreamBroken as broken:
                if status != 200:
                    raise
                # A server that suspended the run for a restart said when to
                # come back (``retry:``) and may be unreachable for a while.
                restarting = broken.retry is not None
                wait = broken.retry / 1000.0 if restarting else None
                while True:
                    failures += 1
                    if failures > (RESTART_ATTEMPTS if restarting else self.reattach_attempts):
                        raise broken
                    time.sleep(wait if wait is not None else REATTACH_BACKOFF * failures)
                    try:
                        stream = self.attach(session_id, last_seen)
                    except ChatGateError:
                        if restarting:
                            continue
                        raise
                    if stream.status == 503:
                        # Not ready yet: the server restarting, the store out
                        # of reach, or the replica that held the run gone
                        # until another may take it over (Retry-After says
                        # when). Worth waiting for, as after a restart.
                        restarting = True
                        wait = _retry_after(stream.headers)
                        stream.close()
                        continue
                    break
                if stream.status != 200:
                    gone = next(iter(stream), {})
                    why = (gone.get("metadata") or {}).get("error_type") or stream.status
                    raise StreamBroken("%s; re-attach refused (%s)" % (broken, why)) from None
        return RunResult(final, chunks, status, session_id)

    pause_interrupted = threading.Event()

    def _answer(self, chunk, session_id, on_chunk, on_confirmation, interrupted):
        """Asks ``on_confirmation`` and sends its reply, asking again (a few
        times) when the server refuses it as it stands (422: decisions or
        an action that do not fit); whether it asked for :data:`ASK_AGAIN`."""
        data = chunk.get("confirmation_data") or {}
        for _ in range(QUESTION_ATTEMPTS):
            reply = on_confirmation(chunk)
            if reply is ASK_AGAIN:
                return True
            answer = parse_reply(reply)
            if answer is None:
                return False
            decisions = with_previews_seen(reply_decisions(reply), chunk, answer[0])
            ack = self.reply(session_id, answer[0], answer[1], data.get("confirmation_id"),
                             decisions, grant=reply_grant(reply))
            if ack.get("chunk_type") == "approval_recorded" and on_chunk:
                # One approval of several: the run waits for the others.
                on_chunk(ack)
            if ack.get("chunk_type") != "error":
                return False
            if on_chunk:
                on_chunk(ack)
            refused = (ack.get("metadata") or {}).get("error_type")
            if refused not in ("invalid_decision", "invalid_confirm_action") or interrupted.is_set():
                return False
        return False

    def _answer_questions(self, chunk, session_id, on_chunk, on_question, interrupted):
        """Asks ``on_question`` and sends its reply, asking again (a few
        times) when the server refuses the answer; whether it asked for
        :data:`ASK_AGAIN`."""
        data = chunk.get("confirmation_data") or {}
        for _ in range(QUESTION_ATTEMPTS):
            reply = on_question(chunk)
            if reply is ASK_AGAIN:
                return True
            if reply is None:
                return False
            if isinstance(reply, dict):
                ack = self.reply(session_id, "answer", None, data.get("confirmation_id"),
                                 answers=reply)
            else:
                action, text = parse_reply(reply)
                ack = self.reply(session_id, action, text, data.get("confirmation_id"))
            if ack.get("chunk_type") != "error":
                return False
            if on_chunk:
                on_chunk(ack)
            refused = (ack.get("metadata") or {}).get("error_type")
            if refused not in ("invalid_answer", "invalid_confirm_action") or interrupted.is_set():
                return False
        return False


# -- command line ------------------------------------------------------------

def _retry_after(headers, default=1.0, longest=5.0):
    """Seconds a 503 asked to wait (``Retry-After``), within reason."""
    try:
        return min(max(float(headers.get("Retry-After")), 0.0), longest)
    except (TypeError, ValueError):
        return default


def _seconds_left(expires_at):
    try:
        when = datetime.datetime.strptime(expires_at, "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        return None
    when = when.replace(tzinfo=datetime.timezone.utc)
    return int((when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


#: How many characters of a task's arguments are shown before the rest is
#: cut (and counted): what is approved must be visible, and a screen is finite.
ARGS_SHOWN = 2000


def format_args(args):
    """A task's arguments on one line: all of them, or the first
    ``ARGS_SHOWN`` characters and how many more there are."""
    text = json.dumps({} if args is None else args, ensure_ascii=False, separators=(",", ":"))
    if len(text) <= ARGS_SHOWN:
        return text
    return "%s … (%d more characters; --json shows them all)" % (text[:ARGS_SHOWN], len(text) - ARGS_SHOWN)


def _expects(question):
    """What a question without options takes, in a few words."""
    schema = question.get("schema") or {}
    kind = schema.get("type") or "text"
    bounds = []
    if "minimum" in schema or "maximum" in schema:
        bounds.append("%s..%s" % (schema.get("minimum", ""), schema.get("maximum", "")))
    if "enum" in schema:
        bounds.append("one of " + ", ".join(str(v) for v in schema["enum"]))
    if "maxLength" in schema:
        bounds.append("at most %s characters" % schema["maxLength"])
    if kind == "boolean":
        bounds.append("yes or no")
    return kind + (" " + ", ".join(bounds) if bounds else "")


def format_question(question, n):
    """One question as lines: its text, then its numbered options."""
    required = "" if question.get("required") else " (optional)"
    header = question.get("header") or question.get("id")
    lines = ["  %s. [%s] %s%s" % (n, header, question.get("question"), required)]
    options = question.get("options") or []
    for i, option in enumerate(options, 1):
        about = "  (%s)" % option["description"] if option.get("description") else ""
        lines.append("     %d) %s%s" % (i, option.get("label"), about))
    if options and question.get("allow_other"):
        lines.append("     o) other: a text of your own")
    if options and question.get("multi_select"):
        lines.append("     (several: 1,3)")
    if not options:
        lines.append("     (%s)" % _expects(question))
    return lines


def format_chunk(chunk):
    """One chunk as readable text (several lines for a confirmation request)."""
    kind = chunk.get("chunk_type", "?")
    text = chunk.get("chunk", "")
    if kind == "content":
        return text
    lines = ["[%s] %s" % (kind, text)]
    data = chunk.get("confirmation_data")
    if kind == "confirmation_request" and data:
        for task in data.get("tasks", []):
            risk = ", %s risk" % task["risk_level"] if task.get("risk_level") else ""
            tool = "simulated: no tool runs" if task.get("simulated") else task.get("tool")
            lines.append("  %s. %s  (%s%s)%s"
                         % (task.get("index"), task.get("description"), tool, risk,
                            approved_by_text(task.get("approved_by"))))
            lines.append("     args: %s" % format_args(task.get("args")))
            lines.extend(format_preview(task.get("preview")))
        left = _seconds_left(data.get("expires_at"))
        lines.append(
            "  risk: %s · round %s · expires %s%s"
            % (
                data.get("risk_level"),
                data.get("confirmation_round"),
                data.get("expires_at"),
                "" if left is None else " (in %ss)" % max(left, 0),
            )
        )
    if kind == "input_request" and data:
        for n, question in enumerate(data.get("questions") or [], 1):
            lines.extend(format_question(question, n))
        task = data.get("task") or {}
        if data.get("kind") == "reconcile":
            lines.append("  %s" % data.get("message", ""))
            lines.append("  task %s: %s %s · key %s" % (
                task.get("index"), task.get("tool"), json.dumps(task.get("args")),
                data.get("idempotency_key")))
        left = _seconds_left(data.get("expires_at"))
        lines.append("  %s · expires %s%s" % (
            " / ".join(data.get("options") or ["answer", "skip", "cancel"]),
            data.get("expires_at"), "" if left is None else " (in %ss)" % max(left, 0)))
    meta = chunk.get("metadata") or {}
    if kind == "approval_recorded" and meta.get("required"):
        left = int(meta["required"]) - len(meta.get("approvals") or [])
        groups = meta.get("approvers") or []
        lines.append("  waiting for %d more approval%s%s" % (
            left, "" if left == 1 else "s", " (%s)" % ", ".join(groups) if groups else ""))
    if kind == "confirmation_received" and meta.get("approved_by"):
        lines.append("  approved by: %s" % ", ".join(meta["approved_by"]))
    if kind == "confirmation_received" and meta.get("answers") is not None:
        lines.append("  answers: %s" % json.dumps(meta["answers"], ensure_ascii=False))
    if kind in ("cancelled", "error") and (meta.get("reason") or meta.get("error_type")):
        lines[0] += "  (%s)" % (meta.get("reason") or meta.get("error_type"))
    if kind == "tool_output" and meta.get("simulated"):
        lines[0] += "  (simulated: no tool ran)"
    if kind == "tool_output" and meta.get("approved_by"):
        by = meta["approved_by"]
        lines[0] += "  (ran without asking: %s)" % (
            "rule %s" % by["rule"] if "rule" in by else "grant %s" % by.get("grant"))
    if kind == "tool_output" and meta.get("error_type") == "denied_by_rule":
        lines[0] += "  (denied by rule %s)" % meta.get("rule")
    return "\n".join(lines)


#: Most characters of a task's preview a terminal shows; the rest is counted.
PREVIEW_SHOWN = 4000


def format_preview(preview):
    """A task's preview (what its call would do) as lines, or none."""
    if not preview:
        return []
    body = preview.get("body") or ""
    label = "preview" if preview.get("ok") else "preview (failed)"
    lines = ["     %s:%s" % (label, " (cut by the server)" if preview.get("truncated") else "")]
    lines.extend("     | " + line for line in body[:PREVIEW_SHOWN].splitlines())
    if len(body) > PREVIEW_SHOWN:
        lines.append("     | ... %d more characters" % (len(body) - PREVIEW_SHOWN))
    return lines


def with_previews_seen(decisions, chunk, action):
    """``decisions`` naming the previews ``chunk`` showed (#43): with
    ``confirm`` or ``decide`` every ``approve`` of a previewed task carries
    its ``preview_digest``, and a confirm approves the previewed tasks it
    does not name, naming theirs. The server refuses a reply whose digest
    is not the task's current preview (409 ``preview_stale``)."""
    if action not in ("confirm", "decide"):
        return decisions
    tasks = (chunk.get("confirmation_data") or {}).get("tasks", [])
    digests = {t.get("index"): t["preview"]["digest"] for t in tasks
               if t.get("preview") and t.get("state", "pending") == "pending"}
    if not digests:
        return decisions
    ids = {t.get("task_id"): t.get("index") for t in tasks if t.get("task_id")}
    out = [dict(d) for d in (decisions or [])]
    named = set()
    for d in out:
        index = d.get("index", ids.get(d.get("task_id")))
        named.add(index)
        if d.get("decision") == "approve" and index in digests:
            d.setdefault("preview_digest", digests[index])
    if action == "confirm":
        out.extend(decision(index, "approve", preview_digest=digest)
                   for index, digest in digests.items() if index not in named)
    return out


def approved_by_text(approved_by):
    """What allowed a task without a person, for a task line (or "")."""
    if not approved_by:
        return ""
    if "rule" in approved_by:
        return "  [allowed by rule %s; runs unless you reject it]" % approved_by["rule"]
    return "  [allowed by grant %s; runs unless you reject it]" % approved_by.get("grant")


class _ScriptError(Exception):
    """A scripted reply that cannot work: the run is cancelled, exit 1."""




def _offered(chunk):
    data = chunk.get("confirmation_data") or {}
    return data.get("options") or ["confirm", "modify", "cancel"]


def _decide_tasks(chunk, ask, out):
    """Per-task questions: returns the decisions, or None if ``ask`` gave up."""
    decisions = []
    for task in (chunk.get("confirmation_data") or {}).get("tasks", []):
        index = task.get("index")
        # What this task takes (older servers do not say: all of them).
        takes = task.get("decisions") or ["approve", "reject", "edit", "respond"]
        offered = ["yes", "no"] + [d for d in ("edit", "respond") if d in takes]
        while True:
            out.write("  task %s: %s -- run it? (%s) " % (index, task.get("description"), " / ".join(offered)))
            out.flush()
            answer = ask()
            if answer is None:
                return None
            answer = answer.strip().lower()
            if answer in ("", "y", "yes"):
                decisions.append(decision(index, "approve"))
                break
            if (answer in ("e", "edit") and "edit" not in takes) or (answer in ("r", "respond") and "respond" not in takes):
                out.write("    task %s calls no tool: there are no arguments to edit; answer %s\n"
                          % (index, ", ".join(offered)))
                continue
            if answer in ("n", "no"):
                out.write("    why? (optional) ")
                out.flush()
                why = ask()
                if why is None:
                    return None
                fields = {"reason": why.strip()} if why.strip() else {}
                decisions.append(decision(index, "reject", **fields))
                break
            if answer in ("e", "edit"):
                out.write("    new arguments (JSON, now %s): " % json.dumps(task.get("args")))
                out.flush()
                text = ask()
                if text is None:
                    return None
                try:
                    args = json.loads(text)
                except ValueError:
                    out.write("    not JSON; try again\n")
                    continue
                decisions.append(decision(index, "edit", args=args))
                break
            if answer in ("r", "respond"):
                out.write("    the result to use instead: ")
                out.flush()
                text = ask()
                if text is None:
                    return None
                decisions.append(decision(index, "respond", result=text.strip()))
                break
            out.write("    please answer %s\n" % ", ".join(offered))
    return decisions


def _prompt(chunk, ask, out, interrupted=None):
    """Ask a person on the terminal for one of the offered options; returns
    a reply, or None when ``ask`` gives up (the confirmation expired, or
    ``interrupted`` was set: it stopped waiting for this terminal).
    ``decide`` asks about each task, then confirms with those decisions."""
    options = _offered(chunk)
    data = chunk.get("confirmation_data") or {}
    last = "modify" not in options
    shown = options + (["decide"] if "confirm" in options else [])
    question = "%s?%s " % (" / ".join(shown), " (last round)" if last else "")
    allowable = _allowable_tools(data, options)
    if allowable:
        out.write("  (or allow: confirm, and allow %s for this session for 15 min without "
                  "asking)\n" % ", ".join(allowable))
    while True:
        out.write(question)
        out.flush()
        answer = ask()
        if answer is None:
            # Past its expiry it expired, whatever else the stream showed.
            left = _seconds_left(data.get("expires_at"))
            expired = left is not None and left <= 0
            if interrupted is not None and interrupted.is_set() and not expired:
                out.write("\nthe confirmation stopped waiting here (decided elsewhere, or its "
                          "stream broke); following the run\n")
            else:
                out.write("\nno answer before the confirmation expired\n")
            out.flush()
            return None
        answer = answer.strip().lower()
        if answer == "confirm":
            return "confirm"
        if answer in ("c", "y", "yes"):
            # A high-risk plan takes the whole word, as the page asks.
            if data.get("risk_level") == "high":
                out.write("this plan is high risk: type confirm to run it\n")
                continue
            return "confirm"
        if answer in ("cancel", "n", "no", "x"):
            return "cancel"
        if allowable and answer in ("allow", "a"):
            return {"action": "confirm", "grant": grant("session", allowable, ttl="15m")}
        if answer in ("decide", "d"):
            decisions = _decide_tasks(chunk, ask, out)
            if decisions is None:
                return None
            return {"action": "confirm", "decisions": every_task(decisions, chunk)}
        if not last and answer in ("modify", "m"):
            out.write("what should change? (empty: ask again as is) ")
            out.flush()
            text = ask()
            if text is None:
                return None
            return ("modify", text.strip())
        out.write("please answer %s\n" % ", ".join(options))


def _allowable_tools(data, options):
    """The tools "allow" may grant at the prompt ("yes, and don't ask
    again"): the plan's real tools, when one person decides it and none is
    high risk (a high risk tool is grantable only by its tools file)."""
    if "confirm" not in options or (data.get("required") or 1) > 1 or data.get("approvers"):
        return []
    tasks = data.get("tasks") or []
    if any(not t.get("simulated") and t.get("risk_level") == "high" for t in tasks):
        return []
    return granted_tools({"confirmation_data": data})


def _typed(question, text):
    """``text`` as the value a question without options takes: (value, None),
    or (None, what it expects)."""
    import re

    schema = question.get("schema") or {}
    kind = schema.get("type")
    text = text.strip()
    wrong = (None, "expects %s" % _expects(question))
    if kind == "boolean":
        value = {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}
        return (value[text.lower()], None) if text.lower() in value else wrong
    if kind in ("integer", "number"):
        try:
            value = int(text) if kind == "integer" else float(text)
        except ValueError:
            return wrong
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            return wrong
        return value, None
    if not text:
        return wrong
    if len(text) > schema.get("maxLength", len(text)) or len(text) < schema.get("minLength", 0):
        return wrong
    if "enum" in schema and text not in schema["enum"]:
        return wrong
    if "pattern" in schema and not re.search(schema["pattern"], text):
        return wrong
    return text, None


def _option_named(options, text):
    """The id of the option ``text`` names: its number (1-based), its id or
    its label, in any case; None for none."""
    if text.isdigit():
        return options[int(text) - 1]["id"] if 1 <= int(text) <= len(options) else None
    for option in options:
        if text.lower() in (str(option.get("id", "")).lower(), str(option.get("label", "")).lower()):
            return option["id"]
    return None


def _by_question_id(answers, questions):
    """``--answer`` pairs keyed by a question's id or its header (any case),
    as the ids the server takes."""
    named = {}
    for key, value in answers.items():
        match = next((q["id"] for q in questions if q.get("id") == key), None) or next(
            (q["id"] for q in questions if (q.get("header") or "").lower() == key.lower()), key)
        named[match] = value
    return named


def _ask_one(question, ask, out):
    """One question on the terminal, asked until the answer fits: its value
    (an option id, a list of them, other text, a typed value), ``...`` when
    an optional one is left empty, or None when ``ask`` gave up."""
    options = question.get("options") or []
    multi = question.get("multi_select")
    other = question.get("allow_other")
    if options:
        hint = "1-%d%s%s" % (len(options), ", several as 1,3" if multi else "",
                             ", o for other" if other else "")
    else:
        hint = _expects(question)
    while True:
        out.write("  %s [%s]: " % (question.get("header") or question.get("id"), hint))
        out.flush()
        line = ask()
        if line is None:
            return None
        line = line.strip()
        if not line and not question.get("required"):
            return ...
        if not options:
            value, wrong = _typed(question, line) if question.get("schema") else (line or None, "expects a text")
            if value is not None:
                return value
            out.write("    %s\n" % wrong)
            continue
        if other and line.lower() in ("o", "other"):
            out.write("    your text: ")
            out.flush()
            text = ask()
            if text is None:
                return None
            if text.strip():
                return text.strip()
            continue
        picks = [p.strip() for p in line.split(",") if p.strip()]
        chosen = [_option_named(options, p) for p in picks]
        if picks and all(chosen) and (len(picks) == 1 or multi):
            return chosen if multi else chosen[0]
        out.write("    please answer %s\n" % hint)


def _prompt_questions(chunk, ask, out, interrupted=None):
    """Ask a person on the terminal for the answers; returns the answers (a
    dict), ``"skip"``, ``"cancel"``, or None when ``ask`` gives up (the
    pause expired, or ``interrupted`` was set)."""
    data = chunk.get("confirmation_data") or {}
    if data.get("kind") == "reconcile":
        # A call a crash cut short: run it again, skip it, or cancel.
        while True:
            out.write("run_again / skip / cancel? ")
            out.flush()
            line = ask()
            if line is None:
                return None
            choice = line.strip().lower()
            if choice in ("run_again", "skip", "cancel"):
                return choice
            out.write("please answer run_again, skip or cancel\n")
    while True:
        out.write("answer / skip / cancel? [answer] ")
        out.flush()
        line = ask()
        if line is None:
            break
        choice = line.strip().lower()
        if choice in ("skip", "s"):
            return "skip"
        if choice in ("cancel", "c", "x"):
            return "cancel"
        if choice not in ("", "answer", "a"):
            out.write("please answer answer, skip or cancel\n")
            continue
        answers = {}
        for question in data.get("questions") or []:
            value = _ask_one(question, ask, out)
            if value is None:
                break
            if value is not ...:
                answers[question["id"]] = value
        else:
            return answers
        break
    if interrupted is not None and interrupted.is_set():
        out.write("\nthe questions stopped waiting here (answered elsewhere, or their stream "
                  "broke); following the run\n")
    else:
        out.write("\nno answer before the questions expired\n")
    out.flush()
    return None


def _scripted_answers(pairs):
    """The answers of --answer ID=VALUE; ValueError if malformed."""
    answers = {}
    for given in pairs:
        qid, sep, value = given.partition("=")
        if not sep or not qid.strip():
            raise ValueError("--answer expects ID=VALUE, got %r" % given)
        answers[qid.strip()] = value
    return answers


def _ask_until(deadline, interrupted=None):
    """Reads a line from the terminal; None once ``deadline`` (a
    ``time.monotonic()`` value, or None for never) has passed, or once
    ``interrupted`` (a ``threading.Event``) is set."""
    import select

    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        if interrupted is not None and interrupted.is_set():
            return None
        ready, _, _ = select.select([sys.stdin], [], [], 0.2 if left is None else min(left, 0.2))
        if ready:
            line = sys.stdin.readline()
            return line if line else None


def _cancel_pending(client, session_id, pending):
    """Sends cancel for the pending confirmation, briefly; says what happened."""
    quick = ChatGateClient(client.base_url, api_key=client.api_key, read_timeout=CANCEL_TIMEOUT)
    try:
        ack = quick.reply(session_id, "cancel", confirmation_id=pending.get("confirmation_id"))
    except ChatGateError as err:
        return "could not cancel the pending confirmation (%s)" % err
    if ack.get("chunk_type") == "confirmation_received":
        return "the pending confirmation was cancelled; nothing runs"
    meta = ack.get("metadata") or {}
    return "could not cancel the pending confirmation (%s)" % (meta.get("error_type") or ack.get("chunk"))


def _list_inbox(client, out):
    """--inbox: one entry per pending pause, its tasks under it."""
    items = client.interactions(limit=500)
    if not items:
        out.write("nothing is waiting for a decision\n")
    for item in items:
        what = item.get("title") if item.get("kind") == "question" else item.get("summary")
        left = item.get("expires_in_seconds") or 0
        out.write("%s  %s%s  %s  session %s  from %s  expires in %d min\n" % (
            item.get("confirmation_id"), item.get("kind"),
            " (%s risk)" % item["risk_level"] if item.get("risk_level") else "", what,
            item.get("session_id"), item.get("key"), (left + 59) // 60))
        required = item.get("required") or 1
        if required > 1 or item.get("approvers"):
            approvals = item.get("approvals") or []
            by = " of %s" % " and ".join(item["approvers"]) if item.get("approvers") else ""
            so = ": %s" % ", ".join(approvals) if approvals else ""
            out.write("    needs %d%s; %d of %d approved%s\n" % (required, by, len(approvals),
                                                                required, so))
        if item.get("may_approve") is False:
            out.write("    you may not approve it: %s\n" % item.get("why_not"))
        for task in item.get("tasks") or []:
            runs = "simulated: no tool runs" if task.get("simulated") else "%s %s" % (
                task.get("tool"), task.get("args"))
            out.write("    %s. %s  (%s risk; %s)\n" % (task.get("index"), task.get("description"),
                                                       task.get("risk_level"), runs))
    out.flush()
    return 0


def _decide_listed(client, confirmation_id, on_confirmation, on_question, out):
    """--decide ID: the listed pause shown, decided as a run's would be."""
    items = client.interactions(limit=500)
    item = next((i for i in items if i.get("confirmation_id") == confirmation_id), None)
    if item is None:
        sys.stderr.write("error: no pause %s is waiting for this key (decided, expired, or "
                         "another namespace's)\n" % confirmation_id)
        return 1
    question = item.get("kind") == "question"
    chunk = {
        "chunk_type": "input_request" if question else "confirmation_request",
        "chunk": item.get("title") if question else item.get("summary"),
        "session_id": item.get("session_id"),
        "confirmation_data": item.get("confirmation_data"),
    }
    out.write(format_chunk(chunk) + "\n")
    out.flush()
    client.pause_interrupted = threading.Event()
    given = (on_question if question else on_confirmation)(chunk)
    if given is None or given is ASK_AGAIN:
        return 1
    if isinstance(given, dict) and question:
        ack = client.reply(item["session_id"], "answer", confirmation_id=confirmation_id,
                           answers=given)
    else:
        action, text = parse_reply(given)
        granting = reply_grant(given)
        since = time.time()
        decisions = with_previews_seen(reply_decisions(given), chunk, action)
        ack = client.reply(item["session_id"], action, text, confirmation_id,
                           decisions, grant=granting)
        if granting and ack.get("chunk_type") == "confirmation_received":
            out.write(format_chunk(ack) + "\n")
            out.write(_grant_made(client, item["session_id"], since) + "\n")
            out.flush()
            return 0
    out.write(format_chunk(ack) + "\n")
    out.flush()
    return 0 if ack.get("chunk_type") in ("confirmation_received", "approval_recorded") else 1


def _grant_made(client, session_id, since):
    """The grant a confirm just gave on ``session_id``, in words: the run
    keeps it as it goes on, so it is looked for a few seconds."""
    for _ in range(50):
        for made in client.grants():
            if made.get("session_id") == session_id and \
                    _epoch(made.get("created_at")) >= since - 2:
                return describe_grant(made)
        time.sleep(0.1)
    return "the grant was not kept (the run's stream says why); later calls will be asked"


def _epoch(rfc3339):
    """Seconds since the epoch of an RFC 3339 UTC time (0 if unreadable)."""
    try:
        text = (rfc3339 or "").replace("Z", "+00:00")
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0


def describe_grant(g):
    """A grant in one line: what it allows, where, until when, how many calls."""
    where = ("every session of %s" % g.get("key") if g.get("scope") == "key"
             else "session %s" % g.get("session_id"))
    return "granted: %s for %s until %s, %s of %s call(s) left (grant %s, by %s)" % (
        ", ".join(g.get("tools") or []), where, g.get("expires_at"), g.get("calls_left"),
        g.get("max_calls"), g.get("id"), g.get("granted_by"))


def _list_grants(client, out):
    """--grants: the live grants this key may see, one a line."""
    grants = client.grants()
    if not grants:
        out.write("no live grants\n")
    for g in grants:
        out.write(describe_grant(g) + "\n")
    out.flush()
    return 0


def _revoke_grant(client, grant_id, out):
    """--revoke-grant ID: 0 when revoked, 1 when there is no such grant here."""
    if client.revoke_grant(grant_id):
        out.write("revoked grant %s\n" % grant_id)
        out.flush()
        return 0
    sys.stderr.write("error: no grant %s for this key (expired, spent, revoked, or another "
                     "namespace's)\n" % grant_id)
    return 1


def _planned_decisions(args):
    """The decisions of --reject, --edit and --respond; ValueError if malformed."""
    planned = [decision(n, "reject") for n in args.reject]
    for flag, kind in (("edit", "edit"), ("respond", "respond")):
        for given in getattr(args, flag):
            index, sep, value = given.partition("=")
            if not sep or not index.strip().isdigit():
                raise ValueError("--%s expects N=%s, got %r" % (flag, "JSON" if kind == "edit" else "TEXT", given))
            if kind == "edit":
                try:
                    planned.append(decision(int(index), "edit", args=json.loads(value)))
                except ValueError:
                    raise ValueError("--edit %s: the arguments are not JSON" % index) from None
            else:
                planned.append(decision(int(index), "respond", result=value))
    return planned


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1 (an error), not argparse's 2 (which means cancelled here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(1, "%s: error: %s\n" % (self.prog, message))


def main(argv=None):
    parser = _Parser(
        description="Stream a message to chatgate and answer its confirmation requests "
        "and questions.",
        epilog="Without replies left, a terminal is asked (until the confirmation expires); "
        "without a terminal the client says so, cancels the pending confirmation and exits 1 "
        "(unless --wait), "
        "as it does when the server refuses a scripted reply. Ctrl-C while a confirmation is "
        "pending cancels it on the server before exiting. "
        "Exit codes: 0 completed, 2 cancelled, 1 error.",
    )
    parser.add_argument("message", nargs="?", help="the chat message or task")
    parser.add_argument("--url", default=os.environ.get("CHATGATE_URL", "http://127.0.0.1:8080"),
                        help="server base URL (default: $CHATGATE_URL or http://127.0.0.1:8080)")
    parser.add_argument("--session", help="session id (default: a new UUID, made by this client)")
    parser.add_argument("--api-key", default=os.environ.get("CHATGATE_API_KEY"),
                        help="bearer token (default: $CHATGATE_API_KEY)")
    parser.add_argument("--reply", action="append", default=[],
                        help="scripted reply, one per round, in order: confirm, cancel, modify:<text> "
                        "(or modify alone: the same plan again); a reply that is not among the "
                        "offered options cancels the run, exit 1")
    parser.add_argument("--auto-confirm", action="store_true",
                        help="confirm every round once the scripted replies are used up")
    parser.add_argument("--reject", action="append", default=[], type=int, metavar="N",
                        help="with the first confirm: do not run task N (repeatable)")
    parser.add_argument("--edit", action="append", default=[], metavar="N=JSON",
                        help="with the first confirm: run task N with these arguments")
    parser.add_argument("--respond", action="append", default=[], metavar="N=TEXT",
                        help="with the first confirm: do not run task N, use TEXT as its result")
    parser.add_argument("--grant", metavar="SCOPE:TTL[:N]",
                        help="with the first confirm: also allow later calls of the pause's tools "
                        "without asking, in this session (session:30m) or every session of the "
                        "key (key:1h), at most N calls (default 100)")
    parser.add_argument("--answer", action="append", default=[], metavar="ID=VALUE",
                        help="scripted answer to the question ID (or its header, as the prompt "
                        "shows it) of every question pause "
                        "(repeatable): an option's id or label (a,b for several), other text, "
                        "or a typed value; an answer that does not fit exits 1, naming the question")
    parser.add_argument("--answer-text", metavar="TEXT",
                        help="scripted answer to a question pause of one question")
    parser.add_argument("--skip", action="store_true",
                        help="decline every question pause (the run goes on without answers)")
    parser.add_argument("--json", action="store_true", help="print raw chunks, one JSON per line")
    parser.add_argument("--inbox", action="store_true",
                        help="list the pauses this key may decide (an approver's: every "
                        "namespace's), with a quorum's progress and whether this key may approve "
                        "each (and why not), then exit")
    parser.add_argument("--grants", action="store_true",
                        help="list the live grants this key may see, then exit")
    parser.add_argument("--revoke-grant", metavar="ID",
                        help="revoke grant ID: exit 0 when revoked, 1 when there is none")
    parser.add_argument("--decide", metavar="ID|N=DECISION,...",
                        help="decide the listed pause ID (its confirmation_id): shown, then asked "
                        "on the terminal or answered by --reply/--auto-confirm/--answer/--skip; "
                        "exit 0 when taken, 1 when refused. Given tasks instead "
                        "(1=approve,3=reject:why,2=respond:text,4=edit:{json}; a task by its "
                        "index or task_id), with a message: the first pause's tasks named are "
                        "decided on their own first (the others stay pending for the replies "
                        "that follow)")
    parser.add_argument("--attach", metavar="SESSION",
                        help="follow the run of SESSION from its start (or its kept outcome) to "
                        "its end, answering its pauses as for a message")
    parser.add_argument("--wait", action="store_true",
                        help="without a terminal and with no reply left, wait for the decision "
                        "to come from elsewhere (another client, the page)")
    args = parser.parse_args(argv)
    decide_first = []
    if args.decide and "=" in args.decide:
        try:
            decide_first.append(parse_task_flag(args.decide))
        except ValueError as err:
            parser.error("--decide: %s" % err)
        args.decide = None
        if not (args.message or args.attach):
            parser.error("--decide N=DECISION,... goes with a message (or --attach SESSION)")
    if not (args.message or args.inbox or args.decide or args.attach or args.grants
            or args.revoke_grant):
        parser.error("a message is required (or --inbox, --decide ID, --attach SESSION, "
                     "--grants, --revoke-grant ID)")
    if args.attach:
        # Following a run that may be decided elsewhere (its replayed pauses
        # were): with nothing scripted, wait rather than give up.
        args.wait = True
    try:
        planned = _planned_decisions(args)
        scripted_answers = _scripted_answers(args.answer)
        granting = [parse_grant_flag(args.grant)] if args.grant else []
    except ValueError as err:
        parser.error(str(err))

    out = sys.stdout
    replies = list(args.reply)
    interactive = sys.stdin.isatty()
    in_content = [False]  # mid-way through streamed text, no newline yet
    session_id = args.session or str(uuid.uuid4())
    pending = [None]  # the confirmation waiting for a decision, if any
    pending_at = [0]  # its place on the run's stream
    scripted = [False]  # a scripted reply was just sent: an error now is its refusal

    def on_chunk(chunk):
        kind = chunk.get("chunk_type")
        error_type = (chunk.get("metadata") or {}).get("error_type")
        if scripted[0] and kind == "error" and error_type in ("invalid_grant", "too_many_grants") \
                and isinstance(last_reply[0], dict) and "grant" in last_reply[0]:
            # A refused grant never cancels: the confirm goes again without it.
            sys.stderr.write("--grant was refused: %s (%s); confirming without it\n"
                             % (chunk.get("chunk", ""), error_type))
            without = dict(last_reply[0])
            without.pop("grant")
            last_reply[0] = None
            scripted[0] = False
            confirmation_id = (pending[0] or {}).get("confirmation_id")
            ack = client.reply(session_id, "confirm", None, confirmation_id,
                               reply_decisions(without))
            if ack.get("chunk_type") == "error":
                raise _ScriptError("the server refused the confirm without the grant too: "
                                   "%s (%s)" % (ack.get("chunk", ""),
                                                (ack.get("metadata") or {}).get("error_type")))
        if scripted[0] and kind == "error" and error_type != "already_decided":
            # The server refused what the script said (a task number or
            # arguments that do not fit): waiting on would ask nobody. (A
            # decision that stands, this reply's own after an unknown
            # outcome included, shows on the run's stream.)
            raise _ScriptError("the server refused the scripted reply: %s (%s)"
                               % (chunk.get("chunk", ""), error_type or "error"))
        scripted[0] = False
        if kind in PAUSES:
            pending[0] = chunk.get("confirmation_data") or {}
            pending_at[0] = chunk.get("sequence") or 0
        elif (kind == "confirmation_received" or chunk.get("finished")) \
                and (chunk.get("sequence") or float("inf")) > pending_at[0]:
            # Only the run's own stream, past the pause, ends it: a refused
            # reply's one chunk (numbered on its own stream, from 1) does not.
            pending[0] = None
        if args.json:
            out.write(json.dumps(chunk, ensure_ascii=False) + "\n")
        elif chunk.get("chunk_type") == "content":
            out.write(chunk.get("chunk", ""))
            in_content[0] = True
        else:
            if in_content[0]:
                out.write("\n")
                in_content[0] = False
            out.write(format_chunk(chunk) + "\n")
        out.flush()

    last_reply = [None]  # the scripted reply just sent

    def with_planned(reply, chunk):
        last_reply[0] = _with_planned(reply, chunk)
        return last_reply[0]

    def _with_planned(reply, chunk):
        # The per-task flags (with a decision for every task) and --grant go
        # with the first confirm.
        if parse_reply(reply)[0] != "confirm" or not (planned or granting):
            return reply
        if not isinstance(reply, dict):
            reply = {"action": "confirm"}
        if planned:
            reply["decisions"] = every_task(list(planned), chunk)
            planned.clear()
        if granting:
            scope, ttl, calls = granting.pop()
            tools = granted_tools(chunk)
            if tools:
                reply["grant"] = grant(scope, tools, ttl, calls)
            else:
                sys.stderr.write("--grant: no task of this pause calls a tool; nothing granted\n")
        return reply

    def on_confirmation(chunk):
        if decide_first:
            # --decide N=...: those tasks first, on their own.
            data = chunk.get("confirmation_data") or {}
            ack = client.decide(session_id, decide_first.pop(), data.get("confirmation_id"))
            out.write((json.dumps(ack, ensure_ascii=False) if args.json
                       else format_chunk(ack)) + "\n")
            out.flush()
            if ack.get("chunk_type") == "error":
                raise _ScriptError("the server refused --decide: %s (%s)"
                                   % (ack.get("chunk", ""),
                                      (ack.get("metadata") or {}).get("error_type")))
            if ack.get("chunk_type") == "confirmation_received":
                # Every task is decided: the run goes on by itself.
                return None
        if replies:
            reply = replies.pop(0)
            answer = parse_reply(reply)
            options = _offered(chunk)
            if answer is None or answer[0] not in options:
                raise _ScriptError("scripted reply %r is not one of the offered options: %s"
                                   % (reply, ", ".join(options)))
            scripted[0] = True
            return with_planned(reply, chunk)
        if args.auto_confirm:
            scripted[0] = True
            return with_planned("confirm", chunk)
        if interactive:
            left = _seconds_left((chunk.get("confirmation_data") or {}).get("expires_at"))
            # Until the confirmation expires (and a second): the server
            # ends the run then, and prompting on would ask for nothing.
            deadline = None if left is None else time.monotonic() + max(left, 0) + 1
            interrupted = client.pause_interrupted
            reply = _prompt(chunk, lambda: _ask_until(deadline, interrupted),
                            sys.stderr if args.json else out, interrupted)
            if reply is None:
                return ASK_AGAIN if interrupted.is_set() else None
            return with_planned(reply, chunk)
        if args.wait:
            data = chunk.get("confirmation_data") or {}
            sys.stderr.write("waiting for a decision from elsewhere (session %s, until %s)\n"
                             % (session_id, data.get("expires_at") or "the timeout"))
            sys.stderr.flush()
            return None
        raise _ScriptError("a confirmation is waiting and nothing here can answer it: stdin is "
                           "not a terminal and no --reply is left (script the answers with "
                           "--reply or --auto-confirm, or --wait for a decision from elsewhere)")

    def on_question(chunk):
        data = chunk.get("confirmation_data") or {}
        if args.skip:
            scripted[0] = True
            return "skip"
        if scripted_answers:
            scripted[0] = True
            return _by_question_id(scripted_answers, data.get("questions") or [])
        if args.answer_text is not None:
            scripted[0] = True
            return ("answer", args.answer_text)
        if interactive:
            left = _seconds_left(data.get("expires_at"))
            deadline = None if left is None else time.monotonic() + max(left, 0) + 1
            interrupted = client.pause_interrupted
            reply = _prompt_questions(chunk, lambda: _ask_until(deadline, interrupted),
                                      sys.stderr if args.json else out, interrupted)
            return ASK_AGAIN if reply is None and interrupted.is_set() else reply
        if args.wait:
            sys.stderr.write("waiting for an answer from elsewhere (session %s, until %s)\n"
                             % (session_id, data.get("expires_at") or "the timeout"))
            sys.stderr.flush()
            return None
        raise _ScriptError("questions are waiting and nothing here can answer them: stdin is "
                           "not a terminal and no --answer, --answer-text or --skip was given "
                           "(or --wait for an answer from elsewhere)")

    client = ChatGateClient(args.url, api_key=args.api_key)
    try:
        if args.inbox:
            return _list_inbox(client, out)
        if args.grants:
            return _list_grants(client, out)
        if args.revoke_grant:
            return _revoke_grant(client, args.revoke_grant, out)
        if args.decide:
            return _decide_listed(client, args.decide, on_confirmation, on_question, out)
        if args.attach:
            session_id = args.attach
            result = client.resume(session_id, on_chunk, on_confirmation, on_question)
        else:
            result = client.run(args.message, session_id, on_chunk, on_confirmation, on_question)
    except _ScriptError as err:
        said = "; " + _cancel_pending(client, session_id, pending[0]) if pending[0] else ""
        sys.stderr.write("error: %s%s\n" % (err, said))
        return 1
    except ChatGateError as err:
        sys.stderr.write("error: %s\n" % err)
        return 1
    except KeyboardInterrupt:
        if in_content[0]:
            out.write("\n")
        if pending[0]:
            sys.stderr.write("interrupted: %s\n" % _cancel_pending(client, session_id, pending[0]))
        else:
            sys.stderr.write("interrupted\n")
        return 2
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`); say nothing more.
        sys.stderr.close()
        return 1
    if result.outcome == "completed":
        # A plan of which nothing ran because its tasks were rejected: as a cancel.
        counts = (result.final or {}).get("metadata") or {}
        if counts.get("tasks_completed") == 0 and \
                (counts.get("tasks_rejected") or 0) + (counts.get("tasks_denied") or 0) > 0:
            sys.stderr.write("nothing ran: %s\n" % result.final.get("chunk", ""))
            return 2
        return 0
    kind = "cancelled" if result.outcome == "cancelled" else "error"
    # The reason line is for scripts; on one terminal the end was just shown.
    if not (sys.stdout.isatty() and sys.stderr.isatty() and not args.json):
        sys.stderr.write("%s: %s: %s\n" % (kind, result.reason, (result.final or {}).get("chunk", "")))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
