"""cyserve answering from app.files(): each route is a file on disk, opened, checked (ETag,
conditional and range headers) and sent with sendfile by the C core on every request, as nginx
and Lwan serve theirs. The files are written into a fresh temporary folder at start-up."""

import atexit
import os
import shutil
import tempfile

import cyserve

from bench.http import workloads

_root = tempfile.mkdtemp(prefix="cyserve-files-")
atexit.register(shutil.rmtree, _root, True)
for _name, _body in workloads.expected_bodies().items():
    if _name in ("plaintext", "welcome", "transfer"):
        with open(os.path.join(_root, _name), "wb") as f:
            f.write(_body)

app = cyserve.App()
app.files("/", _root)
