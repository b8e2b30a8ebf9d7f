"""h2spec, the HTTP/2 conformance suite, from `make test`: its 145 cases over h2c and over TLS
against this tree's build (tests/h2spec_run.py, which `make h2spec` runs by hand).

h2spec is a Go program. The first run builds the release pinned in tests/h2spec/ into
build/h2spec/ (about 40 s of compiling on a loaded 2-core machine) and later runs reuse it; the
cases themselves take about 2 s. Without Go, or where the Go module proxy cannot be reached, the
test is skipped with one line that says which: that is the machine's lack, not a failure of this
tree, and pytest's summary (-ra) shows the line.

Not marked `native`: `make test-asan` does not run it again. h2spec speaks to a server in this
process as any client does; the sanitizer build's HTTP/2 code runs under tests/e2e/test_http2.py
and the fuzz corpus replay."""

from __future__ import annotations

import re
from pathlib import Path

import h2spec_run
import pytest


@pytest.mark.slow
@pytest.mark.timeout(h2spec_run.INSTALL_TIMEOUT + 120)
def test_h2spec_passes_every_case_over_h2c_and_tls() -> None:
    try:
        h2spec = h2spec_run.install()
    except h2spec_run.Unavailable as e:
        pytest.skip(f"h2spec not run: {e}")
    outcomes = h2spec_run.conformance(h2spec)
    assert [o.name for o in outcomes] == ["h2c", "TLS"]
    for o in outcomes:
        assert o.failed == set(), f"h2spec over {o.name}: {o.summary}"
        assert (o.total, o.passed) == (h2spec_run.CASES, h2spec_run.CASES), o.summary


def test_an_unreachable_module_proxy_skips_rather_than_fails(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What the test above does on a machine without network and with Go's module cache empty:
    a proxy that refuses the connection is the machine's lack (Unavailable, a skip with its
    reason), not an error. (With the pinned modules already in the cache the build needs no
    proxy at all.)"""
    if h2spec_run.go_command() is None:
        pytest.skip("h2spec not run: no Go toolchain (no `go` on the PATH, none in "
                    "/usr/local/go/bin)")
    monkeypatch.setenv("GOPROXY", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("GOFLAGS", "")
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "modules"))  # an empty module cache
    with pytest.raises(h2spec_run.Unavailable, match="module proxy is unreachable"):
        h2spec_run.install(tmp_path / "h2spec")
    assert not (tmp_path / "h2spec" / "h2spec").exists()


def test_the_pins_name_h2spec_2_2_1_and_a_checksum_for_each_module() -> None:
    """The build is reproducible only if go.sum holds a line for every module go.mod requires."""
    mod = (h2spec_run.PINS / "go.mod").read_text()
    required = re.findall(r"^\t(\S+) (v\S+)", mod, re.MULTILINE)
    assert ("github.com/summerwind/h2spec", "v2.2.1+incompatible") in required
    assert f"tool {h2spec_run.PACKAGE}" in mod
    sums = (h2spec_run.PINS / "go.sum").read_text().split("\n")
    for module, version in required:
        assert any(line.startswith(f"{module} {version} h1:") for line in sums), module
