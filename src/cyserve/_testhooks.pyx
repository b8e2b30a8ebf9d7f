# cython: language_level=3
"""cyserve._testhooks: entry points for the tests and the benchmarks, kept out of the product
module cyserve._core. setup.py builds it only when CYSERVE_TEST_HOOKS=1 (the Makefile sets it), so
an installed cyserve does not carry it.

- The HTTP parser's hooks (native/parser_hook.pyx) turn csrc/http_parse.c's results into Python
  values for tests/http/test_parser.py, as native/proxyproto_hook.pyx does csrc/proxyproto.c's
  for tests/http/test_proxyproto.py. The parsers are compiled into this extension from the same
  source as into _core, with the same flags (sanitizers included), because _core exports no C
  symbols: its hidden visibility keeps the parsers out of reach of any other module.
- The coroutine benchmark drivers (native/sched_bench.pyx) for bench/coro/ and tests/unit/test_sched.py
  drive the runtime inside _core through its exported API (cimport cyserve._core), like any
  other Cython module.
- The WebSocket codec's hooks (native/ws_hook.pyx) feed csrc/ws.c's frame reader for
  tests/ws/test_ws_codec.py, compiled in for the same reason as the parser."""

include "native/parser_hook.pyx"
include "native/proxyproto_hook.pyx"
include "native/sched_bench.pyx"
include "native/ws_hook.pyx"
