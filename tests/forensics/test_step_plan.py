#!/usr/bin/env python3
"""scripts/step_plan.py: the memory a layout repeating every step needs (ctest step_plan)."""
import csv
import gzip
import os
import subprocess
import sys
import tempfile

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
SCRIPT = os.path.join(SCRIPTS, "step_plan.py")
HEADER = ["action", "addr", "size", "stream", "time_us", "where"]
sys.path.insert(0, SCRIPTS)
import step_plan  # noqa: E402


def write(path, rows):
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(rows)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def step(t):
    # Events 0..7 of a step (the marker is M, 1024 bytes):
    #   M [0, 3), A (2048) [2, 5), B (1536) [4, 6), and C (512), allocated at 7 and freed at 1 of the
    #   next step: it lives over the step's end, [7, 8) and [0, 1).
    # Live: M + C = 1536 at 0, M + A = 3072 at 2, A + B = 3584 at 4: the peak.
    return [["alloc", "200", "1024", "0", str(t), "m"],
            ["free_completed", "500", "512", "0", str(t + 1), "c"],
            ["alloc", "300", "2048", "0", str(t + 2), "a"],
            ["free_completed", "200", "1024", "0", str(t + 3), "m"],
            ["alloc", "400", "1536", "0", str(t + 4), "b"],
            ["free_completed", "300", "2048", "0", str(t + 5), "a"],
            ["free_completed", "400", "1536", "0", str(t + 6), "b"],
            ["alloc", "500", "512", "0", str(t + 7), "c"]]


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    rows = ([["alloc", "7", "4096", "0", "0", "weights"], ["alloc", "500", "512", "0", "1", "c"]] +
            step(10) + step(20) + step(30))
    # The step the script takes: from the second-last marker allocation to the last.
    lo, hi = 2 + 8, 2 + 16
    blocks, persistent = step_plan.step_blocks(rows, lo, hi, "t")
    check(persistent == 4096, f"persistent {persistent}: the weights, never freed")
    check(len(blocks) == 4, f"{len(blocks)} blocks")
    by_size = {size: lifetimes for lifetimes, size in blocks}
    check(by_size.get(1024) == [(0, 3)], f"M lives [0, 3): {by_size.get(1024)}")
    check(by_size.get(512) == [(7, 8), (0, 1)], f"C lives over the step's end: {by_size.get(512)}")
    check(step_plan.peak_live(blocks) == 3584, f"peak {step_plan.peak_live(blocks)}")
    # By size: A at 0; B overlaps A: 2048; M overlaps A, not B: 2048; C overlaps M (at 0), not A: 0.
    check(step_plan.plan(blocks, "size") == 3584, f"plan by size {step_plan.plan(blocks, 'size')}")
    # By duration (A 3, M 3, B 2, C 2; ties: larger first): A at 0, M at 2048, B at 2048 (M is gone
    # by 4), C over M at 0 is free of A: 0. The same arena.
    check(step_plan.plan(blocks, "duration") == 3584, f"plan by duration {step_plan.plan(blocks, 'duration')}")
    # The step before the planned one makes the same requests in the same order (its free of C frees
    # a block from before it, as the planned step's does), though addresses are not compared.
    check(step_plan.repeats(rows, 1024, 1, lo, hi) == (1, 1), f"repeats {step_plan.repeats(rows, 1024, 1, lo, hi)}")
    moved = [list(r) for r in rows]
    for r in moved[2:10]:
        r[1] = str(int(r[1]) + 5000) if r[1] != "500" else r[1]
    check(step_plan.repeats(moved, 1024, 1, lo, hi) == (1, 1), "addresses do not count")
    changed = [list(r) for r in rows]
    changed[6][2] = changed[8][2] = "2560"  # the first step's B is larger
    check(step_plan.repeats(changed, 1024, 1, lo, hi) == (0, 1), f"a different step: {step_plan.repeats(changed, 1024, 1, lo, hi)}")
    # Sizes are rounded up to 512 bytes.
    check(step_plan.round_up(1) == 512 and step_plan.round_up(512) == 512 and step_plan.round_up(513) == 1024,
          "rounding to 512 bytes")

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "t.csv.gz")
        write(src, rows)
        r = run(src, "--marker", "1024", "--per-step", "1")
        check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
        check("4 blocks (1 live over its end)" in r.stdout, f"blocks line: {r.stdout}")
        check("the 1 whole step(s) before it: the last 1 in a row" in r.stdout, f"repeats line: {r.stdout}")
        check("best: by " in r.stdout and "1.0000 x the step's peak" in r.stdout, f"best line: {r.stdout}")
        r = run(src, "--marker", "1024", "--per-step", "1", "--order", "area")
        check(r.returncode == 0 and "plan by area" in r.stdout and "best:" not in r.stdout,
              f"one order: {r.returncode} {r.stdout}")
        # A step that is not closed, too few markers, not a trace, bad arguments.
        bad = rows[:lo] + rows[lo:hi - 1] + rows[hi:]  # the step's last allocation (C) is lost
        write(src, bad)
        r = run(src, "--marker", "1024", "--per-step", "1")
        check(r.returncode == 1 and "not closed" in r.stderr, f"unclosed step: {r.returncode} {r.stderr}")
        write(src, rows)
        r = run(src, "--marker", "1024", "--per-step", "3")
        check(r.returncode == 1 and "need 6" in r.stderr, f"too few markers: {r.returncode} {r.stderr}")
        txt = os.path.join(d, "x.csv")
        with open(txt, "w") as f:
            f.write("a,b\n")
        r = run(txt, "--marker", "1", "--per-step", "1")
        check(r.returncode == 1 and "not a CSV trace" in r.stderr, f"not a trace: {r.returncode} {r.stderr}")
        r = run(src, "--marker", "0", "--per-step", "1")
        check(r.returncode == 2, f"usage error: {r.returncode}")
        r = run(src, "--marker", "1024", "--per-step", "1", "--order", "random")
        check(r.returncode == 2, f"unknown order: {r.returncode}")

    for f in failures:
        print("FAILED:", f)
    print(f"test_step_plan: {len(failures)} failed" if failures else "test_step_plan: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
