"""Generate bench/data/: the records every server decodes, encodes and sends
(docs/benchmarks.md#where-the-workloads-come-from).

Run once with bench/.venv/bin/python bench/http/gen_data.py; the output is committed so that every
server, on every machine, reads the same bytes. The generator is deterministic (fixed seed), so a
rerun reproduces the files exactly.

  records.msgpack  a MessagePack array of 1,000 `bin` items; each item is one record encoded on
                   its own (the "1,000 pre-encoded strings" of /msgpack, as a cache would hold them)
  transfer.json    the 1,000 decoded records as one compact JSON document (keys in record order,
                   separators "," and ":"), exactly 133,622 bytes: the /json length and the
                   /transfer body.
"""

import json
import os
import random

import msgpack

N_RECORDS = 1000
TRANSFER_SIZE = 133622  # the /transfer workload's size; the last description is padded to reach it
SEED = 3
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "data")  # bench/data/

NAMES = ["My name", "Other name", "Jane Roe", "John Doe", "Ada", "Grace Hopper", "Linus"]
WORDS = "some words on here so it looks full of data and text for the benchmark".split()


def make_records():
    rng = random.Random(SEED)
    records = []
    for i in range(N_RECORDS):
        created = 1569882498 + rng.randrange(0, 10_000_000) + rng.randrange(1, 9999999) / 1e7
        records.append({
            "id": i,
            "name": rng.choice(NAMES),
            "description": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 9))),
            "type": rng.choice("UAB"),
            "count": rng.randrange(0, 1000),
            # A fractional part is kept on purpose: Go writes 1.0 as "1" and Python as "1.0".
            "created_at": created,
        })
    return records


def dump(records):
    return json.dumps(records, separators=(",", ":"))


def main():
    records = make_records()
    # Lengthen descriptions one word at a time, round robin, until the document is within a word
    # of the target, then pad the last description with dots to hit it exactly.
    rng = random.Random(SEED + 1)
    k = 0
    while TRANSFER_SIZE - len(dump(records)) > 12:
        records[k % N_RECORDS]["description"] += " " + rng.choice(WORDS)
        k += 1
    short = TRANSFER_SIZE - len(dump(records))
    if short < 0:
        raise SystemExit(f"records too long by {-short} bytes; shorten WORDS")
    records[-1]["description"] += "." * short
    doc = dump(records).encode("ascii")
    assert len(doc) == TRANSFER_SIZE
    for r in records:
        assert float(r["created_at"]) != int(r["created_at"])
    packed = msgpack.packb([msgpack.packb(r, use_bin_type=True) for r in records], use_bin_type=True)
    os.makedirs(DATA, exist_ok=True)
    with open(os.path.join(DATA, "records.msgpack"), "wb") as f:
        f.write(packed)
    with open(os.path.join(DATA, "transfer.json"), "wb") as f:
        f.write(doc)
    print(f"records.msgpack: {len(packed)} bytes; transfer.json: {len(doc)} bytes")


if __name__ == "__main__":
    main()
