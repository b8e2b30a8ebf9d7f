"""The RSGI peer app: granian --interface rsgi (granian's own protocol)."""

from bench.peers.python.routes import handle


async def app(scope, proto):
    status, body, ctype = handle(scope.path)
    proto.response_bytes(status, [("content-type", ctype)], body)
