"""Static files through the engine: sendfile bodies, Content-Type, conditional requests (ETag,
Last-Modified, 304), single ranges (206, 416), HEAD, and no way out of the root."""

from __future__ import annotations

import email.utils
import errno
import os
import resource
import time

import pytest

import cyserve

from _rawhttp import Conn, get, request, serving

pytestmark = pytest.mark.native

BODY = bytes(range(256)) * 600  # 153,600 bytes: larger than one socket write


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("site")
    root = base / "root"
    root.mkdir()
    (root / "index.html").write_text("<h1>home</h1>")
    (root / "style.css").write_text("body{}")
    (root / "big.bin").write_bytes(BODY)
    (root / "sub").mkdir()
    (root / "sub" / "a.txt").write_text("sub text")
    (base / "secret.txt").write_text("do not serve")
    os.symlink(base / "secret.txt", root / "escape.txt")
    os.symlink("sub/a.txt", root / "inside.txt")  # relative: stays beneath the root
    routes = [("prefix", "/files", ("GET", "HEAD"), "files", str(root))]
    with serving(routes, threads=2) as srv:
        yield srv.port


def test_file_and_content_type(site):
    r = request(site, get("/files/style.css"))
    assert (r.status, r.body) == (200, b"body{}")
    assert r.header("content-type").startswith("text/css")
    assert r.header("etag") and r.header("last-modified")
    r = request(site, get("/files/sub/a.txt"))
    assert r.body == b"sub text" and r.header("content-type").startswith("text/plain")


def test_directory_index(site):
    r = request(site, get("/files/"))
    assert (r.status, r.body) == (200, b"<h1>home</h1>")
    assert r.header("content-type").startswith("text/html")


def test_large_file_over_keep_alive(site):
    with Conn(site) as c:
        for _ in range(3):
            c.send(get("/files/big.bin"))
            r = c.reply()
            assert r.status == 200 and r.body == BODY


def test_head_sends_no_body(site):
    with Conn(site) as c:
        c.send(b"HEAD /files/big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert r.header("content-length") == str(len(BODY))
        c.send(get("/files/style.css"))
        assert c.reply().body == b"body{}"


def test_not_modified(site):
    first = request(site, get("/files/style.css"))
    r = request(site, get("/files/style.css", extra=f"If-None-Match: {first.header('etag')}\r\n"))
    assert (r.status, r.body) == (304, b"")
    assert r.header("etag") == first.header("etag")
    r = request(site, get("/files/style.css",
                          extra=f"If-Modified-Since: {first.header('last-modified')}\r\n"))
    assert r.status == 304
    r = request(site, get("/files/style.css", extra='If-None-Match: "other"\r\n'))
    assert r.status == 200


def test_ranges(site):
    r = request(site, get("/files/big.bin", extra="Range: bytes=10-19\r\n"))
    assert (r.status, r.body) == (206, BODY[10:20])
    assert r.header("content-range") == f"bytes 10-19/{len(BODY)}"
    r = request(site, get("/files/big.bin", extra="Range: bytes=-5\r\n"))
    assert (r.status, r.body) == (206, BODY[-5:])
    r = request(site, get("/files/big.bin", extra=f"Range: bytes={len(BODY)}-\r\n"))
    assert r.status == 416
    assert r.header("content-range") == f"bytes */{len(BODY)}"
    r = request(site, get("/files/big.bin", extra="Range: bytes=0-1,5-6\r\n"))
    assert r.status == 200 and r.body == BODY  # several ranges: ignored, whole file


def test_if_range(site):
    """A resumed download whose validator no longer matches gets the whole file, not a piece of
    the new one to splice onto the old (RFC 9110 13.1.5)."""
    first = request(site, get("/files/big.bin"))
    etag, lm = first.header("etag"), first.header("last-modified")
    for validator in (etag, lm):
        extra = f"Range: bytes=10-19\r\nIf-Range: {validator}\r\n"
        r = request(site, get("/files/big.bin", extra=extra))
        assert (r.status, r.body) == (206, BODY[10:20]), validator
    for stale in ('"stale"', "W/" + etag, "Sun, 06 Nov 1994 08:49:37 GMT", "garbage"):
        extra = f"Range: bytes=10-19\r\nIf-Range: {stale}\r\n"
        r = request(site, get("/files/big.bin", extra=extra))
        assert (r.status, r.body) == (200, BODY), stale
        assert r.header("content-range") is None


def test_conditionals_in_every_form(site):
    first = request(site, get("/files/style.css"))
    etag = first.header("etag")
    # An If-None-Match list split over two field lines is one list (RFC 9110 5.3).
    r = request(site, get("/files/style.css",
                          extra=f'If-None-Match: "zzz"\r\nIf-None-Match: {etag}\r\n'))
    assert (r.status, r.body) == (304, b"")
    r = request(site, get("/files/style.css",
                          extra='If-None-Match: "zzz"\r\nIf-None-Match: "yyy"\r\n'))
    assert r.status == 200
    # If-None-Match decides alone, even when If-Modified-Since would say 304.
    r = request(site, get("/files/style.css", extra=f'If-None-Match: "zzz"\r\n'
                          f"If-Modified-Since: {first.header('last-modified')}\r\n"))
    assert r.status == 200
    # If-Modified-Since in the two obsolete date forms a recipient must accept (RFC 9110 5.6.7).
    t = email.utils.parsedate_to_datetime(first.header("last-modified")).timestamp() + 60
    tm = time.gmtime(t)
    rfc850 = time.strftime("%A, %d-%b-%y %H:%M:%S GMT", tm)
    asctime = time.strftime("%a %b ", tm) + f"{tm.tm_mday:2d}" + time.strftime(" %H:%M:%S %Y", tm)
    for date in (rfc850, asctime):
        r = request(site, get("/files/style.css", extra=f"If-Modified-Since: {date}\r\n"))
        assert r.status == 304, date
    old = "Sun Nov  6 08:49:37 1994"
    r = request(site, get("/files/style.css", extra=f"If-Modified-Since: {old}\r\n"))
    assert r.status == 200


def test_out_of_descriptors_is_503_not_404(site):
    """EMFILE is the server's state, not the file's: a 404 would be wrong and cacheable."""
    with Conn(site) as c:
        c.send(get("/files/style.css"))
        assert c.reply().status == 200
        # Every descriptor below the limit taken. A descriptor an earlier test's thread closes
        # a moment later (a connection finishing) would be free again for the server's open:
        # such a round is retried with that one taken too.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        top = os.dup(0)
        os.close(top)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 64, hard))
        taken: list[int] = []
        try:
            for _ in range(5):
                try:
                    while True:
                        taken.append(os.open(os.devnull, os.O_RDONLY))
                except OSError as exc:
                    assert exc.errno == errno.EMFILE
                c.send(get("/files/style.css"))
                r = c.reply()
                if r.status != 200:
                    break
        finally:
            for fd in taken:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert (r.status, r.header("retry-after")) == (503, "1")
        c.send(get("/files/style.css"))
        assert c.reply().body == b"body{}"  # and it recovers


@pytest.mark.parametrize("path", [
    "/files/../secret.txt", "/files/sub/../../secret.txt", "/files/%2e%2e/secret.txt",
    "/files/..%2fsecret.txt", "/files/sub/%2E%2E/%2e%2e/secret.txt", "/files/escape.txt",
    "/files/%00", "/files/nope.txt",
])
def test_no_way_out_of_the_root(site, path):
    r = request(site, get(path))
    assert r.status in (400, 404), (path, r.status)
    assert b"do not serve" not in r.body


def test_symlink_inside_root_is_followed(site):
    assert request(site, get("/files/inside.txt")).body == b"sub text"


def test_other_methods_refused(site):
    r = request(site, b"POST /files/style.css HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
    assert r.status == 405
    assert "GET" in r.header("allow")


def test_directory_named_in_bytes_or_not_utf8(tmp_path):
    """A directory given as bytes, or whose name is not UTF-8, is served from the very bytes the
    file system gave (os.fsdecode/os.fsencode), not refused as missing at start-up."""
    raw = os.fsencode(tmp_path) + b"/d\xff"
    os.mkdir(raw)
    with open(raw + b"/a.txt", "wb") as f:
        f.write(b"odd name")
    app = cyserve.App()
    app.files("/b", raw)
    app.files("/s", os.fsdecode(raw))
    with serving(app.build()) as srv:
        assert request(srv.port, get("/b/a.txt")).body == b"odd name"
        assert request(srv.port, get("/s/a.txt")).body == b"odd name"
