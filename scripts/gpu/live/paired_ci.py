#!/usr/bin/env python3
"""How large a step-time difference live.py's repetitions can see: per (workload, mode), the
ratio of its step time to a reference mode's in the same repetition, summarized over repetitions
as a geometric mean with a 95% confidence interval. Standard library only.

    paired_ci.py LIVE.jsonl [LIVE.jsonl ...] [--ref native] [--key step_s] [--target 1.01]

Why: the GPU host drifts by ~15% between processes, so "median over 3 repetitions" cannot tell a
1% difference from none. The interval says what the data can tell. If it lies inside the target,
the target is shown; if it contains 1.0 but reaches past the target, the runs cannot tell (more
repetitions are needed, about (half-width / wanted half-width)^2 times as many); if it lies
wholly above the target, the mode is slower than the target allows.

Each repetition of live.py runs every mode once, in a rotated order, in fresh processes; a ratio is
taken within one repetition (the same minutes of the host), never across. Several files (several
GPU calls) may be given: a repetition is identified by (file, rep), so ratios still pair only runs
of one call. The interval is Student's t on the logarithms of the per-repetition ratios (the
repetitions are the independent samples; the steps of one run are not, as they share its
process and its minutes of the host); with n < 3 repetitions none is given.
"""

import argparse
import json
import math
import statistics
import sys

def load_runs(paths):
    """{(workload, mode, (file_index, rep)): run} of the runs whose status is ok."""
    runs = {}
    for i, path in enumerate(paths):
        try:
            with open(path) as f:
                lines = f.readlines()
        except OSError as e:
            raise SystemExit(f"paired_ci.py: cannot read {path}: {e.strerror} "
                             "(give the live.jsonl that scripts/gpu/live.sh wrote under $OUT)")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"paired_ci.py: {path}:{n}: not a JSON line ({e.msg}); "
                                 "the file must be live.py's live.jsonl, one run per line")
            if not isinstance(r, dict) or "workload" not in r or "mode" not in r or "rep" not in r:
                raise SystemExit(f"paired_ci.py: {path}:{n}: a run needs workload, mode and rep; "
                                 "the file must be live.py's live.jsonl")
            if r.get("status", "ok") != "ok":
                continue
            runs[(r["workload"], r["mode"], (i, r["rep"]))] = r
    return runs


def paired_ratios(runs, workload, mode, ref, key):
    """The ratio mode/ref of `key` in every repetition where both ran with a positive value."""
    out = []
    for (w, m, rep), r in sorted(runs.items(), key=lambda kv: kv[0][2]):
        if w != workload or m != mode:
            continue
        base = runs.get((workload, ref, rep))
        if base is None:
            continue
        a, b = r.get(key), base.get(key)
        if a is None or b is None or a <= 0 or b <= 0:
            continue
        out.append(a / b)
    return out


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


# Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (beyond 30: 2.042 down
# to the normal's 1.960, approximated by 1.96 + 2.4 / df).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df):
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df


def confidence_interval(ratios):
    """(low, high): the 95% interval of the geometric mean ratio, from Student's t on the
    logarithms of the per-repetition ratios, or None with fewer than 3 ratios (an interval from
    1 or 2 repetitions means nothing)."""
    n = len(ratios)
    if n < 3:
        return None
    logs = [math.log(v) for v in ratios]
    mean = sum(logs) / n
    sd = statistics.stdev(logs)
    half = t975(n - 1) * sd / math.sqrt(n)
    return math.exp(mean - half), math.exp(mean + half)


def verdict(ci, target):
    """What the interval says about "ratio <= target" (a slowdown of at most target - 1)."""
    if ci is None:
        return "fewer than 3 repetitions: no interval"
    lo, hi = ci
    if hi <= target:
        return f"within {target:g}: shown"
    if lo > target:
        return f"over {target:g}: slower than the target allows"
    if lo <= 1.0 <= hi:
        want = target - 1.0
        half = (hi - lo) / 2
        more = (half / want) ** 2 if want > 0 else float("inf")
        return (f"cannot tell: no difference is seen, but the interval reaches {hi:.3f} "
                f"(~{more:.0f}x the repetitions to resolve {target:g})")
    return f"cannot tell: the interval straddles {target:g}"


def summarize(runs, ref, key, target):
    rows = []
    pairs = sorted({(w, m) for (w, m, _) in runs})
    for w, m in pairs:
        if m == ref:
            continue
        ratios = paired_ratios(runs, w, m, ref, key)
        if not ratios:
            continue
        ci = confidence_interval(ratios)
        rows.append({
            "workload": w, "mode": m, "n": len(ratios), "geomean": geomean(ratios),
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "ci": ci, "verdict": verdict(ci, target),
        })
    return rows


def format_rows(rows, ref, key, target):
    lines = [f"{key} relative to {ref} in the same repetition; geometric mean and 95% interval "
             f"(Student's t on log ratios) over repetitions; target <= {target:g}",
             f"{'workload':<20} {'mode':<16} {'n':>3}  {'geomean':>8}  {'95% interval':<15}  "
             f"{'median (min..max)':<24}  verdict"]
    for r in rows:
        ci = f"{r['ci'][0]:.3f}..{r['ci'][1]:.3f}" if r["ci"] else "-"
        spread = f"{r['median']:.3f} ({r['min']:.3f}..{r['max']:.3f})"
        lines.append(f"{r['workload']:<20} {r['mode']:<16} {r['n']:>3}  {r['geomean']:>8.3f}  "
                     f"{ci:<15}  {spread:<24}  {r['verdict']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="LIVE.jsonl", help="live.py's live.jsonl (one or more)")
    p.add_argument("--ref", default="native", help="the reference mode (default native)")
    p.add_argument("--key", default="step_s",
                   help="the per-run value compared (default step_s; e.g. cpu_s for CPU per step)")
    p.add_argument("--target", type=float, default=1.01,
                   help="the ratio the target allows (default 1.01: within 1%%)")
    a = p.parse_args(argv)
    if not a.target > 0 or math.isinf(a.target) or math.isnan(a.target):
        p.error(f"--target {a.target} must be a positive ratio, e.g. 1.01 for 'within 1%'")
    runs = load_runs(a.files)
    if not any(m == a.ref for (_, m, _) in runs):
        modes = sorted({m for (_, m, _) in runs})
        raise SystemExit(f"paired_ci.py: no run of the reference mode '{a.ref}' in the files "
                         f"(modes there: {', '.join(modes) or 'none'}); pass --ref MODE")
    rows = summarize(runs, a.ref, a.key, a.target)
    if not rows:
        raise SystemExit(f"paired_ci.py: no repetition has both '{a.ref}' and another mode with "
                         f"'{a.key}'; nothing to compare")
    print(format_rows(rows, a.ref, a.key, a.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
