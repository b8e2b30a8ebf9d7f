"""Every command the documentation shows for starting a server is run as written, as a
subprocess on a free port, asked for a page, and stopped: a documented command cannot break
silently (as `--interface wsgi` once did, refusing every WSGI app).

What is read, mechanically, from README.md and docs/*.md:
  - inline code spans (`...`, a span may wrap across a line break), and each line of an
    indented or fenced shell block (a `# comment` after the command is dropped);
  - fenced ```python blocks that call cyserve.run(...).
Which of those are commands (the patterns below, nothing else):
  - CLI:       `cyserve ARGS`, `python -m cyserve ARGS`, `.venv/bin/python -m cyserve ARGS`;
  - MAKE_RUN:  `make run [VAR=value ...]`, run as the recipe of `run:` in the Makefile with its
               variables (the `build` it depends on is what this suite runs on already);
  - RUN_CALL:  inline `cyserve.run(...)`, and ```python blocks calling cyserve.run;
  - FLAG:      an option span (`--access-log`, `--processes N`, `--interface wsgi`) in the same
               paragraph as a CLI command: it is run added to the closest CLI command before
               it; when the next span names an app (`myapp:create_app`, as "`--factory` calls an
               application factory such as `myapp:create_app`"), that app replaces the command's.
How a command is made runnable (and only this):
  - placeholders: the app names in PLACEHOLDER_APPS become small modules written for the test
    (an App, a WSGI application, a factory, an ASGI application); `N` is 2; `...` after
    `python -m cyserve` stands for the arguments of the command before it in the paragraph (as
    the README writes it);
  - the port is replaced by a free one (added when absent), `python` by this interpreter;
    where a command names its addresses (`--bind HOST:PORT`, `--bind unix:PATH`, `--uds PATH`),
    the first TCP address gets the free port, a socket path is put in the test's folder under
    its own file name, and a command with no TCP address gets `--bind 127.0.0.1:PORT` added so
    that it can be asked for a page; a metrics address gets port 0;
  - cyserve.run() calls get that port as a keyword; a python block is run as a script.
What each must answer: the demo app (make run) its documented "Hello, World!" at / and
/plaintext; the placeholder apps their known bodies; a python block the body of each static
route and of each handler that returns a string literal, and 200 on its other GET routes (a
`{name:int}` segment filled with 7); with `--access-log`, one access line for the request.

Skipped, each with its reason in SKIP (the test fails on a command-looking snippet that is
neither run nor skipped, and on a SKIP entry that no longer matches anything, so that a change
to the docs is a change here): the benchmark, fuzz and test targets and bench/ scripts (they
install peers or run for minutes; tests/test_bench_smoke.py covers the runner), an option named
without its value (`--max-body-bytes`: named in prose, not a command), an option in a paragraph
with no command to add it to (docs/architecture.md's prose).
"""

from __future__ import annotations

import ast
import re
import shlex
import ssl
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cyserve import cli

from _subserve import PYTHON, ROOT, free_port, running

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Stands for the free port in a collected command until it runs.
PORT = "__PORT__"
# Stands for the test's folder in a socket path until it runs.
TMPDIR = "__TMPDIR__"

CLI = re.compile(r"^(?:cyserve|python3? -m cyserve|\.venv/bin/python -m cyserve)\s")
MAKE_RUN = re.compile(r"^make run(?:\s|$)")
RUN_CALL = re.compile(r"^cyserve\.run\(.*\)$")
FLAG = re.compile(r"^--[a-z][a-z-]*(?: \S+)?$")
APP_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# What looks like a command and must therefore be run or skipped with a reason.
COMMANDISH = re.compile(r"^(?:make|cyserve|python3?|\.venv/bin/\S+)\s")

SKIP = {
    r"^make test\b": "runs this very suite",
    r"^make build\b": "builds, serves nothing: this suite runs on its result",
    r"^make (?:bench|bench-quick|bench-coro|soak)\b": "benchmarks and the soak: install peers "
                                                      "or run for minutes (tests/bench/ runs "
                                                      "short versions of each)",
    r"^make fuzz\b": "make fuzz needs clang (tests/test_fuzz_replay.py replays the corpus "
                     "with gcc); make fuzz-net runs for ten minutes (tests/e2e/test_fuzz_net.py "
                     "runs eight seconds of it)",
    r"^make h2spec\b": "runs tests/h2spec_run.py, which tests/e2e/test_h2spec.py runs within "
                       "this suite where Go is present",
    r"^make autobahn\b": "needs Python 2.7 and a download of the Autobahn suite, and runs for "
                         "minutes; tests/ws/ and tests/e2e/test_websocket*.py cover the rules",
    r"^\.venv/bin/python bench/": "benchmark scripts: same as make bench",
    r"^python3 bench/micro/envparts_sim\.py\b": "a simulation that runs for about ten seconds and "
                                             "reads no cyserve code (tests/e2e/test_wsgi.py tests "
                                             "the table it models)",
    r"^python -m bench\.http\.scaling\b": "needs a machine of 2N cores and wrk "
                                         "(tests/bench/test_scaling_report.py checks its table)",
    r"^python -m build\b": "packaging: tests/e2e/test_packaging.py builds the sdist and the wheel "
                          "and serves from the installed wheel",
    r"^make (?:python-ft|test-ft)\b": "a free-threaded CPython built from source (minutes of "
                                      "CPU), and this suite run again on it",
    r"^python -m bench\.": "benchmark scripts: same as make bench",
    r"^\.venv/bin/python -m cyserve\.cli --write-options-doc": "rewrites docs/options.md's "
                                                             "tables, serves nothing: "
                                                             "tests/unit/test_config_sources.py "
                                                             "compares them with the parser",
    r"^make test-docker\b": "builds and runs the Dockerfile with buildah and podman (root, apt, "
                            "minutes); tests/e2e/test_packaging.py serves from the wheel it "
                            "installs",
    r"^make (?:dist|test-pythons|lint)\b": "packaging, other Pythons, the source gates: "
                                           "tests/e2e/test_packaging.py builds what make dist "
                                           "builds; test-pythons and lint run this suite, or "
                                           "part of it, again",
}

PLACEHOLDER_APPS = {
    "module:app": "docapp:app",
    "myproject.wsgi:application": "docwsgi:application",
    "myapp:create_app": "docwsgi:create_app",
    "main:app": "docasgi:app",
}

FIXTURE_MODULES = {
    "docapp.py": '''
        import cyserve
        app = cyserve.App()
        app.static("/", "doc app", content_type="text/plain")
        app.static("/plaintext", "Hello, World!", content_type="text/plain")
    ''',
    "docwsgi.py": '''
        def application(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"doc wsgi"]

        def create_app():
            return application
    ''',
    "docasgi.py": '''
        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"doc asgi"})
    ''',
}
# The body each placeholder app (by the module it comes from) answers at "/".
FIXTURE_BODIES = {"docapp": b"doc app", "docwsgi": b"doc wsgi", "docasgi": b"doc asgi"}
# Documented in README.md ("serves the demo app") and examples/demo/app.py's docstring.
DEMO_ANSWERS = {"/": b"Hello, World!", "/plaintext": b"Hello, World!"}


@dataclass
class Snippet:
    doc: str
    line: int
    text: str
    kind: str  # "span", "line" or "python"
    paragraph: int  # spans and lines of one paragraph or block share it


def _collapse(text: str) -> str:
    return " ".join(text.split())


def extract(path: Path) -> list[Snippet]:
    """The snippets of one Markdown file, in order."""
    out: list[Snippet] = []
    lines = path.read_text().splitlines()
    para, para_start, n_para = [], 0, 0

    def flush() -> None:
        nonlocal para, n_para
        text = "\n".join(para)
        for m in re.finditer(r"`([^`]+)`", text):
            at = para_start + text.count("\n", 0, m.start()) + 1
            out.append(Snippet(path.name, at, _collapse(m.group(1)), "span", n_para))
        para = []
        n_para += 1

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            flush()
            lang = fence.group(1)
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = lines[i + 1:j]
            if lang == "python":
                out.append(Snippet(path.name, i + 2, "\n".join(body), "python", n_para))
            elif lang in ("", "sh", "shell", "bash", "console"):
                for k, b in enumerate(body):
                    cmd = b.split(" #", 1)[0].strip()
                    if cmd:
                        out.append(Snippet(path.name, i + 2 + k, cmd, "line", n_para))
            n_para += 1
            i = j + 1
            continue
        if line.startswith("    ") and not para:
            # An indented code block: starts after a blank line (not a list continuation).
            flush()
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                cmd = lines[j].strip().split(" #", 1)[0].strip()
                if cmd:
                    out.append(Snippet(path.name, j + 1, cmd, "line", n_para))
                j += 1
            n_para += 1
            i = j
            continue
        if not line.strip() or line.startswith("#") or line.startswith("|"):
            flush()
            if line.startswith("|"):  # a table row is a paragraph of its own
                para, para_start = [line], i
                flush()
            i += 1
            continue
        if not para:
            para_start = i
        para.append(line)
        i += 1
    flush()
    return out


@dataclass
class Case:
    id: str
    argv: list[str] = field(default_factory=list)
    script: str | None = None
    answers: dict[str, bytes | None] = field(default_factory=dict)  # None: any 200
    access_log: bool = False
    source: str = ""


def _takes_value(flag: str) -> bool:
    action = cli.build_parser()._option_string_actions[flag]  # argparse's own table
    return action.nargs != 0


def _cli_argv(words: list[str]) -> tuple[list[str], str]:
    """argv for a documented CLI command with placeholders filled in; and the app module."""
    words = [PLACEHOLDER_APPS.get(w, w) for w in words]
    words = ["2" if w == "N" else w for w in words]
    if words[0] == "cyserve":
        # The command `make build` installs beside the interpreter (.venv/bin/cyserve).
        script = Path(PYTHON).parent / "cyserve"
        words = [str(script), *words[1:]] if script.exists() else [PYTHON, "-m", *words]
    else:
        words = [PYTHON, *words[1:]]
    if _names_addresses(words):
        words = _addresses_runnable(words)
    elif "--port" in words:
        words[words.index("--port") + 1] = PORT
    else:
        words += ["--port", PORT]
    spec = next(w for w in words[1:] if APP_SPEC.match(w))
    return words, spec.partition(":")[0]


def _names_addresses(words: list[str]) -> bool:
    return any(w in ("--bind", "-b", "--uds") for w in words)


def _addresses_runnable(words: list[str]) -> list[str]:
    """The first TCP address on the free port, socket paths in the test's folder, and a TCP
    address added where there is none (see the module docstring)."""
    out = list(words)
    tcp = False
    for i, w in enumerate(out[:-1]):
        value = out[i + 1]
        if w in ("--bind", "-b") and value.startswith("unix:"):
            out[i + 1] = f"unix:{TMPDIR}/{Path(value[5:]).name}"
        elif w == "--uds":
            out[i + 1] = f"{TMPDIR}/{Path(value).name}"
        elif w == "--metrics-bind":  # a port of the system's choosing: the example's may be taken
            out[i + 1] = value[:value.rindex(":")] + ":0"
        elif w == "--metrics-port":
            out[i + 1] = "0"
        elif w in ("--bind", "-b") and not value.startswith("fd://") and not tcp:
            host = value[:value.rindex("]") + 1] if value.startswith("[") else \
                value.partition(":")[0]
            out[i + 1] = f"{host}:{PORT}"
            tcp = True
    if not tcp:
        out += ["--bind", f"127.0.0.1:{PORT}"]
    return out


def _answers_for_module(module: str) -> dict[str, bytes | None]:
    if module == "examples.demo.app":
        return dict(DEMO_ANSWERS)
    return {"/": FIXTURE_BODIES[module.split(".")[0]]}


def _run_call_script(call: str) -> tuple[str, str]:
    """A script for an inline cyserve.run(...) call: its names come from the fixture modules."""
    tree = ast.parse(call.replace("=N", "=2"), mode="eval")
    node = tree.body
    assert isinstance(node, ast.Call)
    node.keywords = [k for k in node.keywords if k.arg != "port"]
    node.keywords.append(ast.keyword("port", ast.Name(PORT)))
    first = node.args[0]
    assert isinstance(first, ast.Name), call
    module = "docwsgi" if "wsgi" in first.id else "docapp"
    attr = "application" if module == "docwsgi" else "app"
    script = (f"import cyserve\nfrom {module} import {attr} as {first.id}\n"
              f"{ast.unparse(node)}\n")
    return script, module


def _python_block_case(snippet: Snippet) -> Case:
    tree = ast.parse(snippet.text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "cyserve.run"]
    for call in calls:
        call.keywords = [k for k in call.keywords if k.arg != "port"]
        call.keywords.append(ast.keyword("port", ast.Name(PORT)))
    answers: dict[str, bytes | None] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "app.static":
            path, body = (a.value for a in n.args[:2])  # type: ignore[attr-defined]
            answers[path] = body if isinstance(body, bytes) else body.encode()
        if isinstance(n, ast.FunctionDef):
            for d in n.decorator_list:
                if (isinstance(d, ast.Call) and ast.unparse(d.func) == "app.get"
                        and isinstance(d.args[0], ast.Constant)):
                    path = re.sub(r"\{\w+:int\}", "7", d.args[0].value)
                    if "{" in path:
                        continue
                    ret = n.body[-1]
                    literal = (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Constant)
                               and isinstance(ret.value.value, str))
                    answers[path] = ret.value.value.encode() if literal else None  # type: ignore
    return Case(f"{snippet.doc}:{snippet.line} python block", script=ast.unparse(tree),
                answers=answers, source=snippet.text)


def _make_run_case(snippet: Snippet) -> Case:
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \?= (.*)$", makefile, re.M))
    variables["PY"] = PYTHON
    overrides = dict(w.split("=", 1) for w in shlex.split(snippet.text)[2:])
    variables.update(overrides)
    recipe = re.search(r"^run:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile has no run: recipe"
    line = recipe.group(1).strip()
    if "PORT" not in overrides:
        # The doc says where the default serves: the Makefile's defaults must say the same.
        url = f"http://{variables['HOST']}:{variables['PORT']}"
        assert snippet.kind != "line" or "http://" not in _doc_line(snippet) or \
            url in _doc_line(snippet), (url, _doc_line(snippet))
    variables["PORT"] = PORT
    line = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], line)
    argv = shlex.split(line)
    module = next(w for w in argv if APP_SPEC.match(w)).partition(":")[0]
    return Case(f"{snippet.doc}:{snippet.line} {snippet.text}", argv=argv,
                answers=_answers_for_module(module), source=snippet.text)


def _doc_line(snippet: Snippet) -> str:
    return (ROOT / ("docs/" if snippet.doc != "README.md" else "") / snippet.doc
            ).read_text().splitlines()[snippet.line - 1]


def collect() -> tuple[list[Case], list[tuple[str, str]], list[str]]:
    """The runnable cases, the skipped snippets (with why) and the unclassified ones."""
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    unknown: list[str] = []
    for doc in DOCS:
        snippets = extract(doc)
        last_cli: dict[int, list[str]] = {}
        for k, s in enumerate(snippets):
            where = f"{s.doc}:{s.line}"
            if s.kind == "python":
                if "cyserve.run(" in s.text:
                    cases.append(_python_block_case(s))
                continue
            text = s.text
            if CLI.match(text) and shlex.split(text)[-1] != "..." and not any(
                    APP_SPEC.match(w) or w in PLACEHOLDER_APPS for w in shlex.split(text)[1:]):
                # A command with no app (`cyserve --help`) serves nothing: skipped with a reason
                # like any other, or reported as unknown.
                reason = next((why for pat, why in SKIP.items() if re.search(pat, text)), None)
                if reason:
                    skipped.append((f"{where} {text}", reason))
                else:
                    unknown.append(f"{where} `{text}`")
            elif CLI.match(text):
                words = shlex.split(text)
                if words[-1] == "...":
                    assert s.paragraph in last_cli, f"{where}: '...' with no command before it"
                    words = words[:-1] + last_cli[s.paragraph][1:]
                last_cli[s.paragraph] = words
                argv, module = _cli_argv(words)
                cases.append(Case(f"{where} {text}", argv=argv,
                                  answers=_answers_for_module(module), source=text))
            elif MAKE_RUN.match(text):
                cases.append(_make_run_case(s))
            elif RUN_CALL.match(text):
                script, module = _run_call_script(text)
                cases.append(Case(f"{where} {text}", script=script,
                                  answers=_answers_for_module(module), source=text))
            elif FLAG.match(text):
                flag, _, value = text.partition(" ")
                if flag not in cli.build_parser()._option_string_actions:
                    continue  # not an option of the command (another tool's flag)
                if s.paragraph not in last_cli:
                    skipped.append((f"{where} {text}", "an option named in prose, with no "
                                    "command in its paragraph to add it to"))
                    continue
                if _takes_value(flag) and not value:
                    skipped.append((f"{where} {text}", "an option named without a value: "
                                    "prose, not a command"))
                    continue
                words = list(last_cli[s.paragraph])
                nxt = snippets[k + 1] if k + 1 < len(snippets) else None
                if nxt and nxt.paragraph == s.paragraph and APP_SPEC.match(nxt.text):
                    spec = next(i for i, w in enumerate(words) if APP_SPEC.match(w)
                                or w in PLACEHOLDER_APPS)
                    words[spec] = nxt.text
                words += text.split()
                argv, module = _cli_argv(words)
                cases.append(Case(f"{where} {text} (as {shlex.join(words)})", argv=argv,
                                  answers=_answers_for_module(module),
                                  access_log=flag == "--access-log", source=text))
            elif COMMANDISH.match(text):
                reason = next((why for pat, why in SKIP.items() if re.search(pat, text)), None)
                if reason:
                    skipped.append((f"{where} {text}", reason))
                else:
                    unknown.append(f"{where} `{text}`")
    # The same command shown in several places is run once (the first place names it).
    unique: dict[str, Case] = {}
    for c in cases:
        unique.setdefault(repr((c.argv, c.script)), c)
    return list(unique.values()), skipped, unknown


CASES, SKIPPED, UNKNOWN = collect()


def test_the_docs_show_the_commands_this_file_expects():
    """The extraction itself: it found the README's ways to start a server, and every SKIP
    pattern still matches something (a stale entry means the docs changed: look again)."""
    ids = " | ".join(c.id for c in CASES)
    for wanted in ("make run", "cyserve module:app", "python -m cyserve", "--interface wsgi",
                   "--factory", "--processes N", "--access-log", "cyserve.run(app, processes=N)",
                   "cyserve.run(wsgi_app)", "python block"):
        assert wanted in ids, f"no documented command with {wanted!r} was found: {ids}"
    assert not UNKNOWN, ("these look like commands: run them here (a pattern above) or add "
                         f"them to SKIP with a reason: {UNKNOWN}")
    for pattern in SKIP:
        assert any(re.search(pattern, s.split(" ", 1)[1]) for s, _ in SKIPPED), (
            f"SKIP entry {pattern!r} matches no documented command any more")


def _with_port(case: Case, port: int) -> Case:
    argv = [a.replace(PORT, str(port)) for a in case.argv]
    script = case.script.replace(PORT, str(port)) if case.script else None
    return Case(case.id, argv, script, case.answers, case.access_log, case.source)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_documented_command_serves(case: Case, tmp_path: Path) -> None:
    for name, source in FIXTURE_MODULES.items():
        (tmp_path / name).write_text(textwrap.dedent(source))
    port = free_port()
    case = _with_port(case, port)
    argv = [a.replace(TMPDIR, str(tmp_path)) for a in case.argv]
    cwd = tmp_path
    if case.script is not None:
        (tmp_path / "snippet.py").write_text(case.script)
        argv = [PYTHON, "snippet.py"]
    elif any(a.startswith("examples.") for a in argv):
        cwd = ROOT  # the repository's own apps are named from its root, as the docs run them
    probe = next(iter(case.answers))
    tls = None
    if "--ssl-certfile" in argv:
        # HTTPS: the certificate and key files the command names, made here, and a TLS client.
        cert = argv[argv.index("--ssl-certfile") + 1]
        key = argv[argv.index("--ssl-keyfile") + 1] if "--ssl-keyfile" in argv else cert
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(cwd / key), "-out", str(cwd / cert), "-days", "2", "-subj",
                        "/CN=localhost"], check=True, capture_output=True)
        tls = ssl.create_default_context(cafile=str(cwd / cert))
    with running(argv, port, cwd=cwd, probe=probe, tls=tls) as srv:
        for path, body in case.answers.items():
            r = srv.get(path)
            assert r.status == 200, (case.source, path, r.status, r.body, srv.output())
            if body is not None:
                assert r.body == body, (case.source, path, r.body)
    assert srv.proc.returncode == 0, (case.source, srv.proc.returncode, srv.output())
    if case.access_log:
        assert f'"GET {probe} HTTP/1.1" 200' in srv.output(), srv.output()
