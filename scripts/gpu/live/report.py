"""What live.py's runs add up to: per (workload, mode), the median and the spread over repetitions
of step time, peaks and their ratio; step time relative to a reference mode measured in the same
repetition; whether the losses or generated tokens match the reference's. Standard library only
(test_live.py tests it on synthetic results).

A run's result (one JSON line in live.jsonl) is a dict with at least:

    workload, mode, rep, status ("ok", "failed", "timeout", "crashed", "not_run"), error,
    step_s (the run's step time: median of its timed steps, or their mean where step_metric is
    "mean"), peak_reserved / peak_requested / peak_allocated (bytes, None without CUDA),
    outputs ({"kind": "loss", "values": [float per step]} or
             {"kind": "tokens", "values": [checksum per generate() call]})

Reference modes: every mode is compared with "native" run in the same repetition (the machine
drifts between repetitions, so ratios are taken within one and then summarized); a mode with a
base of its own (gpumem_trace and gpumem_ops: gpumem; native_history: native) is also compared
with that base, which is how issue 14's overheads are stated.
"""

import statistics

GiB = float(1 << 30)
NATIVE = "native"


def base_mode(mode):
    """The mode an overhead is measured against: gpumem for gpumem_* modes, native for
    native_* modes (e.g. native_history), None for the plain modes."""
    if mode.startswith("gpumem_"):
        return "gpumem"
    if mode.startswith("native_"):
        return NATIVE
    return None


def spread(values):
    """{"median", "min", "max", "n"} of the values that are not None, or None when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def ok_runs(results):
    return [r for r in results if r.get("status") == "ok"]


def index_runs(results):
    """{(workload, mode, rep): result} over the successful runs."""
    return {(r["workload"], r["mode"], r["rep"]): r for r in ok_runs(results)}


def per_rep_ratios(runs, workload, mode, ref, key="step_s"):
    """The ratio run/ref of `key` (a result's field, or a function of the result that gives None
    where it has no value) for every repetition in which both ran and have the value."""
    value = key if callable(key) else (lambda r: r.get(key))
    out = []
    for (w, m, rep), r in sorted(runs.items(), key=lambda kv: kv[0][2]):
        if w != workload or m != mode:
            continue
        base = runs.get((workload, ref, rep))
        if base is None or value(r) is None or not value(base):
            continue
        out.append(value(r) / value(base))
    return out


def per_rep_differences(runs, workload, mode, ref, key):
    """run - ref of `key` for every repetition in which both ran and have the value (CPU seconds
    per step: what a mode adds is a difference, not a ratio)."""
    out = []
    for (w, m, rep), r in sorted(runs.items(), key=lambda kv: kv[0][2]):
        if w != workload or m != mode:
            continue
        base = runs.get((workload, ref, rep))
        if base is None or r.get(key) is None or base.get(key) is None:
            continue
        out.append(r[key] - base[key])
    return out


def compare_outputs(run, ref):
    """How one run's outputs compare with a reference run's (same workload, same seeds):
    {"kind", "compared", "equal", "first_equal", "max_abs_diff"} (max_abs_diff for losses only),
    or None when either has none or they are of different kinds."""
    a, b = (run or {}).get("outputs"), (ref or {}).get("outputs")
    if not a or not b or a.get("kind") != b.get("kind"):
        return None
    va, vb = a.get("values") or [], b.get("values") or []
    n = min(len(va), len(vb))
    if n == 0:
        return None
    equal = sum(1 for x, y in zip(va[:n], vb[:n]) if x == y)
    out = {"kind": a["kind"], "compared": n, "equal": equal, "first_equal": va[0] == vb[0],
           "max_abs_diff": None}
    if a["kind"] == "loss":
        diffs = [abs(x - y) for x, y in zip(va[:n], vb[:n]) if x is not None and y is not None]
        out["max_abs_diff"] = max(diffs) if diffs else None
    return out


def outputs_summary(runs, workload, mode, ref):
    """Over the repetitions where both ran: how many compared, in how many the first step matched,
    in how many every step matched, and the largest loss difference. For ref == mode (the
    reference itself) each repetition is compared with the reference's first repetition, which
    shows PyTorch's own run-to-run differences."""
    reps = sorted(rep for (w, m, rep) in runs if w == workload and m == mode)
    comps = []
    for rep in reps:
        if mode == ref:
            first = reps[0]
            if rep == first:
                continue
            other = runs.get((workload, ref, first))
        else:
            other = runs.get((workload, ref, rep))
        c = compare_outputs(runs[(workload, mode, rep)], other)
        if c is not None:
            comps.append(c)
    if not comps:
        return None
    diffs = [c["max_abs_diff"] for c in comps if c["max_abs_diff"] is not None]
    return {"kind": comps[0]["kind"], "reps": len(comps),
            "first_equal": sum(1 for c in comps if c["first_equal"]),
            "all_equal": sum(1 for c in comps if c["equal"] == c["compared"]),
            "steps": comps[0]["compared"],
            "max_abs_diff": max(diffs) if diffs else None}


def calls_by_kind(runs):
    """Per call kind ("driver.map", "wait.sync_stream", ...), over the runs that carry calls_timed:
    the spread of calls per timed step and of ms per timed step, and the longest call of any run
    (ms). None when no run carries them."""
    have = [r for r in runs if r.get("calls_timed") and r.get("steps") is not None]
    if not have:
        return None
    out = {}
    for kind in have[0]["calls_timed"]:
        per_run = []
        for r in have:
            n = r["steps"] - r.get("warmup", 0)
            c = r["calls_timed"].get(kind)
            if c is not None and n > 0:
                per_run.append((c["calls"] / n, c["ns"] / 1e6 / n, c["max_ns_run"] / 1e6))
        if per_run:
            out[kind] = {"calls_per_step": spread([x[0] for x in per_run]),
                         "ms_per_step": spread([x[1] for x in per_run]),
                         "max_ms": max(x[2] for x in per_run)}
    return out


def summarize(results, order):
    """One row per (workload, mode) in `order` (a list of (workload, [modes])): counts by status,
    spreads of step time and peaks, ratios to native and to the mode's base, outputs compared."""
    runs = index_runs(results)
    rows = []
    for workload, modes in order:
        for mode in modes:
            mine = [r for r in results if r["workload"] == workload and r["mode"] == mode]
            good = [r for r in mine if r.get("status") == "ok"]
            base = base_mode(mode)
            row = {
                "workload": workload, "mode": mode, "base": base,
                "runs": len(mine), "ok": len(good),
                "not_run": sum(1 for r in mine if r.get("status") == "not_run"),
                "failed": sum(1 for r in mine if r.get("status") not in ("ok", "not_run")),
                "errors": sorted({r.get("error") or r.get("status") for r in mine
                                  if r.get("status") not in ("ok", "not_run")}),
                "step_metric": good[0].get("step_metric", "median") if good else None,
                "step_s": spread([r.get("step_s") for r in good]),
                "vs_native": spread(per_rep_ratios(runs, workload, mode, NATIVE)),
                "vs_base": spread(per_rep_ratios(runs, workload, mode, base)) if base else None,
                "cpu_s": spread([r.get("cpu_s") for r in good]),
                "thread_cpu_s": spread([r.get("thread_cpu_s") for r in good]),
                "cpu_vs_base_s": spread(per_rep_differences(runs, workload, mode, base, "cpu_s")) if base else None,
                "thread_cpu_vs_base_s": (spread(per_rep_differences(runs, workload, mode, base, "thread_cpu_s"))
                                         if base else None),
                "allocs_per_step": spread([r.get("allocs_per_step") for r in good]),
                # gpumem modes: driver calls, stream waits and event calls per timed step (means
                # over a run's timed steps; their spread over repetitions), and their share of the
                # run's summed step time.
                "driver_s": spread([r.get("driver_s") for r in good]),
                "wait_s": spread([r.get("wait_s") for r in good]),
                "event_s": spread([r.get("event_s") for r in good]),
                "driver_calls_per_step": spread([r.get("driver_calls_per_step") for r in good]),
                "wait_calls_per_step": spread([r.get("wait_calls_per_step") for r in good]),
                "event_calls_per_step": spread([r.get("event_calls_per_step") for r in good]),
                "driver_share": spread([r.get("driver_share") for r in good]),
                "wait_share": spread([r.get("wait_share") for r in good]),
                "calls_timed": calls_by_kind(good),
                "driver_timed": (all((r.get("calls_timed_by") or {}).get("driver") for r in good)
                                 if any(r.get("calls_timed_by") for r in good) else None),
                "peak_reserved": spread([r.get("peak_reserved") for r in good]),
                "peak_requested": spread([r.get("peak_requested") for r in good]),
                "peak_allocated": spread([r.get("peak_allocated") for r in good]),
                "reserved_over_requested": spread([
                    r["peak_reserved"] / r["peak_requested"] for r in good
                    if r.get("peak_reserved") is not None and r.get("peak_requested")]),
                "outputs_vs_native": outputs_summary(runs, workload, mode, NATIVE),
            }
            rows.append(row)
    return rows


# ---- text --------------------------------------------------------------------------------------

def fmt_spread(s, scale=1.0, digits=3, unit=""):
    """'m' when min == max, else 'm (lo..hi)'; '-' for None."""
    if s is None:
        return "-"
    f = "%%.%df" % digits
    m = f % (s["median"] * scale)
    lo, hi = f % (s["min"] * scale), f % (s["max"] * scale)
    if lo == hi:
        return m + unit
    return "%s%s (%s..%s)" % (m, unit, lo, hi)


def fmt_outputs(o, is_ref):
    if o is None:
        return "-"
    what = "loss" if o["kind"] == "loss" else "tokens"
    if is_ref:
        head = "%s vs own rep 1: " % what
    else:
        head = "%s vs native: " % what
    text = head + "first step equal %d/%d, all %d steps equal %d/%d" % (
        o["first_equal"], o["reps"], o["steps"], o["all_equal"], o["reps"])
    if o["kind"] == "loss" and o["max_abs_diff"]:
        text += ", max |diff| %.3g" % o["max_abs_diff"]
    return text


def format_table(rows):
    head = ("workload", "mode", "ok", "step ms", "vs native", "vs base", "CPU ms/step", "CPU vs base ms",
            "driver ms/step", "wait ms/step", "peak reserved GiB", "peak requested GiB", "reserved/requested",
            "outputs")
    lines = []
    for r in rows:
        ok = "%d/%d" % (r["ok"], r["runs"])
        step = fmt_spread(r["step_s"], 1000.0, 1)
        if r["step_s"] and r["step_metric"] == "mean":
            step += " mean"
        vs_native = "1 (ref)" if r["mode"] == NATIVE and r["ok"] else fmt_spread(r["vs_native"], digits=3)
        vs_base = "-" if not r["base"] else "%s: %s" % (r["base"], fmt_spread(r["vs_base"], digits=3))
        cpu = fmt_spread(r.get("cpu_s"), 1000.0, 1)
        cpu_vs = "-" if not r["base"] else "%s: %s" % (r["base"], fmt_spread(r.get("cpu_vs_base_s"), 1000.0, 2))
        lines.append((r["workload"], r["mode"], ok, step, vs_native, vs_base, cpu, cpu_vs,
                      fmt_spread(r.get("driver_s"), 1000.0, 2) if r.get("driver_timed") is not False else "not timed",
                      fmt_spread(r.get("wait_s"), 1000.0, 2),
                      fmt_spread(r["peak_reserved"], 1 / GiB, 3),
                      fmt_spread(r["peak_requested"], 1 / GiB, 3),
                      fmt_spread(r["reserved_over_requested"], digits=4),
                      fmt_outputs(r["outputs_vs_native"], r["mode"] == NATIVE)))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)] if lines else [len(h) for h in head]
    out = []
    for i, line in enumerate([head] + lines):
        out.append("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def aligned(head, lines):
    """A table's lines: the head, a rule, then the rows, each column as wide as its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head] + lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def all_steps_s(run):
    """The summed time of all of a run's steps, warm-up included (None when it kept none)."""
    return sum(run["step_s_all"]) if run.get("step_s_all") else None


def pct(s):
    return "-" if s is None else fmt_spread(s, 100.0, 2, "%")


def driver_table(rows):
    """The gpumem modes' driver calls and stream waits per timed step (means over a run's timed
    steps; median and min..max over repetitions): totals with their share of the step time, then
    each call kind's calls and ms per step and its longest call. Empty when no row has them."""
    have = [r for r in rows if r.get("driver_s") or r.get("wait_s")]
    if not have:
        return ""
    head = ("workload", "mode", "step ms", "driver ms/step", "driver share", "driver calls/step",
            "wait ms/step", "wait share", "waits/step", "event ms/step", "events/step")
    lines = []
    for r in have:
        step = fmt_spread(r["step_s"], 1000.0, 1)
        driver = fmt_spread(r["driver_s"], 1000.0, 3) if r.get("driver_timed") is not False else "not timed"
        lines.append((r["workload"], r["mode"], step, driver, pct(r.get("driver_share")),
                      fmt_spread(r.get("driver_calls_per_step"), digits=1),
                      fmt_spread(r.get("wait_s"), 1000.0, 3), pct(r.get("wait_share")),
                      fmt_spread(r.get("wait_calls_per_step"), digits=1),
                      fmt_spread(r.get("event_s"), 1000.0, 3),
                      fmt_spread(r.get("event_calls_per_step"), digits=1)))
    out = aligned(head, lines)
    kinds = []
    for r in have:
        for kind, c in sorted((r.get("calls_timed") or {}).items()):
            if c["calls_per_step"]["max"] == 0:
                continue
            kinds.append("  %-18s %-14s %-17s %s calls/step, %s ms/step, longest call %.3f ms" % (
                r["workload"], r["mode"], kind, fmt_spread(c["calls_per_step"], digits=2),
                fmt_spread(c["ms_per_step"], digits=3), c["max_ms"]))
    if kinds:
        out += ["", "by call (timed steps; kinds not listed made no call):"] + kinds
    return "\n".join(out)


def whole_run_table(results, order=None):
    """Every step of each run, warm-up included, where the timed-step tables leave the warm-up out:
    per (workload, mode), median and min..max over repetitions of the first step's time, of the
    summed time of all steps, and of that sum against native's in the same repetition; for the
    gpumem modes also the driver time of the first step, of the later steps, and of all steps as a
    share of the summed step time. The first step builds the footprint (and a gpumem step that
    reaches a new high, or takes the step planner's arena, makes calls later): this is what a run
    pays once, which the timed steps' medians do not show. Empty when no run kept its step times."""
    runs = index_runs(results)
    keys = []
    for (w, m, _rep), r in sorted(runs.items(), key=lambda kv: kv[0][2]):
        if r.get("step_s_all") and (w, m) not in keys:
            keys.append((w, m))
    if order:  # summarize's: (workload, [modes]) pairs
        rank = {(w, m): i for i, (w, m) in enumerate((w, m) for w, modes in order for m in modes)}
        keys.sort(key=lambda k: rank.get(k, len(rank)))
    if not keys:
        return ""
    head = ("workload", "mode", "runs", "first step s", "all steps s", "all steps vs native",
            "driver ms: first step", "later steps", "share of all steps")
    lines = []
    for w, m in keys:
        rs = [r for (ww, mm, _rep), r in runs.items() if ww == w and mm == m and r.get("step_s_all")]
        ratios = per_rep_ratios(runs, w, m, NATIVE, all_steps_s)
        drv = [r for r in rs if r.get("driver_ns_all")]
        first_ms = spread([r["driver_ns_all"][0] / 1e6 for r in drv])
        later_ms = spread([sum(r["driver_ns_all"][1:]) / 1e6 for r in drv])
        share = spread([sum(r["driver_ns_all"]) / 1e9 / all_steps_s(r) for r in drv if all_steps_s(r) > 0])
        lines.append((w, m, str(len(rs)), fmt_spread(spread([r["step_s_all"][0] for r in rs])),
                      fmt_spread(spread([all_steps_s(r) for r in rs])),
                      "-" if m == NATIVE else fmt_spread(spread(ratios)),
                      fmt_spread(first_ms, digits=1), fmt_spread(later_ms, digits=1), pct(share)))
    return "\n".join(aligned(head, lines))


def verdict(s, limit):
    """Whether a spread of ratios meets a target ratio <= limit (e.g. 1.01: at most 1% slower) by
    its median, said to be inconclusive when the repetitions straddle the limit."""
    text = "target <= %g: %s" % (limit, "met" if s["median"] <= limit else "MISSED")
    if s["min"] <= limit < s["max"]:
        text += " by the median; the repetitions straddle it (inconclusive at this spread)"
    return text


# The modes whose overhead over their base issue 14 states (trace recording, op attribution, and
# PyTorch's own history beside them). Other modes with a base (a --mode-conf variant of gpumem,
# e.g. gpumem_fp0) are compared with it too, without an issue's label or target.
ISSUE_14_MODES = ("gpumem_trace", "gpumem_ops", "native_history")


def targets(rows):
    """The issues' targets, with the numbers they rest on: issue 12 (gpumem's peak reserved below
    expandable_segments'), issue 13 (gpumem's step time within 1% of native), issue 14 (trace
    recording and op attribution within 3% of plain gpumem; PyTorch's history beside them). Other
    modes with a base get the same comparison, unlabelled."""
    by = {(r["workload"], r["mode"]): r for r in rows}
    out = []
    for r in rows:
        w, m = r["workload"], r["mode"]
        if m == "gpumem":
            exp = by.get((w, "expandable"))
            if exp and exp["peak_reserved"] and r["peak_reserved"]:
                g, e = r["peak_reserved"]["median"], exp["peak_reserved"]["median"]
                out.append("issue 12  %-18s gpumem peak reserved %.3f GiB vs expandable %.3f GiB: %s (%+.3f GiB)"
                           % (w, g / GiB, e / GiB, "below" if g < e else "NOT below", (g - e) / GiB))
            if r["vs_native"]:
                v = r["vs_native"]
                out.append("issue 13  %-18s gpumem step / native %s over %d reps: %s"
                           % (w, fmt_spread(v, digits=3), v["n"], verdict(v, 1.01)))
        elif r["base"] and r["vs_base"]:
            v = r["vs_base"]
            issue_14 = m in ISSUE_14_MODES
            text = "%-8s  %-18s %s step / %s %s over %d reps" % (
                "issue 14" if issue_14 else "", w, m, r["base"], fmt_spread(v, digits=3), v["n"])
            if issue_14 and r["base"] == "gpumem":
                text += ": " + verdict(v, 1.03)
            out.append(text)
            c, b = r.get("cpu_vs_base_s"), by.get((w, r["base"]))
            if c and b and b.get("step_s") and b.get("cpu_s"):
                out.append("          %-18s %s CPU per step %+.2f ms over %s (%s ms; %.1f%% of %s's step time, "
                           "%.1f%% of its CPU; calling thread %s ms)" % (
                               w, m, c["median"] * 1000, r["base"], fmt_spread(c, 1000.0, 2),
                               100.0 * c["median"] / b["step_s"]["median"], r["base"],
                               100.0 * c["median"] / b["cpu_s"]["median"],
                               fmt_spread(r.get("thread_cpu_vs_base_s"), 1000.0, 2)))
    return out


def launch_to_ready(r):
    """Seconds from launching a run to its child being ready to build (CUDA started, settings
    checked): the child's own ready_s plus what the launch took before the child's clock started
    (launch_to_result_s minus the child's own time). None when the run did not report them."""
    t, p = r.get("timing") or {}, r.get("phases") or {}
    if None in (t.get("launch_to_result_s"), p.get("child_s"), p.get("ready_s")):
        return None
    return t["launch_to_result_s"] - p["child_s"] + p["ready_s"]


def phase_table(results):
    """Where the wall time went, per workload, over the runs that were started (seconds, means per
    run): launch -> CUDA ready in the child (process start, gpumem load, CUDA start, settings
    probe), model build, steps, result -> process gone; and the whole run, and their sum."""
    by = {}
    for r in results:
        if r.get("status") != "not_run":
            by.setdefault(r["workload"], []).append(r)
    head = ("workload", "runs", "ready s", "build s", "steps s", "exit s", "run s", "sum s")
    lines = []
    for w, rs in by.items():
        def mean(src, key):
            vals = [(r.get(src) or {}).get(key) for r in rs]
            vals = [v for v in vals if v is not None]
            return "%.1f" % statistics.fmean(vals) if vals else "-"
        ready = [launch_to_ready(r) for r in rs]
        ready = [v for v in ready if v is not None]
        total = sum((r.get("timing") or {}).get("wall_s") or 0 for r in rs)
        lines.append((w, str(len(rs)), "%.1f" % statistics.fmean(ready) if ready else "-",
                      mean("phases", "build_s"), mean("phases", "steps_s"), mean("timing", "exit_s"),
                      mean("timing", "wall_s"), "%.0f" % total))
    return "\n".join(aligned(head, lines))


def problems(results):
    """One line per run that did not finish ok, and the runs the deadline left out."""
    out = []
    for r in results:
        st = r.get("status")
        if st == "ok":
            continue
        out.append("%-9s rep %d %s/%s: %s" % (st.upper().replace("_", " "), r["rep"] + 1, r["workload"],
                                             r["mode"], r.get("error") or ""))
    return out
