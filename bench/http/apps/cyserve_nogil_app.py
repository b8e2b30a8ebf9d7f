"""cyserve with the GIL-free Cython handlers of cyserve_nogil.pyx (built into bench/.build/)."""

import cyserve

import cyserve_nogil  # bench/.build/ is on PYTHONPATH when the runner starts this app

app = cyserve.App()
for _path, _capsule in cyserve_nogil.HANDLERS.items():
    app.nogil(_path, _capsule)
