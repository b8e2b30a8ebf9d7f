"""cyserve.App: what build() hands the engine, and every registration mistake it catches.

Most of these tests need no engine: they check the route list and the error messages. The last
ones check that the engine's router agrees; behaviour over HTTP is tested in test_demo.py.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Any

import pytest

import cyserve
from cyserve.app import METHODS, is_nogil_capsule
from cyserve.errors import RouteError

# PyCapsule keeps the name pointer it is given, so the names must outlive the capsules.
_GOOD_NAME = ctypes.create_string_buffer(b"cyserve.nogil_handler")
_BAD_NAME = ctypes.create_string_buffer(b"someone.else")
_POINTEE = ctypes.c_int(0)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object


def make_capsule(name: Any) -> object:
    """A capsule that is never called: only its name is checked."""
    return _capsule_new(ctypes.addressof(_POINTEE), name, None)


def handler(req: object) -> str:
    return "ok"


def other(req: object) -> str:
    return "other"


def test_decorators_build_the_route_tuples() -> None:
    app = cyserve.App()

    @app.get("/a")
    def a(req: object) -> str:
        return "a"

    app.post("/a")(handler)
    app.put("/p")(handler)
    app.delete("/d")(handler)
    app.patch("/pa")(handler)
    app.head("/h")(handler)
    app.options("/o")(handler)
    app.route("/any")(handler)
    app.route("/some", methods=["get", "Post"])(handler)
    assert app.build() == [
        ("path", "/a", ("GET",), "python", a),
        ("path", "/a", ("POST",), "python", handler),
        ("path", "/p", ("PUT",), "python", handler),
        ("path", "/d", ("DELETE",), "python", handler),
        ("path", "/pa", ("PATCH",), "python", handler),
        ("path", "/h", ("HEAD",), "python", handler),
        ("path", "/o", ("OPTIONS",), "python", handler),
        ("path", "/any", None, "python", handler),
        ("path", "/some", ("GET", "POST"), "python", handler),
    ]
    assert len(app) == 9


def test_decorator_returns_the_function_so_decorators_stack() -> None:
    app = cyserve.App()

    @app.get("/one")
    @app.get("/two")
    def both(req: object) -> str:
        return "x"

    assert both(None) == "x"
    assert [r[1] for r in app.build()] == ["/two", "/one"]


def test_methods_given_as_one_string_is_one_method_not_letters() -> None:
    app = cyserve.App()
    app.route("/x", methods="POST")(handler)
    assert app.build()[0][2] == ("POST",)


def test_duplicate_methods_are_merged() -> None:
    app = cyserve.App()
    app.route("/x", methods=["GET", "get", "POST"])(handler)
    assert app.build()[0][2] == ("GET", "POST")


@pytest.mark.parametrize("methods", [["FETCH"], ["GE T"], [""], [3], []])
def test_bad_methods_are_rejected(methods: Any) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError, match="method"):
        app.route("/x", methods=methods)(handler)


def test_every_known_method_can_be_routed() -> None:
    app = cyserve.App()
    app.route("/x", methods=list(METHODS))(handler)
    assert app.build()[0][2] == METHODS


def test_prefix_regex_and_add_route() -> None:
    app = cyserve.App()
    app.prefix("/api", handler)
    app.regex(r"^/x/([0-9]+)$", other, methods=["GET"])
    app.add_route("/plain", handler, methods=["GET"])
    assert app.build() == [
        ("prefix", "/api", None, "python", handler),
        ("regex", r"^/x/([0-9]+)$", ("GET",), "python", other),
        ("path", "/plain", ("GET",), "python", handler),
    ]


def test_static_route_serialises_body_and_headers() -> None:
    app = cyserve.App()
    app.static("/plaintext", "Hello, World!")
    app.static("/j", b'{"a":1}', content_type="application/json", status=201,
               headers=[("X-Thing", "1")], methods=None)
    app.static("/t", "héllo", headers=[("content-type", "text/html; charset=utf-8")])
    app.static("/b", b"raw")
    assert app.build() == [
        # A str body is UTF-8 and says so; a bytes body's charset is unknown.
        ("path", "/plaintext", ("GET",), "static",
         (200, [("Content-Type", "text/plain; charset=utf-8")], b"Hello, World!")),
        ("path", "/j", None, "static",
         (201, [("Content-Type", "application/json"), ("X-Thing", "1")], b'{"a":1}')),
        ("path", "/t", ("GET",), "static",
         (200, [("content-type", "text/html; charset=utf-8")], "héllo".encode())),
        ("path", "/b", ("GET",), "static", (200, [("Content-Type", "text/plain")], b"raw")),
    ]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"body": 3}, "body must be str or bytes"),
    ({"body": "x", "status": 99}, "status must be an integer between 200 and 599"),
    ({"body": "x", "status": 600}, "status must be an integer between 200 and 599"),
    ({"body": "x", "status": True}, "status must be an integer"),
    ({"body": "x", "status": 204}, "a 204 response cannot have a body"),
    ({"body": "x", "status": 205}, "a 205 response cannot have a body"),
    ({"body": "x", "headers": [("Content-Length", "1")]}, "written by the server itself"),
    # A route's own Server replaces the engine's, but Server is not a list.
    ({"body": "x", "headers": [("Server", "a"), ("server", "b")]}, "'server' given twice"),
    ({"body": "x", "headers": [("Transfer-Encoding", "chunked")]}, "written by the server"),
    ({"body": "x", "headers": [("Bad Name", "1")]}, "invalid header name"),
    ({"body": "x", "headers": [("X-A", "1\r\nX-B: 2")]}, "invalid value for header 'X-A'"),
    ({"body": "x", "headers": [("X-A", "nul\x00")]}, "invalid value for header 'X-A'"),
    ({"body": "x", "headers": [("X-A", "snow\u2603")]}, "is not Latin-1"),
    ({"body": "x", "headers": ["X-A: 1"]}, "must be .name, value. pairs"),
    ({"body": "x", "content_type": "text/plain\n"}, "invalid value for header 'Content-Type'"),
])
def test_static_route_mistakes(kwargs: dict[str, Any], message: str) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError, match=message) as info:
        app.static("/s", **kwargs)
    assert "app.static('/s')" in str(info.value)
    assert len(app) == 0


def test_static_route_may_set_its_own_server() -> None:
    app = cyserve.App()
    app.static("/s", "x", headers=[("Server", "mine/1")])
    assert app.build()[0][4][1] == [("Content-Type", "text/plain; charset=utf-8"),
                                    ("Server", "mine/1")]


def test_static_204_without_body_is_fine() -> None:
    app = cyserve.App()
    app.static("/empty", b"", status=204)
    assert app.build()[0][4][0] == 204


def test_files_route_uses_the_real_directory_and_a_slash_prefix(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    app = cyserve.App()
    app.files("/files", link)
    assert app.build() == [("prefix", "/files/", ("GET",), "files", os.path.realpath(real))]


def test_files_route_needs_an_existing_directory(tmp_path: Path) -> None:
    app = cyserve.App()
    missing = tmp_path / "nope"
    with pytest.raises(RouteError, match=f"directory '{missing}' does not exist"):
        app.files("/f/", missing)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(RouteError, match="is not a directory"):
        app.files("/f/", a_file)
    # The contract in app.py's docstring: a ValueError naming the directory.
    with pytest.raises(ValueError, match="nope"):
        app.files("/f/", str(missing))


def test_nogil_route_takes_a_named_capsule() -> None:
    app = cyserve.App()
    cap = make_capsule(_GOOD_NAME)
    assert is_nogil_capsule(cap)
    app.nogil("/", cap)
    app.nogil("/fib", cap, methods=["GET"])
    # prefix/regex/add_route also take a capsule, like a Lwan-style url map.
    app.prefix("/c", cap)
    assert app.build() == [
        ("path", "/", None, "nogil", cap),
        ("path", "/fib", ("GET",), "nogil", cap),
        ("prefix", "/c", None, "nogil", cap),
    ]


def test_nogil_route_with_a_context_capsule() -> None:
    app = cyserve.App()
    cap, ctx = make_capsule(_GOOD_NAME), make_capsule(_BAD_NAME)
    app.nogil("/c", cap, ctx=ctx)
    assert app.build() == [("path", "/c", None, "nogil", (cap, ctx))]
    with pytest.raises(TypeError, match="ctx must be a PyCapsule"):
        app.nogil("/d", cap, ctx=42)


def test_nogil_route_kept_off_the_inline_path() -> None:
    app = cyserve.App()
    cap, ctx = make_capsule(_GOOD_NAME), make_capsule(_BAD_NAME)
    app.nogil("/a", cap, inline=False)
    app.nogil("/b", cap, ctx=ctx, inline=False)
    app.nogil("/c", cap, inline=True)
    assert app.build() == [("path", "/a", None, "nogil", (cap, None, False)),
                           ("path", "/b", None, "nogil", (cap, ctx, False)),
                           ("path", "/c", None, "nogil", cap)]
    with pytest.raises(TypeError, match="inline must be True or False, got str 'no'"):
        app.nogil("/d", cap, inline="no")  # type: ignore[arg-type]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: make_capsule(_BAD_NAME), "got a capsule named 'someone.else'"),
    (lambda: make_capsule(None), "got a capsule named NULL"),
    (lambda: handler, "got function"),
    (lambda: 42, "got int 42"),
])
def test_nogil_route_rejects_anything_else(make: Any, message: str) -> None:
    app = cyserve.App()
    with pytest.raises(TypeError, match=message):
        app.nogil("/n", make())


def test_nogil_rejection_is_a_clear_error() -> None:
    app = cyserve.App()
    with pytest.raises(RouteError) as info:
        app.nogil("/n", make_capsule(_BAD_NAME))
    assert str(info.value) == ("app.nogil('/n'): expected a PyCapsule named "
                               "'cyserve.nogil_handler' (made by cyserve_handler_capsule), got a "
                               "capsule named 'someone.else'")


@pytest.mark.parametrize("pattern", [
    "/", "/users/{id:int}", "/users/{name}", "/users/{name:str}", "/static/{rest:path}",
    "/a/{x:int}/b/{y}", "/a-b_c.d~e/!$&'()*+,;=:@%20", "/trailing/",
])
def test_valid_path_patterns(pattern: str) -> None:
    app = cyserve.App()
    app.get(pattern)(handler)
    assert app.build()[0][1] == pattern


@pytest.mark.parametrize(("pattern", "message"), [
    ("users", "must start with '/'"),
    ("", "must start with '/'"),
    ("/a/{id", "unbalanced braces"),
    ("/a/id}", "unbalanced braces"),
    ("/a/{{id}}", "unbalanced braces"),
    ("/a/x{id}", "does not fill its segment"),
    ("/a/{id}.json", "does not fill its segment"),
    ("/a/{id:float}", "unknown parameter type 'float'"),
    ("/a/{1x}", "parameter name '1x' is not an identifier"),
    ("/a/{}", "parameter name '' is not an identifier"),
    ("/a/{x}/{x:int}", "parameter 'x' appears twice"),
    ("/a/{rest:path}/b", "must be the last segment"),
    ("/a b", "character ' ' is not allowed"),
    ("/a?b", "character '?' is not allowed"),
    ("/a#b", "character '#' is not allowed"),
    ("/caf\u00e9", "is not allowed in a path"),
    ("/a//b", "empty path segment"),
    ("".join(f"/{{p{i}}}" for i in range(17)), "more than 16 parameters"),
])
def test_invalid_path_patterns_name_the_pattern(pattern: str, message: str) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError, match=re.escape(message)) as info:
        app.get(pattern)(handler)
    assert repr(pattern) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("prefix", ["/api/{x}", "api", "/a b"])
def test_invalid_prefixes(prefix: str) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError, match=repr(prefix).replace("{", r"\{").replace("}", r"\}")):
        app.prefix(prefix, handler)


@pytest.mark.parametrize(("regex", "message"), [
    ("(abc", "Unmatched"),
    ("[abc", "Unmatched"),
    ("a{2,1}", "Invalid"),
    ("", "empty"),
    ("/a" + "+" * 40, "a repetition operator follows another"),
    ("/a*?", "a repetition operator follows another"),
    ("/a{2}*", "a repetition operator follows another"),
    ("/([a-z])" * 17, "17 groups, at most 16"),
])
def test_invalid_regexes_get_the_c_librarys_message(regex: str, message: str) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError, match=message) as info:
        app.regex(regex, handler)
    assert repr(regex) in str(info.value)


@pytest.mark.parametrize("regex", [
    r"^/x/[[:alpha:]]+$",  # Python's re would warn about "[["; regcomp accepts it, and so must we
    r"^/x/[*+]+$",  # operators inside brackets are literals
    r"^/x/[]*]+$",  # a ']' first in a bracket is literal
    r"^/x\*+$",  # an escaped operator is an atom
    r"^/(a+)+$",  # a group between two operators
    r"^/a{1,3}$",
    "/([a-z])" * 16 + r"/[(]\(",  # 16 groups; a '(' in brackets or escaped opens none
    "/([a-z])" * 16 + "/[[:alpha:](]",  # the '(' is in the bracket, after the class's ':]'
    "/[[:alpha:]*+]",  # operators after a class, still inside the bracket
    r"/(a)\1",  # a backreference to the user's own first group
])
def test_valid_regexes(regex: str) -> None:
    app = cyserve.App()
    app.regex(regex, handler)
    assert len(app) == 1


@pytest.mark.parametrize(("first", "second"), [
    (("/users/{id:int}", ["GET"]), ("/users/{uid:int}", ["GET", "POST"])),
    (("/same", None), ("/same", ["DELETE"])),
    (("/same", ["PUT"]), ("/same", None)),
])
def test_duplicate_routes_name_both(first: Any, second: Any) -> None:
    app = cyserve.App()
    app.route(first[0], methods=first[1])(handler)
    with pytest.raises(RouteError) as info:
        app.route(second[0], methods=second[1])(other)
    text = str(info.value)
    assert text.startswith("duplicate route: ")
    assert first[0] in text and second[0] in text
    assert "test_app.handler" in text and "test_app.other" in text


def test_same_pattern_with_other_methods_or_other_types_is_not_a_duplicate() -> None:
    app = cyserve.App()
    app.get("/users/{id:int}")(handler)
    app.post("/users/{id:int}")(handler)
    app.get("/users/{name}")(handler)  # a str parameter is a different route than an int one
    app.prefix("/users", handler)  # another kind of match
    assert len(app) == 4


def test_duplicate_prefixes_ignore_the_trailing_slash() -> None:
    app = cyserve.App()
    app.prefix("/api/", handler)
    with pytest.raises(RouteError, match="duplicate route"):
        app.prefix("/api", other)


def test_duplicate_static_and_python_route() -> None:
    app = cyserve.App()
    app.static("/x", "x")
    with pytest.raises(RouteError, match=r"static response, 1 bytes"):
        app.get("/x")(handler)


@pytest.mark.parametrize(("bad", "message"), [
    (42, "handler must be a callable"),  # also a TypeError, see below
    (lambda: None, "must accept exactly one argument"),
    (lambda a, b: None, "must accept exactly one argument"),
])
def test_bad_python_handlers(bad: Any, message: str) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError, match=message):
        app.add_route("/x", bad)


def test_a_non_callable_handler_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="handler must be a callable"):
        cyserve.App().add_route("/x", "not a function")


def test_async_handlers_are_refused() -> None:
    app = cyserve.App()

    async def coro(req: object) -> str:
        return "x"

    with pytest.raises(RouteError, match="is async"):
        app.get("/x")(coro)


def test_handlers_with_defaults_or_varargs_are_fine() -> None:
    def with_default(req: object, extra: int = 1) -> None:
        return None

    def varargs(*args: object) -> None:
        return None

    app = cyserve.App()
    app.add_route("/a", with_default)
    app.add_route("/b", varargs)
    app.add_route("/c", print)  # a builtin
    assert len(app) == 3


def test_a_failed_registration_leaves_the_app_unchanged() -> None:
    app = cyserve.App()
    app.get("/ok")(handler)
    with pytest.raises(RouteError):
        app.get("/bad/{x")(handler)
    assert app.build() == [("path", "/ok", ("GET",), "python", handler)]


def test_package_exports() -> None:
    assert cyserve.App is not None and callable(cyserve.run)
    assert os.path.isfile(os.path.join(cyserve.get_include(), "cyserve", "handler.h"))
    for name in ("App", "Request", "Response", "run", "get_include"):
        assert name in cyserve.__all__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cyserve.nope  # noqa: B018


# ---- agreement with the engine's router (csrc/router.c) ------------------------------------
# The App's checks exist to give clear messages early; the router checks again. These tests
# hand routes straight to the engine's Server (no start, no socket) to keep the two in step.

VALID_FOR_BOTH = [
    ("path", "/users/{id:int}"), ("path", "/s/{rest:path}"), ("path", "/a/{x}/b/{y:str}"),
    ("path", "/trailing/"), ("prefix", "/api/"), ("prefix", "/"),
    ("regex", r"^/x/[[:alpha:]]+$"), ("regex", r"^/x/[*+]+$"), ("regex", r"^/x/[]*]+$"),
    ("regex", r"^/x\*+$"), ("regex", r"^/(a+)+$"), ("regex", r"^/a{1,3}$"),
]
INVALID_FOR_BOTH = [
    ("path", "/a/{id"), ("path", "/a/x{id}"), ("path", "/a/{id:float}"),
    ("path", "/a/{x}/{x:int}"), ("path", "/a/{rest:path}/b"), ("path", "users"),
    ("regex", "(abc"), ("regex", "/a" + "+" * 40), ("regex", "/a*?"), ("regex", "/a{2}*"),
]


def _engine_accepts(match: str, pattern: str) -> bool:
    from cyserve._core import Server

    route: Any = (match, pattern, None, "python", handler)
    try:
        Server([route], host="127.0.0.1", port=0, threads=1)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(("match", "pattern"), VALID_FOR_BOTH)
def test_valid_patterns_are_valid_for_the_engine_too(match: str, pattern: str) -> None:
    app = cyserve.App()
    {"path": app.add_route, "prefix": app.prefix, "regex": app.regex}[match](pattern, handler)
    assert _engine_accepts(match, pattern)


@pytest.mark.parametrize(("match", "pattern"), INVALID_FOR_BOTH)
def test_invalid_patterns_are_invalid_for_the_engine_too(match: str, pattern: str) -> None:
    app = cyserve.App()
    with pytest.raises(RouteError):
        {"path": app.add_route, "prefix": app.prefix, "regex": app.regex}[match](pattern, handler)
    assert not _engine_accepts(match, pattern)


def test_every_route_method_is_the_parsers_enum_value() -> None:
    # The router keeps one bit per enum http_method value (csrc/http_method.h) and the Server
    # maps a route's method names onto those values: a name that mapped to another value would
    # route that method's requests to the wrong handlers, or to none.
    from cyserve import _core, _testhooks

    assert set(_core._METHOD_BITS) == set(METHODS)
    for name in METHODS:
        target = b"example.com:443" if name == "CONNECT" else b"/"
        head = name.encode() + b" " + target + b" HTTP/1.1\r\nHost: example.com\r\n\r\n"
        rc, info = _testhooks._parse_request(head)
        assert rc == len(head), (name, rc, info)
        assert info["method_id"] == name
        assert _core._METHOD_BITS[name] == info["method_code"], name


def test_engine_takes_one_server_header_on_a_static_route() -> None:
    from cyserve._core import Server

    one: Any = ("path", "/s", None, "static", (200, [("Server", "mine")], b"x"))
    Server([one], host="127.0.0.1", port=0, threads=1)
    two: Any = ("path", "/s", None, "static", (200, [("Server", "a"), ("SERVER", "b")], b"x"))
    with pytest.raises(ValueError, match="header 'SERVER' given twice"):
        Server([two], host="127.0.0.1", port=0, threads=1)
