"""An MCP server (the Python SDK's MCPServer) whose `search` tool says what DESCRIPTION says,
and which can misbehave on request, for mcpfs's session tests."""
import os
import sys
import time

from mcp.server import MCPServer

server = MCPServer("drifting")


def journal(line: str) -> None:
    """Appends what the server was asked to $JOURNAL, if set: the server's own log of calls."""
    path = os.environ.get("JOURNAL")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@server.tool(description=os.environ.get("DESCRIPTION", "Searches the notes."))
def search(q: str) -> str:
    journal(f"search {q}")
    return f"found: {q}"


@server.tool(description="Exits the server in the middle of a call.")
def crash() -> str:
    os._exit(3)


@server.tool(description="Never answers.")
def hang() -> str:
    time.sleep(3600)
    return "late"


if __name__ == "__main__":
    server.run("stdio")
