#!/usr/bin/env python3
"""Writes the issue-15 "small pickle, huge trace" input: a PyTorch-style memory snapshot whose one
device trace holds N entries (default 10 million) that are the same two dicts (an alloc and its
free_completed of one block) repeated through the pickle memo, so the file is about 2 bytes per
entry (20 MB for 10 M) while a reader must build every entry.

  python3 bench/memo_pickle.py OUT.pickle [--entries N]
  /usr/bin/time -v build/cli/gpumem report OUT.pickle      # time and peak memory of the reader

The gpumem readers bound such files by GPUMEM_MAX_RECORDS (default 32 Mi entries; see
forensics/offline/include/gpumem/forensics/read_limits.h): above it they refuse the file with one
error naming the variable. docs/notes/reliability-fuzzing.md has the measured numbers.
"""
import argparse
import pickle
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--entries", type=int, default=10_000_000, help="trace entries (even; default 10,000,000)")
    args = ap.parse_args()
    if args.entries < 2 or args.entries % 2:
        ap.error("--entries must be an even number >= 2")
    addr = 139_000_000_000_000
    seg = {"device": 0, "address": addr, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
           "allocated_size": 0, "active_size": 0, "requested_size": 0,
           "blocks": [{"address": addr, "size": 2 << 20, "requested_size": 0, "state": "inactive"}]}
    alloc = {"action": "alloc", "addr": addr, "size": 4096, "stream": 0, "time_us": 1, "frames": []}
    free = {"action": "free_completed", "addr": addr, "size": 4096, "stream": 0, "time_us": 2, "frames": []}
    snapshot = {"segments": [seg], "device_traces": [[alloc, free] * (args.entries // 2)]}
    with open(args.out, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    print(f"{args.out}: {args.entries} trace entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
