#!/usr/bin/env python3
"""Tests of scripts/gpu/forensics_cost.py on the CPU: its statistics on known inputs, and (with
--lib and torch) a short paired run on gpumem's CPU allocator with op attribution switched at
run time through torch.ops.gpumem.record_ops.

    test_forensics_cost.py [--lib PATH/libgpumem_torch.so]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import forensics_cost as fc  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: %s" % what)


def near(a, b, tol=1e-9):
    return abs(a - b) <= tol


def test_median_ci():
    # n = 10: x_(2)..x_(9), coverage 1 - 2 P(B(10, 1/2) <= 1) = 1 - 2 * 11/1024
    low, high, cov = fc.median_ci(list(range(1, 11)))
    check((low, high) == (2, 9), "median_ci(1..10) is 2..9, got %s..%s" % (low, high))
    check(near(cov, 1 - 22 / 1024), "coverage for n=10 is 1-22/1024, got %r" % cov)
    # n = 20: j = 6 (P(B <= 5) = 0.0207), coverage 0.9586
    low, high, cov = fc.median_ci([float(i) for i in range(20, 0, -1)])
    check((low, high) == (6.0, 15.0), "median_ci(20 values) is x_(6)..x_(15), got %s..%s" % (low, high))
    check(0.95 <= cov < 0.96, "coverage for n=20 is about 0.9586, got %r" % cov)
    # Too few values for 95%: min..max with their coverage (n = 4: 1 - 2/16)
    low, high, cov = fc.median_ci([3, 1, 2, 4])
    check((low, high) == (1, 4) and near(cov, 0.875), "n=4 gives min..max at 87.5%%, got %s..%s %r"
          % (low, high, cov))
    try:
        fc.median_ci([])
        check(False, "median_ci([]) raises")
    except ValueError:
        pass


def test_pairs_and_stats():
    blocks = []
    for c in range(6):
        blocks.append({"cycle": c, "arm": "off", "step_s": [9.0, 0.100, 0.100, 0.100]})
        blocks.append({"cycle": c, "arm": "trace", "step_s": [9.0, 0.101, 0.101, 0.101]})
    blocks.append({"cycle": 6, "arm": "trace", "step_s": [0.2, 0.2]})  # no off block: left out
    pairs = fc.cycle_pairs(blocks, "trace", skip_first=True)
    check(len(pairs) == 6, "a cycle without an off block is left out (6 pairs), got %d" % len(pairs))
    check(near(pairs[0][0], 0.303) and near(pairs[0][1], 0.300), "skip_first leaves the 9 s step out: %r"
          % (pairs[0],))
    s = fc.arm_stats(pairs, 3)
    check(near(s["ratio_median"], 1.01) and near(s["ratio_geomean"], 1.01), "ratio 1.01: %r" % s)
    check(near(s["delta_ms_per_step_median"], 1.0), "1 ms per step added: %r" % s["delta_ms_per_step_median"])
    check(near(s["off_step_ms_median"], 100.0), "off step 100 ms: %r" % s["off_step_ms_median"])
    check(fc.verdict(s).startswith("within 3%"), "1.01 everywhere is within 3%%: %s" % fc.verdict(s))
    # not_first: cycle 0 always counts; later cycles only when neither block of the pair ran first.
    rot = [{"cycle": 0, "arm": "off", "step_s": [1, 1]}, {"cycle": 0, "arm": "trace", "step_s": [1, 2]},
           {"cycle": 1, "arm": "trace", "step_s": [1, 9]}, {"cycle": 1, "arm": "off", "step_s": [1, 1]},
           {"cycle": 2, "arm": "ops", "step_s": [1, 9]}, {"cycle": 2, "arm": "off", "step_s": [1, 1]},
           {"cycle": 2, "arm": "trace", "step_s": [1, 3]}]
    check(fc.cycle_pairs(rot, "trace", True, not_first=True) == [(2, 1), (3, 1)],
          "not_first keeps cycle 0 and cycle 2: %r" % fc.cycle_pairs(rot, "trace", True, not_first=True))
    restated = fc.restate({"arms": ["off", "trace"], "block_steps": 2, "skip_first": 1, "blocks": rot}, True)
    check(restated["stats"]["trace"]["cycles"] == 2, "restate recomputes from the kept pairs: %r" % restated["stats"])
    with_first = fc.cycle_pairs(blocks, "trace", skip_first=False)
    check(near(with_first[0][0], 9.303), "without skip_first every step counts: %r" % (with_first[0],))
    over = {"ratio_ci_low": 1.05, "ratio_ci_high": 1.09, "ci_coverage": 0.96}
    check(fc.verdict(over).startswith("OVER 3%"), "1.05..1.09 is over 3%%: %s" % fc.verdict(over))
    mixed = {"ratio_ci_low": 0.99, "ratio_ci_high": 1.05, "ci_coverage": 0.96}
    check(fc.verdict(mixed).startswith("not settled"), "0.99..1.05 is not settled: %s" % fc.verdict(mixed))
    few = {"ratio_ci_low": 1.0, "ratio_ci_high": 1.0, "ci_coverage": 0.5}
    check(fc.verdict(few).startswith("not settled: too few"), "a 50%% interval settles nothing: %s" % fc.verdict(few))


def test_micro_stats():
    rounds = []
    for p in range(6):
        rounds.append({"kind": "k", "on": False, "ns_per_op": 1000.0 + p})
        rounds.append({"kind": "k", "on": True, "ns_per_op": 1200.0 + p})
    m = fc.micro_stats(rounds)["k"]
    check(near(m["added_ns_median"], 200.0) and m["rounds"] == 6, "paired +200 ns per op: %r" % m)
    check(near(m["off_ns"], 1002.5) and near(m["on_ns"], 1202.5), "medians of off / on: %r" % m)


def test_arguments():
    for argv, what in ((["--allocator", "gpumem"], "--lib"), (["--allocator", "native", "--block-steps", "1"],
                                                             "no timed step")):
        proc = subprocess.run([sys.executable, os.path.join(HERE, "forensics_cost.py")] + argv,
                              capture_output=True, text=True)
        check(proc.returncode == 2 and what in proc.stderr, "%s is refused naming %r: rc %d, %s"
              % (argv, what, proc.returncode, proc.stderr.strip()[-200:]))


def test_cpu_run(lib):
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIPPED: the paired CPU run (no torch in %s)" % sys.executable)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gpumem.json")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "forensics_cost.py"), "--allocator", "gpumem",
                               "--lib", lib, "--device", "cpu", "--workload", "mlp", "--budget-s", "240", "--max-cycles", "4",
                               "--micro", "--micro-ops", "2000", "--micro-pairs", "4", "--micro-s", "3",
                               "--threads", "1", "--out", out], capture_output=True, text=True, env=env,
                              timeout=300)
        check(proc.returncode == 0, "the CPU run exits 0: rc %d\n%s" % (proc.returncode, proc.stderr[-2000:]))
        if proc.returncode != 0:
            return
        with open(out) as f:
            res = json.load(f)
        check(res["arms"] == ["off", "ops"], "CPU arms are off/ops: %r" % res["arms"])
        # Cycles are bounded by --max-cycles here, not by the clock (a loaded machine keeps it exact).
        check(res["cycles"] == 4, "4 cycles: %r" % res["cycles"])
        s = res["stats"].get("ops")
        check(s is not None and s["cycles"] == res["cycles"], "ops paired in every cycle: %r" % s)
        if s:
            check(s["ratio_ci_low"] <= s["ratio_median"] <= s["ratio_ci_high"] and math.isfinite(s["ratio_geomean"]),
                  "the median lies in its interval: %r" % s)
        check("cpu x.add_(y)" in res.get("micro", {}), "the micro benchmark ran: %r" % res.get("micro"))
        orders = {}
        for b in res["blocks"]:
            orders.setdefault(b["cycle"], []).append(b["arm"])
        check(orders.get(0) == ["off", "ops"] and orders.get(1) == ["ops", "off"], "the order rotates: %r"
              % [orders.get(0), orders.get(1)])
        shapes = {}
        for b in res["blocks"]:
            shapes.setdefault(b["cycle"], []).append(b["shapes"])
        check(all(len(v) == 2 and v[0] == v[1] for v in shapes.values()),
              "every arm of a cycle runs the same shapes: %r" % shapes)
        pool = res["shape_pool"].get("8..64", [])
        check(len(pool) == 6 and all(b["batch"] in pool for v in shapes.values() for blk in v for b in blk),
              "the shapes come from the pool of 6: %r" % res["shape_pool"])
        check("ops " in proc.stdout and "verdict" in proc.stdout, "the table prints: %s" % proc.stdout[-500:])
        summ = subprocess.run([sys.executable, os.path.join(HERE, "forensics_cost.py"), "--summarize", out],
                              capture_output=True, text=True)
        check(summ.returncode == 0 and "gpumem process" in summ.stdout, "--summarize prints the table: %s"
              % (summ.stdout + summ.stderr)[-500:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    args = ap.parse_args()
    test_median_ci()
    test_pairs_and_stats()
    test_micro_stats()
    test_arguments()
    if args.lib:
        test_cpu_run(args.lib)
    else:
        print("SKIPPED: the paired CPU run (no --lib libgpumem_torch.so)")
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
