"""Adds `Authorization: Bearer $TOKEN` to every HTTP/1.1 request it forwards, for clients that
cannot send a header of their own (the conformance suite's server mode). Loopback only. Each
request also gets `Connection: close`, so the upstream closes a connection only after its
response and the client never reuses one the upstream is closing (the suite's back-to-back
requests would otherwise race a connection closed after a refusal).
Usage: TOKEN=… bearer_proxy.py LISTEN_PORT UPSTREAM_HOST:PORT (port 0: a free one, printed
on stdout as `listening on PORT`)."""
import asyncio
import os
import sys

TOKEN = os.environ["TOKEN"].encode()


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def requests(client, upstream):
    """Each request head gets the header; its body (Content-Length or chunked) passes as is."""
    try:
        while True:
            head = await client.readuntil(b"\r\n\r\n")
            lines = [l for l in head.split(b"\r\n")[:-2]
                     if not l.lower().startswith((b"authorization:", b"connection:"))]
            lines[1:1] = [b"Authorization: Bearer " + TOKEN, b"Connection: close"]
            upstream.write(b"\r\n".join(lines) + b"\r\n\r\n")
            fields = {l.split(b":", 1)[0].strip().lower(): l.split(b":", 1)[1].strip() for l in lines[1:] if b":" in l}
            if b"content-length" in fields:
                upstream.write(await client.readexactly(int(fields[b"content-length"])))
            elif fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                while True:
                    size_line = await client.readuntil(b"\r\n")
                    size = int(size_line.split(b";")[0], 16)
                    upstream.write(size_line + await client.readexactly(size + 2))
                    if size == 0:
                        break
            await upstream.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        upstream.close()


async def main():
    port, upstream_addr = int(sys.argv[1]), sys.argv[2]
    host, uport = upstream_addr.rsplit(":", 1)

    async def handle(client_r, client_w):
        up_r, up_w = await asyncio.open_connection(host, int(uport))
        await asyncio.gather(requests(client_r, up_w), pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
