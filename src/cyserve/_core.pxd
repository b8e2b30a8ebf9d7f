# cython: language_level=3
# The public, cimport-able C-level API of cyserve. Other Cython modules `cimport` from here;
# the C types come from headers under cyserve.get_include().
#
# Every function here is defined in _core.pyx (native/*.pyx), is callable without the GIL and
# returns 0 or -errno, like the C runtime underneath, unless its comment says otherwise.

include "native/sched_api.pxi"
include "native/http_api.pxi"
include "native/ws_api.pxi"
