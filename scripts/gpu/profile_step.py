#!/usr/bin/env python3
"""Where a workload's CPU time goes, under one allocator: a sampling profile of its timed steps
(issue 13: "find where the time goes"; the GPU host has no perf).

One run in this process: the allocator is set up as scripts/gpu/live/live.py sets it up (PyTorch's
allocator, expandable segments, or gpumem loaded from --lib), the workload is built from
scripts/gpu/corpus/workloads.py (or the built-in `alloc_loop`), --warmup steps run unprofiled, then
libgpumem_sampler.so (bench/sampling_profiler.cpp) samples the process's CPU time during the timed
steps and writes its report to --out: the share of samples in the allocator (gpumem's or
PyTorch's), in the CUDA driver, in Python, and the top symbols. Run it once per allocator, each in
a fresh process (scripts/gpu/profile.sh does, alternating).

  python3 scripts/gpu/profile_step.py --workload gpt2_generate --mode gpumem \\
      --lib .gpu/build/torch/libgpumem_torch.so --sampler .gpu/build/bench/libgpumem_sampler.so \\
      --out gpumem.txt

`alloc_loop` (no transformers needed; --device cpu runs it on the CPU): a Python loop that
allocates and frees tensors of 64 sizes from 512 B to 4 MiB, 20,000 allocations a step, keeping 32
live: what a decoding loop asks of an allocator, without the model.
"""

import argparse
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "live"))
sys.path.insert(0, os.path.join(HERE, "corpus"))

MODES = ("native", "expandable", "gpumem")


def fail(msg):
    print("profile_step.py: " + msg, file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, help="a workload of scripts/gpu/corpus/workloads.py, or alloc_loop")
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--lib", help="libgpumem_torch.so (required with --mode gpumem)")
    p.add_argument("--sampler", required=True, help="libgpumem_sampler.so (bench/sampling_profiler.cpp)")
    p.add_argument("--out", required=True, help="the report's file")
    p.add_argument("--steps", type=int, help="timed steps (default: the workload's steps minus its warm-up)")
    p.add_argument("--warmup", type=int, help="steps run before sampling (default: the workload's warm-up)")
    p.add_argument("--hz", type=int, default=997, help="samples per second of process CPU time (default 997; "
                   "the kernel's tick may give fewer)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--groups", default="", help="the sampler's groups, NAME=PAT|PAT;... (default: its own)")
    args = p.parse_args(argv)
    if args.mode == "gpumem" and not args.lib:
        fail("--mode gpumem needs --lib PATH/libgpumem_torch.so (built on the CPU machine and carried)")
    if args.lib and not os.path.isfile(args.lib):
        fail("--lib %s does not exist" % args.lib)
    if not os.path.isfile(args.sampler):
        fail("--sampler %s does not exist (build the gpumem_sampler target: bench/libgpumem_sampler.so)" % args.sampler)
    for name in ("steps", "warmup"):
        v = getattr(args, name)
        if v is not None and v < (1 if name == "steps" else 0):
            fail("--%s %d: give %s" % (name, v, "at least 1" if name == "steps" else "0 or more"))
    if not 1 <= args.hz <= 100000:
        fail("--hz %d: give a rate in 1..100000" % args.hz)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        fail("--out %s: the directory %s does not exist" % (args.out, out_dir))
    return args


class AllocLoop:
    """The built-in workload (see the module docstring)."""
    steps, warmup = 6, 1

    def build(self, ctx):
        torch = ctx.torch
        sizes = [int(512 * (8192 ** (k / 63.0))) // 4 * 4 for k in range(64)]  # 512 B .. 4 MiB, geometric
        rng = ctx.rng
        device = ctx.device

        def step(i):
            live = []
            for _ in range(20000):
                live.append(torch.empty(rng.choice(sizes) // 4, dtype=torch.float32, device=device))
                if len(live) > 32:
                    live.pop(0)
            return {"allocations": 20000}
        import workloads
        return workloads.Built(step, "alloc_loop (no model)", {"sizes": "512 B..4 MiB, 64 sizes"}, {})


class Ctx:
    def __init__(self, torch, device, seed):
        import random
        self.torch = torch
        self.device = device
        self.dry = False
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.model_cache = None

    def observe(self, name, value):
        pass


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GPUMEM_ALLOC_CONF"):
        os.environ.pop(var, None)
    if args.mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if args.mode == "gpumem":
        os.environ["GPUMEM_ALLOC_CONF"] = ""  # set (even empty): the library installs itself on load, as live.py's runs do
    sampler = ctypes.CDLL(os.path.abspath(args.sampler))
    sampler.gpumem_sampler_start.argtypes = [ctypes.c_int, ctypes.c_long]
    sampler.gpumem_sampler_stop.restype = ctypes.c_long
    sampler.gpumem_sampler_report.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    sampler.gpumem_sampler_check_groups.argtypes = [ctypes.c_char_p]
    if sampler.gpumem_sampler_check_groups(args.groups.encode()) != 0:
        fail("--groups %r: give NAME=PATTERN[|PATTERN...] separated by ';' (the sampler's reason is above)"
             % args.groups)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "gpumem":
        import live
        live.load_gpumem(torch, {"gpumem_via": "lib", "lib": os.path.abspath(args.lib)})
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("no CUDA device is visible; --device cpu runs alloc_loop on the CPU")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if args.workload == "alloc_loop":
        w = AllocLoop()
    else:
        import workloads
        if args.workload not in workloads.WORKLOADS or workloads.WORKLOADS[args.workload].kind != "python":
            names = [n for n, w in workloads.WORKLOADS.items() if w.kind == "python"]
            fail("--workload %s: not a Python workload; choose alloc_loop or one of %s" % (args.workload, ", ".join(names)))
        w = workloads.WORKLOADS[args.workload]
    warmup = w.warmup if args.warmup is None else args.warmup
    steps = (w.steps - w.warmup if args.steps is None else args.steps)
    steps = max(1, steps)
    torch.manual_seed(args.seed)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    built = w.build(Ctx(torch, device, args.seed))
    sync()
    build_s = time.perf_counter() - t0
    for i in range(warmup):
        built.step(i)
    sync()
    allocs0 = torch.cuda.memory_stats(device).get("allocation.all.allocated") if device.type == "cuda" else None
    cpu0 = time.process_time()
    err = sampler.gpumem_sampler_start(args.hz, 300_000)
    if err != 0:
        fail("the sampler did not start: %s" % os.strerror(err))
    step_s = []
    for i in range(warmup, warmup + steps):
        ts = time.perf_counter()
        built.step(i)
        sync()
        step_s.append(time.perf_counter() - ts)
    kept = sampler.gpumem_sampler_stop()
    cpu_s = time.process_time() - cpu0
    allocs = None
    if allocs0 is not None:
        allocs = torch.cuda.memory_stats(device).get("allocation.all.allocated") - allocs0
    rc = sampler.gpumem_sampler_report(os.path.abspath(args.out).encode(), args.groups.encode())
    if rc != 0:
        fail("the sampler's report failed: %s" % os.strerror(rc))
    head = ("profile_step: %s under %s (backend %s), torch %s, %d threads; build %.1f s, %d warm-up step(s), "
            "%d timed step(s): %s s (sum %.3f s), process CPU %.3f s, %s allocations; %d samples\n"
            % (args.workload, args.mode, torch.cuda.get_allocator_backend() if device.type == "cuda" else "cpu",
               torch.__version__, torch.get_num_threads(), build_s, warmup, steps,
               " ".join("%.3f" % s for s in step_s), sum(step_s), cpu_s,
               "?" if allocs is None else str(allocs), kept))
    with open(args.out) as f:
        body = f.read()
    with open(args.out, "w") as f:
        f.write(head + body)
    print(head, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
