"""cyserve.App: the routes of an application, checked when they are registered.

An App is only a list of routes. ``app.build()`` turns it into the plain list that
``cyserve._core.Server`` takes, one tuple per route::

    (match, pattern, methods, kind, target)

    match    "path"   exact path, or a pattern with typed parameters: /users/{id:int}, {name},
                      {rest:path}
             "prefix" the longest registered prefix wins (a Lwan-style url map)
             "regex"  a POSIX extended regular expression matched against the whole path; its
                      groups become the parameters "1", "2", ...
    methods  a tuple of upper-case method names, or None for any method
    kind     "python" target is a callable taking a Request
             "nogil"  target is a PyCapsule named "cyserve.nogil_handler", or a pair
                      (that capsule, a capsule holding the handler's ctx pointer, or None), or
                      a triple (capsule, ctx or None, inline: bool); inline False keeps the
                      route off the engine's inline path
             "nogil_ws" target is (a PyCapsule named "cyserve.nogil_ws_handler", a ctx capsule
                      or None): a GIL-free WebSocket route (app.nogil_websocket)
             "static" target is (status, [(name, value), ...], body bytes), served from C
             "files"  target is the real path of a directory
             "health" as "static", but answered 503 once the server fails its health or
                      a stop begins (serving.py's --health-path route)

Everything that can be wrong with a route is reported here, at registration, as a RouteError (a
ValueError) that names the pattern, so that the C router only ever sees routes that make sense
(it validates again; these messages are the ones a user should see). Two routes with the same
pattern and a method in common are an error naming both: the router would have to pick one
silently.

A GET route also answers HEAD: the router matches HEAD wherever GET is accepted and the engine
sends the headers only. Prefixes match on segment boundaries, and "/api" and "/api/" are the same
prefix (csrc/router.h).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from .errors import HandlerTypeError, RouteError

if TYPE_CHECKING:
    from ._core import Request, Response

__all__ = ["App", "Handler", "RouteTuple", "METHODS", "NOGIL_CAPSULE_NAME", "is_nogil_capsule"]

HandlerResult = Union[str, bytes, dict[str, Any], list[Any], "Response", None]
Handler = Callable[["Request"], HandlerResult]
H = TypeVar("H", bound=Callable[..., Any])
Match = Literal["path", "prefix", "regex"]
Kind = Literal["python", "nogil", "nogil_ws", "static", "files", "health"]
RouteTuple = tuple[Match, str, tuple[str, ...] | None, Kind, Any]

NOGIL_CAPSULE_NAME = "cyserve.nogil_handler"
NOGIL_WS_CAPSULE_NAME = "cyserve.nogil_ws_handler"
PARAM_TYPES = ("int", "str", "path")
# Path parameters or regex groups per route (ROUTER_MAX_PARAMS in csrc/router.h).
MAX_PARAMS = 16
# The methods the parser names (enum http_method in csrc/http_method.h); the router keeps a bit per
# method, so any other method can only reach a route registered with methods=None.
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE")

# RFC 9110 section 5.6.2: a method and a header name are tokens.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters a literal part of a path pattern may hold: RFC 3986 pchar (unreserved, sub-delims,
# ':' and '@') plus '%' for percent-encoded bytes. The router compares them as raw bytes.
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@%]*")
# Headers the engine writes itself on every response; a static route setting them would produce
# a response that lies about its own framing.
_ENGINE_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "date"})


@dataclass
class _Route:
    match: Match
    pattern: str
    key: str  # what two routes must share to collide: the pattern with parameter names erased
    methods: tuple[str, ...] | None  # as registered, None for any
    kind: Kind
    target: object
    label: str  # how error messages name this route's target

    def describe(self) -> str:
        methods = "any method" if self.methods is None else ",".join(self.methods)
        return f"{methods} {self.pattern} ({self.label})"


class App:
    """A set of routes. Register them with the decorators (``@app.get("/p")``) or the methods
    below, then give the app to :func:`cyserve.run` or the ``cyserve`` command."""

    def __init__(self) -> None:
        self._routes: list[_Route] = []

    # ---- Python handlers, as decorators -------------------------------------------------

    def route(self, path: str, methods: Iterable[str] | str | None = None) -> Callable[[H], H]:
        """Register the decorated function for ``path`` (a pattern such as /users/{id:int}).
        ``methods=None`` answers every method."""
        return self._decorator(path, methods, f"app.route({path!r})")

    def get(self, path: str) -> Callable[[H], H]:
        """Register the decorated function for GET (and so HEAD) on ``path``."""
        return self._decorator(path, ("GET",), f"app.get({path!r})")

    def post(self, path: str) -> Callable[[H], H]:
        return self._decorator(path, ("POST",), f"app.post({path!r})")

    def put(self, path: str) -> Callable[[H], H]:
        return self._decorator(path, ("PUT",), f"app.put({path!r})")

    def delete(self, path: str) -> Callable[[H], H]:
        return self._decorator(path, ("DELETE",), f"app.delete({path!r})")

    def patch(self, path: str) -> Callable[[H], H]:
        return self._decorator(path, ("PATCH",), f"app.patch({path!r})")

    def head(self, path: str) -> Callable[[H], H]:
        return self._decorator(path, ("HEAD",), f"app.head({path!r})")

    def options(self, path: str) -> Callable[[H], H]:
        return self._decorator(path, ("OPTIONS",), f"app.options({path!r})")

    def _decorator(self, path: str, methods: Iterable[str] | str | None,
                   where: str) -> Callable[[H], H]:
        def register(handler: H) -> H:
            self._add("path", path, methods, handler, where)
            return handler  # unchanged, so decorators stack: @app.get("/a") @app.get("/b")

        return register

    # ---- Handlers registered directly ---------------------------------------------------

    def add_route(self, path: str, handler: Handler | object,
                  methods: Iterable[str] | str | None = None) -> None:
        """Register ``handler`` for the path pattern ``path``: a Python callable, or a nogil
        handler capsule (as ``urls.add`` in onion's Python bindings)."""
        self._add("path", path, methods, handler, f"app.add_route({path!r})")

    def prefix(self, prefix: str, handler: Handler | object,
               methods: Iterable[str] | str | None = None) -> None:
        """Register ``handler`` for every path that starts with ``prefix``; when several
        prefixes match, the longest wins. ``handler`` is a Python callable or a nogil capsule."""
        self._add("prefix", prefix, methods, handler, f"app.prefix({prefix!r})")

    def regex(self, pattern: str, handler: Handler | object,
              methods: Iterable[str] | str | None = None) -> None:
        """Register ``handler`` for paths that the POSIX extended regular expression
        ``pattern`` matches as a whole; its groups reach the handler as parameters "1", "2"..."""
        self._add("regex", pattern, methods, handler, f"app.regex({pattern!r})")

    def nogil(self, path: str, capsule: object, methods: Iterable[str] | str | None = None,
              ctx: object = None, inline: bool = True) -> None:
        """Register a GIL-free Cython handler (a capsule from ``cyserve_handler_capsule``).

        ``ctx``, if given, is a PyCapsule whose pointer the handler receives as its ``ctx``
        argument; the App keeps it (and so its memory) alive as long as the route exists.

        ``inline=False`` keeps the route off the engine's inline path: every call then runs in a
        coroutine that idle workers can steal. By default a route whose first calls are quick
        runs on the worker's loop itself (faster), and only a streak of slow calls sends it back
        (docs/architecture.md, "Request path"); a handler that is quick most of the time but
        sometimes slow (a cache miss, a lock) should say ``inline=False``."""
        where = f"app.nogil({path!r})"
        if not is_nogil_capsule(capsule):
            raise HandlerTypeError(f"{where}: expected a PyCapsule named {NOGIL_CAPSULE_NAME!r} "
                                   "(made by cyserve_handler_capsule), got "
                                   f"{_describe_object(capsule)}")
        if not isinstance(inline, bool):
            raise HandlerTypeError(f"{where}: inline must be True or False, got "
                                   f"{_describe_object(inline)}")
        if ctx is not None and type(ctx).__name__ != "PyCapsule":
            raise HandlerTypeError(f"{where}: ctx must be a PyCapsule (its pointer is passed to "
                                   f"the handler) or None, got {_describe_object(ctx)}")
        if not inline:
            self._add_kind("path", path, methods, "nogil", (capsule, ctx, False), "nogil handler",
                           where)
        elif ctx is None:
            self._add("path", path, methods, capsule, where)
        else:
            self._add_kind("path", path, methods, "nogil", (capsule, ctx), "nogil handler", where)

    # ---- Responses served from C ----------------------------------------------------------

    def wsgi(self, prefix: str, app: Callable[..., Any]) -> None:
        """Serve the WSGI application ``app`` (PEP 3333) for every path under ``prefix``, any
        method; ``SCRIPT_NAME`` is the prefix and ``PATH_INFO`` the rest (cyserve.wsgi says how
        requests and answers map, and what differs from a streaming server)."""
        from ._core import WSGIHandler

        where = f"app.wsgi({prefix!r})"
        if isinstance(app, App):
            raise RouteError(f"{where}: this is a cyserve.App, not a WSGI application")
        if not callable(app):
            raise HandlerTypeError(f"{where}: a WSGI application must be callable, got "
                                   f"{_describe_object(app)}")
        if is_asgi_app(app):
            raise RouteError(f"{where}: {_describe_object(app)} is an async (ASGI) "
                             "application; mount it with app.asgi()")
        _check_wsgi_signature(where, app)
        if not isinstance(prefix, str):
            raise RouteError(f"{where}: pattern must be a str, got {type(prefix).__name__}")
        handler = WSGIHandler(app, prefix)
        label = "WSGI " + getattr(app, "__module__", "?") + "." + getattr(
            app, "__qualname__", type(app).__name__)
        self._add_kind("prefix", prefix, None, "python", handler, label, where)

    def asgi(self, prefix: str, app: Callable[..., Any]) -> None:
        """Serve the ASGI 3 application ``app`` (http and lifespan scopes) for every path under
        ``prefix``, any method: ``root_path`` is the prefix and ``path`` the whole path, as
        Starlette's Mount reads them (cyserve.asgi says how requests and answers map)."""
        from ._core import ASGIHandler

        where = f"app.asgi({prefix!r})"
        if isinstance(app, App):
            raise RouteError(f"{where}: this is a cyserve.App, not an ASGI application")
        if not is_asgi_app(app):
            raise HandlerTypeError(f"{where}: an ASGI application is an async callable "
                                   f"(scope, receive, send), got {_describe_object(app)}")
        if not isinstance(prefix, str):
            raise RouteError(f"{where}: pattern must be a str, got {type(prefix).__name__}")
        handler = ASGIHandler(app, prefix)
        label = "ASGI " + getattr(app, "__module__", "?") + "." + getattr(
            app, "__qualname__", type(app).__name__)
        self._add_kind("prefix", prefix, None, "python", handler, label, where)

    def websocket(self, path: str, subprotocols: Iterable[str] | None = None,
                  max_connections: int = 1000) -> Callable[[H], H]:
        """Register the decorated function as the WebSocket handler of ``path`` (a pattern, as
        for ``get``): it is called with a ``cyserve.websocket.WebSocket`` (``receive()``,
        ``send()``, ``close()``, iteration over the messages) once the handshake is accepted, on
        a thread of its own, and may block. ``subprotocols``: those the route speaks, the first
        the client offers is chosen. ``max_connections``: the most WebSockets the route serves
        at once (a thread each); one more is answered 503 with Retry-After before the
        handshake. A plain HTTP request to the path gets 426."""
        from ._core import ASGIHandler
        from .websocket import SyncWebSocketApp

        where = f"app.websocket({path!r})"
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or max_connections < 1:
            raise RouteError(f"{where}: max_connections must be a positive integer, got "
                             f"{max_connections!r}")

        def register(handler: H) -> H:
            if not callable(handler):
                raise HandlerTypeError(f"{where}: a WebSocket handler is a function taking the "
                                       f"WebSocket, got {_describe_object(handler)}")
            target = ASGIHandler(SyncWebSocketApp(handler, list(subprotocols or ()),
                                                  max_connections), "")
            label = "WebSocket " + getattr(handler, "__module__", "?") + "." + getattr(
                handler, "__qualname__", type(handler).__name__)
            self._add_kind("path", path, ("GET",), "python", target, label, where)
            return handler

        return register

    def nogil_websocket(self, path: str, capsule: object, ctx: object = None) -> None:
        """Register a GIL-free WebSocket route (a capsule from ``cyserve_ws_handler_capsule``,
        cyserve/handler.h and _core.pxd): the engine answers the handshake and runs the
        handler's on_open, on_message and on_close in C on the worker, without the GIL; between
        messages the connection is idle and holds no coroutine. ``ctx``, if given, is a
        PyCapsule whose pointer the callbacks receive; the App keeps it alive. GET only; a
        request that is not a valid handshake gets 400 (426 for another version)."""
        where = f"app.nogil_websocket({path!r})"
        if type(capsule).__name__ != "PyCapsule" or not _capsule_is_valid(
                capsule, NOGIL_WS_CAPSULE_NAME.encode()):
            raise HandlerTypeError(f"{where}: expected a PyCapsule named "
                                   f"{NOGIL_WS_CAPSULE_NAME!r} (made by "
                                   f"cyserve_ws_handler_capsule), got {_describe_object(capsule)}")
        if ctx is not None and type(ctx).__name__ != "PyCapsule":
            raise HandlerTypeError(f"{where}: ctx must be a PyCapsule (its pointer is passed to "
                                   f"the callbacks) or None, got {_describe_object(ctx)}")
        self._add_kind("path", path, ("GET",), "nogil_ws", (capsule, ctx),
                       "GIL-free WebSocket", where)

    def static(self, path: str, body: str | bytes, content_type: str | None = None,
               status: int = 200, headers: Iterable[tuple[str, str]] | None = None,
               methods: Iterable[str] | str | None = ("GET",)) -> None:
        """Answer ``path`` with a fixed response, serialised once and served entirely in C
        (as ``add_static`` in onion's Python bindings). A str body is sent as UTF-8, and without a
        content_type as ``text/plain; charset=utf-8`` (bytes: ``text/plain``)."""
        where = f"app.static({path!r})"
        if isinstance(body, str):
            data = body.encode("utf-8")
        elif isinstance(body, (bytes, bytearray, memoryview)):
            data = bytes(body)
        else:
            raise RouteError(f"{where}: body must be str or bytes, got {type(body).__name__}")
        if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
            raise RouteError(f"{where}: status must be an integer between 200 and 599, "
                             f"got {status!r}")
        if status in (204, 205, 304) and data:
            raise RouteError(f"{where}: a {status} response cannot have a body")
        header_list = _check_headers(where, headers or ())
        if not any(name.lower() == "content-type" for name, _ in header_list):
            if content_type is None:
                content_type = ("text/plain; charset=utf-8" if isinstance(body, str)
                                else "text/plain")
            _check_header_value(where, "Content-Type", content_type)
            header_list.insert(0, ("Content-Type", content_type))
        self._add_kind("path", path, methods, "static", (status, header_list, data),
                       f"static response, {len(data)} bytes", where)

    def files(self, prefix: str, directory: str | os.PathLike[str],
              methods: Iterable[str] | str | None = ("GET",)) -> None:
        """Serve the files under ``directory`` at ``prefix`` (normalised to end with '/'):
        GET /files/a/b.txt sends DIRECTORY/a/b.txt. Nothing outside the directory is served."""
        where = f"app.files({prefix!r}, {os.fspath(directory)!r})"
        # A bytes or non-UTF-8 name is kept as the file system gave it (os.fsdecode's
        # surrogateescape); the server turns it back into the same bytes with os.fsencode.
        path = os.fsdecode(directory)
        if not os.path.exists(path):
            raise RouteError(f"{where}: directory {path!r} does not exist")
        if not os.path.isdir(path):
            raise RouteError(f"{where}: {path!r} is not a directory")
        if isinstance(prefix, str) and not prefix.endswith("/"):
            prefix += "/"
        # The real path: the engine's check that a file lies under the root compares against it.
        root = os.path.realpath(path)
        self._add_kind("prefix", prefix, methods, "files", root, f"files from {root}", where)

    # ---- The result -----------------------------------------------------------------------

    def build(self) -> list[RouteTuple]:
        """The routes in the form cyserve._core.Server takes (see the module docstring), in
        registration order."""
        return [(r.match, r.pattern, r.methods, r.kind, r.target) for r in self._routes]

    def __len__(self) -> int:
        return len(self._routes)

    def __repr__(self) -> str:
        return f"<cyserve.App with {len(self._routes)} routes>"

    # ---- Internals ------------------------------------------------------------------------

    def _add(self, match: Match, pattern: str, methods: Iterable[str] | str | None,
             handler: object, where: str) -> None:
        if is_nogil_capsule(handler):
            self._add_kind(match, pattern, methods, "nogil", handler, "nogil handler", where)
            return
        _check_python_handler(where, handler)
        label = getattr(handler, "__module__", "?") + "." + getattr(
            handler, "__qualname__", type(handler).__name__)
        self._add_kind(match, pattern, methods, "python", handler, label, where)

    def _add_kind(self, match: Match, pattern: str, methods: Iterable[str] | str | None,
                  kind: Kind, target: object, label: str, where: str) -> None:
        key = _check_pattern(where, match, pattern)
        new = _Route(match, pattern, key, _check_methods(where, methods), kind, target, label)
        for old in self._routes:
            if old.match == match and old.key == key and _overlap(old, new):
                raise RouteError(f"duplicate route: {new.describe()} overlaps "
                                 f"{old.describe()}, registered before")
        self._routes.append(new)


def is_asgi_app(obj: object) -> bool:
    """Whether obj is an ASGI 3 application: a coroutine function, or an object whose __call__
    is one (uvicorn's test). Here, not in cyserve.asgi, so that telling an app's kind does not
    import asyncio (and ssl with it: ~6 MiB) into a server that serves no ASGI app."""
    if inspect.iscoroutinefunction(obj):
        return True
    call = getattr(obj, "__call__", None)  # noqa: B004 (the method itself is inspected)
    return call is not None and inspect.iscoroutinefunction(call)


def as_app(obj: object, interface: str = "auto") -> App:
    """The App to serve for ``obj``: obj itself when it is an App, else an App serving it as a
    WSGI or an ASGI application at "/". ``interface`` is "cyserve" (obj must be an App), "wsgi"
    (obj must be a WSGI callable), "asgi" (an async callable) or "auto" (whichever it is; an
    async callable is ASGI, as uvicorn tells them). HandlerTypeError (a TypeError) otherwise,
    saying what obj is."""
    from .config import INTERFACES

    if interface not in INTERFACES:
        raise ValueError(f"interface must be one of {', '.join(INTERFACES)}, "
                         f"got {interface!r}")
    if isinstance(obj, App):
        if interface in ("wsgi", "asgi"):
            raise HandlerTypeError(f"interface {interface!r} was asked for, but this is a "
                                   "cyserve.App")
        return obj
    what = _describe_object(obj)
    if interface == "cyserve" or not callable(obj):
        wanted = ("a cyserve.App" if interface == "cyserve"
                  else "a cyserve.App, a WSGI or an ASGI application")
        raise HandlerTypeError(f"expected {wanted}, got {what}")
    if interface == "asgi" or (interface == "auto" and is_asgi_app(obj)):
        if not is_asgi_app(obj):
            raise HandlerTypeError(f"interface 'asgi' was asked for, but {what} is not an "
                                   "async callable")
        app = App()
        app.asgi("/", obj)
        return app
    if is_asgi_app(obj):
        raise HandlerTypeError(f"{what} is an async (ASGI) application, but interface 'wsgi' "
                               "was asked for")
    app = App()
    app.wsgi("/", obj)
    return app


def _check_wsgi_signature(where: str, app: object) -> None:
    """A WSGI application is called with (environ, start_response): say so at registration
    rather than with a 500 on every request. An app factory (create_app()) is the usual mix-up."""
    try:
        sig = inspect.signature(app)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return
    try:
        sig.bind(object(), object())
    except TypeError:
        name = getattr(app, "__qualname__", type(app).__name__)
        hint = ""
        if not any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                   for p in sig.parameters.values()):
            hint = " (an application factory? the command takes --factory to call it first)"
        raise HandlerTypeError(f"{where}: {name!r} cannot be called as a WSGI application "
                               f"with (environ, start_response): its signature is {sig}"
                               f"{hint}") from None


def _overlap(a: _Route, b: _Route) -> bool:
    if a.methods is None or b.methods is None:
        return True
    return bool(set(a.methods) & set(b.methods))


def _check_methods(where: str, methods: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if methods is None:
        return None
    if isinstance(methods, str):  # methods="GET" would otherwise iterate over letters
        methods = (methods,)
    out: list[str] = []
    for m in methods:
        if not isinstance(m, str) or not _TOKEN.fullmatch(m):
            raise RouteError(f"{where}: invalid method {m!r}: must be an HTTP token such as GET")
        m = m.upper()
        if m not in METHODS:
            raise RouteError(f"{where}: method {m!r} cannot be routed by name (known: "
                             f"{', '.join(METHODS)}); use methods=None to accept any method")
        if m not in out:
            out.append(m)
    if not out:
        raise RouteError(f"{where}: methods is empty (use None for any method)")
    return tuple(out)


def _check_pattern(where: str, match: str, pattern: object) -> str:
    """Validate a pattern; return the key under which two routes collide."""
    if not isinstance(pattern, str):
        raise RouteError(f"{where}: pattern must be a str, got {type(pattern).__name__}")
    if match == "regex":
        return _check_regex(where, pattern)
    if not pattern.startswith("/"):
        raise RouteError(f"{where}: invalid pattern {pattern!r}: must start with '/'")
    if match == "prefix":
        if "{" in pattern or "}" in pattern:
            raise RouteError(f"{where}: invalid prefix {pattern!r}: a prefix is literal, "
                             "it cannot hold {parameters}")
        _check_literal(where, pattern, pattern)
        return pattern.rstrip("/") or "/"  # the router stores "/api/" as "/api"
    return _check_path_pattern(where, pattern)


def _check_literal(where: str, pattern: str, part: str) -> None:
    bad = _PATH_CHARS.sub("", part.replace("/", ""))
    if bad:
        raise RouteError(f"{where}: invalid pattern {pattern!r}: character {bad[0]!r} "
                         "is not allowed in a path (percent-encode it)")
    if "//" in part:
        raise RouteError(f"{where}: invalid pattern {pattern!r}: empty path segment '//'")


def _check_path_pattern(where: str, pattern: str) -> str:
    segments = pattern.split("/")[1:]
    names: set[str] = set()
    key_parts: list[str] = []
    for i, seg in enumerate(segments):
        if not seg and i != len(segments) - 1:  # only "/" and a trailing slash are empty
            raise RouteError(f"{where}: invalid pattern {pattern!r}: empty path segment '//'")
        if "{" not in seg and "}" not in seg:
            _check_literal(where, pattern, "/" + seg)
            key_parts.append(seg)
            continue
        if not (seg.startswith("{") and seg.endswith("}")) or seg.count("{") != 1 \
                or seg.count("}") != 1:
            raise RouteError(f"{where}: invalid pattern {pattern!r}: unbalanced braces or a "
                             f"parameter that does not fill its segment in {seg!r} (write "
                             "/{name}, /{name:int} or /{name:path})")
        name, _, typ = seg[1:-1].partition(":")
        typ = typ or "str"
        if not _IDENT.fullmatch(name):
            raise RouteError(f"{where}: invalid pattern {pattern!r}: parameter name {name!r} "
                             "is not an identifier")
        if typ not in PARAM_TYPES:
            raise RouteError(f"{where}: invalid pattern {pattern!r}: unknown parameter type "
                             f"{typ!r} (known: {', '.join(PARAM_TYPES)})")
        if name in names:
            raise RouteError(f"{where}: invalid pattern {pattern!r}: parameter {name!r} "
                             "appears twice")
        if typ == "path" and i != len(segments) - 1:
            raise RouteError(f"{where}: invalid pattern {pattern!r}: a {{{name}:path}} "
                             "parameter must be the last segment")
        names.add(name)
        if len(names) > MAX_PARAMS:
            raise RouteError(f"{where}: invalid pattern {pattern!r}: more than {MAX_PARAMS} "
                             "parameters")
        key_parts.append("{:" + typ + "}")
    return "/" + "/".join(key_parts)


def _check_regex(where: str, pattern: str) -> str:
    if not pattern:
        raise RouteError(f"{where}: invalid regex {pattern!r}: empty")
    if "\x00" in pattern:
        raise RouteError(f"{where}: invalid regex {pattern!r}: contains NUL")
    if _stacked_repetition(pattern):
        raise RouteError(f"{where}: invalid regex {pattern!r}: a repetition operator follows "
                         "another (undefined in POSIX; write one operator or add a group)")
    error = _posix_regex_error(pattern)
    if error is not None:
        raise RouteError(f"{where}: invalid regex {pattern!r}: {error} "
                         "(regex routes are POSIX extended regular expressions)")
    groups = _count_groups(pattern)
    if groups > MAX_PARAMS:
        raise RouteError(f"{where}: invalid regex {pattern!r}: {groups} groups, at most "
                         f"{MAX_PARAMS} (request.params holds one per group)")
    return pattern


# The C router compiles regex routes with the C library's regcomp(REG_EXTENDED), whose syntax is
# not Python's (no \d, no (?P<...>), [[:alpha:]] classes). Checking with the same regcomp gives
# the same verdict and the C library's own message. regex_t is 64 bytes on glibc x86-64 and
# aarch64; the buffer is larger so that a libc with a bigger one is still safe.
_REGEX_T_SIZE = 256
_REG_EXTENDED = 1


def _bracket_end(p: str, i: int) -> int:
    """The index of the ']' closing the bracket expression that opens at p[i] (len(p) if none).
    A ']' right after '[' or '[^' is literal; [:class:], [.x.] and [=x=] hold no ']' before
    their closing ':]', '.]' or '=]'."""
    n = len(p)
    j = i + 1
    if j < n and p[j] == "^":
        j += 1
    if j < n and p[j] == "]":
        j += 1
    while j < n and p[j] != "]":
        if p[j] == "[" and j + 1 < n and p[j + 1] in ":.=":
            close = p.find(p[j + 1] + "]", j + 2)  # the class's own ":]", not its first ':'
            j = close + 2 if close >= 0 else n
        else:
            j += 1
    return j


def _count_groups(p: str) -> int:
    """The capture groups of a POSIX ERE: every '(' that is neither escaped nor in brackets."""
    count, i = 0, 0
    while i < len(p):
        if p[i] == "\\":
            i += 1
        elif p[i] == "[":
            i = _bracket_end(p, i)
        elif p[i] == "(":
            count += 1
        i += 1
    return count


def _stacked_repetition(p: str) -> bool:
    """Whether a repetition operator (*, +, ?, {) directly follows another outside brackets.

    The same rule as the C router's (router__stacked_repetition in csrc/router.c), and checked
    first for the same reason: glibc's regcomp accepts "a+++...+" and builds a tree that grows
    exponentially with the stack, so handing such a pattern to regcomp below could exhaust memory
    in this process."""
    after_rep = False
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            i += 1  # the escaped character is an atom
            after_rep = False
        elif c == "[":
            i = _bracket_end(p, i)
            after_rep = False
        elif c in "*+?{":
            if after_rep:
                return True
            if c == "{":
                close = p.find("}", i)
                i = close if close >= 0 else n
            after_rep = True
        else:
            after_rep = False
        i += 1
    return False


@functools.lru_cache(maxsize=1)
def _libc_regex() -> tuple[Any, Any, Any] | None:
    # CDLL(None) is the running program's own symbol table, which includes the C library the
    # interpreter is linked against, with no ldconfig subprocess (ctypes.util.find_library runs
    # one).
    try:
        libc = ctypes.CDLL(None)
        regcomp, regerror, regfree = libc.regcomp, libc.regerror, libc.regfree
    except (OSError, AttributeError):  # no C library to ask: the C router will tell
        return None
    regcomp.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    regcomp.restype = ctypes.c_int
    regerror.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    regerror.restype = ctypes.c_size_t
    regfree.argtypes = [ctypes.c_void_p]
    regfree.restype = None
    return regcomp, regerror, regfree


def _posix_regex_error(pattern: str) -> str | None:
    funcs = _libc_regex()
    if funcs is None:
        return None
    regcomp, regerror, regfree = funcs
    buf = ctypes.create_string_buffer(_REGEX_T_SIZE)
    rc = regcomp(buf, pattern.encode("utf-8"), _REG_EXTENDED)
    if rc == 0:
        regfree(buf)
        return None
    msg = ctypes.create_string_buffer(256)
    regerror(rc, buf, msg, len(msg))
    return msg.value.decode("utf-8", "replace") or f"regcomp error {rc}"


def _check_python_handler(where: str, handler: object) -> None:
    if not callable(handler):
        raise HandlerTypeError(f"{where}: handler must be a callable taking a Request or a nogil "
                         f"handler capsule, got {_describe_object(handler)}")
    if inspect.iscoroutinefunction(handler):
        raise RouteError(f"{where}: handler {getattr(handler, '__qualname__', handler)!r} is "
                         "async; cyserve calls handlers synchronously on worker threads")
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return
    try:
        sig.bind(object())
    except TypeError:
        raise RouteError(f"{where}: handler {getattr(handler, '__qualname__', handler)!r} "
                         f"must accept exactly one argument (the Request), its signature is "
                         f"{sig}") from None


def _check_headers(where: str, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in headers:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise RouteError(f"{where}: headers must be (name, value) pairs, got {item!r}")
        name, value = item
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise RouteError(f"{where}: invalid header name {name!r}")
        if name.lower() in _ENGINE_HEADERS:
            raise RouteError(f"{where}: header {name!r} is written by the server itself")
        # A route's own Server replaces the engine's; it is not a list, so two are invalid.
        if name.lower() == "server" and any(n.lower() == "server" for n, _ in out):
            raise RouteError(f"{where}: header {name!r} given twice")
        _check_header_value(where, name, value)
        out.append((name, value))
    return out


def _check_header_value(where: str, name: str, value: object) -> None:
    # CR and LF would let a value start a new header or the body; other control characters
    # (NUL above all) are invalid in a field value (RFC 9110 section 5.5).
    if not isinstance(value, str) or any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F
                                         for c in value):
        raise RouteError(f"{where}: invalid value for header {name!r}: {value!r}")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise RouteError(f"{where}: header {name!r} value {value!r} is not Latin-1") from None


_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid.restype = ctypes.c_int
_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_get_name.restype = ctypes.c_char_p


def is_nogil_capsule(obj: object) -> bool:
    """True for a PyCapsule named "cyserve.nogil_handler" with a non-NULL pointer."""
    return type(obj).__name__ == "PyCapsule" and bool(
        _capsule_is_valid(obj, NOGIL_CAPSULE_NAME.encode()))


def _describe_object(obj: object) -> str:
    if type(obj).__name__ == "PyCapsule":
        name = _capsule_get_name(obj)
        return "a capsule named " + (repr(name.decode("utf-8", "replace")) if name else "NULL")
    return f"{type(obj).__name__} {obj!r}"[:120]
