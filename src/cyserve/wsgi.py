"""WSGI applications (PEP 3333) on cyserve.

``app.wsgi(prefix, wsgi_app)`` mounts one under a prefix of an App (beside GIL-free and static
routes); ``cyserve.run(wsgi_app)`` and ``cyserve module:app`` serve one on its own. A WSGI app
runs as a Python handler: on the worker threads, holding the GIL while it runs.

How a request maps onto the environ, and how the answer goes out:

- The body: one that arrived with its head, or of 64 KiB at most, is read whole before the
  app is called: ``wsgi.input`` is a BytesIO over it, ``CONTENT_LENGTH`` its length (a chunked
  upload too). A larger one is read from the connection as the app reads it: ``wsgi.input`` is a
  ``cyserve.RequestBody`` (``read(n)``, ``read()``, ``readline()``, ``readlines()``, iteration),
  ``CONTENT_LENGTH`` the client's Content-Length (none for a chunked upload), and a read that
  meets ``max_body_bytes``, ``body_timeout``, ``min_body_rate`` or the client's leaving raises a
  ``cyserve.RequestBodyError`` naming it (the client gets 413 or 408 if the app lets it
  through). Either way ``wsgi.input_terminated`` is true (read to the end: b"" is the end), and
  what the app leaves unread is dropped before the connection's next request (a rest over
  1 MiB closes the connection after the answer instead).
- The answer: a list or tuple, or a body whose Content-Length the app announced and that ends
  within 64 KiB, is collected whole and sent in one write. Any other body is streamed: each piece
  is sent as the app yields it, and the next is asked for only once it is written, so a slow
  client slows the app down instead of filling memory. Without a Content-Length the pieces go
  out chunked (HTTP/1.1), or until the connection closes (HTTP/1.0); with one, as they are, never
  more than announced, and a body that ends short closes the connection. A body that goes on
  past its Content-Length, held or streamed, sends the announced bytes and logs an error naming
  the request (the rest of the iterable is looked at, as PEP 3333's server iterates to the end,
  once the announced bytes went out: a generator that goes on working or waiting after its last
  piece does not hold its answer back); a held body with a piece that crosses the length is a
  500. The first piece goes
  out at once (server-sent events work); an error before it is a 500, an error after it closes
  the connection without the last chunk, which tells the client the body is incomplete. An app
  that blocks between pieces holds a worker thread, as with gunicorn's sync workers. Empty
  pieces move nothing on (PEP 3333: the head waits for bytes), but under ``Content-Length: 0``
  (or a length that write() filled) the answer goes at once. An answer to HEAD goes as soon as
  its head is known (the first piece with bytes, the end, or a length of 0): the rest of a
  generator is not read (its close() is called then), since none of it would be sent; gunicorn
  reads it to its end.
- ``SCRIPT_NAME`` is the mount prefix, ``PATH_INFO`` the rest of the path, both percent-decoded
  and given as latin-1 text (PEP 3333's bytes in a str), ``QUERY_STRING`` the raw query.
  With ``--root-path /svc`` (``root_path="/svc"``), ``SCRIPT_NAME`` is "/svc" followed by the
  prefix; an application mounted at "/" whose request path still begins with "/svc" has it moved
  from ``PATH_INFO`` to ``SCRIPT_NAME`` (gunicorn's reading of its SCRIPT_NAME).
- A request header whose name holds "_" is left out, as nginx and gunicorn do: otherwise
  "X_User: admin" would arrive as ``HTTP_X_USER``, the same key as "X-User".
- From the answer: Date is the engine's (the app's is dropped); the app's Server is sent, and
  the engine adds its own (``Server: cyserve``) only when the app set none; Content-Length is
  checked against the body (an answer to HEAD may have no body and announce what GET would
  send; one to HEAD with neither says no length); ``Connection: close`` closes the connection
  after the answer, ``Connection: keep-alive`` and ``Keep-Alive`` are dropped;
  Transfer-Encoding, TE, Trailer and Upgrade are an error (PEP 3333: hop-by-hop headers are the
  server's). PEP 3333 has no way to send trailer fields, and none is added here: an answer
  from a WSGI app has none (the App API's Response and the ASGI extension have them). The app's
  reason phrase is sent as given ("200 Everything Fine"); one with a control character (RFC
  9112: HTAB, SP, VCHAR and obs-text only) is an error. A bare code ("200") gets the engine's
  phrase (the IANA registry's; none for an unregistered code).
- Anything the app gets wrong (no start_response, a str chunk, a bad status or header) is a 500
  and a logged error that names it, like an exception raised by the app. A bad header is an
  error raised by start_response itself, in the app's call (PEP 3333 allows it): an app that
  catches it may still answer with an error page (start_response again, with exc_info).
- An answer with a body and no Content-Type gets the engine's default, text/plain; charset=utf-8.

The handler itself (WSGIHandler, the environ, start_response) is native/wsgi.pyx in the
extension: it runs once per request.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["WSGIHandler", "WSGIError", "is_asgi_app"]  # noqa: F822 (module __getattr__)


def is_asgi_app(obj: object) -> bool:
    """Whether obj looks like an ASGI application (an async callable), which cyserve does not
    run."""
    if inspect.iscoroutinefunction(obj):
        return True
    call = getattr(obj, "__call__", None)  # noqa: B004 (the method itself is inspected)
    return call is not None and inspect.iscoroutinefunction(call)


def __getattr__(name: str) -> Any:
    # In the extension; imported lazily, as cyserve/__init__.py does for Request and Response.
    if name in ("WSGIHandler", "WSGIError"):
        from . import _core

        return getattr(_core, name)
    raise AttributeError(f"module 'cyserve.wsgi' has no attribute {name!r}")
