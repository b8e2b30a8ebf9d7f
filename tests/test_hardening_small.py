"""End-to-end checks of small protocol and command-line rules, over raw sockets and subprocesses.

Each test states the rule it holds; the parser's side of each rule also has conformance cases in
tests/http/*.md (fed split at every byte by tests/test_parser.py)."""

from __future__ import annotations

import cyserve

from _rawhttp import Conn, get, request, serving


def _app() -> cyserve.App:
    app = cyserve.App()
    app.static("/a", b"plain a", content_type="text/plain")
    return app


def test_fragment_in_target_is_400_not_404():
    """RFC 9112 3.2: no request-target has a fragment. '#' is a malformed request (400), never a
    path to look up (which used to give 404), and the connection is not kept."""
    with serving(_app().build()) as srv:
        for target in ("/a#x", "/a#", "/a?q=1#x", "/#"):
            with Conn(srv.port) as c:
                c.send(get(target))
                r = c.reply()
                assert r.status == 400, (target, r.status, r.body)
                assert c.is_closed()
        # "%23" is an ordinary (encoded) byte of the path: looked up, not refused.
        assert request(srv.port, get("/a%23")).status == 404
        assert request(srv.port, get("/a")).status == 200
