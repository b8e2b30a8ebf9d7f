"""bjoern (a C WSGI server on libev) serving the WSGI peer app. Run: python -m bench.peers.python.bjoern_app PORT"""

import sys

import bjoern

from bench.peers.python.wsgi_app import app

if __name__ == "__main__":
    bjoern.run(app, "127.0.0.1", int(sys.argv[1]))
