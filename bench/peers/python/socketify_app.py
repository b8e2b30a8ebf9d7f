"""The socketify peer (uWebSockets through CFFI): its native App API, one route per workload.

Run: python -m bench.peers.python.socketify_app PORT
"""

import sys

from socketify import App, AppListenOptions

from bench.peers.python.routes import ROUTES, handle


def _route(path):
    def h(res, req):
        status, body, ctype = handle(path)
        res.write_status(status)
        res.write_header("Content-Type", ctype)
        res.end(body)
    return h


def main():
    port = int(sys.argv[1])
    app = App()
    for path in ROUTES:
        app.get(path, _route(path))
    app.listen(AppListenOptions(port=port, host="127.0.0.1"), lambda config: print(f"socketify listening on {port}", flush=True))
    app.run()


if __name__ == "__main__":
    main()
