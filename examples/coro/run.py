"""Run the ping example built by build.py."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ping  # noqa: E402  (the extension build.py made next to this file)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=0, help="0: one per CPU")
    ap.add_argument("--coroutines", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    steps, cleaned, workers = ping.run(args.workers, args.coroutines, args.rounds)
    print(f"{args.coroutines} coroutines x {args.rounds} rounds: {steps} steps, "
          f"{cleaned} cleaned up, last steps ran on workers {sorted(workers)}")


if __name__ == "__main__":
    main()
