"""The Dockerfile, checked where no container can run: what must agree with cyserve's options
(the CMD parses, the HEALTHCHECK asks the CMD's health path on its port, EXPOSE names that port,
the user is a number other than root's, SIGTERM stops it within docker stop's 10 s), what
.dockerignore must leave out, and the CMD and the HEALTHCHECK's command run as the container
runs them. Building and running the image itself is `make test-docker`
(deploy/docker/test-local-build.sh: root, apt, PyPI and minutes), not part of this suite."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time

from cyserve import cli

from _subserve import PYTHON, ROOT, env_with_src, free_port, running

DOCKERFILE = ROOT / "Dockerfile"
DOCKER_STOP_TIMEOUT = 10.0  # seconds docker stop and podman stop wait before SIGKILL


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction, continuation lines joined and comments
    dropped, as the Dockerfile syntax defines them."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole:
            word, _, rest = whole.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends in a continuation line"
    return out


def _final_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def _one(stage: list[tuple[str, str]], word: str) -> str:
    found = [rest for w, rest in stage if w == word]
    assert len(found) == 1, f"{word}: {found}"
    return found[0]


def _cmd() -> list[str]:
    cmd = json.loads(_one(_final_stage(), "CMD"))
    assert cmd[0] == "cyserve"  # the wheel's console script, on the venv's PATH
    return cmd


def _healthcheck() -> list[str]:
    rest = _one(_final_stage(), "HEALTHCHECK")
    m = re.fullmatch(r"((?:--[a-z-]+=\S+\s+)*)CMD\s+(\[.*\])", rest)
    assert m, rest
    return json.loads(m.group(2))


def test_both_stages_use_the_base_image_argument() -> None:
    ins = _instructions()
    (arg,) = [rest for w, rest in ins if w == "ARG" and rest.startswith("BASE_IMAGE=")]
    assert arg.split("=", 1)[1].startswith("python:3.")
    froms = [rest.split()[0] for w, rest in ins if w == "FROM"]
    assert froms == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    assert ins.index(("ARG", arg)) < [w for w, _ in ins].index("FROM")


def test_cmd_healthcheck_expose_user_and_stop_signal_agree() -> None:
    stage = _final_stage()
    config = cli.config_from_args(cli.build_parser().parse_args(_cmd()[1:]))
    (bind,) = config.bind
    port = int(bind.rsplit(":", 1)[1])
    assert bind.startswith("0.0.0.0:")  # reachable through a published port
    assert _one(stage, "EXPOSE") == str(port)
    assert config.health_path
    check = _healthcheck()
    assert f"http://127.0.0.1:{port}{config.health_path}" in check[-1]
    # By number, not name: Kubernetes' runAsNonRoot cannot check a name.
    user = _one(stage, "USER").split(":")
    assert all(part.isdigit() and int(part) != 0 for part in user), user
    assert _one(stage, "STOPSIGNAL") == "SIGTERM"
    assert config.graceful_timeout + config.drain_delay < DOCKER_STOP_TIMEOUT


def test_dockerignore_leaves_out_local_builds() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    # A host's venvs, objects and generated C would be copied over the image's own, or could
    # not run on its Python.
    for pattern in (".git", ".venv", ".venv-*", "build", "**/*.so", "src/cyserve/_core.c"):
        assert pattern in ignored, pattern
    # Nothing the build reads may be left out.
    for needed in ("setup.py", "pyproject.toml", "MANIFEST.in", "src", "examples", "LICENSE"):
        assert needed not in ignored and (ROOT / needed).exists(), needed


def test_the_cmd_serves_the_healthcheck_and_stops_on_sigterm_in_time() -> None:
    port = free_port()
    args = [a.replace("0.0.0.0:8000", f"127.0.0.1:{port}") for a in _cmd()[1:]]
    assert f"127.0.0.1:{port}" in args
    # The HEALTHCHECK's command, as the container runs it, against the CMD's server (its port
    # swapped for a free one): it must pass while serving and fail once the server is gone.
    check = [c.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for c in _healthcheck()]
    assert check[0] == "python3"
    check[0] = PYTHON
    with running([PYTHON, "-m", "cyserve", *args], port, probe="/healthz") as srv:
        assert srv.get("/").body == b"Hello, World!"
        done = subprocess.run(check, env=env_with_src(), capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        started = time.monotonic()
    assert srv.proc.returncode == 0, srv.output()
    assert time.monotonic() - started < DOCKER_STOP_TIMEOUT
    done = subprocess.run(check, env=env_with_src(), capture_output=True, timeout=30)
    assert done.returncode != 0, shlex.join(check)
