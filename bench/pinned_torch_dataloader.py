#!/usr/bin/env python3
"""The DataLoader-style workload (written by bench_pinned_dataloader --dump) and host-to-device copy
bandwidth through PyTorch's APIs: first with PyTorch's own pinned allocator, then (with --gpumem
LIB, libgpumem_pinned_torch.so) with gpumem's installed into the same process
(torch.ops.load_library + torch.ops.gpumem_pinned.install(): a late dlopen, which the jemalloc of
scripts/stage_jemalloc.sh allows without GLIBC_TUNABLES).

    python3 bench/pinned_torch_dataloader.py WORKLOAD_FILE... [--reps N] [--gpumem LIB]

The workload file: a line "window W lag L", then one line of request sizes (bytes) per step. Each
step pins one uint8 tensor per size (torch.empty(..., pin_memory=True)), writes into it, and keeps
W batches ahead; the oldest batch is copied to the GPU with non_blocking=True on a side stream (so
PyTorch records an event on each buffer) and dropped. Prints peak requested bytes, the allocator's
peak allocated_bytes (pinned memory it holds, free blocks included: torch.cuda.host_memory_stats()),
the ratio, the whole of host_memory_stats() after the workloads, and "RESULT ..." lines the GPU
script collects (one per workload and allocator).
Exit status: 0; 1 no device, or gpumem's allocator could not be installed; 2 bad input.
"""
import argparse
import collections
import os
import sys
import time

import torch


def bandwidth(src, dev, reps, stream):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        dev.copy_(src, non_blocking=True)
        start.record(stream)
        for _ in range(reps):
            dev.copy_(src, non_blocking=True)
        stop.record(stream)
    stop.synchronize()
    return src.numel() * reps / (start.elapsed_time(stop) * 1e6)


def run_workload(who, name, window, lag, steps, stream):
    torch.cuda.synchronize()
    torch._C._host_emptyCache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_host_memory_stats()
    dev = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    ahead = collections.deque()
    copying = collections.deque()
    live = peak = 0
    t0 = time.time()
    for i, sizes in enumerate(steps):
        batch = []
        for n in sizes:
            t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            t[: min(n, 1 << 16)].fill_(i & 0xFF)  # the collate writes
            batch.append(t)
            live += n
        peak = max(peak, live)
        ahead.append(batch)
        if len(ahead) > window:
            old = ahead.popleft()
            nbytes = 0
            with torch.cuda.stream(stream):
                for t in old:
                    for off in range(0, t.numel(), 64 << 20):
                        chunk = t[off : off + (64 << 20)]
                        dev[: chunk.numel()].copy_(chunk, non_blocking=True)
                    nbytes += t.numel()
            done = torch.cuda.Event()
            done.record(stream)
            copying.append((done, nbytes))
            del old, t, chunk  # the host buffers go back to the allocator, their events pending
        while copying and (len(copying) > lag or copying[0][0].query()):
            copying[0][0].synchronize()
            live -= copying[0][1]
            copying.popleft()
    torch.cuda.synchronize()
    seconds = time.time() - t0
    stats = torch.cuda.host_memory_stats()
    locked = stats.get("allocated_bytes.peak", 0)
    print(f"\n{who} pinned allocator through torch, workload {name}, {len(steps)} steps in {seconds:.2f} s")
    print(f"{'peak requested bytes':<26} {peak:>14}")
    print(f"{'peak locked bytes':<26} {locked:>14}")
    print(f"{'locked / requested':<26} {locked / peak:>14.3f}")
    print(f"{'host alloc calls':<26} {stats.get('num_host_alloc', 0):>14}")
    print(f"RESULT {who}_{name}_locked_over_requested={locked / peak:.3f} peak_requested={peak} peak_locked={locked}")


def bandwidth_table(who, reps, stream):
    print(f"\nhost-to-device copy bandwidth through torch, {who} pinned allocator, GB/s ({reps} copies each)")
    print(f"{'bytes':>10} {who + ' pinned':>14} {'pageable':>15}")
    for mb in (1, 16, 64, 256):
        n = mb << 20
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        pinned = torch.ones(n, dtype=torch.uint8, pin_memory=True)
        pageable = torch.ones(n, dtype=torch.uint8)
        p = bandwidth(pinned, dev, reps, stream)
        q = bandwidth(pageable, dev, max(2, reps // 4), stream)
        print(f"{n:>10} {p:>14.1f} {q:>15.1f}")
        print(f"RESULT {who}_h2d_gbps bytes={n} pinned={p:.1f} pageable={q:.1f}")
        del pinned, pageable, dev


def install_gpumem(lib):
    """gpumem's pinned allocator into this process, after PyTorch's served; None or why not."""
    # PyTorch's cached pinned blocks go back first; its blocks still alive keep their events
    # (gpumem passes record_event for them on to PyTorch's allocator).
    torch.cuda.synchronize()
    torch._C._host_emptyCache()
    try:
        torch.ops.load_library(lib)
    except OSError as e:
        return f"cannot load {lib}: {e.__cause__ or e}"
    try:
        torch.ops.gpumem_pinned.install()
    except RuntimeError as e:
        return f"torch.ops.gpumem_pinned.install() failed: {e}"
    if not torch.ops.gpumem_pinned.installed():
        return "torch.ops.gpumem_pinned.installed() is False after install()"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gpumem", metavar="LIB",
                    help="after PyTorch's allocator, install gpumem's from this library and measure again")
    args = ap.parse_args()
    workloads = []
    for path in args.workloads:
        with open(path) as f:
            head = f.readline().split()
            if len(head) != 4 or head[0] != "window" or head[2] != "lag":
                print(f"pinned_torch_dataloader: {path} does not start with 'window W lag L'", file=sys.stderr)
                return 2
            steps = [[int(x) for x in line.split()] for line in f if line.strip()]
        workloads.append((os.path.splitext(os.path.basename(path))[0], int(head[1]), int(head[3]), steps))
    if not torch.cuda.is_available():
        print("pinned_torch_dataloader: no CUDA device", file=sys.stderr)
        return 1

    stream = torch.cuda.Stream()
    for who in ["torch"] + (["gpumem"] if args.gpumem else []):
        if who == "gpumem":
            why = install_gpumem(args.gpumem)
            if why:
                print(f"pinned_torch_dataloader: {why}", file=sys.stderr)
                return 1
            print("\ngpumem's pinned allocator installed (torch.ops.gpumem_pinned.installed() is True)")
        bandwidth_table(who, args.reps, stream)
        for name, window, lag, steps in workloads:
            run_workload(who, name, window, lag, steps, stream)
        stats = torch.cuda.host_memory_stats()
        print(f"\ntorch.cuda.host_memory_stats() after the workloads, {who} pinned allocator:")
        for key in sorted(stats):
            print(f"  {key} = {stats[key]}")
        print(f"RESULT {who}_host_stats keys={len(stats)} allocated_bytes.peak={stats.get('allocated_bytes.peak', 0)} "
              f"num_host_alloc={stats.get('num_host_alloc', 0)} num_host_free={stats.get('num_host_free', 0)} "
              f"active_requests.allocated={stats.get('active_requests.allocated', 0)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
