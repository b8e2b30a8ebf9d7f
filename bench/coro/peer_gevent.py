"""The gevent peer of the coroutine benchmark: n empty greenlets.

Run by bench/coro/run.py in a fresh process per measurement; prints one JSON object:
  python peer_gevent.py --n 500000

The write-up (bench/coro/README.md) has only a total for gevent, saying greenlets start at
spawn. In gevent 1.x and later that is not so: gevent.spawn() creates the greenlet and queues
its start as a callback on the hub, and nothing runs until the main greenlet blocks and the hub
takes over. So the same split as cyserve's can be measured honestly:
  spawn_s  n calls to gevent.spawn() (greenlet objects created, starts queued);
  run_s    gevent.joinall() on them, until every greenlet has finished;
  total_s  from before the hub is created (gevent.get_hub()) to after joinall returns.
Each greenlet increments a counter, checked after the run.
"""

import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500_000)
    args = ap.parse_args()
    if args.n <= 0:
        ap.error("--n must be positive")

    import gevent

    done = 0

    def empty() -> None:
        nonlocal done
        done += 1

    n = args.n
    t_start = time.perf_counter()
    gevent.get_hub()
    t0 = time.perf_counter()
    glets = [gevent.spawn(empty) for _ in range(n)]
    t1 = time.perf_counter()
    gevent.joinall(glets, raise_error=True)
    t2 = time.perf_counter()
    if done != n:
        print(f"peer_gevent: {done} of {n} greenlets ran", file=sys.stderr)
        return 1
    json.dump({"spawn_s": t1 - t0, "run_s": t2 - t1, "total_s": t2 - t_start,
               "version": gevent.__version__}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
