"""Four minimal pure-Python designs: sequential, forking, threading, asyncio (docs/benchmarks.md).

Like the seed's, each reads one request, answers it and closes the connection (no keep-alive: a
sequential server that kept connections open would serve one client and starve the rest). They
read until the end of the request head and ignore any body. Listen backlog 128, as in the seed.

Run: python -m bench.peers.python.minimal DESIGN PORT     (DESIGN: sequential | forking | threading | asyncio)
"""

import asyncio
import os
import socket
import sys
import threading

from bench.peers.python.routes import handle

BACKLOG = 128
_REASONS = {200: b"OK", 404: b"Not Found", 500: b"Internal Server Error"}


def respond(head: bytes) -> bytes:
    """The whole response, head and body, for one request head."""
    try:
        path = head.split(b" ", 2)[1].decode("latin-1")
    except IndexError:
        path = "/"
    status, body, ctype = handle(path)
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        status, _REASONS[status], ctype.encode(), len(body)) + body


def read_head(conn: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def serve_one(conn: socket.socket) -> None:
    try:
        head = read_head(conn)
        if head:
            conn.sendall(respond(head))
    except OSError:
        pass
    finally:
        conn.close()


def listener(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(BACKLOG)
    return s


def sequential(port: int) -> None:
    s = listener(port)
    while True:
        conn, _ = s.accept()
        serve_one(conn)


def forking(port: int) -> None:
    s = listener(port)
    while True:
        conn, _ = s.accept()
        # Reap finished children here rather than ignoring SIGCHLD: only a child reaped by
        # wait() has its CPU time added to ours (cutime), which the harness measures.
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if os.fork() == 0:
            s.close()
            serve_one(conn)
            os._exit(0)
        conn.close()


def threading_design(port: int) -> None:
    s = listener(port)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve_one, args=(conn,), daemon=True).start()


async def _async_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(respond(head))
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        pass
    finally:
        writer.close()


def asyncio_design(port: int) -> None:
    async def main():
        server = await asyncio.start_server(_async_client, "127.0.0.1", port, backlog=BACKLOG)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


DESIGNS = {"sequential": sequential, "forking": forking, "threading": threading_design,
           "asyncio": asyncio_design}

if __name__ == "__main__":
    DESIGNS[sys.argv[1]](int(sys.argv[2]))
