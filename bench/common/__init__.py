"""What every benchmark driver shares: the process tree's CPU time and memory read from /proc,
how busy the machine is, pinning a command to CPUs, and the median/min/max of a set of rounds.

Stdlib only, like the rest of bench/, so that cyserve's own venv can run the drivers' smoke
tests. The drivers are bench/http/run.py with bench/http/harness.py (the HTTP suite),
bench/coro/run.py (the coroutine table) and bench/micro/plaintext_floor.py (the kernel's floor on
/plaintext)."""
