#!/usr/bin/env python3
"""scripts/repeat_steps.py: a trace lengthened by repeating its last whole step (ctest repeat_steps)."""
import csv
import gzip
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "repeat_steps.py")
HEADER = ["action", "addr", "size", "stream", "time_us", "where"]


def write(path, rows):
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(rows)


def read(path):
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.reader(f))


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def step(t, logits_addr):
    # One step: a persistent-looking activation freed in the step, and two marker allocations.
    return [["alloc", "100", "4096", "0", str(t), "a"],
            ["alloc", logits_addr, "1000", "0", str(t + 1), "logits"],
            ["free_requested", logits_addr, "1000", "0", str(t + 2), "logits"],
            ["free_completed", logits_addr, "1000", "0", str(t + 2), "logits"],
            ["alloc", "300", "1000", "0", str(t + 3), "logits"],
            ["free_completed", "300", "1000", "0", str(t + 4), "logits"],
            ["free_completed", "100", "4096", "0", str(t + 5), "a"]]


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "t.csv.gz"), os.path.join(d, "long.csv.gz")
        rows = [["alloc", "7", "64", "0", "0", "weights"]] + step(10, "200") + step(20, "200") + step(30, "200")
        write(src, rows)
        r = run(src, out, "--marker", "1000", "--per-step", "2", "--repeat", "3")
        check(r.returncode == 0, f"closed step: exit {r.returncode}: {r.stderr}")
        got = read(out)
        check(got[0] == HEADER, "header kept")
        body = got[1:]
        # The step repeated runs from the 4th-last marker allocation (step 2's first) to the 2nd-last
        # (step 3's first); the output is everything before the latter, then that step 3 more times.
        marks = [i for i, x in enumerate(rows) if x[0] == "alloc" and x[2] == "1000"]
        lo, hi = marks[-4], marks[-2]
        check(len(body) == hi + 3 * (hi - lo), f"row count {len(body)} != {hi + 3 * (hi - lo)}")
        period = int(rows[hi][4]) - int(rows[lo][4])
        check(period == 10, f"period {period}")
        for k in range(1, 4):
            first = body[hi + (k - 1) * (hi - lo)]
            check(first[:4] == rows[lo][:4] and int(first[4]) == int(rows[lo][4]) + k * period,
                  f"repetition {k} starts with the step's first entry, shifted by {k} periods: {first}")
        check(all(int(a[4]) <= int(b[4]) for a, b in zip(body, body[1:])), "times never go back")

        # A step that frees what it did not allocate: refused, nothing written.
        s2 = step(20, "200")
        s2.insert(3, ["free_completed", "7", "64", "0", "22", "w"])  # inside the step repeated
        bad = [["alloc", "7", "64", "0", "0", "w"]] + step(10, "200") + s2 + step(30, "200")
        write(src, bad)
        out2 = os.path.join(d, "bad.csv.gz")
        r = run(src, out2, "--marker", "1000", "--per-step", "2")
        check(r.returncode == 1 and "not closed" in r.stderr and not os.path.exists(out2),
              f"unclosed step refused: exit {r.returncode}: {r.stderr}")
        # Too few markers, a non-trace file, bad arguments.
        write(src, rows)
        r = run(src, out2, "--marker", "1000", "--per-step", "4")
        check(r.returncode == 1 and "need 8" in r.stderr, f"too few markers: {r.returncode} {r.stderr}")
        txt = os.path.join(d, "x.csv")
        with open(txt, "w") as f:
            f.write("a,b\n")
        r = run(txt, out2, "--marker", "1", "--per-step", "1")
        check(r.returncode == 1 and "not a CSV trace" in r.stderr, f"not a trace: {r.returncode} {r.stderr}")
        r = run(src, out2, "--marker", "0", "--per-step", "1")
        check(r.returncode == 2, f"usage error: {r.returncode}")

    for f in failures:
        print("FAILED:", f)
    print(f"test_repeat_steps: {len(failures)} failed" if failures else "test_repeat_steps: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
