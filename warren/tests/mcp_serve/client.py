# An MCP client written with the Python SDK, driving `warren mcp serve` over stdio for
# warren/tests/mcp_serve.rs. Prints one JSON line per step: {"step": ..., ...}.
# Usage: client.py SCENARIO WARREN [FLAGS…]   (FLAGS: `warren mcp serve`'s)
import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def call(session, name, arguments, **kw):
    try:
        return {"result": dump(await session.call_tool(name, arguments, **kw))}
    except MCPError as e:
        return {"error": {"code": e.error.code, "message": e.error.message}}


def transport(warren, flags):
    # MCP_URL: a `warren mcp serve --listen` already running, with its bearer token MCP_TOKEN.
    if "MCP_URL" in os.environ:
        headers = {"Authorization": "Bearer " + os.environ["MCP_TOKEN"]}
        return streamable_http_client(os.environ["MCP_URL"], http_client=create_mcp_http_client(headers=headers))
    params = StdioServerParameters(command=warren, args=["mcp", "serve", *flags], env=dict(os.environ))
    return stdio_client(params)


async def main():
    scenario, warren, *flags = sys.argv[1:]
    # The elicitation requests the server sent (scenario `elicit`: the client declares the
    # capability and answers each with ELICIT_ANSWER: allow_once, deny or decline).
    elicitations = []

    async def on_elicit(context, params):
        elicitations.append(dump(params))
        answer = os.environ.get("ELICIT_ANSWER", "decline")
        if answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"decision": answer})

    kw = {"elicitation_callback": on_elicit} if scenario == "elicit" else {}
    async with transport(warren, flags) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write, **kw) as session:
            init = await session.initialize()
            out("initialize", result=dump(init))
            if scenario == "grant":
                tools = await session.list_tools()
                out("tools/list", tools=[dump(t) for t in tools.tools])
                out("ungranted", **await call(session, "fs_write", {"path": "/x", "content": "y"}))
                out("echo", **await call(session, "echo", {"text": "hello from the client"}))
                await session.send_ping()
                out("ping")
            elif scenario == "ask":
                # Waits for the operator: progress arrives meanwhile; the answer ends it.
                progress = []

                async def on_progress(value, total, message):
                    progress.append(message)

                out("calling")
                reply = await call(session, os.environ["TOOL"], json.loads(os.environ["ARGS"]),
                                   progress_callback=on_progress)
                out("answered", progress=progress, **reply)
            elif scenario == "elicit":
                # Each progress notification is a line as it arrives: the test's clock while
                # the call waits (the server sends one a second).
                async def on_progress(value, total, message):
                    out("progress", value=value)

                out("calling")
                reply = await call(session, os.environ["TOOL"], json.loads(os.environ["ARGS"]),
                                   progress_callback=on_progress)
                out("answered", elicitations=elicitations, **reply)
            elif scenario == "list":
                tools = await session.list_tools()
                out("tools/list", tools=[dump(t) for t in tools.tools])
            elif scenario == "mcp":
                tools = await session.list_tools()
                out("tools/list", tools=[dump(t) for t in tools.tools])
                out("echo", **await call(session, "everything__echo", {"message": "hi via mcpfs"}))
            elif scenario == "cancel":
                # The call waits for the operator; the client gives up (notifications/cancelled).
                out("calling")
                with anyio.move_on_after(float(os.environ.get("GIVE_UP_AFTER", "3"))):
                    await call(session, os.environ["TOOL"], json.loads(os.environ["ARGS"]))
                out("gave up")
                await session.send_ping()
                out("still serving")
                # Stays connected until the test closes our stdin.
                await anyio.to_thread.run_sync(sys.stdin.read)
            elif scenario == "hang-up":
                out("calling")
                sys.stdout.flush()
                # The test kills this process while the call waits.
                await call(session, os.environ["TOOL"], json.loads(os.environ["ARGS"]))


anyio.run(main)
