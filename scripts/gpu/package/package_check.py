#!/usr/bin/env python3
"""The installed gpumem Python package on a GPU (issue 16): import, gpumem.install(), a small
training loop, stats against torch's, a snapshot and its report, and an OOM whose postmortem
gpumem.report and the command-line tool (python -m gpumem, the console script) judge alike.

    PYTHONPATH=<site with the gpumem wheel> python package_check.py --out DIR [--site SITE]

Prints "ok: ..." / "FAIL: ..." per check; exit status 1 if any failed.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--site", default="")
    args = ap.parse_args()
    oom_dir = os.path.join(args.out, "oom")
    os.makedirs(oom_dir, exist_ok=True)
    t0 = time.time()

    import torch
    import gpumem

    check("torch" in sys.modules and not gpumem.is_installed(), f"import gpumem {gpumem.__version__} (not installed yet)")
    from gpumem import _build_info
    ships_pinned = bool(getattr(_build_info, "PINNED_ALLOCATOR", False))
    check(ships_pinned, "the wheel ships libgpumem_pinned_torch.so (gpumem._build_info.PINNED_ALLOCATOR)")
    config = {"oom_report_dir": oom_dir, "trace_entries": 50000}
    if ships_pinned:
        config["pinned_allocator"] = "gpumem"
    gpumem.install(config)
    check(gpumem.is_installed() and torch.cuda.get_allocator_backend() == "gpumem",
          "gpumem.install(): torch.cuda.get_allocator_backend() == 'gpumem'")
    if ships_pinned:
        # pinned_allocator:gpumem from the package: the library beside libgpumem_torch.so in the
        # package is loaded and installed as PyTorch's host allocator.
        pinned_path = os.path.join(os.path.dirname(gpumem.library_path()), "libgpumem_pinned_torch.so")
        with open("/proc/self/maps") as f:
            loaded = os.path.realpath(pinned_path) in f.read()
        check(loaded and bool(torch.ops.gpumem_pinned.installed()),
              f"pinned_allocator:gpumem: the package's {os.path.basename(pinned_path)} is loaded and installed")
        host = torch.empty(32 << 20, dtype=torch.uint8, pin_memory=True)
        torch.cuda.init()  # host_memory_stats() is {} until torch.cuda is initialized in Python
        hs = torch.cuda.host_memory_stats()
        check(host.is_pinned() and hs.get("allocated_bytes.current", 0) >= (32 << 20)
              and hs.get("active_requests.current", 0) >= 1,
              f"pin_memory=True through gpumem's pinned allocator (host_memory_stats: "
              f"{hs.get('allocated_bytes.current', 0) >> 20} MiB locked, {hs.get('active_requests.current', 0)} live)")
        dev_copy = host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        del host, dev_copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(20):
        x = torch.randn(64 + 16 * (step % 5), 512, device="cuda")
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    check(all(l == l for l in losses) and losses[-1] < losses[0],
          f"20 training steps (loss {losses[0]:.4f} -> {losses[-1]:.4f})")

    s = gpumem.stats()
    t = torch.cuda.memory_stats()
    check(s["allocated_bytes.all.current"] == t["allocated_bytes.all.current"] > 0,
          f"gpumem.stats() == torch.cuda.memory_stats() (allocated {s['allocated_bytes.all.current'] >> 20} MiB)")
    check(s["reserved_bytes.all.peak"] >= s["allocated_bytes.all.peak"] > 0, "peak reserved >= peak allocated")
    check(gpumem.stats(0)["allocation.all.allocated"] == s["allocation.all.allocated"], "gpumem.stats(0) is device 0")

    snap = gpumem.snapshot()
    check(len(snap["segments"]) > 0 and len(snap["device_traces"]) >= 1, f"gpumem.snapshot(): {len(snap['segments'])} segments")
    live = gpumem.report(snap)
    check(live["reserved_bytes"] >= live["allocated_bytes"] > 0 and not live["oom"],
          f"gpumem.report(snapshot): {live['allocated_bytes'] >> 20} MiB allocated, no OOM "
          f"(verdict at the {live['moment'].get('kind', 'peak')} moment: {live['verdict']})")
    torch_snap = torch.cuda.memory._snapshot()
    check(gpumem.report(torch_snap)["reserved_bytes"] > 0, "gpumem.report(torch.cuda.memory._snapshot()) reads torch's dict")

    # An OOM under a memory fraction: the postmortem lands in oom_report_dir.
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + (256 << 20)) / total)
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        check(False, "an OutOfMemoryError under a 256 MiB headroom")
    except torch.OutOfMemoryError as e:
        check("gpumem wrote an OOM report" in str(e), "OOM raised torch.OutOfMemoryError naming the postmortem")
    torch.cuda.set_per_process_memory_fraction(1.0)
    pickles = sorted(glob.glob(os.path.join(oom_dir, "*.pickle")))
    check(len(pickles) == 1, f"one OOM snapshot written ({pickles})")
    if pickles:
        verdict = gpumem.report(pickles[0]).get("verdict")
        check(verdict is not None, f"gpumem.report(oom snapshot) verdict: {verdict}")
        by_module = subprocess.run([sys.executable, "-m", "gpumem", "report", pickles[0], "--json"],
                                   capture_output=True, text=True, timeout=60)
        check(by_module.returncode == 0 and json.loads(by_module.stdout).get("verdict") == verdict,
              f"python -m gpumem report --json gives the same verdict ({by_module.stderr.strip()[:200]})")
        script = os.path.join(args.site, "bin", "gpumem") if args.site else ""
        if script and os.path.exists(script):
            env = dict(os.environ)
            by_script = subprocess.run([script, "report", pickles[0]], capture_output=True, text=True, timeout=60, env=env)
            check(by_script.returncode == 0 and len(by_script.stdout) > 100,
                  f"the gpumem console script prints the text report ({by_script.stderr.strip()[:200]})")
        with open(os.path.join(args.out, "oom_report.json"), "w") as f:
            f.write(by_module.stdout)
    print(f"package_check: {len(failures)} failed, {time.time() - t0:.1f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
