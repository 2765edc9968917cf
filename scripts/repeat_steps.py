#!/usr/bin/env python3
"""Lengthens a CSV allocator trace by repeating one of its training steps: a long run to replay.

usage: scripts/repeat_steps.py TRACE.csv.gz OUT.csv.gz --marker BYTES --per-step K [--repeat N]

The corpus traces are a few steps long, so a replay of one is mostly warm-up. This writes the trace
up to the start of its last whole step, that step, and then the same step N more times (times
shifted by the step's length), so `gpumem replay OUT` reports what a run N steps longer would pay
in steady state (its VMM share is then close to the per-step share a live run sees).

A step is found by a marker: an allocation size (BYTES, exact) that occurs K times in every step,
e.g. the LM head's logits (llama_train: --marker 1048576000 --per-step 4). The step repeated runs
from the K-th last marker allocation back to the 2K-th last one. It must be closed: every block it
allocates it frees and every block it frees it allocated (same address and size), else the
repetitions would free blocks that were never allocated; the script says so and writes nothing.

Entries are copied as they are (action,addr,size,stream,time_us,where), only time_us shifted.
Exit status: 0 written, 1 the trace cannot be read or has no closed step, 2 usage error.
"""
import argparse
import csv
import gzip
import sys


def open_text(path, mode):
    return gzip.open(path, mode + "t", newline="") if path.endswith(".gz") else open(path, mode, newline="")


class TraceError(Exception):
    """A trace that cannot be read, or has no closed step: the message says which and why."""


def read_trace(path):
    """The trace's header and rows (lists of strings), or TraceError."""
    try:
        with open_text(path, "r") as f:
            rows = list(csv.reader(f))
    except (OSError, EOFError, csv.Error, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read {path}: {e}") from e
    if not rows or rows[0][:5] != ["action", "addr", "size", "stream", "time_us"]:
        raise TraceError(f"{path} is not a CSV trace (its header must start action,addr,size,stream,time_us)")
    return rows[0], rows[1:]


def find_step(rows, marker, per_step, path):
    """The last whole closed step, [lo, hi) of rows: from the 2K-th last allocation of `marker` bytes
    to the K-th last (K = per_step). Closed: every block it allocates it frees and every block it
    frees it allocated (same address and size). TraceError otherwise."""
    markers = [i for i, r in enumerate(rows) if len(r) >= 5 and r[0] == "alloc" and r[2] == str(marker)]
    if len(markers) < 2 * per_step:
        raise TraceError(f"{len(markers)} allocations of {marker} bytes in {path}; two steps of {per_step} need "
                         f"{2 * per_step} (check --marker and --per-step)")
    lo, hi = markers[-2 * per_step], markers[-per_step]
    balance = {}
    for r in rows[lo:hi]:
        key = (r[1], r[2])
        if r[0] == "alloc":
            balance[key] = balance.get(key, 0) + 1
        elif r[0] == "free_completed":
            balance[key] = balance.get(key, 0) - 1
    open_blocks = sum(1 for v in balance.values() if v != 0)
    if open_blocks:
        raise TraceError(f"the step (entries {lo + 1}..{hi} of {path}) is not closed: {open_blocks} blocks are "
                         "allocated without being freed in it, or freed without being allocated in it (try another "
                         "--marker or --per-step)")
    return lo, hi


def write_longer(trace, out, marker, per_step, repeat):
    """Writes trace lengthened by `repeat` more repetitions of its last whole closed step to out;
    returns (entries kept before the repetitions, entries of the step, the step's length in us).
    TraceError when the trace cannot be read, has no closed step, or its step takes no time."""
    header, rows = read_trace(trace)
    lo, hi = find_step(rows, marker, per_step, trace)
    step = rows[lo:hi]
    period_us = int(rows[hi][4]) - int(step[0][4])
    if period_us <= 0:
        raise TraceError(f"the step found in {trace} takes no time (times must increase)")
    with open_text(out, "w") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows[:hi])
        for k in range(1, repeat + 1):
            shift = k * period_us
            for r in step:
                shifted = list(r)
                shifted[4] = str(int(r[4]) + shift)
                w.writerow(shifted)
    return hi, len(step), period_us


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="CSV trace (.csv or .csv.gz): action,addr,size,stream,time_us,where")
    ap.add_argument("out", help="where to write the longer trace (.csv or .csv.gz)")
    ap.add_argument("--marker", type=int, required=True, help="allocation size in bytes that marks steps")
    ap.add_argument("--per-step", type=int, required=True, help="marker allocations in one step")
    ap.add_argument("--repeat", type=int, default=100, help="extra repetitions of the step (default 100)")
    args = ap.parse_args(argv)
    if args.marker <= 0 or args.per_step <= 0 or args.repeat < 0:
        ap.error("--marker and --per-step must be positive, --repeat at least 0")
    try:
        hi, step_entries, period_us = write_longer(args.trace, args.out, args.marker, args.per_step, args.repeat)
    except TraceError as e:
        print(f"repeat_steps.py: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {hi} entries of {args.trace}, then its last whole step ({step_entries} entries, "
          f"{period_us / 1e3:.1f} ms) {args.repeat} more times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
