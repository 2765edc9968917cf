#!/usr/bin/env python3
"""Counts the ops of a workload's step: the events torch.profiler records on the CPU (one per
RecordFunction at the scopes it watches, on every thread, autograd's included), over a few steps
after warm-up. It turns a per-op cost (record_ops' RecordFunction callback) into a per-step cost.

    python3 scripts/gpu/ops_per_step.py [WORKLOAD] [--warmup N] [--steps N]   (default gpt2_varlen_train)

Runs on the GPU machine with PyTorch's own allocator (nothing of gpumem is loaded).
"""
import argparse
import collections
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", nargs="?", default="gpt2_varlen_train")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    from workloads import WORKLOADS
    if args.workload not in WORKLOADS or WORKLOADS[args.workload].kind != "python":
        names = ", ".join(n for n, w in WORKLOADS.items() if w.kind == "python")
        sys.exit("ops_per_step.py: unknown python workload %r; choose one of: %s" % (args.workload, names))
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        sys.exit("ops_per_step.py: %s; run it with the python that has torch (on the GPU machine: python3)" % e)
    if not torch.cuda.is_available():
        sys.exit("ops_per_step.py: needs a CUDA device (run it on the GPU machine)")

    class Ctx:
        pass
    ctx = Ctx()
    ctx.device = torch.device("cuda")
    ctx.rng = random.Random(0)
    ctx.gen = torch.Generator().manual_seed(0)
    ctx.dry = False
    built = WORKLOADS[args.workload].build(ctx)
    for i in range(args.warmup):
        built.step(i)
    torch.cuda.synchronize()
    counts = []
    for i in range(args.warmup, args.warmup + args.steps):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            info = built.step(i)
            torch.cuda.synchronize()
        events = prof.events()
        per_thread = collections.Counter(e.thread for e in events)
        counts.append(len(events))
        print("step %d %s: %d profiled ops (%d threads: %s)" % (i, info, len(events), len(per_thread),
                                                               dict(per_thread)))
    print("median ops per step: %d" % sorted(counts)[len(counts) // 2])


if __name__ == "__main__":
    main()
