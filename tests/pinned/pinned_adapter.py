#!/usr/bin/env python3
"""pinned_allocator:gpumem through the torch adapter, from Python, the way users reach it:
GPUMEM_ALLOC_CONF set, then torch.ops.load_library(libgpumem_torch.so) right after `import torch`.
libgpumem_torch.so installs the CUDA allocator and dlopens libgpumem_pinned_torch.so (a late
dlopen: no GLIBC_TUNABLES here, which is what the jemalloc of scripts/stage_jemalloc.sh allows).

    python3 tests/pinned/pinned_adapter.py --lib build/torch/libgpumem_torch.so [--gpumem-cli build/cli/gpumem]

Without a CUDA device (CI): the pinned library loads into the running interpreter, the install
then refuses with one sentence (no device) and says the CUDA allocator stayed installed; a missing
library refuses the whole install before anything changes. With a device (scripts/gpu/pinned.sh):
pin_memory(), torch.empty(pin_memory=True), DataLoader(pin_memory=True) and non_blocking copies go
through gpumem; a buffer freed while its copy is queued is not handed out again until the copy ran
(the copy reads the data it was given); torch.cuda.host_memory_stats() reports gpumem (once torch.cuda
is initialized: before, PyTorch returns {} whatever the allocator, as the PyTorch-pinned case shows,
while torch._C._cuda_hostMemoryStats() already reads gpumem's numbers); a snapshot
of pinned memory is written and `gpumem report --device -1` reads it.

Each case runs in a child interpreter (the configuration is read when the library loads). Prints
one line per check and "N passed, N failed[, N skipped]" last; exit status 1 on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile

RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


def check(ok, what):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    return ok


STATIC_TLS_TUNABLE = "glibc.rtld.optional_static_tls=16384"
NEEDS_TUNABLE = False  # --initial-exec-tls: the build carries Debian's jemalloc (initial-exec TLS)


def child(case, lib, env_extra, args=()):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("GLIBC_TUNABLES", None)
    if NEEDS_TUNABLE:
        env["GLIBC_TUNABLES"] = STATIC_TLS_TUNABLE
    env.update(env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--lib", lib, *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def loaded_libraries():
    with open("/proc/self/maps") as f:
        return f.read()


# ---------------------------------------------------------------- child side: prints KEY=VALUE lines


def child_main(case, lib, rest):
    import torch

    try:
        torch.ops.load_library(lib)
    except OSError as e:
        # A failed load-time install raises in Python (issue 15); the library stays loaded.
        print(f"load_raised={str(e.__cause__ or e)!r}")
    print(f"load_error={torch.ops.gpumem.load_error()!r}")
    print(f"cuda_installed={torch.ops.gpumem.installed()}")
    print(f"pinned_library_loaded={'libgpumem_pinned_torch.so' in loaded_libraries()}")
    try:
        print(f"pinned_installed={torch.ops.gpumem_pinned.installed()}")
    except (AttributeError, RuntimeError):
        print("pinned_installed=no-ops")
    if case == "gpu":
        return gpu_checks(torch, rest)
    if case == "gpu-native-pinned":
        return native_pinned_checks(torch)
    return 0


def flat_stats(nested, prefix=""):
    """torch._C._cuda_hostMemoryStats()'s nested dict as host_memory_stats() flattens it."""
    out = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update(flat_stats(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def native_pinned_checks(torch):
    """PyTorch's own pinned allocator (pinned_allocator:native): host_memory_stats() is {} before
    torch.cuda is initialized in Python there too; what gpumem's case relies on is PyTorch's rule."""
    a = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    before = torch.cuda.host_memory_stats()
    raw = flat_stats(torch._C._cuda_hostMemoryStats())
    torch.cuda.init()
    after = torch.cuda.host_memory_stats()
    print(f"CHECK PyTorch's pinned allocator: host_memory_stats() is {{}} until torch.cuda.init() "
          f"(before: {len(before)} keys, raw allocated_bytes.current {raw.get('allocated_bytes.current')}; "
          f"after: allocated_bytes.current {after.get('allocated_bytes.current')})="
          f"{a.is_pinned() and before == {} and after.get('allocated_bytes.current', 0) >= (64 << 20)}", flush=True)
    return 0


def gpu_checks(torch, rest):
    """Prints CHECK name=True/False lines; the parent counts them."""
    def say(name, ok):
        print(f"CHECK {name}={bool(ok)}", flush=True)

    # torch.cuda.host_memory_stats() is {} until torch.cuda is initialized in Python
    # (host_memory_stats_as_nested_dict() checks torch.cuda.is_initialized()), whatever the host
    # allocator, and pinning memory does not initialize it. The binding underneath,
    # torch._C._cuda_hostMemoryStats(), asks the installed HostAllocator (gpumem's) at any time.
    stats0 = torch._C._cuda_hostMemoryStats()
    n = 64 << 20
    a = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    say("torch.empty(pin_memory=True) is pinned", a.is_pinned())
    b = torch.arange(1000, dtype=torch.float32).pin_memory()
    say("pin_memory() is pinned and keeps the data", b.is_pinned() and bool((b == torch.arange(1000.0)).all()))
    raw = flat_stats(torch._C._cuda_hostMemoryStats())
    say("before torch.cuda.init(): torch._C._cuda_hostMemoryStats() counts gpumem's region and live blocks "
        f"(allocated_bytes.current {raw.get('allocated_bytes.current')}, "
        f"active_requests.current {raw.get('active_requests.current')})",
        raw.get("allocated_bytes.current", 0) >= n and raw.get("active_requests.current", 0) >= 2)
    say("before torch.cuda.init(): host_memory_stats() is {} (PyTorch's rule: torch.cuda is not initialized "
        f"by pinning memory; is_initialized() {torch.cuda.is_initialized()})",
        not torch.cuda.is_initialized() and torch.cuda.host_memory_stats() == {})
    stats0 = flat_stats(stats0)
    torch.cuda.init()
    s = torch.cuda.host_memory_stats()
    say("host_memory_stats counts gpumem's regions", s.get("allocated_bytes.current", 0) >= n
        and s.get("num_host_alloc", 0) > stats0.get("num_host_alloc", 0))
    say("host_memory_stats counts live blocks", s.get("active_requests.current", 0) >= 2)

    # Event semantics: a copy queued behind a long kernel reads a buffer the program then drops;
    # the next request of that size must not get the buffer (and overwrite it) before the copy ran.
    side = torch.cuda.Stream()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    a.fill_(1)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time
        dev.copy_(a, non_blocking=True)
    first = a.data_ptr()
    del a
    c = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    reused_early = c.data_ptr() == first
    c.fill_(2)
    side.synchronize()
    say("a block whose copy is pending is not handed out again", not reused_early)
    say("the copy read the data it was given", bool((dev[:: 1 << 20] == 1).all()) and int(dev.sum()) == n)
    second = c.data_ptr()
    del c
    torch.cuda.synchronize()
    regions = torch.cuda.host_memory_stats().get("num_host_alloc", 0)
    d = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    say("after the copy completed its block serves again (no new region)",
        d.data_ptr() in (first, second) and torch.cuda.host_memory_stats().get("num_host_alloc", 0) == regions)
    del d

    # DataLoader(pin_memory=True): its batches come from gpumem (active blocks while they live).
    ds = torch.utils.data.TensorDataset(torch.randn(256, 3, 32, 32), torch.arange(256))
    loader = torch.utils.data.DataLoader(ds, batch_size=64, pin_memory=True, num_workers=0)
    before = torch.cuda.host_memory_stats().get("active_requests.allocated", 0)
    ok = True
    for x, y in loader:
        ok &= x.is_pinned() and y.is_pinned()
        x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    after = torch.cuda.host_memory_stats().get("active_requests.allocated", 0)
    say("DataLoader(pin_memory=True) batches are pinned by gpumem", ok and after >= before + 8)

    torch._C._host_emptyCache()
    torch.cuda.synchronize()
    say("_host_emptyCache gives regions back", torch.cuda.host_memory_stats().get("allocated_bytes.current", 1)
        < (64 << 20))
    if rest:
        torch.ops.gpumem_pinned.dump_snapshot(rest[0])
        say("dump_snapshot wrote a file", os.path.getsize(rest[0]) > 0)
    return 0


# ---------------------------------------------------------------- parent side


def parse(out):
    kv = {}
    for line in out.splitlines():
        if "=" in line and not line.startswith("CHECK "):
            k, v = line.split("=", 1)
            kv[k.strip()] = v.strip()
    return kv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libgpumem_torch.so")
    ap.add_argument("--gpumem-cli", help="the gpumem command, to read the pinned snapshot back (GPU case)")
    ap.add_argument("--initial-exec-tls", action="store_true",
                    help="the build links Debian's jemalloc (initial-exec TLS, no scripts/stage_jemalloc.sh): "
                    "children start with GLIBC_TUNABLES=" + STATIC_TLS_TUNABLE)
    ap.add_argument("--child")
    ap.add_argument("rest", nargs="*")
    args = ap.parse_args()
    if args.child:
        return child_main(args.child, args.lib, args.rest)
    global NEEDS_TUNABLE
    NEEDS_TUNABLE = args.initial_exec_tls
    if NEEDS_TUNABLE:
        print(f"note: Debian's jemalloc (initial-exec TLS): the children start with GLIBC_TUNABLES={STATIC_TLS_TUNABLE}")
    if not os.path.exists(args.lib):
        print(f"pinned_adapter: {args.lib} does not exist (build target gpumem_torch)")
        return 1
    pinned_lib = os.path.join(os.path.dirname(os.path.abspath(args.lib)), "libgpumem_pinned_torch.so")
    check(os.path.exists(pinned_lib), f"libgpumem_pinned_torch.so is built beside libgpumem_torch.so ({pinned_lib})")

    import torch  # only to ask for a device; the cases run in children

    have_gpu = torch.cuda.is_available()
    # 1. A library that is not there: nothing is installed, the message names it and the fix.
    rc, out, err = child("missing", args.lib, {"GPUMEM_ALLOC_CONF": "source:sim,pinned_allocator:gpumem",
                                               "GPUMEM_PINNED_LIBRARY": "/nonexistent/libgpumem_pinned_torch.so"})
    kv = parse(out)
    check(rc == 0, f"missing library: the interpreter survives the load (rc {rc}) {err[-300:] if rc else ''}")
    check("/nonexistent/libgpumem_pinned_torch.so" in kv.get("load_error", "") and
          "Nothing was installed" in kv.get("load_error", ""), f"missing library: load_error names it: {kv.get('load_error')}")
    check(kv.get("cuda_installed") == "False", "missing library: the CUDA allocator was not installed either")
    check("/nonexistent/libgpumem_pinned_torch.so" in kv.get("load_raised", ""),
          f"missing library: the load raises in Python, naming it: {kv.get('load_raised')}")

    if not have_gpu:
        # 2. No device: the pinned library loads late into Python (no GLIBC_TUNABLES), then refuses.
        rc, out, err = child("cpu", args.lib, {"GPUMEM_ALLOC_CONF": "source:sim,pinned_allocator:gpumem"})
        kv = parse(out)
        check(rc == 0, f"no device: the interpreter survives the load (rc {rc}) {err[-300:] if rc else ''}")
        check(kv.get("pinned_library_loaded") == "True",
              "libgpumem_pinned_torch.so was dlopen'ed into a running interpreter "
              + ("(with GLIBC_TUNABLES: initial-exec TLS)" if NEEDS_TUNABLE else "without GLIBC_TUNABLES"))
        check("needs a CUDA device" in kv.get("load_error", "") and "CUDA allocator is installed" in
              kv.get("load_error", ""), f"no device: load_error says why and what stayed: {kv.get('load_error')}")
        check(kv.get("cuda_installed") == "True", "no device: the CUDA allocator (source:sim) is installed")
        check(kv.get("pinned_installed") == "False", "no device: torch.ops.gpumem_pinned.installed() is False")
        # 3. pinned_allocator:native (the default) never loads the pinned library.
        rc, out, err = child("cpu", args.lib, {"GPUMEM_ALLOC_CONF": "source:sim"})
        kv = parse(out)
        check(rc == 0 and kv.get("pinned_library_loaded") == "False" and kv.get("load_error") == "''",
              "pinned_allocator:native: libgpumem_pinned_torch.so is not loaded")
        RESULTS["skipped"] += 1
        print("skip the GPU cases: no CUDA device")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            snap = os.path.join(tmp, "pinned_snapshot.pickle")
            rc, out, err = child("gpu", args.lib,
                                 {"GPUMEM_ALLOC_CONF": "pinned_allocator:gpumem,trace_entries:100000"}, [snap])
            kv = parse(out)
            check(rc == 0, f"GPU: the child ran (rc {rc}) {err[-600:] if rc else ''}")
            gpu_out = out
            rc, out, err = child("gpu-native-pinned", args.lib, {"GPUMEM_ALLOC_CONF": "pinned_allocator:native"})
            check(rc == 0 and "CHECK " in out, f"GPU, PyTorch's pinned allocator: the child ran (rc {rc}) "
                  f"{err[-600:] if rc else ''}")
            out = gpu_out + "\n" + "\n".join(l for l in out.splitlines() if l.startswith("CHECK "))
            check(kv.get("load_error") == "''", f"GPU: installed on load, no error: {kv.get('load_error')}")
            check(kv.get("pinned_installed") == "True", "GPU: torch.ops.gpumem_pinned.installed()")
            for line in out.splitlines():
                if line.startswith("CHECK "):
                    name, _, value = line[6:].rpartition("=")
                    check(value == "True", f"GPU: {name}")
            if args.gpumem_cli and os.path.exists(snap):
                r = subprocess.run([args.gpumem_cli, "report", snap, "--device", "-1"], capture_output=True,
                                   text=True, timeout=120)
                check(r.returncode == 0 and "(pinned host," in r.stdout,
                      f"gpumem report --device -1 reads the pinned snapshot: {(r.stdout + r.stderr)[:300]}")
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed, {RESULTS['skipped']} skipped")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
