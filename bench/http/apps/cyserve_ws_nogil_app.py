"""The WebSocket echo of the protocol workloads as a GIL-free route: examples/ws_echo_nogil.pyx
(built into bench/.build/ by bench/http/build_nogil.py) through app.nogil_websocket, its
callbacks run in C on the worker; /plaintext from app.static() as in cyserve_static_app.py."""

import cyserve

import ws_echo_nogil  # bench/.build/ is on PYTHONPATH when the runner starts this app
from bench.http import workloads

app = cyserve.App()
app.static("/plaintext", workloads.expected_bodies()["plaintext"], content_type="text/plain")
app.nogil_websocket("/ws", ws_echo_nogil.ECHO)
