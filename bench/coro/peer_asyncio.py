"""The asyncio (and asyncio + uvloop) peer of the coroutine benchmark: n empty coroutines.

Run by bench/coro/run.py in a fresh process per measurement; prints one JSON object:
  python peer_asyncio.py --n 500000 [--uvloop]

What is timed, with time.perf_counter(), to match cyserve's bench_empty:
  spawn_s  creating n tasks from inside the running loop (asyncio.Task objects; each task's first
           step is queued with call_soon, so nothing runs yet: spawn-then-run, as in cyserve);
  run_s    awaiting all of them (asyncio.gather) until every task has finished;
  total_s  from before the event loop is created to after it is closed.
Each coroutine increments a counter, checked after the run, so the work cannot be skipped.
Python's cyclic GC stays on, as users run it; it takes most of the spawn time (500,000 Task
objects trigger repeated full collections), see bench/coro/README.md.
"""

import argparse
import asyncio
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    args = ap.parse_args()
    if args.n <= 0:
        ap.error("--n must be positive")

    if args.uvloop:
        import uvloop

        new_loop = uvloop.new_event_loop
        version = uvloop.__version__
    else:
        new_loop = asyncio.new_event_loop
        version = sys.version.split()[0]

    done = 0

    async def empty() -> None:
        nonlocal done
        done += 1

    async def bench(n: int) -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        tasks = [loop.create_task(empty()) for _ in range(n)]
        t1 = time.perf_counter()
        await asyncio.gather(*tasks)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    t_start = time.perf_counter()
    loop = new_loop()
    try:
        spawn_s, run_s = loop.run_until_complete(bench(args.n))
    finally:
        loop.close()
    total_s = time.perf_counter() - t_start
    if done != args.n:
        print(f"peer_asyncio: {done} of {args.n} coroutines ran", file=sys.stderr)
        return 1
    json.dump({"spawn_s": spawn_s, "run_s": run_s, "total_s": total_s, "version": version},
              sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
