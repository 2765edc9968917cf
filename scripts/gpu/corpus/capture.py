#!/usr/bin/env python3
"""Captures one corpus workload under PyTorch's own CUDA caching allocator, in this process.

    capture.py --workload NAME --mode native|expandable --out-root DIR [--bin-dir DIR]
    capture.py --workload NAME --dry-run-cpu          (tiny shapes, one step on the CPU)
    capture.py --list

--mode sets PYTORCH_CUDA_ALLOC_CONF before torch is imported ('' or expandable_segments:True), so
each mode runs in a process of its own. History recording
(torch.cuda.memory._record_memory_history(max_entries=..., stacks="python")) starts before the
model is created; after the last step, torch.cuda.memory._snapshot() is converted to
DIR/MODE/NAME.trace.csv.gz (the CSV trace format, see snapshot_csv.py) and DIR/MODE/NAME.json holds
what torch.cuda.memory_stats() reported, the allocator settings, versions, shapes and timings.

C++ workloads run the example binary from --bin-dir with --record-native-history and convert the
snapshot pickle it writes the same way (their `where` is empty: no Python frames).

Checks, in the JSON under "checks" and on stderr: the history holds fewer entries than max_entries
(else entries were dropped: exit status 3, the files are still written); the trace's own segment
entries reach exactly PyTorch's peak reserved and its live requested bytes exactly PyTorch's peak
requested (flagged when not). Exit status: 0 ok, 3 a check failed, 4 skipped (no binary),
1 the workload failed, 2 usage.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import snapshot_csv  # noqa: E402
import workloads  # noqa: E402

MODES = {"native": "", "expandable": "expandable_segments:True"}
DEFAULT_MAX_ENTRIES = 10_000_000  # the ring grows on demand: a large bound costs nothing
EXIT_CHECK_FAILED, EXIT_SKIPPED = 3, 4


def log(msg):
    print("[capture] %s" % msg, file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", help="workload name (--list shows them)")
    ap.add_argument("--mode", choices=sorted(MODES), default="native")
    ap.add_argument("--out-root", help="corpus directory: MODE/NAME.trace.csv.gz and .json go there")
    ap.add_argument("--bin-dir", default=None, help="directory of the C++ example binaries")
    ap.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES)
    ap.add_argument("--steps", type=int, default=None, help="override the workload's step count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shared-gpu", action="store_true",
                    help="other captures run on the GPU at the same time (recorded in the JSON)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--timeout", type=float, default=300, help="C++ workloads: seconds before the "
                    "binary is stopped")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="build the workload with tiny shapes and run one step on the CPU")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    ap.add_argument("--print-library-path", action="store_true",
                    help="print the LD_LIBRARY_PATH the C++ examples run with (needs --bin-dir)")
    args = ap.parse_args(argv)
    if args.print_library_path and not args.bin_dir:
        ap.error("--print-library-path needs --bin-dir")
    if args.list or args.print_library_path:
        return args
    if not args.workload:
        ap.error("--workload NAME is required (see --list)")
    if args.workload not in workloads.WORKLOADS:
        ap.error("unknown workload %r; choose one of: %s" % (args.workload, ", ".join(workloads.WORKLOADS)))
    if not args.dry_run_cpu and not args.out_root:
        ap.error("--out-root DIR is required (or --dry-run-cpu)")
    if args.max_entries < 1000:
        ap.error("--max-entries %d is too small to hold a workload's history" % args.max_entries)
    return args


def set_alloc_conf(mode):
    """Sets PYTORCH_CUDA_ALLOC_CONF for the mode; refuses a different value already set, so a
    capture never runs under settings its JSON does not name."""
    want = MODES[mode]
    have = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if have is not None and have != want:
        raise SystemExit("capture.py: PYTORCH_CUDA_ALLOC_CONF=%r is set but --mode %s means %r; unset it "
                         "(capture.py sets it itself)" % (have, mode, want))
    if want:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = want
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return want


def versions():
    v = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "torchvision"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing library is recorded, not fatal here
            v[mod] = None
    return v


def out_paths(out_root, mode, name):
    d = os.path.join(out_root, mode)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name + ".trace.csv.gz"), os.path.join(d, name + ".json")


def trace_checks(stats, max_entries, peak_reserved, peak_requested):
    checks = {
        "entries_below_max_entries": stats.entries < max_entries,
        "trace_peak_reserved_matches": stats.peak_reserved == peak_reserved,
        "trace_peak_requested_matches": stats.peak_requested == peak_requested,
        "time_monotonic": stats.time_regressions == 0,
    }
    return checks


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def report_checks(checks, stats, max_entries):
    failed = [k for k, ok in checks.items() if not ok]
    if not checks["entries_below_max_entries"]:
        log("FAILED: the history holds %d entries = max_entries %d: older entries were dropped; "
            "rerun with a larger --max-entries" % (stats.entries, max_entries))
    for k in failed:
        if k != "entries_below_max_entries":
            log("CHECK %s failed (see the JSON's checks)" % k)
    return EXIT_CHECK_FAILED if failed else 0


# ---- Python workloads ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, torch, device, dry, seed):
        import random
        self.device = device
        self.dry = dry
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)


def capture_device(torch):
    """The device a capture runs on (a function so tests can run the capture path on the CPU)."""
    return torch.device("cuda", 0)


def run_python(w, args, alloc_conf):
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    steps = args.steps or (w.steps if not args.dry_run_cpu else 1)
    if args.dry_run_cpu:
        t0 = time.perf_counter()
        built = w.build(Ctx(torch, torch.device("cpu"), True, args.seed))
        infos = [built.step(i) for i in range(steps)]
        log("dry run %s: built and ran %d step(s) on the CPU in %.1f s: %s; model %s"
            % (w.name, steps, time.perf_counter() - t0, infos, built.model))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("capture.py: no CUDA device is visible; use --dry-run-cpu on a CPU machine")
    device = capture_device(torch)
    t_start = time.perf_counter()
    torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks="python")
    built = w.build(Ctx(torch, device, False, args.seed))
    torch.cuda.synchronize()
    t_built = time.perf_counter()
    step_s, infos = [], []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        infos.append(built.step(i))
        torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        log("%s %s step %d/%d %.3f s %s" % (w.name, args.mode, i + 1, steps, step_s[-1], infos[-1]))
    t_steps = time.perf_counter()
    stats = torch.cuda.memory_stats(device)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    t_snap = time.perf_counter()

    trace_path, json_path = out_paths(args.out_root, args.mode, w.name)
    dev, tstats = snapshot_csv.write_csv(snap, trace_path, device.index)
    t_conv = time.perf_counter()
    peaks = {
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "peak_reserved": stats["reserved_bytes.all.peak"],
        "peak_requested": stats["requested_bytes.all.peak"],
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "num_ooms": stats.get("num_ooms", 0),
    }
    checks = trace_checks(tstats, args.max_entries, peaks["peak_reserved"], peaks["peak_requested"])
    warm = min(w.warmup, len(step_s) - 1)  # warm-up steps are left out of step_s
    timed = step_s[warm:]
    doc = {
        # The keys of the shared traces' JSON first, in their order (gpumem replay reads them).
        "workload": w.name,
        "alloc_conf": alloc_conf,
        "torch": torch.__version__,
        "trace_entries": tstats.entries,
        "peak_allocated": peaks["peak_allocated"],
        "peak_reserved": peaks["peak_reserved"],
        "num_alloc_retries": peaks["num_alloc_retries"],
        "num_ooms": peaks["num_ooms"],
        "step_s": statistics.fmean(timed),
        "steps": steps,
        # Then what the corpus adds.
        "peak_requested": peaks["peak_requested"],
        "ratio_reserved_to_requested": peaks["peak_reserved"] / max(1, peaks["peak_requested"]),
        "warmup_steps": warm,
        "step_s_median": statistics.median(timed),
        "step_s_all": step_s,
        "timed_with_other_captures": bool(args.shared_gpu),
        "summary": w.summary,
        "model": built.model,
        "shapes": built.shapes,
        "step_shapes": infos,
        "seed": args.seed,
        "model_info": built.extra,
        "max_entries": args.max_entries,
        "history_dropped": not checks["entries_below_max_entries"],
        "checks": checks,
        "trace": tstats.as_dict(),
        "memory_stats_end": {k: v for k, v in stats.items() if k.endswith(".all.current")
                             or k.startswith("num_")},
        "allocator_settings": snap.get("allocator_settings"),
        "versions": versions(),
        "device_name": torch.cuda.get_device_name(device),
        "cuda_runtime": torch.version.cuda,
        "seconds": {"build": t_built - t_start, "steps": t_steps - t_built,
                    "snapshot": t_snap - t_steps, "convert": t_conv - t_snap},
        "segments_end": snapshot_csv.segments_end(snap, dev),
    }
    write_json(json_path, doc)
    log("%s %s: %d entries, peak allocated %d, requested %d, reserved %d (ratio %.4f), step %.3f s; "
        "build %.1f s, steps %.1f s, snapshot %.1f s, convert %.1f s"
        % (w.name, args.mode, tstats.entries, peaks["peak_allocated"], peaks["peak_requested"],
           peaks["peak_reserved"], doc["ratio_reserved_to_requested"], doc["step_s"],
           t_built - t_start, t_steps - t_built, t_snap - t_steps, t_conv - t_snap))
    return report_checks(checks, tstats, args.max_entries)


# ---- C++ workloads -------------------------------------------------------------------------------

def cpp_library_path(bin_dir):
    """LD_LIBRARY_PATH for the C++ examples: torch's lib/, the CUDA libraries of the torch wheel
    (site-packages/nvidia/*/lib: the examples need libcudart.so.13 themselves, and libtorch finds
    the rest only through its own RPATH), then bin_dir (libgpumem_torch.so and friends travel with
    the binaries), then what was set."""
    import glob
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("capture.py: python3 cannot find torch, whose lib/ the C++ examples need")
    torch_dir = list(spec.submodule_search_locations)[0]
    paths = [os.path.join(torch_dir, "lib")]
    paths += sorted(glob.glob(os.path.join(os.path.dirname(torch_dir), "nvidia", "*", "lib")))
    paths.append(os.path.abspath(bin_dir))
    paths += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p not in paths]
    return ":".join(paths)


def result_fields(output):
    """The key=value pairs of the last RESULT line an example printed."""
    lines = [l for l in output.splitlines() if l.startswith("RESULT ")]
    if not lines:
        return {}
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', lines[-1]))


def run_cpp(w, args, alloc_conf):
    binary = os.path.join(args.bin_dir or "", w.binary)
    if not args.bin_dir or not os.access(binary, os.X_OK):
        print("SKIPPED %s: no executable %s (build examples/%s and pass its directory as --bin-dir)"
              % (w.name, binary, w.binary), flush=True)
        return EXIT_SKIPPED
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = cpp_library_path(args.bin_dir)
    env.update(w.env)
    env.setdefault("MASTER_PORT", str(29600 + 7 * sorted(MODES).index(args.mode) + os.getpid() % 5))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.dry_run_cpu:
        cmd = [binary] + w.dry_args
        log("dry run: %s" % " ".join(cmd))
        r = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
        sys.stdout.write(r.stdout[-3000:])
        sys.stderr.write(r.stderr[-3000:])
        log("dry run %s: exit %d" % (w.name, r.returncode))
        return 0 if r.returncode == 0 else 1

    trace_path, json_path = out_paths(args.out_root, args.mode, w.name)
    pickle_path = os.path.join(os.path.dirname(trace_path), w.name + ".snapshot.pickle")
    cmd = [binary] + w.args + ["--record-native-history", pickle_path]
    log("running %s" % " ".join(cmd))
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.stdout.write(out[-5000:])
        log("%s: the binary ran past %.0f s and was stopped" % (w.name, args.timeout))
        return 1
    wall = time.perf_counter() - t0
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        log("%s: %s exited with status %d" % (w.name, w.binary, r.returncode))
        return 1
    with open(pickle_path + ".stats.json") as f:
        cstats = json.load(f)
    max_entries = int(cstats["max_entries"])
    snap = snapshot_csv.load_snapshot(pickle_path)
    t1 = time.perf_counter()
    dev, tstats = snapshot_csv.write_csv(snap, trace_path, None)
    t_conv = time.perf_counter() - t1
    checks = trace_checks(tstats, max_entries, cstats["peak_reserved"], cstats["peak_requested"])
    res = result_fields(r.stdout)
    step_ms = res.get("step_ms") or res.get("ms_per_step")
    doc = {
        "workload": w.name,
        "alloc_conf": alloc_conf,
        "torch": versions()["torch"],
        "trace_entries": tstats.entries,
        "peak_allocated": cstats["peak_allocated"],
        "peak_reserved": cstats["peak_reserved"],
        "num_alloc_retries": cstats["num_alloc_retries"],
        "num_ooms": cstats["num_ooms"],
        "step_s": float(step_ms) / 1000 if step_ms else None,
        "steps": w.steps,
        "peak_requested": cstats["peak_requested"],
        "ratio_reserved_to_requested": cstats["peak_reserved"] / max(1, cstats["peak_requested"]),
        "warmup_steps": w.warmup,
        "step_s_note": "the example's own median (checkpoint_llama) or mean (zero_train) step time",
        "timed_with_other_captures": bool(args.shared_gpu),
        "summary": w.summary,
        "model": w.model,
        "shapes": w.shapes,
        "command": [w.binary] + w.args + ["--record-native-history", "FILE"],
        "seed": args.seed,
        "result_line": res,
        "max_entries": max_entries,
        "history_dropped": not checks["entries_below_max_entries"],
        "checks": checks,
        "trace": tstats.as_dict(),
        "side_streams_used": any(s != "0" for s in tstats.as_dict()["alloc_streams"]),
        "peak_resets_noted": cstats.get("peak_resets_noted", 0),
        "allocator_settings": snap.get("allocator_settings"),
        "versions": versions(),
        "where_note": "empty: a C++ program records no Python frames",
        "seconds": {"run": wall, "convert": t_conv},
        "segments_end": snapshot_csv.segments_end(snap, dev),
    }
    write_json(json_path, doc)
    os.remove(pickle_path)
    os.remove(pickle_path + ".stats.json")
    log("%s %s: %d entries, peak allocated %d, requested %d, reserved %d (ratio %.4f), streams %s"
        % (w.name, args.mode, tstats.entries, cstats["peak_allocated"], cstats["peak_requested"],
           cstats["peak_reserved"], doc["ratio_reserved_to_requested"], doc["trace"]["alloc_streams"]))
    return report_checks(checks, tstats, max_entries)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.print_library_path:
        print(cpp_library_path(args.bin_dir))
        return 0
    if args.list:
        for name, w in workloads.WORKLOADS.items():
            print("%-26s %-6s %5d GiB %4d s  %s" % (name, w.kind, w.est_gib, w.est_s, w.summary))
        return 0
    alloc_conf = set_alloc_conf(args.mode)
    w = workloads.WORKLOADS[args.workload]
    try:
        if w.kind == "cpp":
            return run_cpp(w, args, alloc_conf)
        return run_python(w, args, alloc_conf)
    except snapshot_csv.SnapshotError as err:
        log("%s: %s" % (w.name, err))
        return 1


if __name__ == "__main__":
    sys.exit(main())
