"""deploy/kubernetes/cyserve.yaml, the sample Kubernetes manifest of docs/deployment.md: the
fields that must agree with cyserve's own options are checked here (kubectl's client-side dry
run needs a cluster's API discovery, which a test machine has not), and the container's command
is run as the pod would run it: it answers the probes' path and the metrics, and stops within
the grace period on SIGTERM."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cyserve import cli

from _subserve import PYTHON, ROOT, free_port, running

yaml = pytest.importorskip("yaml")

MANIFEST = ROOT / "deploy" / "kubernetes" / "cyserve.yaml"


def _documents() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["Deployment", "Service"]
    assert by_kind["Deployment"]["apiVersion"] == "apps/v1"
    assert by_kind["Service"]["apiVersion"] == "v1"
    return by_kind


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_manifest_agrees_with_cyserves_options() -> None:
    docs = _documents()
    dep, svc = docs["Deployment"], docs["Service"]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    c = _container(dep)
    assert c["command"] == ["cyserve"]  # the wheel's console script
    config = cli.config_from_args(cli.build_parser().parse_args(c["args"]))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    (bind,) = config.bind
    assert ports["http"] == _port(bind)
    assert ports["metrics"] == _port(config.metrics_bind)
    annotations = pod["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert annotations["prometheus.io/path"] == "/metrics"
    # Both probes ask the health path, on the application's port.
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == config.health_path, probe
        assert ports.get(get["port"], get["port"]) == ports["http"], probe
    for sp in svc["spec"]["ports"]:
        assert ports.get(sp["targetPort"], sp["targetPort"]) == ports["http"]
    # SIGTERM comes after preStop; SIGKILL after the grace period: it must cover both.
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(pre_stop[1]) + config.graceful_timeout
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_containers_command_serves_the_probes_and_stops_in_time(tmp_path: Path) -> None:
    c = _container(_documents()["Deployment"])
    port, metrics = free_port(), free_port()
    args = [a.replace("0.0.0.0:8000", f"127.0.0.1:{port}")
             .replace("0.0.0.0:9100", f"127.0.0.1:{metrics}") for a in c["args"]]
    argv = [PYTHON, "-m", "cyserve", *args]
    with running(argv, port, probe="/healthz") as srv:
        r = srv.get("/healthz")
        assert (r.status, r.body) == (200, b"ok\n")
        assert srv.get("/plaintext").body == b"Hello, World!"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=30) as m:
            assert b"cyserve_" in m.read()
        started = time.monotonic()
    grace = _documents()["Deployment"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert srv.proc.returncode == 0, srv.output()
    assert time.monotonic() - started < grace
