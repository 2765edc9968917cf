#!/usr/bin/env python3
"""A bad GPUMEM_ALLOC_CONF raises in Python when the real libgpumem_torch.so is loaded (issue 15).

The load-time install cannot throw out of dlopen; python_error.h queues a RuntimeError that
Python raises as torch.ops.load_library returns (torch wraps it in OSError "Could not load this
library" with gpumem's RuntimeError as the cause). The library is loaded all the same, PyTorch's
own allocators stay in use, and torch.ops.gpumem.load_error() keeps the text. Each case runs in a
fresh interpreter: the install runs once per process, at load.

  python3 tests/torch/bad_config_raises.py --lib build/torch/libgpumem_torch.so
Exit 0 when every case holds; 1 with what did not.
"""
import argparse
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import sys, torch
    lib = sys.argv[1]
    raised = None
    try:
        torch.ops.load_library(lib)
    except BaseException as e:  # OSError from torch, or gpumem's RuntimeError itself
        raised = e
    if raised is None:
        print("RAISED none")
    else:
        cause = raised if isinstance(raised, RuntimeError) else raised.__cause__
        print("RAISED", type(raised).__name__, "CAUSE", type(cause).__name__)
        print("MESSAGE", str(cause).replace("\\n", " "))
    print("LOAD_ERROR", torch.ops.gpumem.load_error().replace("\\n", " "))
    # PyTorch's own allocator still serves the process.
    t = torch.ones(1 << 20)
    print("SUM", int(t.sum().item()))
""")


def run(lib, conf):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if conf is not None:
        env["GPUMEM_ALLOC_CONF"] = conf
    done = subprocess.run([sys.executable, "-c", CHILD, lib], env=env, capture_output=True, text=True, timeout=300)
    fields = {}
    for line in done.stdout.splitlines():
        key, _, rest = line.partition(" ")
        fields[key] = rest
    return done, fields


def main():
    ap = argparse.ArgumentParser(description="A bad GPUMEM_ALLOC_CONF raises in Python at load.")
    ap.add_argument("--lib", required=True, help="path of libgpumem_torch.so")
    args = ap.parse_args()
    if not os.path.isfile(args.lib):
        print(f"bad_config_raises: {args.lib} does not exist (build the gpumem_torch target)")
        return 1
    failures = []
    cases = [
        # (config, words the message must hold)
        ("expandable_segmnts:True", ["GPUMEM_ALLOC_CONF", "unknown key 'expandable_segmnts'", "expandable_segments"]),
        ("garbage_collection_threshold:7", ["GPUMEM_ALLOC_CONF", "garbage_collection_threshold"]),
        ("max_split_size_mb:lots", ["GPUMEM_ALLOC_CONF", "max_split_size_mb"]),
    ]
    for conf, words in cases:
        done, f = run(args.lib, conf)
        what = f"GPUMEM_ALLOC_CONF={conf!r}"
        if done.returncode != 0:
            failures.append(f"{what}: the child failed ({done.returncode}): {done.stderr[-2000:]}")
            continue
        if not f.get("RAISED", "none").endswith("CAUSE RuntimeError"):
            failures.append(f"{what}: loading did not raise RuntimeError (got {f.get('RAISED')!r})")
        message = f.get("MESSAGE", "")
        for w in words + ["was not installed"]:
            if w not in message:
                failures.append(f"{what}: the raised message lacks {w!r}: {message!r}")
        if not f.get("LOAD_ERROR") or f.get("LOAD_ERROR") not in message:
            failures.append(f"{what}: load_error() does not hold the message: {f.get('LOAD_ERROR')!r}")
        if f.get("SUM") != str(1 << 20):
            failures.append(f"{what}: torch did not keep working after the raise: {f.get('SUM')!r}")
        print(f"{what}: raised {f.get('RAISED')}: ...{message[-150:]}")
    # Unset: nothing is installed at load, nothing raises.
    done, f = run(args.lib, None)
    if done.returncode != 0 or f.get("RAISED") != "none" or f.get("LOAD_ERROR", "x") != "":
        failures.append(f"GPUMEM_ALLOC_CONF unset: expected no raise and no load error, got {f} {done.stderr[-2000:]}")
    else:
        print("GPUMEM_ALLOC_CONF unset: no raise, load_error() empty")
    for line in failures:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
