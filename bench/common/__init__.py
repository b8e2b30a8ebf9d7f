"""What every benchmark driver shares: starting a server and stopping its whole process tree
(processes), pinning a command to CPUs (pinning), the tree's CPU time and memory and how busy the
machine is, read from /proc (procfs), the median/min/max of a set of rounds (stats), and the
Markdown cells and tables of a report (report).

Stdlib only, like the rest of bench/, so that cyserve's own venv can run the drivers' smoke
tests. The drivers are bench/http/run.py with bench/http/harness.py (the HTTP suite),
bench/coro/run.py (the coroutine table) and bench/micro/plaintext_floor.py (the kernel's floor on
/plaintext)."""
