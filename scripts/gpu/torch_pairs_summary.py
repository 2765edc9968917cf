#!/usr/bin/env python3
"""Issue 13's rows through libtorch over several processes: reads the logs of torch_alloc_pairs runs
(each a fresh process; scripts/gpu/torch_pairs_reps.sh makes them) and prints, per pattern, the
median over the processes of native's and gpumem's ns per pair and of each process's speed-up, with
the smallest and largest in brackets, and whether the median meets the issue's targets: >= 3x
native with one thread and with T threads, and under 1 us per pair per thread with T threads.

One torch_alloc_pairs process alternates native and gpumem round by round, so its speed-up compares
the two under the same conditions; the host's speed differs between processes by 30-60%
(docs/notes/fast-path.md, "Measured on the H200"), which moves both columns of one process together
but the ns per pair of different processes apart. So the speed-up is taken per process first, and
its median over the processes is the number the targets are read from.

    torch_pairs_summary.py LOG [LOG...] [--json FILE]

Standard library only. A log without the table (a run that failed, a --sim run, which has no
native column) is an error that names the file.
"""

import argparse
import json
import re
import statistics
import sys

HEADER = re.compile(r"^torch_alloc_pairs: native vs gpumem, (\d+) pairs \(1 thread\), (\d+) pairs per thread "
                    r"\((\d+) threads?\), median of (\d+) rounds?$")
ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<n1>\d+(?:\.\d+)?)\s+(?P<g1>\d+(?:\.\d+)?)\s+\d+(?:\.\d+)?x"
                 r"\s+(?P<nt>\d+(?:\.\d+)?)\s+(?P<gt>\d+(?:\.\d+)?)\s+\d+(?:\.\d+)?x"
                 r"\s+(?P<c1>\d+) / (?P<ct>\d+)\s+(?P<d1>\d+(?:\.\d+)?)$")

SPEEDUP_TARGET = 3.0      # >= 3x native, 1 thread and T threads
THREAD_NS_TARGET = 1000.0  # < 1 us per pair per thread with T threads


class LogError(Exception):
    pass


def parse(path, text):
    """One run's table: (threads, {pattern: {n1, g1, nt, gt, c1, ct, d1}}) in the table's order."""
    threads = None
    rows = {}
    for line in text.splitlines():
        line = line.rstrip()
        m = HEADER.match(line)
        if m:
            threads = int(m.group(3))
            continue
        if threads is None:
            continue
        m = ROW.match(line)
        if m:
            r = {k: float(m.group(k)) for k in ("n1", "g1", "nt", "gt", "d1")}
            r["c1"], r["ct"] = int(m.group("c1")), int(m.group("ct"))
            if r["g1"] <= 0 or r["gt"] <= 0:
                raise LogError("%s: pattern '%s' has a gpumem time of 0 ns; the run measured nothing" %
                               (path, m.group("name")))
            rows[m.group("name")] = r
    if "torch_alloc_pairs --sim" in text:
        raise LogError("%s: a --sim run (gpumem alone on a simulated device, no native column); run "
                       "torch_alloc_pairs on a GPU without --sim" % path)
    if threads is None or not rows:
        first = next((l for l in text.splitlines() if l.strip()), "(empty)")
        raise LogError("%s: no torch_alloc_pairs table in it (did the run fail? its first line: %s)" %
                       (path, first[:120]))
    return threads, rows


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs):
    """runs: [(path, threads, rows)]. Per pattern (first-seen order): the spreads over the runs."""
    threads = {t for _, t, _ in runs}
    if len(threads) != 1:
        raise LogError("the logs ran different thread counts (%s); summarize runs of one --threads at a time" %
                       ", ".join(sorted(str(t) for t in threads)))
    order = []
    for _, _, rows in runs:
        for name in rows:
            if name not in order:
                order.append(name)
    out = []
    for name in order:
        rs = [rows[name] for _, _, rows in runs if name in rows]
        s1 = [r["n1"] / r["g1"] for r in rs]
        st = [r["nt"] / r["gt"] for r in rs]
        entry = {
            "pattern": name,
            "runs": len(rs),
            "native_1t_ns": spread([r["n1"] for r in rs]),
            "gpumem_1t_ns": spread([r["g1"] for r in rs]),
            "speedup_1t": spread(s1),
            "native_tt_ns": spread([r["nt"] for r in rs]),
            "gpumem_tt_ns": spread([r["gt"] for r in rs]),
            "speedup_tt": spread(st),
            "driver_1t_ns": spread([r["d1"] for r in rs]),
        }
        entry["meets"] = {
            "speedup_1t": entry["speedup_1t"]["median"] >= SPEEDUP_TARGET,
            "speedup_tt": entry["speedup_tt"]["median"] >= SPEEDUP_TARGET,
            "under_1us_tt": entry["gpumem_tt_ns"]["median"] < THREAD_NS_TARGET,
        }
        out.append(entry)
    return next(iter(threads)), out


def cell(s, fmt, suffix=""):
    return ("%s%s (%s..%s)" % (fmt % s["median"], suffix, fmt % s["min"], fmt % s["max"]))


def render(threads, entries, nruns):
    lines = ["torch_alloc_pairs over %d processes: per pattern the median over the processes (smallest..largest); "
             "the speed-ups are each process's native / gpumem" % nruns,
             "%-27s %-25s %-25s %-22s %-25s %-22s %s" % ("pattern", "native 1t ns", "gpumem 1t ns", "speed-up 1t",
                                                        "gpumem %dt ns/thread" % threads,
                                                        "speed-up %dt" % threads, "targets (median)")]
    for e in entries:
        m = e["meets"]
        verdict = "1t>=3x %s, %dt>=3x %s, %dt<1us %s" % ("yes" if m["speedup_1t"] else "NO", threads,
                                                         "yes" if m["speedup_tt"] else "NO", threads,
                                                         "yes" if m["under_1us_tt"] else "NO")
        if e["runs"] != nruns:
            verdict += " (in %d of %d runs)" % (e["runs"], nruns)
        lines.append("%-27s %-25s %-25s %-22s %-25s %-22s %s" % (
            e["pattern"], cell(e["native_1t_ns"], "%.1f"), cell(e["gpumem_1t_ns"], "%.1f"),
            cell(e["speedup_1t"], "%.2f", "x"), cell(e["gpumem_tt_ns"], "%.0f"), cell(e["speedup_tt"], "%.1f", "x"),
            verdict))
    met = sum(all(e["meets"].values()) for e in entries)
    lines.append("patterns meeting all three targets by the median: %d of %d" % (met, len(entries)))
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="torch_alloc_pairs outputs, one per process")
    ap.add_argument("--json", help="also write the summary as JSON to this file")
    a = ap.parse_args(argv)
    try:
        runs = []
        for path in a.logs:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
            except OSError as e:
                raise LogError("%s: cannot read it (%s)" % (path, e.strerror))
            threads, rows = parse(path, text)
            runs.append((path, threads, rows))
        threads, entries = summarize(runs)
    except LogError as e:
        print("torch_pairs_summary: %s" % e, file=sys.stderr)
        return 2
    print(render(threads, entries, len(runs)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": threads, "runs": len(runs), "patterns": entries}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
