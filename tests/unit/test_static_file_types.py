"""cyserve.static_files: the content type table from mimetypes, and the scan for precompressed
siblings that tells the engine which encodings to look for."""

from __future__ import annotations

import mimetypes

from cyserve import static_files


def test_the_table_is_mimetypes_plus_the_overrides() -> None:
    table = dict(static_files.content_types())
    assert table["mp4"] == "video/mp4"
    assert table["csv"] == "text/csv; charset=utf-8"
    assert table["js"] == table["mjs"] == "text/javascript; charset=utf-8"
    assert table["wasm"] == "application/wasm"
    assert table["json"] == "application/json"  # no charset: JSON is UTF-8 by definition
    assert table["png"] == "image/png"
    assert len(table) > 100  # far more than the engine's built-in twenty
    for ext, mime in table.items():
        assert ext == ext.lower() and "." not in ext and 0 < len(ext) <= 31
        assert mime.isascii() and mime.isprintable() and len(mime) <= 120
    assert static_files.content_type("dir/A.CSV") == "text/csv; charset=utf-8"
    assert static_files.content_type(".bashrc") == "application/octet-stream"
    assert static_files.content_type("noext") == "application/octet-stream"


def test_an_application_can_add_a_type_before_the_server_starts() -> None:
    mimetypes.add_type("application/x-cyserve-test", ".cyservetest")
    try:
        assert static_files.content_type("a.cyservetest") == "application/x-cyserve-test"
    finally:
        mimetypes.types_map.pop(".cyservetest", None)


def test_the_scan_finds_the_encodings_of_real_siblings(tmp_path) -> None:
    assert static_files.precompressed_encodings(str(tmp_path)) == frozenset()
    (tmp_path / "a.js").write_text("x")
    (tmp_path / "orphan.css.br").write_text("x")  # no orphan.css beside it: not a sibling
    (tmp_path / "archive.tar.gz").write_text("x")  # no archive.tar: a file of its own
    assert static_files.precompressed_encodings(str(tmp_path)) == frozenset()
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "b.js").write_text("x")
    (tmp_path / "deep" / "b.js.zst").write_text("x")
    assert static_files.precompressed_encodings(str(tmp_path)) == {"zstd"}
    (tmp_path / "a.js.gz").write_text("x")
    (tmp_path / "a.js.br").write_text("x")
    assert static_files.precompressed_encodings(str(tmp_path)) == {"br", "zstd", "gzip"}


def test_a_tree_too_large_to_scan_counts_as_having_every_encoding(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(static_files, "SCAN_LIMIT", 3)
    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text("x")
    assert static_files.precompressed_encodings(str(tmp_path)) == {"br", "zstd", "gzip"}
