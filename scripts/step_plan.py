#!/usr/bin/env python3
"""How much memory a layout that repeats every step would need: a static plan of a trace's step.

usage: scripts/step_plan.py TRACE.csv.gz --marker BYTES --per-step K [--order ORDER]

An online allocator places each request when it comes. On a training loop that places the step's
largest tensors on fresh address space every step, and recycling then moves pieces there at every
step (docs/notes/allocation-policy.md, "Why the logits find no place of their own"). A layout that
gave every request of the step the same address at every step would make no driver call once
built. This computes one and says how much memory it needs, against the step's peak.

The step is found as scripts/repeat_steps.py finds it (the last whole closed step between two
allocations of the marker size). Blocks live before it and not freed in it are persistent (their
bytes are added to both sides). Every other block of the step gets one offset in an arena that the
plan maps once: a block allocated in the step and freed in it lives over that interval; a block
allocated in the step and still live at its end is freed in the next step where its counterpart
(same address and size) was freed in this one, so it lives over the step's end and its start (the
plan repeats). Sizes are rounded up to 512 bytes, as PyTorch's allocator and gpumem round them.

Streams are not modelled: on a step that uses several, a block's offset would be reused across
them only after an event, which the plan does not count.

It also says how many of the whole steps before the planned one make the same requests (sizes,
streams, which block each free frees) in the same order, in a row: the steps a plan would have
served.

The plan is greedy (dynamic storage allocation is NP-hard): blocks are taken in an order and each
goes at the lowest offset free over its whole lifetime. ORDER: size (largest first), area (size x
lifetime), duration (longest-lived first), or all (the default: each, and the best). The arena's
size is an upper bound on what a repeating layout needs; the transient peak is a lower bound.

Exit status: 0 printed, 1 the trace cannot be read or has no closed step, 2 usage error.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from repeat_steps import TraceError, find_step, read_trace  # noqa: E402

ORDERS = ("size", "area", "duration")


def round_up(size):
    return (size + 511) // 512 * 512


def step_blocks(rows, lo, hi, path):
    """(blocks, persistent bytes): blocks as (lifetimes, bytes), a lifetime a (start, end) pair of
    event indices within the step, [start, end); a block that lives over the step's end has two."""
    live = {}
    for r in rows[:lo]:
        if r[0] == "alloc":
            live[r[1]] = int(r[2])
        elif r[0] == "free_completed":
            live.pop(r[1], None)
    blocks, opened, freed_before = [], {}, {}
    t = 0
    for r in rows[lo:hi]:
        if r[0] == "alloc":
            opened[r[1]] = (t, int(r[2]))
            t += 1
        elif r[0] == "free_completed":
            if r[1] in opened:
                start, size = opened.pop(r[1])
                blocks.append(([(start, t)], round_up(size)))
            elif r[1] in live:
                freed_before.setdefault((r[1], live.pop(r[1])), []).append(t)
            t += 1
    end = t
    for addr, (start, size) in opened.items():
        frees = freed_before.get((addr, size))
        if not frees:
            raise TraceError(f"the step (entries {lo + 1}..{hi} of {path}) leaves a block of {size} bytes at {addr} "
                             "live that no block of the step before frees: it does not repeat")
        blocks.append(([(start, end), (0, frees.pop(0))], round_up(size)))
    return blocks, sum(live.values())


def peak_live(blocks):
    events = []
    for lifetimes, size in blocks:
        for start, end in lifetimes:
            events += [(start, size), (end, -size)]
    now = peak = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # frees first at equal times
        now += change
        peak = max(peak, now)
    return peak


def overlap(a, b):
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def plan(blocks, order):
    """The arena's size when blocks are placed in `order`, each at the lowest offset free over its
    whole lifetime."""
    def lifetime(b):
        return sum(e - s for s, e in b[0])
    keys = {"size": lambda b: (-b[1], b[0][0][0]),
            "area": lambda b: (-b[1] * lifetime(b), b[0][0][0]),
            "duration": lambda b: (-lifetime(b), -b[1])}
    placed = []
    for lifetimes, size in sorted(blocks, key=keys[order]):
        taken = sorted((o, o + z) for (other, z, o) in placed if overlap(lifetimes, other))
        offset = 0
        for lo, hi in taken:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((lifetimes, size, offset))
    return max((o + z for (_, z, o) in placed), default=0)


def signature(rows, lo, hi):
    """The requests of rows[lo:hi] in order, without addresses: (action, size, stream, which block)
    for each alloc and free_completed, a freed block named by the position of its allocation in the
    step, or as allocated before it."""
    position, out = {}, []
    for r in rows[lo:hi]:
        if r[0] == "alloc":
            position[r[1]] = len(out)
            out.append(("alloc", r[2], r[3], None))
        elif r[0] == "free_completed":
            out.append(("free", r[2], r[3], position.pop(r[1], "before")))
    return out


def repeats(rows, marker, per_step, lo, hi):
    """(n, m): n of the m whole steps before rows[lo:hi] (counted back from it, as many as there
    are markers for) make the same requests in the same order as it, in a row."""
    markers = [i for i, r in enumerate(rows) if len(r) >= 5 and r[0] == "alloc" and r[2] == str(marker)]
    end = markers.index(lo)
    planned = signature(rows, lo, hi)
    earlier = [(markers[j - per_step], markers[j]) for j in range(end, per_step - 1, -per_step)]
    same = 0
    for a, b in earlier:
        if signature(rows, a, b) != planned:
            break
        same += 1
    return same, len(earlier)


def gib(n):
    return f"{n / 2**30:.3f} GiB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="CSV trace (.csv or .csv.gz): action,addr,size,stream,time_us,where")
    ap.add_argument("--marker", type=int, required=True, help="allocation size in bytes that marks steps")
    ap.add_argument("--per-step", type=int, required=True, help="marker allocations in one step")
    ap.add_argument("--order", choices=ORDERS + ("all",), default="all",
                    help="the greedy plan's order (default: all three, and the best)")
    args = ap.parse_args(argv)
    if args.marker <= 0 or args.per_step <= 0:
        ap.error("--marker and --per-step must be positive")
    try:
        _, rows = read_trace(args.trace)
        lo, hi = find_step(rows, args.marker, args.per_step, args.trace)
        blocks, persistent = step_blocks(rows, lo, hi, args.trace)
    except TraceError as e:
        print(f"step_plan.py: {e}", file=sys.stderr)
        return 1
    peak = peak_live(blocks)
    crossing = sum(1 for lifetimes, _ in blocks if len(lifetimes) > 1)
    same, earlier = repeats(rows, args.marker, args.per_step, lo, hi)
    print(f"{args.trace}: step of entries {lo + 1}..{hi}, {len(blocks)} blocks ({crossing} live over its end)")
    print(f"the {earlier} whole step(s) before it: the last {same} in a row make the same requests in the same "
          "order")
    print(f"persistent {gib(persistent)}; the step's blocks peak at {gib(peak)} live "
          f"(whole: {gib(persistent + peak)})")
    orders = ORDERS if args.order == "all" else (args.order,)
    sizes = {o: plan(blocks, o) for o in orders}
    for o in orders:
        whole = persistent + sizes[o]
        ratio = whole / (persistent + peak) if persistent + peak else 1.0
        print(f"  plan by {o:<8} arena {gib(sizes[o])}, whole {gib(whole)}: {ratio:.4f} x the step's peak")
    if len(orders) > 1:
        best = min(orders, key=lambda o: sizes[o])
        whole = persistent + sizes[best]
        ratio = whole / (persistent + peak) if persistent + peak else 1.0
        print(f"best: by {best}, {ratio:.4f} x the step's peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
