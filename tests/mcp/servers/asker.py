"""An MCP server for chatgate's tests, written with the official Python SDK
(`mcp`, tests/mcp/requirements.txt). stdio. Its tools cover what a server can
do to a call: ask the person (elicitation), fail (`isError`), crash, be slow,
answer too much.

`--log FILE` appends one line per call that got past its question, so a test
can tell what the server did (and did not) do. `--http PORT` serves
streamable HTTP on 127.0.0.1:PORT (path /mcp) instead of stdio;
`--extra-tools N` offers N more tools.
"""

import asyncio
import os
import sys
from typing import Literal

from pydantic import BaseModel, Field

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp import types
from mcp.types import ToolAnnotations

LOG = None
if "--log" in sys.argv:
    LOG = sys.argv[sys.argv.index("--log") + 1]


def record(line: str) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(line + "\n")


server = MCPServer("asker")


class Deploy(BaseModel):
    region: Literal["eu-west", "us-east"] = Field(description="Where to deploy?")
    replicas: int = Field(ge=1, le=5, description="How many replicas?")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    """Says the text back."""
    return text


@server.tool()
def stamp(text: str, ctx: Context) -> str:
    """Records the receipt and the idempotency key chatgate sent with the
    call, in `_meta`."""
    meta = ctx.request_context.meta or {}
    record(f"receipt {meta.get('io.chatgate/receipt')}")
    record(f"idempotency_key {meta.get('io.chatgate/idempotencyKey')}")
    return f"stamped {text}"


@server.tool()
async def deploy(service: str, ctx: Context) -> str:
    """Deploys a service; asks where and how many first (and logs that it
    asks, as an MCP log message)."""
    await ctx.info(f"asking where to deploy {service}")
    answer = await ctx.elicit(message=f"Deploy {service} where?", schema=Deploy)
    if answer.action == "accept":
        line = f"deployed {service} to {answer.data.region} x{answer.data.replicas}"
        record(line)
        return line
    record(f"{answer.action} {service}")
    return f"not deployed: {answer.action}"


class Pick(BaseModel):
    # Two choices under one title: only their values tell them apart.
    file: str = Field(
        description="Which file?",
        json_schema_extra={"oneOf": [
            {"const": "/srv/a/report.pdf", "title": "report.pdf"},
            {"const": "/srv/b/report.pdf", "title": "report.pdf"},
        ]},
    )


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def pick(ctx: Context) -> str:
    """Asks which of two same-titled files; says which came back."""
    answer = await ctx.elicit(message="Which file?", schema=Pick)
    return f"picked {answer.data.file}" if answer.action == "accept" else answer.action


@server.tool()
async def late(seconds: float, ctx: Context) -> str:
    """Works `seconds` (past the call's timeout, in the test), then asks a
    question: one that belongs to a call chatgate has given up on."""
    record(f"late pid={os.getpid()}")
    await asyncio.sleep(seconds)
    answer = await ctx.elicit(message="Deploy password?", schema=Deploy)
    record(f"late question: {answer.action}")
    return answer.action


@server.tool(annotations=ToolAnnotations(destructiveHint=True))
def fail(why: str) -> str:
    """Always fails (an `isError` result with this text)."""
    raise ToolError(f"refused: {why}")


@server.tool()
def crash() -> str:
    """Exits in the middle of the call."""
    os._exit(3)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
async def slow(seconds: float) -> str:
    """Takes its time."""
    await asyncio.sleep(seconds)
    record(f"slow {seconds} done")
    return "slept"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def revision(ctx: Context) -> str:
    """The protocol revision the client's handshake offered."""
    params = ctx.session.client_params
    return str(params.protocol_version) if params else "no handshake"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def header(ctx: Context) -> str:
    """The `X-Chatgate-Test` header of the request (HTTP only)."""
    return (ctx.headers or {}).get("x-chatgate-test", "none")


@server.tool()
async def retire(name: str, ctx: Context) -> str:
    """Stops offering the tool `name`, and says the list changed."""
    server.remove_tool(name)
    # The notification of revisions up to 2025-11-25 (notify_tools_changed
    # only reaches 2026-07-28 subscribers).
    await ctx.session.send_tool_list_changed()
    return f"retired {name}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def borrow(ctx: Context) -> str:
    """Asks the client for its roots and its model (both are refused)."""
    said = []
    for what, request, result in [
        ("roots", types.ListRootsRequest(), types.ListRootsResult),
        (
            "sampling",
            types.CreateMessageRequest(
                params=types.CreateMessageRequestParams(
                    messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))],
                    max_tokens=10,
                )
            ),
            types.CreateMessageResult,
        ),
    ]:
        try:
            await ctx.session.send_request(request, result)
            said.append(f"{what}: granted")
        except Exception as err:  # the client's JSON-RPC error
            said.append(f"{what}: refused ({err})")
    return "; ".join(said)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def steps(n: int, ctx: Context) -> str:
    """Reports its progress n times, 0.3 s apart."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
        await asyncio.sleep(0.3)
    return f"{n} steps"


@server.tool()
async def ask_twice(ctx: Context) -> str:
    """Asks two questions at once; reports when the first comes back (the
    test answers the other only then), and says what came of each."""
    first = asyncio.ensure_future(ctx.elicit(message="First?", schema=Deploy))
    second = asyncio.ensure_future(ctx.elicit(message="Second?", schema=Deploy))
    await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
    record("one came back")
    return f"first: {(await first).action}, second: {(await second).action}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def huge(kib: int) -> str:
    """Answers `kib` KiB of text."""
    return "x" * (kib * 1024)


def extra(text: str) -> str:
    return text


# `--extra-tools N`: N more tools, the first with a 5,000-character
# description (bounds on what a tool list may make chatgate hold).
if "--extra-tools" in sys.argv:
    for i in range(int(sys.argv[sys.argv.index("--extra-tools") + 1])):
        server.add_tool(extra, name=f"extra_{i}", description="d" * 5000 if i == 0 else "An extra tool.")


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run("stdio")
