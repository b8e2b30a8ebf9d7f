"""Static file routes: the content types of the standard library's mimetypes (plus cyserve's
overrides), and precompressed siblings (x.br, x.zst, x.gz beside x) chosen by Accept-Encoding,
with Vary, their own ETags, ranges, HEAD and 304 as for any file."""

from __future__ import annotations

import gzip

import pytest

from _rawhttp import Conn, get, request, serving

pytestmark = pytest.mark.native

JS = b"function hello() { return 'hello, world'; }\n" * 50


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("negotiated")
    (root / "clip.mp4").write_bytes(b"\0\0\0\x18ftypmp42")
    (root / "table.csv").write_text("a,b\n1,2\n")
    (root / "mod.mjs").write_text("export {};")
    (root / "app.wasm").write_bytes(b"\0asm\1\0\0\0")
    (root / "notes.md").write_text("# notes")
    (root / "a.UNKNOWNEXT").write_text("?")
    (root / "app.js").write_bytes(JS)
    (root / "app.js.gz").write_bytes(gzip.compress(JS, mtime=0))
    (root / "app.js.br").write_bytes(b"BROTLI" * 10)  # a stand-in: the server never reads it
    (root / "plain.txt").write_text("no siblings")
    (root / "data.json").write_text('{"a": 1}')
    (root / "data.json.zst").write_bytes(b"ZSTD" * 3)  # stand-ins, as app.js.br
    (root / "data.json.gz").write_bytes(b"GZIP" * 4)
    (root / "site").mkdir()
    (root / "site" / "index.html").write_text("<p>index</p>")
    (root / "site" / "index.html.gz").write_bytes(gzip.compress(b"<p>index</p>", mtime=0))
    routes = [("prefix", "/f/", ("GET", "HEAD"), "files", str(root))]
    with serving(routes, threads=2) as srv:
        yield srv.port


@pytest.mark.parametrize(("name", "expected"), [
    ("clip.mp4", "video/mp4"),
    ("table.csv", "text/csv; charset=utf-8"),
    ("mod.mjs", "text/javascript; charset=utf-8"),
    ("app.wasm", "application/wasm"),
    ("notes.md", "text/markdown; charset=utf-8"),
    ("a.UNKNOWNEXT", "application/octet-stream"),
    ("app.js", "text/javascript; charset=utf-8"),
])
def test_content_types_come_from_mimetypes(site, name, expected):
    r = request(site, get(f"/f/{name}"))
    assert r.status == 200
    assert r.header("content-type") == expected


def ae(value: str) -> str:
    return f"Accept-Encoding: {value}\r\n"


def test_the_preferred_sibling_is_sent_with_its_encoding(site):
    r = request(site, get("/f/app.js", extra=ae("gzip, deflate, br")))
    assert (r.status, r.body) == (200, b"BROTLI" * 10)
    assert r.header("content-encoding") == "br"
    assert r.header("vary") == "Accept-Encoding"
    assert r.header("content-type") == "text/javascript; charset=utf-8"
    r = request(site, get("/f/app.js", extra=ae("gzip")))
    assert r.header("content-encoding") == "gzip" and gzip.decompress(r.body) == JS
    assert r.header("content-length") == str(len(r.body))


def test_a_zstd_sibling_is_sent_and_ranks_between_br_and_gzip(site):
    # Equal q-values go to br, then zstd, then gzip (docs/architecture.md); data.json has no
    # br sibling, so zstd wins over gzip, and a higher q for gzip wins over zstd.
    r = request(site, get("/f/data.json", extra=ae("gzip, br, zstd")))
    assert (r.status, r.body, r.header("content-encoding")) == (200, b"ZSTD" * 3, "zstd")
    assert r.header("vary") == "Accept-Encoding"
    assert r.header("content-type") == "application/json"
    assert r.header("content-length") == "12"
    r = request(site, get("/f/data.json", extra=ae("zstd;q=0.5, gzip")))
    assert (r.body, r.header("content-encoding")) == (b"GZIP" * 4, "gzip")


def test_q_values_are_honoured_and_q0_refuses(site):
    r = request(site, get("/f/app.js", extra=ae("br;q=0.2, gzip;q=0.9")))
    assert r.header("content-encoding") == "gzip"
    r = request(site, get("/f/app.js", extra=ae("br;q=0, gzip;q=0")))
    assert (r.body, r.header("content-encoding")) == (JS, None)
    assert r.header("vary") == "Accept-Encoding"
    r = request(site, get("/f/app.js", extra=ae("*;q=0.5, br;q=0")))
    assert r.header("content-encoding") == "gzip"  # "*" accepts gzip, br is refused
    r = request(site, get("/f/app.js", extra=ae("zstd")))  # no app.js.zst
    assert r.body == JS and r.header("content-encoding") is None


def test_without_accept_encoding_the_file_itself_still_says_vary(site):
    r = request(site, get("/f/app.js"))
    assert (r.status, r.body, r.header("content-encoding")) == (200, JS, None)
    assert r.header("vary") == "Accept-Encoding"
    r = request(site, get("/f/plain.txt", extra=ae("gzip, br")))
    assert r.body == b"no siblings"
    assert r.header("vary") is None and r.header("content-encoding") is None


def test_each_encoding_has_its_own_etag_and_304s(site):
    tags = {}
    for enc in ("br", "gzip", "identity"):
        tags[enc] = request(site, get("/f/app.js", extra=ae(enc))).header("etag")
    assert len(set(tags.values())) == 3
    assert tags["br"].endswith('-br"') and tags["gzip"].endswith('-gzip"')
    r = request(site, get("/f/app.js", extra=ae("gzip") + f"If-None-Match: {tags['gzip']}\r\n"))
    assert (r.status, r.header("vary"), r.header("etag")) == (304, "Accept-Encoding", tags["gzip"])
    # The gzip ETag does not validate the br answer.
    r = request(site, get("/f/app.js", extra=ae("br") + f"If-None-Match: {tags['gzip']}\r\n"))
    assert r.status == 200 and r.header("content-encoding") == "br"


def test_ranges_and_head_apply_to_the_encoded_file(site):
    whole = request(site, get("/f/app.js", extra=ae("gzip"))).body
    r = request(site, get("/f/app.js", extra=ae("gzip") + "Range: bytes=2-9\r\n"))
    assert r.status == 206 and r.body == whole[2:10]
    assert r.header("content-range") == f"bytes 2-9/{len(whole)}"
    assert r.header("content-encoding") == "gzip"
    with Conn(site) as c:
        c.send(b"HEAD /f/app.js HTTP/1.1\r\nHost: t\r\nAccept-Encoding: br\r\n\r\n")
        r = c.reply(head_only=True)
        assert r.status == 200 and r.body == b""
        assert r.header("content-length") == "60" and r.header("content-encoding") == "br"
        c.send(get("/f/app.js", extra=ae("br")))  # the same connection goes on
        assert c.reply().body == b"BROTLI" * 10


def test_a_directory_index_has_its_sibling_too(site):
    r = request(site, get("/f/site/", extra=ae("gzip")))
    assert r.header("content-encoding") == "gzip"
    assert gzip.decompress(r.body) == b"<p>index</p>"
    assert r.header("content-type") == "text/html; charset=utf-8"
