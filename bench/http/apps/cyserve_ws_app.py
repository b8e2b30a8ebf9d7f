"""The WebSocket echo of the protocol workloads on cyserve's App API: @app.websocket runs the
blocking handler on a thread of the event loop's executor (cyserve/websocket.py), /plaintext
from app.static() as in cyserve_static_app.py."""

import cyserve

from bench.http import workloads

app = cyserve.App()
app.static("/plaintext", workloads.expected_bodies()["plaintext"], content_type="text/plain")


@app.websocket("/ws")
def echo(ws):
    for message in ws:  # str or bytes, until the client closes
        ws.send(message)
