"""How often the WSGI environ's table of connection parts misses with C connections served in
turn (WSGIHandler._conn_part, native/wsgi.pyx), for two ways of finding a part's set:

    fnv:  FNV-1a over the peer's text ("127.0.0.1:PORT") and the Host's, 256 sets of two
          (main before session 20's envparts branch), or 128 sets of four;
    ptr:  a Fibonacci hash of the engine's pointer to the peer's text, with flags and the
          Host's length, 128 sets of four (the branch).

    python3 bench/micro/envparts_sim.py [--conns C] [--draws D]

Each draw takes C client ports (consecutive from a random start on even draws, drawn at random
on odd ones, as the kernel may hand them out) and C pointers: the engine mallocs each
connection's peer text (about 20 bytes, a 32-byte chunk) on its first request, so the pointers
step through memory by 32 bytes, or, on the "ptr, uneven" line, by a step drawn from 32 to 320
bytes for what else the worker thread mallocs between two connections. The connections are then
served in turn (each set kept in the order of use, the least recently used let go), and the
misses after the first rounds are counted. It prints, for each way, the mean share of requests
that miss, the worst draw's, and how many draws missed at all. A model, not a measurement: the
counts in docs/benchmarks.md ("Session 20: the environ's connection parts at 64 connections")
are the measurement.
"""

import argparse
import random

FLAGS = 0x71  # HTTP/1.1, one Host and it first, a peer: what the benchmark's requests have
HOST = b"127.0.0.1:8000"
MASK64 = (1 << 64) - 1


def fnv(peer: bytes) -> int:
    h = 2166136261
    for c in peer + HOST:
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return ((h ^ FLAGS) * 16777619) & 0xFFFFFFFF


def ptr_set(ptr: int) -> int:
    key = ((ptr >> 4) ^ FLAGS ^ (len(HOST) << 7)) & MASK64
    return ((key * 0x9E3779B97F4A7C15) & MASK64) >> 57


def miss_share(keys: list, set_of, ways: int, rounds: int = 30, warm: int = 5) -> float:
    sets: dict[int, list] = {}
    misses = 0
    for r in range(rounds):
        for k in keys:
            entries = sets.setdefault(set_of(k), [])
            if k in entries:
                entries.remove(k)
            elif r >= warm:
                misses += 1
            entries.insert(0, k)
            del entries[ways:]
    return misses / ((rounds - warm) * len(keys))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--draws", type=int, default=400)
    args = ap.parse_args()
    rnd = random.Random(1)
    seen: dict[str, list[float]] = {"fnv, 256 x 2": [], "fnv, 128 x 4": [], "ptr, 128 x 4": [],
                                    "ptr, uneven, 128 x 4": []}
    for draw in range(args.draws):
        if draw % 2:
            ports = rnd.sample(range(32768, 61000), args.conns)
        else:
            start = rnd.randrange(32768, 61000 - args.conns)
            ports = list(range(start, start + args.conns))
        peers = [f"127.0.0.1:{p}".encode() for p in ports]
        seen["fnv, 256 x 2"].append(miss_share(peers, lambda k: (fnv(k) & 510) // 2, 2))
        seen["fnv, 128 x 4"].append(miss_share(peers, lambda k: (fnv(k) & 508) // 4, 4))
        first = 0x7F0000000000 + rnd.randrange(1 << 20) * 16
        seen["ptr, 128 x 4"].append(
            miss_share([first + 32 * i for i in range(args.conns)], ptr_set, 4))
        ptrs, p = [], first
        for _ in range(args.conns):
            p += 16 * rnd.choice((2, 2, 2, 3, 4, 6, 10, 20))
            ptrs.append(p)
        seen["ptr, uneven, 128 x 4"].append(miss_share(ptrs, ptr_set, 4))
    for name, shares in seen.items():
        print(f"{name}: {100 * sum(shares) / len(shares):.2f} % of requests missed, worst draw "
              f"{100 * max(shares):.2f} %, {sum(1 for s in shares if s)} of {len(shares)} draws "
              "with a miss")


if __name__ == "__main__":
    main()
