"""cyserve answering from app.static(): each response serialised once, served by the C core."""

import cyserve

from bench.http import workloads

_bodies = workloads.expected_bodies()
app = cyserve.App()
app.static("/plaintext", _bodies["plaintext"], content_type="text/plain")
app.static("/welcome", _bodies["welcome"], content_type="text/plain")
app.static("/transfer", _bodies["transfer"], content_type="application/json")
