#!/usr/bin/env python3
"""GPT-2 training under three allocators: step time and peak reserved vs peak requested.

    gpt2_train.py --lib build/torch/libgpumem_torch.so [--steps 30] [--batch 16]
                  [--min-seq 64] [--max-seq 1024] [--modes native,expandable,gpumem] [--out DIR]

GPT-2 (124M, transformers' GPT2LMHeadModel, random weights), AdamW, bf16 autocast, batch 16, a
sequence length drawn uniformly from [min-seq, max-seq] every step (the same lengths in every
mode). Modes, each in a fresh process:
  native      PyTorch's caching allocator as shipped
  expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  gpumem      gpumem installed on load (GPUMEM_ALLOC_CONF set, torch.ops.load_library)
Prints per mode the median step time (first 3 steps excluded), peak reserved, peak requested
(requested_bytes.all.peak) and their ratio; writes gpt2_train.json under --out if given.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def child(a):
    import random

    import torch

    if a.mode == "gpumem":
        torch.ops.load_library(a.lib)
        if torch.cuda.get_allocator_backend() != "gpumem":
            sys.exit(f"gpumem not installed: {torch.ops.gpumem.load_error()}")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(1234)
    lengths = [rng.randint(a.min_seq, a.max_seq) for _ in range(a.steps)]
    vocab = model.config.vocab_size
    times, losses = [], []
    for seq in lengths:
        ids = torch.randint(0, vocab, (a.batch, seq), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    s = torch.cuda.memory_stats()
    steady = sorted(times[3:]) if len(times) > 3 else sorted(times)
    result = {
        "mode": a.mode,
        "backend": torch.cuda.get_allocator_backend(),
        "steps": a.steps,
        "median_step_ms": steady[len(steady) // 2],
        "mean_step_ms": sum(steady) / len(steady),
        "peak_reserved": s["reserved_bytes.all.peak"],
        "peak_allocated": s["allocated_bytes.all.peak"],
        "peak_requested": s["requested_bytes.all.peak"],
        "num_device_alloc": s["num_device_alloc"],
        "num_alloc_retries": s["num_alloc_retries"],
        "final_loss": losses[-1],
    }
    result["reserved_over_requested"] = result["peak_reserved"] / result["peak_requested"]
    print("RESULT " + json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--min-seq", type=int, default=64)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--modes", default="native,expandable,gpumem")
    p.add_argument("--out", default=None)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mode:
        child(a)
        return
    lib = os.path.abspath(a.lib)
    envs = {
        "native": {},
        "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "gpumem": {"GPUMEM_ALLOC_CONF": ""},
    }
    results = []
    for mode in a.modes.split(","):
        if mode not in envs:
            sys.exit(f"gpt2_train: unknown mode '{mode}'; modes are native, expandable, gpumem")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "GPUMEM_ALLOC_CONF")}
        env.update(envs[mode])
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--lib", lib, "--steps", str(a.steps),
               "--batch", str(a.batch), "--min-seq", str(a.min_seq), "--max-seq", str(a.max_seq)]
        print(f"=== {mode}", flush=True)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"=== {mode}: FAILED (exit {proc.returncode})", flush=True)
            continue
        results.append(json.loads(lines[-1][len("RESULT "):]))
    gib = float(1 << 30)
    print(f"\nGPT-2 124M, batch {a.batch}, seq uniform {a.min_seq}..{a.max_seq}, {a.steps} steps, bf16 autocast")
    print(f"{'mode':12s} {'median ms':>10s} {'peak reserved GiB':>18s} {'peak requested GiB':>19s} {'reserved/requested':>19s}")
    for r in results:
        print(f"{r['mode']:12s} {r['median_step_ms']:10.1f} {r['peak_reserved'] / gib:18.3f} "
              f"{r['peak_requested'] / gib:19.3f} {r['reserved_over_requested']:19.4f}")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "gpt2_train.json"), "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if len(results) == len(a.modes.split(",")) else 1)


if __name__ == "__main__":
    main()
