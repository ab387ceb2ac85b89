"""An MCP server (the Python SDK's MCPServer) with one tool, `fetch(url)`: an HTTP(S) GET the way
any client makes it, through whatever proxy the environment names (`HTTPS_PROXY` and the rest,
which nsd sets in a `net proxy` namespace) and checking certificates against `SSL_CERT_FILE` when
set. For the network grant's tests: what such a server can reach is what its namespace grants."""
import urllib.error
import urllib.request

from mcp.server import MCPServer

server = MCPServer("fetching")


@server.tool(description="Fetches a URL and returns its body, or why it could not.")
def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return "body:" + answer.read().decode()
    except urllib.error.HTTPError as e:
        return f"status:{e.code}"
    except (urllib.error.URLError, OSError) as e:
        return f"failed:{getattr(e, 'reason', e)}"


if __name__ == "__main__":
    server.run("stdio")
