#!/usr/bin/env python3
"""What trace recording and op attribution cost, paired inside one process (issue 14's 3% target).

Between fresh processes the H200 host's step time varies by ~15% (the GPT-2 step is CPU-bound and
the host's CPU speed drifts), so comparing processes cannot settle a 3% question. Within one
process consecutive steps are close. So one process alternates blocks of steps with a recorder on
and off, switched at run time, many times, and each cycle pairs every arm's block with the "off"
block of the same cycle (same sequence lengths, same data: the workload's RNGs are reseeded per
cycle; the arms' order rotates from cycle to cycle, so no arm always runs first). The sequence
lengths come from a pool of --shapes values drawn once from the workload's range (GPT-2 varlen:
64..1024), each run twice before the blocks start, so that no block meets a shape for the first
time (ShapePool says why):

    gpumem process (GPUMEM_ALLOC_CONF="" unless --conf: plain gpumem)
      off     nothing recorded
      trace   torch.cuda.memory._record_memory_history(context=None, max_entries=100000): gpumem's
              trace ring of 100,000 records without stacks (what trace_entries:100000 attaches)
      ops     gpumem.record_ops(True): the at::RecordFunction callbacks that name each event's op
              (torch.ops.gpumem.record_ops; record_ops:True adds a live-block tracker besides,
              whose cost bench_forensics_observers measures per allocation)
    native process (PyTorch's CUDA caching allocator)
      off           nothing recorded
      history       torch.cuda.memory._record_memory_history(max_entries=100000): PyTorch's
                    defaults, C++ and Python stacks for every allocation (the anchor users know)
      history_state the same with context=None: the trace alone, no stacks (like gpumem's trace arm)

Per arm: the ratio of its block time to the off block's in the same cycle, over all cycles: the
median with a distribution-free 95% confidence interval (order statistics of the sign test), the
geometric mean, and the difference in ms per step. A block is --block-steps steps; its first step
after the switch is left out of the block time (--skip-first; it also absorbs one-time costs of
switching, e.g. the history's ring allocation), the rest are summed.

--micro (gpumem process) adds the per-op cost of record_ops' callback: rounds of N small torch ops
(`x.add_(y)` on 4-element CPU and CUDA tensors: no allocation; `x + y` on CUDA: one allocation per
op), callbacks on and off alternated, the calling thread's CPU time per op; paired per round.

    forensics_cost.py --allocator gpumem --lib PATH/libgpumem_torch.so [--budget-s 60] [--micro]
    forensics_cost.py --allocator native [--budget-s 45]
    forensics_cost.py --summarize A.json B.json ...        (the table of earlier runs)
    forensics_cost.py --allocator gpumem --lib PATH --device cpu --workload mlp   (a CPU dry run)

Each process writes --out FILE (JSON: every block's step times, the arms' statistics) and prints
its table. The GPU machine: scripts/gpu/forensics_cost.sh runs both processes and the summary.
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "corpus"))

HISTORY_ENTRIES = 100_000
TARGET = 1.03  # issue 14: each recorder within 3% of plain


class ScriptError(Exception):
    """A problem the user can fix; the message names it and the fix."""


# ---------------------------------------------------------------- statistics (standard library)

def binom_cdf(k, n):
    """P(B <= k) for B ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(0, min(k, n) + 1)) / 2.0 ** n


def median_ci(values, level=0.95):
    """(low, high, coverage) of the median of `values`: the order statistics x_(j), x_(n-j+1)
    with the largest j whose sign-test coverage 1 - 2 P(B <= j-1) is at least `level`. With too
    few values for that level: (min, max, their coverage)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci of no values")
    best = 1
    for j in range(1, n // 2 + 1):
        if 1.0 - 2.0 * binom_cdf(j - 1, n) >= level:
            best = j
        else:
            break
    coverage = 1.0 - 2.0 * binom_cdf(best - 1, n)
    return xs[best - 1], xs[n - best], coverage


def arm_stats(pairs, steps_per_block):
    """pairs: [(arm block seconds, off block seconds)] of one arm, one per cycle. The ratio's
    median and its CI, the geometric mean, and the added ms per step (median)."""
    ratios = [a / b for a, b in pairs]
    deltas_ms = [(a - b) * 1000.0 / steps_per_block for a, b in pairs]
    low, high, coverage = median_ci(ratios)
    return {
        "cycles": len(pairs),
        "ratio_median": statistics.median(ratios),
        "ratio_ci_low": low, "ratio_ci_high": high, "ci_coverage": coverage,
        "ratio_geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "delta_ms_per_step_median": statistics.median(deltas_ms),
        "off_step_ms_median": statistics.median(b * 1000.0 / steps_per_block for _, b in pairs),
    }


def verdict(s, target=TARGET):
    """Whether the CI settles `target` (a ratio): within, over, or not settled."""
    pct = (target - 1.0) * 100.0
    if s["ci_coverage"] < 0.93:
        return "not settled: too few cycles for a 95%% interval (%.0f%%)" % (s["ci_coverage"] * 100)
    if s["ratio_ci_high"] <= target:
        return "within %.0f%% (the whole %.0f%% interval is)" % (pct, s["ci_coverage"] * 100)
    if s["ratio_ci_low"] > target:
        return "OVER %.0f%% (the whole %.0f%% interval is)" % (pct, s["ci_coverage"] * 100)
    return "not settled: the interval straddles %.3f" % target


def cycle_pairs(blocks, arm, skip_first, not_first=False):
    """[(arm seconds, off seconds)] per cycle that has both blocks. not_first: only cycles where
    neither of the two ran first (for runs without a shape pool, whose first block of a cycle
    met its shapes first; cycle 0 repeats the warm-up's shapes and always counts)."""
    by_cycle, first = {}, {}
    for b in blocks:
        steps = b["step_s"][1:] if skip_first and len(b["step_s"]) > 1 else b["step_s"]
        by_cycle.setdefault(b["cycle"], {})[b["arm"]] = sum(steps)
        first.setdefault(b["cycle"], b["arm"])
    return [(c[arm], c["off"]) for k, c in sorted(by_cycle.items())
            if arm in c and "off" in c and not (not_first and k > 0 and first[k] in (arm, "off"))]


def restate(result, not_first):
    """The result's statistics recomputed from its blocks (--summarize --not-first)."""
    steps = result["block_steps"] - (1 if result["skip_first"] and result["block_steps"] > 1 else 0)
    out = dict(result)
    out["stats"] = {}
    for arm in result["arms"]:
        pairs = cycle_pairs(result["blocks"], arm, result["skip_first"], not_first) if arm != "off" else []
        if pairs:
            out["stats"][arm] = arm_stats(pairs, steps)
    return out


def micro_stats(rounds):
    """rounds: [{"kind", "on", "ns_per_op"}], on/off alternated. Per kind: the medians and the
    per-round paired difference (each on round minus the off round next to it)."""
    out = {}
    for kind in sorted({r["kind"] for r in rounds}):
        rs = [r for r in rounds if r["kind"] == kind]
        on = [r["ns_per_op"] for r in rs if r["on"]]
        off = [r["ns_per_op"] for r in rs if not r["on"]]
        diffs = [a - b for a, b in zip(on, off)]
        low, high, coverage = median_ci(diffs)
        out[kind] = {"off_ns": statistics.median(off), "on_ns": statistics.median(on),
                     "added_ns_median": statistics.median(diffs), "added_ns_ci": [low, high],
                     "ci_coverage": coverage, "rounds": len(diffs)}
    return out


def format_table(result):
    """The text table of one process's result."""
    lines = ["%s process: %s; %d cycles of %s, %d steps per block (%s), off step %.1f ms (median)" % (
        result["allocator"], result["workload"], result["cycles"], "/".join(result["arms"]),
        result["block_steps"], "first step after the switch left out" if result["skip_first"] else "all steps timed",
        result.get("off_step_ms", float("nan")))]
    lines.append("  %-14s %4s %8s %21s %8s %15s %9s  %s" % ("arm", "n", "ratio", "95% CI (order stats)", "geomean",
                                                           "min..max", "ms/step", "verdict (target 1.03)"))
    for arm, s in result["stats"].items():
        lines.append("  %-14s %4d %8.4f %10.4f..%-10.4f %8.4f %7.3f..%-7.3f %+9.2f  %s" % (
            arm, s["cycles"], s["ratio_median"], s["ratio_ci_low"], s["ratio_ci_high"], s["ratio_geomean"],
            s["ratio_min"], s["ratio_max"], s["delta_ms_per_step_median"], verdict(s)))
        if abs(s["ci_coverage"] - 0.95) > 0.02:
            lines.append("  %-14s (the interval's coverage is %.1f%% with %d cycles)" % (
                "", s["ci_coverage"] * 100, s["cycles"]))
    for kind, m in result.get("micro", {}).items():
        lines.append("  per op, %-22s callbacks off %7.1f ns, on %7.1f ns: %+7.1f ns (%.0f%% CI %+.1f..%+.1f, "
                     "%d paired rounds of %d ops)" % (kind, m["off_ns"], m["on_ns"], m["added_ns_median"],
                                                      m["ci_coverage"] * 100, m["added_ns_ci"][0],
                                                      m["added_ns_ci"][1], m["rounds"], result.get("micro_ops", 0)))
    return "\n".join(lines)


# ---------------------------------------------------------------- the measurement (needs torch)

def arms_for(allocator, device_type):
    if allocator == "gpumem":
        return ["off", "trace", "ops"] if device_type == "cuda" else ["off", "ops"]
    if device_type != "cuda":
        raise ScriptError("--allocator native measures PyTorch's CUDA history; it needs --device cuda")
    return ["off", "history", "history_state"]


def switch_arm(torch, gpumem_ops, allocator, arm, device_type):
    """Puts the recorders in the state `arm` asks for (from any previous state)."""
    cuda = device_type == "cuda"
    if allocator == "gpumem":
        gpumem_ops.record_ops(arm == "ops")
        if cuda:
            if arm == "trace":
                torch.cuda.memory._record_memory_history(context=None, max_entries=HISTORY_ENTRIES)
            else:
                torch.cuda.memory._record_memory_history(enabled=None)
        return
    if arm == "history":
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
    elif arm == "history_state":
        torch.cuda.memory._record_memory_history(context=None, max_entries=HISTORY_ENTRIES)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


class ShapePool:
    """Stands in for workloads.py's ctx.rng (shapes only: randint). Each (lo, hi) range gets a
    fixed pool of `size` values drawn once from it; randint returns one of them, chosen by this
    object's own RNG (reseeded per cycle, so every arm of a cycle runs the same shapes), or, while
    `forced` holds indices, those pool entries in turn (the warm-up runs every shape once).

    Why a pool: the first step that meets a new shape pays one-time costs (the allocator reserving
    memory for a larger peak, libraries' per-shape setup), up to 100 ms on the H200 host; with
    fresh lengths every cycle that cost lands on whichever arm runs a cycle first and swamps the
    recorders' cost (the first request's ratios spread 0.40..6.33). With every shape warmed up,
    blocks of one cycle differ only by the recorder."""

    def __init__(self, seed, size):
        self.draw = random.Random(seed)
        self.pick = random.Random(seed)
        self.size = size
        self.pools = {}
        self.forced = []

    def randint(self, lo, hi):
        pool = self.pools.get((lo, hi))
        if pool is None:
            pool = self.pools[(lo, hi)] = [self.draw.randint(lo, hi) for _ in range(self.size)]
        if self.forced:
            return pool[self.forced.pop(0) % len(pool)]
        return pool[self.pick.randrange(len(pool))]

    def seed(self, seed):
        self.pick.seed(seed)


class Ctx:
    """What workloads.py's builders read: device, dry (tiny shapes), rng (shapes: a ShapePool),
    gen (data)."""

    def __init__(self, torch, device, dry, seed, shapes):
        self.device = device
        self.dry = dry
        self.rng = ShapePool(seed, shapes)
        self.gen = torch.Generator().manual_seed(seed)

    def reseed(self, seed):
        self.rng.seed(seed)
        self.gen.manual_seed(seed)


def build_mlp(torch, ctx):
    """A small CPU-friendly training step with a varying batch (for dry runs and tests)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        n = ctx.rng.randint(8, 64)
        x = torch.randn(n, 64, generator=ctx.gen).to(ctx.device)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"batch": n}
    return step


def load_gpumem(torch, lib, conf, device_type):
    """Loads libgpumem_torch.so with GPUMEM_ALLOC_CONF=conf (CUDA: installs on load) or installs
    it as the CPU allocator; returns torch.ops.gpumem."""
    if not lib or not os.path.isfile(lib):
        raise ScriptError("no libgpumem_torch.so at %r: pass --lib PATH (built on the CPU machine and carried)" % lib)
    if device_type == "cuda":
        os.environ["GPUMEM_ALLOC_CONF"] = conf
    try:
        torch.ops.load_library(lib)
    except OSError as err:
        if err.__cause__ is None:
            raise
    ops = torch.ops.gpumem
    if device_type == "cuda":
        if torch.cuda.get_allocator_backend() != "gpumem":
            raise ScriptError("gpumem is not torch's CUDA allocator after loading %s (GPUMEM_ALLOC_CONF=%r): %s"
                              % (lib, conf, ops.load_error() or "no load error recorded"))
    else:
        ops.install_cpu(conf)
    if not hasattr(ops, "record_ops"):
        raise ScriptError("%s has no torch.ops.gpumem.record_ops (the run-time switch): build a newer gpumem" % lib)
    return ops


def run_micro(torch, ops, device_type, n_ops, pairs, deadline):
    """Per-op cost of the callbacks: rounds of n_ops small ops, callbacks off / on alternated
    (the order flips every pair). Thread CPU time per op."""
    kinds = [("cpu x.add_(y)", "cpu", True)]
    if device_type == "cuda":
        kinds += [("cuda x.add_(y)", "cuda", True), ("cuda x + y (allocates)", "cuda", False)]
    rounds = []
    for name, dev, inplace in kinds:
        x = torch.zeros(4, device=dev)
        y = torch.ones(4, device=dev)
        for _ in range(200):  # warm the dispatcher and the callback lists
            x.add_(y) if inplace else (x + y)
        for p in range(pairs):
            if time.monotonic() > deadline and p >= 3:
                break
            for on in ((False, True) if p % 2 == 0 else (True, False)):
                ops.record_ops(on)
                x.add_(y)
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.thread_time_ns()
                if inplace:
                    for _ in range(n_ops):
                        x.add_(y)
                else:
                    for _ in range(n_ops):
                        x + y
                t1 = time.thread_time_ns()
                if dev == "cuda":
                    torch.cuda.synchronize()
                rounds.append({"kind": name, "on": on, "ns_per_op": (t1 - t0) / n_ops, "pair": p})
        ops.record_ops(False)
    return rounds


def measure(args):
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GPUMEM_ALLOC_CONF"):
        os.environ.pop(var, None)
    try:
        import torch
    except ImportError as err:
        raise ScriptError("cannot import torch (%s): run it with the python that has torch (on the GPU machine: "
                          "python3)" % err)
    device_type = args.device
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ScriptError("no CUDA device is visible; on a machine without a GPU use --device cpu --workload mlp")
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = None
    if args.allocator == "gpumem":
        ops = load_gpumem(torch, args.lib, args.conf, device_type)
    arms = arms_for(args.allocator, device_type)
    device = torch.device(device_type)
    torch.manual_seed(args.seed)
    ctx = Ctx(torch, device, args.workload == "mlp" or device_type == "cpu", args.seed, args.shapes)
    t0 = time.monotonic()
    if args.workload == "mlp":
        step = build_mlp(torch, ctx)
        model = "a 2-layer MLP (64-256-64), batch 8..64"
    else:
        import workloads
        if args.workload not in workloads.WORKLOADS or workloads.WORKLOADS[args.workload].kind != "python":
            names = ", ".join(n for n, w in workloads.WORKLOADS.items() if w.kind == "python")
            raise ScriptError("unknown --workload %r; choose mlp or one of: %s" % (args.workload, names))
        built = workloads.WORKLOADS[args.workload].build(ctx)
        step, model = built.step, built.model
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    # Warm-up: every shape of the pool once (largest last is not needed: the pool is small), then
    # the extra warm-up steps; the blocks then meet no shape for the first time.
    ctx.rng.forced = list(range(args.shapes)) + list(range(args.shapes))
    for i in range(2 * args.shapes):
        step(i)
    ctx.rng.forced = []
    for i in range(args.warmup):
        step(2 * args.shapes + i)
    sync()
    ready_s = time.monotonic() - t_start
    print("%s process ready in %.1f s (build and %d warm-up steps %.1f s); arms %s; shapes %s; budget %.0f s" % (
        args.allocator, ready_s, 2 * args.shapes + args.warmup, time.monotonic() - t0, "/".join(arms),
        {"%d..%d" % k: sorted(v) for k, v in ctx.rng.pools.items()}, args.budget_s), flush=True)

    micro_budget = args.micro_s if (args.micro and ops is not None) else 0.0
    blocks = []
    cycle = 0
    block_s = None
    checked_trace = False
    while cycle < args.max_cycles:
        now = time.monotonic()
        cycle_est = block_s * len(arms) if block_s else 0.0
        if cycle >= args.min_cycles and now + cycle_est * 1.2 > deadline - micro_budget:
            break
        if cycle > 0 and now + cycle_est > deadline:
            break
        order = arms[cycle % len(arms):] + arms[:cycle % len(arms)]
        for arm in order:
            switch_arm(torch, ops, args.allocator, arm, device_type)
            ctx.reseed(args.seed * 1_000_003 + cycle)
            sync()
            b0 = time.perf_counter()
            times, infos = [], []
            for k in range(args.block_steps):
                ts = time.perf_counter()
                infos.append(step(10_000 + cycle * args.block_steps + k))
                sync()
                times.append(time.perf_counter() - ts)
            block_s = time.perf_counter() - b0
            blocks.append({"cycle": cycle, "arm": arm, "step_s": times, "shapes": infos})
            if arm in ("trace", "history", "history_state") and not checked_trace:
                # Once: the history really recorded (outside the timed steps).
                n = len(torch.cuda.memory._snapshot()["device_traces"][device.index or 0])
                if n == 0:
                    raise ScriptError("arm %s recorded no trace entries: _record_memory_history did not take effect"
                                      % arm)
                checked_trace = True
                print("  (check: arm %s recorded %d trace entries in its block)" % (arm, n), flush=True)
        switch_arm(torch, ops, args.allocator, "off", device_type)
        print("cycle %d: %s" % (cycle, "  ".join(
            "%s %.1f ms" % (b["arm"], 1000 * sum(b["step_s"]) / len(b["step_s"])) for b in blocks[-len(arms):])),
            flush=True)
        cycle += 1

    steps_per_block = args.block_steps - (1 if args.skip_first and args.block_steps > 1 else 0)
    stats = {}
    for arm in arms:
        if arm == "off":
            continue
        pairs = cycle_pairs(blocks, arm, args.skip_first)
        if pairs:
            stats[arm] = arm_stats(pairs, steps_per_block)
    off_steps = [s for b in blocks if b["arm"] == "off" for s in b["step_s"]]
    result = {
        "allocator": args.allocator, "workload": args.workload, "model": model, "device": device_type,
        "conf": args.conf if args.allocator == "gpumem" else None, "arms": arms, "cycles": cycle,
        "block_steps": args.block_steps, "skip_first": args.skip_first, "stats": stats, "blocks": blocks,
        "shape_pool": {"%d..%d" % k: sorted(v) for k, v in ctx.rng.pools.items()},
        "off_step_ms": 1000 * statistics.median(off_steps) if off_steps else float("nan"),
        "ready_s": ready_s, "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device_type == "cuda" else "cpu",
    }
    if device_type == "cuda":
        result["allocs_per_step_total"] = torch.cuda.memory_stats(device).get("allocation.all.allocated")
    if args.micro and ops is not None:
        rounds = run_micro(torch, ops, device_type, args.micro_ops, args.micro_pairs, deadline)
        result["micro"] = micro_stats(rounds)
        result["micro_ops"] = args.micro_ops
        result["micro_rounds"] = rounds
    result["wall_s"] = time.monotonic() - t_start
    return result


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--allocator", choices=["gpumem", "native"])
    ap.add_argument("--lib", help="libgpumem_torch.so (--allocator gpumem)")
    ap.add_argument("--conf", default="", help="GPUMEM_ALLOC_CONF of the gpumem process (default: plain gpumem)")
    ap.add_argument("--workload", default="gpt2_varlen_train", help="a python workload of corpus/workloads.py, or mlp")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--budget-s", type=float, default=60.0, help="wall time of the whole process (default 60)")
    ap.add_argument("--block-steps", type=int, default=4)
    ap.add_argument("--skip-first", type=int, choices=[0, 1], default=1,
                    help="leave each block's first step out of its time (default 1)")
    ap.add_argument("--warmup", type=int, default=2, help="steps after every shape ran twice (default 2)")
    ap.add_argument("--shapes", type=int, default=6,
                    help="distinct values per random shape range, each warmed up before the blocks (default 6)")
    ap.add_argument("--min-cycles", type=int, default=3)
    ap.add_argument("--max-cycles", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--micro", action="store_true", help="also the per-op cost of the callbacks (gpumem)")
    ap.add_argument("--micro-ops", type=int, default=20_000)
    ap.add_argument("--micro-pairs", type=int, default=8)
    ap.add_argument("--micro-s", type=float, default=6.0, help="time kept for --micro at the end (default 6)")
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--summarize", nargs="+", metavar="JSON", help="print the tables of earlier results")
    ap.add_argument("--not-first", action="store_true",
                    help="with --summarize: only pairs where neither block ran first in its cycle (runs "
                         "made before the shape pool, whose first block met new shapes)")
    args = ap.parse_args(argv)
    if args.summarize:
        return args
    if not args.allocator:
        ap.error("--allocator gpumem|native is required (or --summarize FILE...)")
    if args.allocator == "gpumem" and not args.lib:
        ap.error("--allocator gpumem needs --lib PATH/libgpumem_torch.so")
    if args.block_steps < 1 or args.block_steps - args.skip_first < 1:
        ap.error("--block-steps %d leaves no timed step (with --skip-first %d); use at least %d"
                 % (args.block_steps, args.skip_first, 1 + args.skip_first))
    if args.shapes < 1:
        ap.error("--shapes must be at least 1 (the number of distinct sequence lengths), e.g. --shapes 6")
    if args.budget_s <= 0:
        ap.error("--budget-s must be positive seconds, e.g. --budget-s 60")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.summarize:
            for path in args.summarize:
                try:
                    with open(path) as f:
                        result = json.load(f)
                    if args.not_first:
                        print("(pairs of cycles whose first block was neither of the two)")
                        result = restate(result, True)
                    print(format_table(result))
                except (OSError, ValueError, KeyError) as err:
                    raise ScriptError("cannot summarize %s: %s (give a JSON file written by --out)" % (path, err))
            return 0
        result = measure(args)
    except ScriptError as err:
        print("forensics_cost.py: %s" % err, file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    print(format_table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
