"""A self-signed test certificate for localhost, made with the openssl command.

Several test files serve TLS; each made the same certificate with the same ten lines. The openssl
command runs without LD_PRELOAD: `make test-asan` preloads the sanitizers' runtime, which is
cyserve's to carry, not the tool's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(d: Path, days: int = 2) -> dict[str, str]:
    """Writes d/cert.pem and d/key.pem (P-256, CN and SAN localhost and 127.0.0.1); their paths."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificate")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", str(days), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, env=env)
    return {"cert": str(d / "cert.pem"), "key": str(d / "key.pem")}
