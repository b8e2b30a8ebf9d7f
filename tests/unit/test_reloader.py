"""--reload's choice of files (cyserve/reloader.py): the .py files, what --reload-include adds,
less what --reload-exclude takes out, looked at every --reload-delay seconds when polling."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cyserve.reloader import Watcher, watched


@pytest.mark.parametrize("path, includes, excludes, expected", [
    ("app.py", (), (), True),
    ("pkg/views.py", (), (), True),
    ("index.html", (), (), False),
    ("index.html", ("*.html",), (), True),
    ("templates/a/index.html", ("templates/*",), (), True),
    ("static/index.html", ("templates/*",), (), False),
    ("app_test.py", (), ("*_test.py",), False),
    ("pkg/gen/out.py", (), ("pkg/gen/*",), False),
    ("pkg/views.py", (), ("pkg/gen/*",), True),
    ("index.html", ("*.html",), ("index.*",), False),
    ("App.PY", (), (), False),  # patterns are matched as written, as on a Linux file system
])
def test_which_files_are_watched(path: str, includes: tuple[str, ...],
                                 excludes: tuple[str, ...], expected: bool) -> None:
    assert watched(path, includes, excludes) is expected


def _touch(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    # Past the last look's modification time even on a coarse clock.
    t = time.time() + 5
    os.utime(path, (t, t))


def test_polling_reports_included_files_and_not_excluded_ones(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("x = 1\n")
    w = Watcher([str(tmp_path)], includes=["*.html"], excludes=["skip_*"], delay=0.05,
                use_watchfiles=False)
    assert w.uses == "polling"
    assert w.changed() == []  # nothing yet (and too early to look)
    time.sleep(0.06)
    assert w.changed() == []
    _touch(tmp_path / "app.py", "x = 2\n")
    _touch(tmp_path / "tpl" / "page.html", "<p>\n")
    _touch(tmp_path / "skip_me.py", "y = 1\n")
    _touch(tmp_path / "notes.txt", "not watched\n")
    _touch(tmp_path / ".git" / "hook.py", "hidden folder\n")
    time.sleep(0.06)
    assert w.changed() == [str(tmp_path / "app.py"), str(tmp_path / "tpl" / "page.html")]
    (tmp_path / "tpl" / "page.html").unlink()  # a removal is a change too
    time.sleep(0.06)
    assert w.changed() == [str(tmp_path / "tpl" / "page.html")]


def test_the_delay_spaces_the_looks(tmp_path: Path) -> None:
    w = Watcher([str(tmp_path)], delay=30, use_watchfiles=False)
    _touch(tmp_path / "app.py", "x = 2\n")
    assert w.changed() == []  # within the delay: not looked at yet
    w._last -= 31
    assert w.changed() == [str(tmp_path / "app.py")]


def test_the_watchfiles_filter_is_the_same_choice(tmp_path: Path) -> None:
    w = Watcher([str(tmp_path)], includes=["*.html"], excludes=["skip_*"],
                use_watchfiles=False)
    top = str(tmp_path)
    assert w._filter(None, f"{top}/a/page.html")
    assert w._filter(None, f"{top}/app.py")
    assert not w._filter(None, f"{top}/skip_me.py")
    assert not w._filter(None, f"{top}/notes.txt")
    assert not w._filter(None, f"{top}/__pycache__/app.py")
    assert not w._filter(None, "/elsewhere/app.py")


def test_watchfiles_reports_a_change_made_before_the_first_ask(tmp_path: Path) -> None:
    # watchfiles' generator makes its inotify watcher on its first step: a file written between
    # the Watcher's making and the supervisor's first ask (a fraction of a second after the
    # workers start) went unreported, and --reload's first edit did nothing.
    pytest.importorskip("watchfiles")  # pinned in requirements-dev.txt: present in make test
    w = Watcher([str(tmp_path)], delay=0.05)
    assert w.uses == "watchfiles"
    (tmp_path / "app.py").write_text("x = 1\n")
    deadline = time.monotonic() + 5
    got: list[str] = []
    while not got and time.monotonic() < deadline:
        got = w.changed()
    assert got == [str(tmp_path / "app.py")]
