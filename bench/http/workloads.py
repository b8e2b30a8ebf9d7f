"""The workloads, by path: what every server must answer, byte for byte
(docs/benchmarks.md#where-the-workloads-come-from).

This module is the single definition the harness validates against; cyserve's apps in
bench/http/apps/ and the peers in bench/peers/ implement the same routes. Stdlib only: the CI
smoke test imports it.

  /plaintext  "Hello, World!"
  /fib        "Fibonacci(10^6) = <n> (with overflow)\n"         (10^6 iterations, 32-bit wrap)
  /welcome    "Welcome!\n"
  /msgpack    "1000\n": decode the 1,000 pre-encoded records, return how many were decoded
  /json       "133622\n": encode the cached records as one compact JSON document, return its length
  /transfer   the 133,622-byte JSON document itself (bench/data/transfer.json)
  /loop       "<n>\n": one million iterations of two arithmetic operations and an `if`
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
# bench/data/: read by every server, the Go peers and bench/micro/ too, so it stays beside them.
DATA = os.path.join(os.path.dirname(HERE), "data")
RECORDS_PATH = os.path.join(DATA, "records.msgpack")
TRANSFER_PATH = os.path.join(DATA, "transfer.json")

WORKLOADS = ["plaintext", "fib", "welcome", "msgpack", "json", "transfer", "loop"]

# The loop of /loop, written once here; every implementation must do the same arithmetic:
#     acc = 0; for i in 0..10^6-1: acc += i * 3; if acc > LOOP_MOD: acc -= LOOP_MOD
# acc stays below 2^31 + 3*10^6, so 64-bit integers in C and Go give Python's exact answer.
LOOP_N = 1_000_000
LOOP_MOD = 1_000_000_007


def fib_u32(n: int) -> int:
    """The /fib workload's Fibonacci: a, b = b, a + b, n times, in unsigned 32-bit arithmetic."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) & 0xFFFFFFFF
    return a


def loop_value() -> int:
    acc = 0
    for i in range(LOOP_N):
        acc += i * 3
        if acc > LOOP_MOD:
            acc -= LOOP_MOD
    return acc


_expected = None


def expected_bodies() -> dict:
    """Path name -> the exact body every server must send (computed once, ~0.3 s)."""
    global _expected
    if _expected is None:
        with open(TRANSFER_PATH, "rb") as f:
            transfer = f.read()
        _expected = {
            "plaintext": b"Hello, World!",
            "fib": b"Fibonacci(10^6) = %d (with overflow)\n" % fib_u32(10**6),
            "welcome": b"Welcome!\n",
            "msgpack": b"1000\n",
            "json": b"%d\n" % len(transfer),
            "transfer": transfer,
            "loop": b"%d\n" % loop_value(),
        }
    return _expected
