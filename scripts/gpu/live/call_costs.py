#!/usr/bin/env python3
"""What gpumem's driver calls cost in live runs: per call kind, the calls and the mean host time
per call, summed over the gpumem runs of live.py's result files. Standard library only.

    call_costs.py LIVE.jsonl [LIVE.jsonl ...] [--by-workload] [--json]
    call_costs.py LIVE.jsonl [LIVE.jsonl ...] --engine-lock [--json]

Each gpumem run (mode gpumem or a gpumem variant) records gpumem.memory_stats at its end
(`gpumem_stats`): for every CUDA VMM call kind its calls and its host nanoseconds, cumulative over
the process (warm-up and model building included). This sums them over the runs given and divides:
the same quantities the replay's cost model charges per call (forensics/offline/include/gpumem/
forensics/call_costs.h), measured on real workloads instead of a loop of calls on an idle GPU.
A "map" in that model is cuMemMap plus its cuMemSetAccess; the table prints both and their sum.
Runs without gpumem_stats (native modes, failed runs, files from before the key existed) and runs
whose source was not timed (gpumem.driver.timed 0: a simulated source) are left out and counted.

--engine-lock prints instead, per workload, how often the runs took the engine's lock and found it
taken (gpumem.engine_lock.acquisitions / .contended) and in how many runs the thread caches came on
(gpumem.thread_caches.on): whether real programs ever contend for the lock that per-thread caches
and arenas exist for (docs/notes/thread-caches.md).
"""

import argparse
import json
import sys

CALLS = ("create", "map", "set_access", "unmap", "release")


def read_runs(paths):
    """Every run (a JSON object per line) of the files, in order, as (where, run) with where
    "PATH:LINE"; an error names a bad line."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    run = json.loads(line)
                except json.JSONDecodeError as err:
                    raise SystemExit("call_costs.py: %s:%d is not JSON (%s); pass live.py's live.jsonl files"
                                     % (path, number, err))
                if not isinstance(run, dict):
                    raise SystemExit("call_costs.py: %s:%d is not a JSON object (a run); pass live.py's live.jsonl "
                                     "files" % (path, number))
                yield "%s:%d" % (path, number), run


def count(stats, key, where):
    """stats[key] (0 when absent) as a non-negative integer; an error names the run and the key."""
    value = stats.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise SystemExit("call_costs.py: %s: gpumem_stats[%r] is %r, not a count; pass live.py's live.jsonl files"
                         % (where, key, value))
    return int(value)


def gpumem_stats(run):
    """The run's gpumem_stats when it is a gpumem run that recorded them, else None."""
    stats = run.get("gpumem_stats")
    if not str(run.get("mode", "")).startswith("gpumem") or not isinstance(stats, dict):
        return None
    return stats


def load(paths):
    """(runs, skipped): runs as (workload, {call: (calls, ns)}) for every timed gpumem run."""
    runs, skipped = [], 0
    for where, run in read_runs(paths):
        stats = gpumem_stats(run)
        if stats is None or not stats.get("gpumem.driver.timed", 0):
            skipped += 1
            continue
        calls = {c: (count(stats, "gpumem.driver.%s.calls" % c, where), count(stats, "gpumem.driver.%s.ns" % c, where))
                 for c in CALLS}
        runs.append((str(run.get("workload", "?")), calls))
    return runs, skipped


def load_engine_lock(paths):
    """({workload: [runs, acquisitions, contended, runs with thread caches on]}, skipped): every gpumem
    run that recorded the engine-lock counters (simulated sources included: the lock is the same)."""
    by_workload, skipped = {}, 0
    for where, run in read_runs(paths):
        stats = gpumem_stats(run)
        if stats is None or "gpumem.engine_lock.acquisitions" not in stats:
            skipped += 1
            continue
        row = by_workload.setdefault(str(run.get("workload", "?")), [0, 0, 0, 0])
        row[0] += 1
        row[1] += count(stats, "gpumem.engine_lock.acquisitions", where)
        row[2] += count(stats, "gpumem.engine_lock.contended", where)
        row[3] += 1 if count(stats, "gpumem.thread_caches.on", where) else 0
    return by_workload, skipped


def engine_lock_main(args):
    by_workload, skipped = load_engine_lock(args.files)
    if not by_workload:
        raise SystemExit("call_costs.py: no gpumem run with gpumem.engine_lock counters in %d file(s) (%d runs left "
                         "out); live.py records them since the engine-lock keys were added" % (len(args.files), skipped))
    total = [sum(r[i] for r in by_workload.values()) for i in range(4)]
    if args.json:
        keys = ("runs", "acquisitions", "contended", "thread_caches_on_runs")
        json.dump({"left_out": skipped, "all": dict(zip(keys, total)),
                   "by_workload": {w: dict(zip(keys, r)) for w, r in sorted(by_workload.items())}},
                  sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    print("%d gpumem runs of %d workloads with engine-lock counters (%d runs left out)" %
          (total[0], len(by_workload), skipped))
    print("  %-34s %5s %14s %10s %16s" % ("workload", "runs", "acquisitions", "contended", "caches on (runs)"))
    for w, r in sorted(by_workload.items()) + [("all", total)]:
        print("  %-34s %5d %14d %10d %16d" % (w, r[0], r[1], r[2], r[3]))
    return 0


def summarize(runs):
    """{call: (calls, ns)} summed over runs, with "map+set_access" (the cost model's map) added."""
    total = {c: [0, 0] for c in CALLS}
    for _, calls in runs:
        for c, (n, ns) in calls.items():
            total[c][0] += n
            total[c][1] += ns
    out = {c: tuple(v) for c, v in total.items()}
    # cuMemSetAccess follows every cuMemMap, so per map the two means add.
    out["map+set_access"] = (out["map"][0], out["map"][1] + out["set_access"][1])
    return out


def mean_us(calls, ns):
    return ns / 1e3 / calls if calls else None


def table(summary):
    rows = []
    for c in CALLS + ("map+set_access",):
        n, ns = summary[c]
        m = mean_us(n, ns)
        rows.append("  %-16s %12d calls  %s" % (c, n, "%8.1f us per call" % m if m is not None else "       - (no call)"))
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="live.jsonl files written by scripts/gpu/live/live.py")
    ap.add_argument("--by-workload", action="store_true", help="a table per workload as well")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--engine-lock", action="store_true",
                    help="engine-lock acquisitions, contended acquisitions and thread caches per workload instead "
                         "(always by workload)")
    args = ap.parse_args(argv)
    if args.engine_lock:
        return engine_lock_main(args)
    runs, skipped = load(args.files)
    if not runs:
        raise SystemExit("call_costs.py: no timed gpumem run with gpumem_stats in %d file(s) (%d runs left out); "
                         "these keys exist in live.py's output since the driver-time keys were added" %
                         (len(args.files), skipped))
    overall = summarize(runs)
    workloads = sorted({w for w, _ in runs})
    by_workload = {w: summarize([r for r in runs if r[0] == w]) for w in workloads}
    if args.json:
        def as_json(s):
            return {c: {"calls": n, "ns": ns, "mean_us": mean_us(n, ns)} for c, (n, ns) in s.items()}
        json.dump({"runs": len(runs), "left_out": skipped, "all": as_json(overall),
                   "by_workload": {w: as_json(s) for w, s in by_workload.items()} if args.by_workload else {}},
                  sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    print("%d gpumem runs of %d workloads (%d runs left out: not gpumem, not timed, or no gpumem_stats)"
          % (len(runs), len(workloads), skipped))
    print("all runs:")
    print(table(overall))
    if args.by_workload:
        for w in workloads:
            print("%s (%d runs):" % (w, sum(1 for r in runs if r[0] == w)))
            print(table(by_workload[w]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
