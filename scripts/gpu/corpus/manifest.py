#!/usr/bin/env python3
"""Builds the corpus manifest from the JSON files beside the traces.

    manifest.py [CORPUS_DIR]      (default traces/corpus; writes MANIFEST.md and MANIFEST.json there)

A corpus directory holds MODE/NAME.trace.csv.gz and MODE/NAME.json for MODE in native and
expandable (capture.py writes them). The manifest lists per workload the model, shapes, seed,
torch version and steps, and per mode the measured peaks (allocated, requested, reserved), the
ratio peak reserved / peak requested, the trace's entries and the checks capture.py ran.
"""

import json
import os
import sys

MODES = ("native", "expandable")
GIB = float(1 << 30)


def _load(path):
    with open(path) as f:
        return json.load(f)


def build(corpus):
    """The manifest of CORPUS as a dict: {"workloads": {name: {...}}}."""
    out = {}
    for mode in MODES:
        d = os.path.join(corpus, mode)
        if not os.path.isdir(d):
            continue
        for fn in sorted(os.listdir(d)):
            if not fn.endswith(".json"):
                continue
            name = fn[:-len(".json")]
            doc = _load(os.path.join(d, fn))
            trace = os.path.join(d, name + ".trace.csv.gz")
            w = out.setdefault(name, {
                "summary": doc.get("summary"), "model": doc.get("model"), "shapes": doc.get("shapes"),
                "seed": doc.get("seed"), "torch": doc.get("torch"), "steps": doc.get("steps"),
                "versions": doc.get("versions"), "modes": {}})
            w["modes"][mode] = {
                "trace": os.path.relpath(trace, corpus) if os.path.exists(trace) else None,
                "trace_bytes": os.path.getsize(trace) if os.path.exists(trace) else None,
                "alloc_conf": doc.get("alloc_conf"),
                "entries": doc.get("trace_entries"),
                "peak_allocated": doc.get("peak_allocated"),
                "peak_requested": doc.get("peak_requested"),
                "peak_reserved": doc.get("peak_reserved"),
                "ratio_reserved_to_requested": doc.get("ratio_reserved_to_requested"),
                "num_alloc_retries": doc.get("num_alloc_retries"),
                "num_ooms": doc.get("num_ooms"),
                "step_s": doc.get("step_s"),
                "timed_with_other_captures": doc.get("timed_with_other_captures"),
                "alloc_streams": (doc.get("trace") or {}).get("alloc_streams"),
                "checks": doc.get("checks"),
            }
    for w in out.values():
        n, e = w["modes"].get("native"), w["modes"].get("expandable")
        if n and e and n.get("peak_reserved") and e.get("peak_reserved"):
            w["native_over_expandable_reserved"] = n["peak_reserved"] / e["peak_reserved"]
    return {"corpus": os.path.basename(os.path.abspath(corpus)), "workloads": out}


def _gib(b):
    return "-" if b is None else "%.3f" % (b / GIB)


def _ratio(x):
    return "-" if x is None else "%.4f" % x


def markdown(man):
    lines = [
        "# Corpus of real workloads: manifest",
        "",
        "Captured with scripts/gpu/corpus/ (see its README.md): each workload ran twice in a fresh",
        "process under PyTorch's own CUDA caching allocator, with default settings (native) and with",
        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (expandable). Peaks are what",
        "`torch.cuda.memory_stats()` reported (allocated_bytes / requested_bytes / reserved_bytes",
        ".all.peak), in GiB (2^30 bytes); ratio = peak reserved / peak requested. Exact bytes, step",
        "times, allocator settings and per-step shapes are in each trace's JSON and MANIFEST.json.",
        "",
        "| workload | mode | entries | peak allocated | peak requested | peak reserved | ratio | step s | checks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, w in sorted(man["workloads"].items()):
        for mode in MODES:
            m = w["modes"].get(mode)
            if not m:
                continue
            checks = m.get("checks") or {}
            bad = [k for k, ok in checks.items() if not ok]
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, mode, m.get("entries"), _gib(m.get("peak_allocated")), _gib(m.get("peak_requested")),
                _gib(m.get("peak_reserved")), _ratio(m.get("ratio_reserved_to_requested")),
                "-" if m.get("step_s") is None else "%.3f" % m["step_s"],
                "ok" if checks and not bad else ("FAILED: " + ", ".join(bad) if bad else "-")))
    lines += ["", "## Workloads", ""]
    for name, w in sorted(man["workloads"].items()):
        streams = max((m.get("alloc_streams") or {} for m in w["modes"].values()), key=len, default={})
        side = sum(v for k, v in streams.items() if k != "0")
        lines.append("- **%s**: %s. Model: %s. Shapes: %s. Seed %s, %s steps, torch %s%s%s." % (
            name, w.get("summary"), w.get("model"), json.dumps(w.get("shapes"), sort_keys=True),
            w.get("seed"), w.get("steps"), w.get("torch"),
            "" if "native_over_expandable_reserved" not in w else
            "; native / expandable peak reserved %.3f" % w["native_over_expandable_reserved"],
            "" if len(streams) < 2 else
            "; allocations on %d streams (%d off the default stream)" % (len(streams), side)))
    timed = any(m.get("timed_with_other_captures") for w in man["workloads"].values()
                for m in w["modes"].values())
    if timed:
        lines += ["", "Step times were measured with other captures running on the same GPU: they",
                  "are not benchmarks (peaks are per process and unaffected)."]
    return "\n".join(lines) + "\n"


def write(corpus, man):
    with open(os.path.join(corpus, "MANIFEST.json"), "w") as f:
        json.dump(man, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(corpus, "MANIFEST.md"), "w") as f:
        f.write(markdown(man))


def summary_table(man, records=()):
    """The text table printed last: one row per capture, from the run records when given (so
    failed and skipped captures show too), else from the manifest."""
    rows = []
    by_key = {}
    for name, w in man["workloads"].items():
        for mode, m in w["modes"].items():
            by_key["%s.%s" % (name, mode)] = m
    keys = [r["capture"] for r in records] if records else sorted(by_key)
    status = {r["capture"]: r for r in records}
    hdr = "%-26s %-10s %-14s %8s %9s %9s %9s %7s %7s %7s" % (
        "workload", "mode", "status", "entries", "alloc_GiB", "req_GiB", "res_GiB", "res/req", "streams",
        "seconds")
    rows.append(hdr)
    rows.append("-" * len(hdr))
    for key in keys:
        wname, mode = key.rsplit(".", 1)
        m = by_key.get(key, {}) if status.get(key, {}).get("status", "ok") in ("ok", "CHECK FAILED") else {}
        r = status.get(key, {})
        streams = m.get("alloc_streams")
        rows.append("%-26s %-10s %-14s %8s %9s %9s %9s %7s %7s %7s" % (
            wname, mode, (r.get("status") or "ok")[:14], m.get("entries", "-"), _gib(m.get("peak_allocated")),
            _gib(m.get("peak_requested")), _gib(m.get("peak_reserved")),
            _ratio(m.get("ratio_reserved_to_requested")), "-" if streams is None else len(streams),
            "-" if r.get("seconds") is None else "%.1f" % r["seconds"]))
    long_status = [r for r in records if len(r.get("status") or "") > 14]
    for r in long_status:
        rows.append("  %s: %s" % (r["capture"], r["status"]))
    return "\n".join(rows) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    corpus = argv[0] if argv else "traces/corpus"
    if not os.path.isdir(corpus):
        print("manifest.py: %s is not a directory; give the corpus directory (it holds native/ and "
              "expandable/)" % corpus, file=sys.stderr)
        return 2
    man = build(corpus)
    if not man["workloads"]:
        print("manifest.py: %s holds no MODE/NAME.json files" % corpus, file=sys.stderr)
        return 1
    write(corpus, man)
    print(summary_table(man), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
