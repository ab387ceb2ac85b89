"""The tools `@modelcontextprotocol/conformance`'s server scenarios call, as a stdio MCP server
(the Python SDK's MCPServer). warren's conformance test mounts it through mcpfs and serves it
with `warren mcp serve --plain-names --listen`, so the suite sees these tools as warren serves
them: confined, gated and receipted."""
import base64

from mcp.server.mcpserver import Context, Image, MCPServer

server = MCPServer("conformance")

# A 1x1 red PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


@server.tool(description="Returns simple text.")
def test_simple_text() -> str:
    return "This is a simple text response for testing."


@server.tool(description="Returns an image.")
def test_image_content() -> Image:
    return Image(data=PNG, format="png")


@server.tool(description="Fails.")
def test_error_handling() -> str:
    raise RuntimeError("This tool intentionally returns an error for testing")


@server.tool(description="Reports progress.")
async def test_tool_with_progress(ctx: Context) -> str:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100)
    return "Progress test completed"


@server.tool(description="Logs.")
async def test_tool_with_logging(ctx: Context) -> str:
    await ctx.info("Tool execution started")
    await ctx.info("Tool processing data")
    await ctx.info("Tool execution completed")
    return "Logging test completed"


if __name__ == "__main__":
    server.run("stdio")
