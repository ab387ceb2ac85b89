"""The tools `@modelcontextprotocol/conformance`'s server scenarios call, as a stdio MCP server
(the Python SDK's MCPServer). warren's conformance test mounts it through mcpfs and serves it
with `warren mcp serve --plain-names --listen`, so the suite sees these tools as warren serves
them: confined, gated and receipted."""
import base64

from mcp.server.mcpserver import Audio, Context, Image, MCPServer
from mcp_types import EmbeddedResource, TextContent, TextResourceContents

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


# A WAV header with no samples.
WAV = b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00"


@server.tool(description="Returns audio.")
def test_audio_content() -> Audio:
    return Audio(data=WAV, format="wav")


@server.tool(description="Returns an embedded resource.")
def test_embedded_resource() -> EmbeddedResource:
    return EmbeddedResource(
        type="resource",
        resource=TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        ),
    )


@server.tool(description="Returns text, an image and an embedded resource.")
def test_multiple_content_types() -> list:
    return [
        TextContent(type="text", text="Multiple content types test:"),
        Image(data=PNG, format="png"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="test://mixed-content-resource",
                mime_type="application/json",
                text='{"test":"data","value":123}',
            ),
        ),
    ]


@server.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", mime_type="image/png")
def static_binary() -> bytes:
    return PNG


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
