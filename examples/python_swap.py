#!/usr/bin/env python3
"""gpumem in PyTorch, through each way in, with torch's own memory APIs reading it.

    python_swap.py --lib build/torch/libgpumem_torch.so [--mode MODE] [--out DIR]

Modes (each runs in a fresh process, since an allocator must be chosen before CUDA starts):
  load_library  GPUMEM_ALLOC_CONF set, then torch.ops.load_library(lib) right after `import torch`:
                gpumem becomes torch's CUDA allocator; torch.cuda.memory_stats() etc. report it.
  preload       the same through LD_PRELOAD=lib (no change to the program).
  pluggable     torch.cuda.memory.CUDAPluggableAllocator(lib, "gpumem_malloc", "gpumem_free") plus
                gpumem's record_stream / empty_cache / memory-fraction hooks; statistics come from
                torch.ops.gpumem.memory_stats (torch.cuda.memory_stats raises for pluggable
                allocators).
  cpu           torch.ops.gpumem.install_cpu(""): gpumem serves CPU tensors (needs no GPU).
  sim           load_library with source:sim (GPUMEM_ALLOW_SIM=1): gpumem's CUDA allocator on a
                simulated device (fake addresses, driven through gpumem_malloc/gpumem_free with
                ctypes); checks torch's statistics and snapshot APIs and memory_viz on any machine.
  all           every mode that this machine can run (the default).

Each mode trains a small transformer with a sequence length that changes every step, checks
record_stream, empty_cache (cudaMemGetInfo's free rises), a snapshot (its segments tile, its
trace replays consistently, and torch.cuda._memory_viz reads it), and prints memory_stats.
Exit status 0 only if every check passed.
"""
import argparse
import os
import subprocess
import sys
import time


def log(*args):
    print(*args, flush=True)


def fail(msg):
    log(f"FAIL: {msg}")
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    log(f"ok: {msg}")


KEYS = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
    "reserved_bytes.all.peak", "requested_bytes.all.peak", "active_bytes.all.peak", "allocation.all.allocated",
    "segment.all.current", "num_device_alloc", "num_device_free", "num_ooms", "num_alloc_retries",
]


def print_stats(title, stats):
    log(f"--- {title}: {len(stats)} keys")
    for k in KEYS:
        if k in stats:
            log(f"    {k:32s} {stats[k]:>16,d}")


def check_snapshot(snap, complete_trace=False):
    """What PyTorch's memory_viz needs (torch/cuda/_memory_viz.py and MemoryViz.js of PyTorch 2.11).

    complete_trace: the trace holds every event since the allocator started, so every free must
    follow its alloc and every allocation still live must be an active block."""
    check("segments" in snap and "device_traces" in snap, "snapshot has segments and device_traces")
    states = {"active_allocated", "active_pending_free", "inactive"}
    mapped = []
    for seg in snap["segments"]:
        total = sum(b["size"] for b in seg["blocks"])
        if total != seg["total_size"]:
            fail(f"segment at {seg['address']:#x}: blocks sum to {total}, segment is {seg['total_size']}")
        for b in seg["blocks"]:
            if b["state"] not in states:
                fail(f"block state {b['state']!r}")
            if b["requested_size"] > b["size"]:
                fail(f"block requested {b['requested_size']} > size {b['size']}")
        mapped.append((seg["address"], seg["address"] + seg["total_size"]))
    log(f"ok: {len(snap['segments'])} segments, each tiled by its blocks")
    mapped.sort()
    for (a0, a1), (b0, b1) in zip(mapped, mapped[1:]):
        if b0 < a1:
            fail(f"segments overlap: [{a0:#x},{a1:#x}) and [{b0:#x},{b1:#x})")

    # Replay the trace backwards from the segments, as "Allocator State History" does: every
    # segment_map/alloc must undo a mapped range, every segment_unmap/free a hole.
    def covered(lo, hi):
        return any(a <= lo and hi <= b for a, b in mapped)

    def remove(lo, hi):
        for i, (a, b) in enumerate(mapped):
            if a <= lo and hi <= b:
                mapped[i:i + 1] = [r for r in ((a, lo), (hi, b)) if r[0] < r[1]]
                return
        fail(f"trace: range [{lo:#x},{hi:#x}) was not mapped when the trace says it became mapped")

    def coalesce():
        mapped.sort()
        merged = []
        for a, b in mapped:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        mapped[:] = merged

    def add(lo, hi):
        for a, b in mapped:
            if lo < b and a < hi:
                fail(f"trace: range [{lo:#x},{hi:#x}) overlaps mapped memory when the trace says it was unmapped")
        mapped.append((lo, hi))
        coalesce()

    coalesce()

    active = {}
    for seg in snap["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                active[addr] = b
            addr += b["size"]
    for dev, entries in enumerate(snap["device_traces"]):
        if complete_trace:
            live = {}
            for e in entries:
                if e["action"] == "alloc":
                    if e["addr"] in live:
                        fail(f"trace: alloc at {e['addr']:#x} while a block is live there")
                    live[e["addr"]] = e["size"]
                elif e["action"] == "free_completed":
                    if live.pop(e["addr"], None) is None:
                        fail(f"trace: free_completed at {e['addr']:#x} without an alloc")
            for addr, size in live.items():
                if addr not in active or active[addr]["size"] != size:
                    fail(f"trace: block {addr:#x} allocated in the trace but not active in the segments")
            log(f"ok: device {dev}: allocs and frees pair up; {len(live)} live blocks match the segments")
        for e in reversed(entries):
            act, lo = e["action"], e.get("addr", 0)
            hi = lo + e["size"]
            if act in ("segment_map", "segment_alloc"):
                remove(lo, hi)
            elif act in ("segment_unmap", "segment_free"):
                add(lo, hi)
            elif act == "alloc" and not covered(lo, hi):
                fail(f"trace: alloc at {lo:#x} outside mapped memory")
        n = len(entries)
        log(f"ok: device {dev}: {n} trace entries replay consistently")


def workload(device, steps=12):
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True).to(device)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        seq = 16 + (step * 37) % 200
        x = torch.randn(8, seq, 128, device=device)
        loss = layer(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def cuda_checks(lib, stats_fn, out):
    import torch

    dev = torch.device("cuda", 0)
    losses = workload(dev)
    check(all(l == l for l in losses), f"training ran ({len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f})")

    # record_stream: a block freed while a side stream reads it is not reused early.
    side = torch.cuda.Stream()
    bad = 0
    results = []
    for i in range(50):
        x = torch.full((1 << 20,), float(i), device=dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200000)
            results.append((i, (x * 2).sum()))
        x.record_stream(side)
        del x
        for _ in range(3):
            torch.full((1 << 20,), -1.0, device=dev)
    torch.cuda.synchronize()
    for i, r in results:
        bad += abs(r.item() - 2.0 * i * (1 << 20)) > 1e-3 * (1 + 2.0 * i * (1 << 20))
    check(bad == 0, "record_stream: data read on the side stream is intact")

    # empty_cache returns memory to the driver.
    big = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    big.fill_(1)
    del big
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    check(free_after >= free_before + (1900 << 20),
          f"empty_cache: mem_get_info free rose by {(free_after - free_before) >> 20} MiB")

    stats = stats_fn()
    print_stats("memory_stats", stats)
    check(stats["allocation.all.allocated"] > 100, "memory_stats counts the allocations")
    check(stats["reserved_bytes.all.peak"] >= stats["allocated_bytes.all.peak"] > 0, "peak reserved >= peak allocated")
    return stats


def snapshot_checks(out, tag):
    import torch
    from torch.cuda import _memory_viz

    torch.cuda.memory._record_memory_history(max_entries=200000)
    workload(torch.device("cuda", 0), steps=4)
    keep = [torch.empty(n, device="cuda") for n in (1000, 300000, 5000000)]
    snap = torch.cuda.memory._snapshot()
    check_snapshot(snap)
    text = _memory_viz.segsum(snap)
    check("total_reserved" in text, "torch.cuda._memory_viz.segsum reads the snapshot")
    _memory_viz.trace(snap)
    html = _memory_viz.trace_plot(snap)
    check(len(html) > 1000, "torch.cuda._memory_viz.trace_plot renders it")
    if out:
        os.makedirs(out, exist_ok=True)
        torch.cuda.memory._dump_snapshot(os.path.join(out, f"snapshot_{tag}.pickle"))
        with open(os.path.join(out, f"snapshot_{tag}.html"), "w") as f:
            f.write(_memory_viz.segment_plot(snap))
        log(f"wrote {out}/snapshot_{tag}.pickle and .html")
    torch.cuda.memory._record_memory_history(enabled=None)
    del keep


def mode_load_library(lib, out, preloaded=False):
    import torch

    if not preloaded:
        torch.ops.load_library(lib)
    check(torch.ops.gpumem.load_error() == "", "gpumem installed itself on load (no load error)")
    check(torch.ops.gpumem.installed(), "torch.ops.gpumem.installed()")
    check(torch.cuda.get_allocator_backend() == "gpumem", "torch.cuda.get_allocator_backend() == 'gpumem'")
    cuda_checks(lib, torch.cuda.memory_stats, out)
    stats = torch.cuda.memory_stats()  # now: cuda_checks freed its tensors after its own reading
    check(torch.cuda.memory_allocated() == stats["allocated_bytes.all.current"], "memory_allocated()")
    check(torch.cuda.max_memory_reserved() == stats["reserved_bytes.all.peak"], "max_memory_reserved()")
    torch.cuda.reset_peak_memory_stats()
    check(torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated(), "reset_peak_memory_stats()")
    log(torch.cuda.memory_summary(abbreviated=True))
    # OOM under a memory fraction, then recovery.
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + (512 << 20)) / total)
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        fail("no OutOfMemoryError under a 512 MiB headroom")
    except torch.OutOfMemoryError as e:
        check(str(e).startswith("CUDA out of memory. Tried to allocate"), "OOM raises torch.OutOfMemoryError")
    ok = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del ok
    torch.cuda.set_per_process_memory_fraction(1.0)
    check(torch.cuda.memory_stats()["num_ooms"] >= 1, "num_ooms counted, and allocation recovered")
    snapshot_checks(out, "preload" if preloaded else "load_library")
    # Private pools are gpumem's too (scripts/gpu/graphs.sh checks graphs and pools in depth).
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.ones(1 << 20, device="cuda")
    check(float(x.sum()) == float(1 << 20) and pool.use_count() >= 1, "MemPool: an allocation inside use_mem_pool")
    del x, pool


def mode_pluggable(lib, out):
    import ctypes
    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "gpumem_malloc", "gpumem_free")
    so = ctypes.CDLL(lib)

    def fn(name):
        return ctypes.cast(getattr(so, name), ctypes.c_void_p).value

    alloc.allocator().set_record_stream_fn(fn("gpumem_record_stream"))
    alloc.allocator().set_reset_fn(fn("gpumem_empty_cache"))
    alloc.allocator().set_memory_fraction_fn(fn("gpumem_set_memory_fraction"))
    torch.cuda.memory.change_current_allocator(alloc)
    torch.ops.load_library(lib)  # for torch.ops.gpumem.memory_stats
    check(torch.cuda.get_allocator_backend() == "pluggable", "CUDAPluggableAllocator active")
    try:
        torch.cuda.memory_stats()
        log("note: torch.cuda.memory_stats() answered under a pluggable allocator")
    except RuntimeError as e:
        log(f"note: torch.cuda.memory_stats() under CUDAPluggableAllocator: {str(e).splitlines()[0]}")
    dev = torch.device("cuda", 0)

    def stats_fn():
        return dict(torch.ops.gpumem.memory_stats(dev))

    cuda_checks(lib, stats_fn, out)


def mode_cpu(lib, out):
    import torch

    torch.ops.load_library(lib)
    torch.ops.gpumem.install_cpu("")
    cpu = torch.device("cpu")
    before = dict(torch.ops.gpumem.memory_stats(cpu))
    t = torch.empty(1 << 20, dtype=torch.float32)
    during = dict(torch.ops.gpumem.memory_stats(cpu))
    check(during["requested_bytes.all.current"] - before["requested_bytes.all.current"] == 4 << 20,
          "a 4 MiB CPU tensor shows in torch.ops.gpumem.memory_stats('cpu')")
    del t
    losses = workload(cpu, steps=4)
    check(losses[-1] == losses[-1], f"CPU training on gpumem ({len(losses)} steps)")
    after = dict(torch.ops.gpumem.memory_stats(cpu))
    print_stats("memory_stats (cpu)", after)
    check(after["allocation.all.allocated"] > before["allocation.all.allocated"] + 100, "CPU allocations counted")
    check(after["requested_bytes.all.current"] == before["requested_bytes.all.current"], "all freed again")


def mode_sim(lib, out):
    import ctypes
    import random

    import torch
    from torch.cuda import _memory_viz

    torch.ops.load_library(lib)
    check(torch.ops.gpumem.load_error() == "", "gpumem installed itself on load (simulated device)")
    check(torch.cuda.get_allocator_backend() == "gpumem", "torch.cuda.get_allocator_backend() == 'gpumem'")
    so = ctypes.CDLL(lib)
    so.gpumem_malloc.restype = ctypes.c_void_p
    so.gpumem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    so.gpumem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    so.gpumem_empty_cache.argtypes = []

    def stats():  # torch.cuda.memory_stats() answers {} until CUDA is initialized; ask torch's C API
        out = {}

        def flatten(prefix, v):
            if isinstance(v, dict):
                for k, x in v.items():
                    flatten(f"{prefix}.{k}" if prefix else k, x)
            else:
                out[prefix] = v
        flatten("", torch._C._cuda_memoryStats(0))
        return out

    # A window of 256 live allocations, log-uniform 512 B..32 MiB, a random slot replaced per step.
    rng = random.Random(5)
    sizes = lambda: int(2 ** rng.uniform(9, 25))
    live = {}
    for _ in range(256):
        n = sizes()
        live[so.gpumem_malloc(n, 0, None)] = n
    for step in range(3000):
        p = rng.choice(list(live))
        so.gpumem_free(p, live.pop(p), 0, None)
        n = sizes()
        live[so.gpumem_malloc(n, 0, None)] = n
    s = stats()
    print_stats("torch._C._cuda_memoryStats(0), flattened", s)
    ours = dict(torch.ops.gpumem.memory_stats(torch.device("cuda", 0)))
    check(all(ours[k] == v for k, v in s.items() if k in ours), "torch's and gpumem's statistics agree")
    check(s["allocation.all.current"] == len(live), "allocation.all.current == live allocations")
    check(s["requested_bytes.all.current"] == sum(live.values()), "requested_bytes.all.current == bytes requested")
    check(s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"] >= s["requested_bytes.all.current"],
          "reserved >= allocated >= requested")

    snap = torch.cuda.memory._snapshot()
    check_snapshot(snap, complete_trace=True)
    check(sum(len(t) for t in snap["device_traces"]) > 6000, "the trace holds the run")
    text = _memory_viz.segsum(snap)
    check("total_reserved" in text, "torch.cuda._memory_viz.segsum reads the snapshot")
    _memory_viz.trace(snap)
    check(len(_memory_viz.trace_plot(snap)) > 1000, "torch.cuda._memory_viz.trace_plot renders it")
    check(len(_memory_viz.segment_plot(snap)) > 1000, "torch.cuda._memory_viz.segment_plot renders it")

    for p, n in list(live.items()):
        so.gpumem_free(p, n, 0, None)
    live.clear()
    before = stats()["reserved_bytes.all.current"]
    so.gpumem_empty_cache()
    after = stats()
    check(after["reserved_bytes.all.current"] < before and after["allocated_bytes.all.current"] == 0,
          f"empty_cache released {before - after['reserved_bytes.all.current']} bytes")
    snap = torch.cuda.memory._snapshot()
    check_snapshot(snap, complete_trace=True)
    if out:
        os.makedirs(out, exist_ok=True)
        torch.cuda.memory._dump_snapshot(os.path.join(out, "snapshot_sim.pickle"))


def run_child(mode, lib, out, extra_env):
    env = dict(os.environ)
    env.pop("GPUMEM_ALLOC_CONF", None)
    env.update(extra_env)
    cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--lib", lib, "--child"]
    if out:
        cmd += ["--out", out]
    log(f"=== {mode}: {' '.join(f'{k}={v}' for k, v in extra_env.items())} {' '.join(cmd[1:])}")
    t0 = time.time()
    rc = subprocess.call(cmd, env=env)
    log(f"=== {mode}: {'passed' if rc == 0 else 'FAILED'} in {time.time() - t0:.1f} s")
    return rc


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="path to libgpumem_torch.so")
    p.add_argument("--mode", default="all", choices=["all", "load_library", "preload", "pluggable", "cpu", "sim"])
    p.add_argument("--out", default=None, help="directory for snapshots (pickle + html)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    lib = os.path.abspath(a.lib)
    if not os.path.exists(lib):
        fail(f"--lib {lib} does not exist; build the gpumem_torch target first")

    if a.mode == "all" or (not a.child and a.mode in ("load_library", "preload", "sim")):
        import torch  # only to ask whether there is a GPU; children choose allocators

        modes = ["load_library", "preload", "pluggable", "cpu", "sim"] if torch.cuda.is_available() else ["cpu", "sim"]
        if a.mode != "all":
            modes = [a.mode]
        envs = {
            "load_library": {"GPUMEM_ALLOC_CONF": "expandable_segments:True"},
            "preload": {"GPUMEM_ALLOC_CONF": "expandable_segments:True", "LD_PRELOAD": lib},
            "pluggable": {},
            "cpu": {},
            "sim": {"GPUMEM_ALLOC_CONF": "source:sim,memory_limit_mb:65536,trace_entries:1000000",
                    "GPUMEM_ALLOW_SIM": "1"},
        }
        failed = [m for m in modes if run_child(m, lib, a.out, envs[m]) != 0]
        log(f"python_swap: {len(modes) - len(failed)} passed, {len(failed)} failed")
        sys.exit(1 if failed else 0)

    if a.mode == "load_library":
        mode_load_library(lib, a.out)
    elif a.mode == "preload":
        mode_load_library(lib, a.out, preloaded=True)
    elif a.mode == "pluggable":
        mode_pluggable(lib, a.out)
    elif a.mode == "cpu":
        mode_cpu(lib, a.out)
    elif a.mode == "sim":
        mode_sim(lib, a.out)
    log(f"{a.mode}: all checks passed")


if __name__ == "__main__":
    main()
