"""An MCP server for the injection benchmark (the Python SDK's MCPServer): `read_note` returns a
note from the directory named by its first argument. A note is where an attacker's text arrives
as an MCP tool's result."""
import os
import sys

from mcp.server import MCPServer

server = MCPServer("notes")
NOTES = sys.argv[1]


@server.tool(description="Reads the team's note NAME.")
def read_note(name: str) -> str:
    with open(os.path.join(NOTES, os.path.basename(name))) as f:
        return f.read()


if __name__ == "__main__":
    server.run("stdio")
