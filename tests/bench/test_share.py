"""bench/http/share.py: the server's own share of an app-bound request (docs/benchmarks.md,
"Session 18"). Running it needs valgrind and minutes; what is checked here is that it starts
(--help) and that it reads callgrind's call graph as it should: the app's call is the inclusive
cost of the server's edge into it, less the server's start_response made inside it."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.http import share  # noqa: E402

# A callgrind file as callgrind writes it: compressed names ("(n) name" once, "(n)" after), self
# costs on "position cost" lines, and each call's inclusive cost on the line after "calls=".
DUMP = """\
version: 1
creator: callgrind-3.19.0
events: Ir
summary: 10000
fn=(1) wsgi_call_application
0 40
cfn=(2) PyObject_CallFunctionObjArgs
calls=2 0
0 9000
cfn=(3) _Py_Dealloc
calls=1 0
0 60
fn=(2)
0 30
cfn=(4) start_response
calls=2 0
0 500
fn=(4)
0 420
cfn=(5) PyTuple_Pack
calls=4 0
0 80
totals: 10000
"""


def test_help_runs():
    r = subprocess.run([sys.executable, "-m", "bench.http.share", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--conns" in r.stdout and "loop-wsgi" in r.stdout


def test_the_app_call_less_the_servers_start_response(tmp_path):
    path = tmp_path / "cg.1"
    path.write_text(DUMP)
    self_cost, edges = share.call_graph(str(path))
    assert self_cost["wsgi_call_application"] == 40
    assert self_cost["start_response"] == 420
    assert edges[("wsgi_call_application", "PyObject_CallFunctionObjArgs")] == 9000
    assert edges[("start_response", "PyTuple_Pack")] == 80
    assert share.total(str(path)) == 10000
    # bjoern's entry: the edge into the app (9,000) and its start_response (420 + 80 inclusive).
    assert share.app_share([str(path)], "bjoern") == (9000, 500)
