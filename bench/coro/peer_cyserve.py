"""The cyserve side of the coroutine benchmark: thin calls into cyserve._testhooks' C benchmarks.

Run by bench/coro/run.py in a fresh process per measurement; prints one JSON object:
  python peer_cyserve.py empty  --workers K --n 500000 [--stack-size 65536]
  python peer_cyserve.py fib    --workers K --n 20000 --fib 100000
  python peer_cyserve.py parked --workers K --seconds 5

The timing is done in C by cyserve._testhooks (CLOCK_MONOTONIC, GIL released), not here:
bench_empty/bench_fib return spawn_s (n coroutines queued from the calling thread before the
workers start, the write-up's semantics), run_s (the workers run until no coroutine is left) and
total_s (from before the scheduler is created to after it is freed). parked_cpu starts a
scheduler with no work and returns the process's CPU time over `seconds`.

Exit status 3 means cyserve's benchmark functions are not available (the test-hooks extension,
built by `make build`, is not there or is older than the runtime); run.py reports that as a clear
line instead of a failure.
"""

import argparse
import json
import sys

NOT_AVAILABLE = 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("empty", "fib", "parked"))
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--fib", type=int, default=100_000)
    ap.add_argument("--stack-size", type=int, default=65536)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()

    func_name = {"empty": "bench_empty", "fib": "bench_fib", "parked": "parked_cpu"}[args.mode]
    try:
        from cyserve import _testhooks
    except ImportError as exc:
        # An installed cyserve, or a build from before the hooks: no benchmark functions.
        print(f"cyserve has no {func_name}() yet: cyserve._testhooks cannot be imported "
              f"({exc}); run `make build`", file=sys.stderr)
        return NOT_AVAILABLE
    func = getattr(_testhooks, func_name, None)
    if func is None:
        print(f"cyserve._testhooks has no {func_name}() yet (the runtime has not landed)",
              file=sys.stderr)
        return NOT_AVAILABLE

    if args.mode == "empty":
        res = func(args.workers, args.n, args.stack_size)
    elif args.mode == "fib":
        res = func(args.workers, args.n, args.fib)
    else:
        res = func(args.workers, args.seconds)
    json.dump(dict(res), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
