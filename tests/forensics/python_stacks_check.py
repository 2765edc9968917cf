#!/usr/bin/env python3
"""python_stacks: an OOM postmortem names the Python lines that hold the memory, with nothing but
oom_report_dir set (no _record_memory_history), and what gathering the stacks costs.

    python_stacks_check.py --lib build/torch/libgpumem_torch.so [--device cpu|cuda] [--bench]

Each case runs in a fresh interpreter (an allocator is installed once per process):
  auto      oom_report_dir alone (python_stacks:auto): tensors allocated in hold_memory() until the
            OOM; the postmortem report's per-site table names this file's line in hold_memory(),
            the snapshot's live blocks carry that frame
  off       python_stacks:False: no Python frames anywhere in the postmortem
  min_kb    python_stacks_min_kb above the tensors' size: no frames; the request itself, larger,
            has one
  bench     (--bench) alloc+free pairs of torch.empty from Python under oom_report_dir with
            python_stacks False, auto (default bound: allocations of at least 1 MiB) and auto with
            python_stacks_min_kb:0 (every allocation), for 4 KiB, 256 KiB and 4 MiB tensors, 30 Python frames deep: the calling thread's CPU ns per pair, median of 5
            rounds of 20000

--device cuda runs the same on the GPU (gpumem as torch's CUDA allocator through load_library,
memory_limit_mb caps it); --quick keeps the auto case and the bench (scripts/gpu/forensics.sh).
--device sim: gpumem's CUDA allocator on a simulated device (GPUMEM_ALLOW_SIM=1, no GPU), allocating
through its C API from a Python function: gpumem's snapshot file and torch.cuda.memory._snapshot()
both name that function's line on the live blocks. Exit status 0 only if every check passed.
"""
import argparse
import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile

def child(args):
    """Runs inside the fresh interpreter: installs gpumem, allocates until the OOM, prints JSON."""
    import torch
    device = args.device
    conf = args.conf
    if device == "cuda":
        os.environ["GPUMEM_ALLOC_CONF"] = conf
        torch.ops.load_library(args.lib)
    else:
        torch.ops.load_library(args.lib)
        torch.ops.gpumem.install_cpu(conf)

    def hold_memory(held, numel):
        while True:
            held.append(torch.empty(numel, dtype=torch.uint8, device=device))  # <- the line the report must name

    held = []
    error = ""
    try:
        hold_memory(held, args.tensor_kb * 1024)
    except Exception as e:  # torch.OutOfMemoryError (a RuntimeError)
        error = str(e)
    try:
        torch.empty(args.request_kb * 1024, dtype=torch.uint8, device=device)
    except Exception as e:
        error = error or str(e)
    print(json.dumps({"held": len(held), "error": error}))


def sim_child(args):
    """gpumem's CUDA allocator on a simulated device (no GPU): allocations through its C API from a
    Python function, then gpumem's snapshot file and torch.cuda.memory._snapshot() must both carry
    that function's frame on the live blocks."""
    import ctypes
    import torch
    os.environ["GPUMEM_ALLOC_CONF"] = args.conf
    os.environ["GPUMEM_ALLOW_SIM"] = "1"
    torch.ops.load_library(args.lib)
    so = ctypes.CDLL(args.lib)  # releases the GIL around the call: the gatherer takes it back
    so.gpumem_malloc.restype = ctypes.c_void_p
    so.gpumem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def hold_memory(held, numel):
        for _ in range(8):
            held.append(so.gpumem_malloc(numel, 0, None))  # <- the line the sim case must name

    held = []
    hold_memory(held, args.tensor_kb * 1024)
    path = os.path.join(args.out, "sim.pickle")
    torch.ops.gpumem.write_snapshot(torch.device("cuda", 0), path)
    torch_snap = torch.cuda.memory._snapshot()
    torch_frames = [b.get("frames", []) for seg in torch_snap["segments"] for b in seg["blocks"]
                    if b["state"] == "active_allocated"]
    print(json.dumps({"held": len(held), "path": path, "torch_frames": torch_frames}))


def bench_child(args):
    import torch
    if args.device == "cuda":
        os.environ["GPUMEM_ALLOC_CONF"] = args.conf
        torch.ops.load_library(args.lib)
    else:
        torch.ops.load_library(args.lib)
        torch.ops.gpumem.install_cpu(args.conf)
    out = {}

    def nested(depth, fn):  # a training loop calls allocations from some 30 frames deep
        return fn() if depth == 0 else nested(depth - 1, fn)

    nested(STACK_DEPTH, lambda: measure(torch, args, out))
    print(json.dumps(out))


STACK_DEPTH = 30


def measure(torch, args, out):
    import time
    for kb in (4, 256, 4096):
        numel = kb * 1024
        pairs = 20000
        for _ in range(200):
            torch.empty(numel, dtype=torch.uint8, device=args.device)
        rounds = []
        for _ in range(5):
            # The calling thread's CPU time: what the allocations cost it, less sensitive to other
            # processes on a shared machine than the wall clock.
            t0 = time.thread_time_ns()
            for _ in range(pairs):
                torch.empty(numel, dtype=torch.uint8, device=args.device)
            rounds.append((time.thread_time_ns() - t0) / pairs)
        rounds.sort()
        out[str(kb)] = rounds[len(rounds) // 2]


def run_child(lib, device, conf, tensor_kb=1024, request_kb=1024, bench=False, out=""):
    mode = "--child-bench" if bench else "--child-sim" if device == "sim" else "--child"
    cmd = [sys.executable, os.path.abspath(__file__), "--lib", lib, "--device", device, "--conf", conf,
           "--tensor-kb", str(tensor_kb), "--request-kb", str(request_kb), "--out", out, mode]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(name, None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


failures = []


def check(cond, msg):
    print(("ok: " if cond else "FAIL: ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def alloc_line(call="torch.empty"):
    with open(os.path.abspath(__file__)) as f:
        for n, line in enumerate(f, 1):
            if "# <- the line" in line and call + "(" in line:
                return n
    raise AssertionError("the tagged line is missing from this file")


def postmortem(directory):
    pickles = sorted(glob.glob(os.path.join(directory, "gpumem-oom-*.pickle")))
    texts = sorted(glob.glob(os.path.join(directory, "gpumem-oom-*.txt")))
    return pickles, texts


def block_frames(snapshot_path):
    with open(snapshot_path, "rb") as f:
        snap = pickle.load(f)
    frames = []
    for seg in snap.get("segments", []):
        for block in seg.get("blocks", []):
            if block.get("state") == "active_allocated":
                frames.append(block.get("frames", []))
    trace = [e for dev in snap.get("device_traces", []) for e in dev]
    return frames, trace


def names_site(frames, line):
    me = os.path.basename(__file__)
    return any(os.path.basename(fr.get("filename", "")) == me and fr.get("line") == line and
               fr.get("name") == "hold_memory" for fr in frames)


def case_auto(lib, device, limit_mb, line):
    with tempfile.TemporaryDirectory() as d:
        out = run_child(lib, device, f"oom_report_dir:{d},memory_limit_mb:{limit_mb}")
        check(out["held"] > 0 and out["error"] != "",
              f"auto: {out['held']} tensors, then the OOM" + ("" if out["held"] > 0 else f" ({out['error'][:300]})"))
        check("gpumem wrote an OOM report" in out["error"], "auto: the OOM message names the postmortem")
        pickles, texts = postmortem(d)
        check(len(pickles) >= 1 and len(texts) >= 1, f"auto: postmortem files written ({len(pickles)} pickles)")
        if not pickles:
            return
        text = open(texts[0]).read()
        site = f"{os.path.basename(__file__)}:{line}:hold_memory"
        check(site in text, f"auto: the report names {site}")
        frames, trace = block_frames(pickles[0])
        with_site = sum(1 for f in frames if names_site(f, line))
        check(with_site >= out["held"] - 1,
              f"auto: {with_site} of {len(frames)} live blocks carry the frame (held {out['held']})")
        allocs = [e for e in trace if e.get("action") == "alloc"]
        check(any(names_site(e.get("frames", []), line) for e in allocs), "auto: trace alloc entries carry the frame")


def case_sim(lib):
    line = alloc_line("so.gpumem_malloc")
    with tempfile.TemporaryDirectory() as d:
        out = run_child(lib, "sim", "source:sim,python_stacks:True", out=d)
        frames, trace = block_frames(out["path"])
        with_site = sum(1 for f in frames if names_site(f, line))
        check(with_site == out["held"] == 8, f"sim: {with_site} of {len(frames)} live blocks in gpumem's snapshot carry the frame")
        torch_site = sum(1 for f in out["torch_frames"] if names_site(f, line))
        check(torch_site == 8, f"sim: {torch_site} live blocks in torch.cuda.memory._snapshot() carry the frame")


def case_off(lib, device, limit_mb, line):
    with tempfile.TemporaryDirectory() as d:
        out = run_child(lib, device, f"oom_report_dir:{d},memory_limit_mb:{limit_mb},python_stacks:False")
        pickles, texts = postmortem(d)
        check(out["held"] > 0 and len(pickles) >= 1, "off: the OOM and its postmortem")
        if not pickles:
            return
        frames, _ = block_frames(pickles[0])
        me = os.path.basename(__file__)
        check(not any(os.path.basename(fr.get("filename", "")) == me for f in frames for fr in f),
              "off: python_stacks:False keeps no Python frame")
        check(f"{me}:{line}" not in open(texts[0]).read(), "off: the report names no Python line")


def case_min_kb(lib, device, limit_mb, line):
    with tempfile.TemporaryDirectory() as d:
        # 256 KiB tensors under a 512 KiB threshold gather nothing; the 1 MiB request after the OOM does.
        out = run_child(lib, device, f"oom_report_dir:{d},memory_limit_mb:{limit_mb},python_stacks_min_kb:512",
                        tensor_kb=256, request_kb=1024)
        pickles, _ = postmortem(d)
        check(out["held"] > 0 and len(pickles) >= 1, "min_kb: the OOM and its postmortem")
        if not pickles:
            return
        frames, _ = block_frames(pickles[0])
        check(not any(names_site(f, line) for f in frames), "min_kb: blocks below python_stacks_min_kb have no stack")


def bench(lib, device):
    """ns per alloc+free pair: oom_report_dir with python_stacks False, auto (its default bound:
    allocations of at least 1 MiB) and auto with python_stacks_min_kb:0 (every allocation); each in
    its own interpreter."""
    with tempfile.TemporaryDirectory() as d:
        modes = [("off", f"oom_report_dir:{d},python_stacks:False"), ("auto", f"oom_report_dir:{d}"),
                 ("min_kb:0", f"oom_report_dir:{d},python_stacks_min_kb:0")]
        got = {name: run_child(lib, device, conf, bench=True) for name, conf in modes}
    print(f"alloc+free pairs from Python on {device} (torch.empty, {STACK_DEPTH} frames deep, median of 5 rounds "
          "of 20000), thread CPU ns per pair:")
    print(f"{'size':>8} " + " ".join(f"{name:>12}" for name, _ in modes) + f" {'auto +ns':>9}")
    for kb in got["off"]:
        row = " ".join(f"{got[name][kb]:12.0f}" for name, _ in modes)
        print(f"{kb + ' KiB':>8} {row} {got['auto'][kb] - got['off'][kb]:9.0f}")
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "sim"],
                   help="sim: gpumem's CUDA allocator on a simulated device (GPUMEM_ALLOW_SIM), snapshots only")
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--child-sim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--limit-mb", type=int, default=64)
    p.add_argument("--bench", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="the auto case only, then the bench if asked (4 interpreters: the GPU run)")
    p.add_argument("--conf", default="", help=argparse.SUPPRESS)
    p.add_argument("--tensor-kb", type=int, default=1024, help=argparse.SUPPRESS)
    p.add_argument("--request-kb", type=int, default=1024, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-bench", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.child_bench:
        return bench_child(args)
    if args.child_sim:
        return sim_child(args)
    lib = os.path.abspath(args.lib)
    if not os.path.isfile(lib):
        print(f"FAIL: {lib} does not exist (build the gpumem_torch target)")
        return 1
    if args.device == "sim":
        case_sim(lib)
        print(f"python_stacks (sim): {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
        return 1 if failures else 0
    line = alloc_line()
    case_auto(lib, args.device, args.limit_mb, line)
    if not args.quick:
        case_off(lib, args.device, args.limit_mb, line)
        case_min_kb(lib, args.device, args.limit_mb, line)
    if args.bench:
        bench(lib, args.device)
    print(f"python_stacks ({args.device}): {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main() or 0)
