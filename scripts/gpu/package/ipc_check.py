#!/usr/bin/env python3
"""CUDA IPC through unmodified torch.multiprocessing with gpumem (issue 16), on a GPU.

    PYTHONPATH=<site with the gpumem wheel> python ipc_check.py [--timeout S]

The parent installs gpumem and spawns two children at once:
  gpumem child   installs gpumem too. Receives three tensors the parent allocated through gpumem
                 (64 MiB over several 20 MiB pieces, a 1 KiB one from the small pool, a view with
                 a storage offset), checks their data, writes into one (the parent sees it), sends
                 back a tensor of its own (the parent checks it), and releases its references only
                 when told, so each side can check that the other's memory stays allocated while
                 shared and returns once released (torch.cuda.ipc_collect).
  native child   PyTorch's own allocator: receives a gpumem tensor (PyTorch's native consumer
                 reading gpumem's handle; needs pidfd_getfd, skipped with the reason if the system
                 refuses it) and sends one of its own (a cudaMalloc 'c' handle gpumem opens). Then
                 gpumem.install() there must refuse, CUDA having started.
Prints one line per check ("ok: ...", "FAIL: ...", "skip: ...") and exits non-zero on a failure.
"""
import argparse
import os
import queue
import sys
import time
import traceback

MIB = 1 << 20
CHILD_WAIT_S = 45  # a child waits this long for the parent's next message, then gives up
BIG = 64 * MIB // 4  # float32 elements


def log(*a):
    print(*a, flush=True)


def pattern(n, device, seed):
    import torch

    return (torch.arange(n, dtype=torch.float32, device=device) * 3 + seed).remainder_(1 << 20)


def gpumem_child(to_child, to_parent):
    """Runs in a spawned process: installs gpumem before anything touches CUDA."""
    try:
        import gpumem
        import torch

        gpumem.install()
        msg = to_child.get(timeout=CHILD_WAIT_S)
        big, small, view = msg["big"], msg["small"], msg["view"]
        ok_big = bool(torch.equal(big, pattern(BIG, "cuda", 1)))
        ok_small = bool(torch.equal(small, torch.full((256,), 7.0, device="cuda")))
        ok_view = bool(torch.equal(view, pattern(BIG, "cuda", 1)[1000:2000])) and view.storage_offset() == 1000
        small.mul_(2)  # written here, read by the parent
        torch.cuda.synchronize()
        mine = pattern(BIG // 4, "cuda", 5)
        torch.cuda.synchronize()
        before = gpumem.stats()["allocated_bytes.all.current"]
        to_parent.put({"ok": (ok_big, ok_small, ok_view), "mine": mine, "pid": os.getpid()})
        # Our own tensor: once the parent has read it we drop ours; it stays allocated here while
        # the parent holds it, and returns when the parent drops it.
        assert to_child.get(timeout=CHILD_WAIT_S) == "read mine"
        del mine
        torch.cuda.ipc_collect()
        held = gpumem.stats()["allocated_bytes.all.current"]
        to_parent.put({"child_held": held, "child_before": before})
        assert to_child.get(timeout=CHILD_WAIT_S) == "dropped mine"
        for _ in range(100):  # the parent's release reaches us through PyTorch's reference counting
            torch.cuda.ipc_collect()
            if gpumem.stats()["allocated_bytes.all.current"] <= before - (BIG // 4) * 4:
                break
            time.sleep(0.05)
        to_parent.put({"child_after": gpumem.stats()["allocated_bytes.all.current"]})
        # Hold the parent's tensors until told; then release them.
        assert to_child.get(timeout=CHILD_WAIT_S) == "release yours"
        del big, small, view, msg
        torch.cuda.synchronize()
        to_parent.put("released")
    except Exception:
        to_parent.put({"error": traceback.format_exc()})


def native_child(to_child, to_parent):
    """Runs in a spawned process on PyTorch's own allocator."""
    try:
        import torch

        try:  # the tensor is rebuilt (the handle opened) while the message is unpickled
            msg = to_child.get(timeout=CHILD_WAIT_S)
            t = msg["t"]
            result = {"read": bool(torch.equal(t, pattern(BIG // 8, "cuda", 9)))}
            del t, msg
        except Exception as e:
            result = {"read_error": f"{type(e).__name__}: {e}"}
        native = pattern(BIG // 8, "cuda", 11)
        torch.cuda.synchronize()
        result["native"] = native
        result["backend"] = torch.cuda.get_allocator_backend()
        import gpumem

        try:
            gpumem.install()
            result["late_install"] = "installed after CUDA started"
        except gpumem.InstallError as e:
            result["late_install"] = "refused: " + str(e)
        to_parent.put(result)
        assert to_child.get(timeout=CHILD_WAIT_S) == "done"
    except Exception:
        to_parent.put({"error": traceback.format_exc()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()

    import gpumem
    import torch
    import torch.multiprocessing as mp

    gpumem.install()
    failures = []

    def check(cond, what):
        log(("ok: " if cond else "FAIL: ") + what)
        if not cond:
            failures.append(what)

    ctx = mp.get_context("spawn")
    g_in, g_out, n_in, n_out = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    t0 = time.time()
    # Daemons: if the parent stops early, its children go with it.
    g = ctx.Process(target=gpumem_child, args=(g_in, g_out), daemon=True)
    n = ctx.Process(target=native_child, args=(n_in, n_out), daemon=True)
    g.start()
    n.start()

    def get(q, what):
        try:
            msg = q.get(timeout=args.timeout)
        except queue.Empty:
            raise SystemExit(f"FAIL: no answer from the {what} within {args.timeout} s")
        except Exception:
            raise SystemExit(f"FAIL: the {what}'s message could not be received (opening its CUDA tensors):\n"
                             + traceback.format_exc())
        if isinstance(msg, dict) and "error" in msg:
            raise SystemExit(f"FAIL: the {what} failed:\n{msg['error']}")
        return msg

    base = gpumem.stats()["allocated_bytes.all.current"]
    big = pattern(BIG, "cuda", 1)
    small = torch.full((256,), 7.0, device="cuda")
    view = big[1000:2000]
    for_native = pattern(BIG // 8, "cuda", 9)
    torch.cuda.synchronize()
    shared_bytes = gpumem.stats()["allocated_bytes.all.current"] - base
    g_in.put({"big": big, "small": small, "view": view})
    n_in.put({"t": for_native})

    # gpumem <-> gpumem
    reply = get(g_out, "gpumem child")
    ok_big, ok_small, ok_view = reply["ok"]
    check(ok_big, "gpumem child read a 64 MiB gpumem tensor (several pieces) with the right data")
    check(ok_small, "gpumem child read a small-pool tensor with the right data")
    check(ok_view, "gpumem child read a view with its storage offset")
    torch.cuda.synchronize()
    check(bool(torch.equal(small, torch.full((256,), 14.0, device="cuda"))), "the child's write is seen by the parent")
    mine = reply.pop("mine")  # the only reference: dropping it must release the child's memory
    check(bool(torch.equal(mine, pattern(BIG // 4, "cuda", 5))), "the parent read the gpumem child's tensor")
    g_in.put("read mine")
    lifetimes = get(g_out, "gpumem child")
    check(lifetimes["child_held"] >= lifetimes["child_before"],
          "the child's tensor stays allocated in the child after it drops it, while the parent holds it")
    del mine
    g_in.put("dropped mine")
    after = get(g_out, "gpumem child")["child_after"]
    check(after <= lifetimes["child_before"] - (BIG // 4) * 4,
          "and returns to the child's gpumem once the parent drops it")
    # Our tensors stay allocated while the child holds them, even after we drop ours.
    del big, small, view
    torch.cuda.ipc_collect()
    held = gpumem.stats()["allocated_bytes.all.current"] - base
    check(held >= shared_bytes - 8 * MIB, f"tensors the child holds stay allocated after the parent drops them "
          f"({held // MIB} MiB of {shared_bytes // MIB} MiB held)")
    g_in.put("release yours")
    assert get(g_out, "gpumem child") == "released"
    freed = False
    for _ in range(100):
        torch.cuda.ipc_collect()
        if gpumem.stats()["allocated_bytes.all.current"] - base <= (BIG // 8) * 4 + MIB:
            freed = True
            break
        time.sleep(0.05)
    check(freed, f"returned to gpumem once the child released them "
          f"({(gpumem.stats()['allocated_bytes.all.current'] - base) // MIB} MiB left, the native child's 8 MiB expected)")

    # gpumem <-> PyTorch's own allocator
    nat = get(n_out, "native child")
    check(nat["backend"] == "native", "the native child runs PyTorch's own allocator")
    if "read" in nat:
        check(nat["read"], "PyTorch's own allocator opened gpumem's handle (pidfd_getfd) with the right data")
    else:
        err = nat["read_error"]
        if "pidfd" in err and ("not permitted" in err or "Operation not permitted" in err or "ENOSYS" in err
                               or "not support" in err):
            log(f"skip: PyTorch's own allocator cannot take gpumem's descriptors here (pidfd_getfd refused): {err[:300]}")
        elif "handle type" in err or "illformed" in err or "ill-formed" in err:
            # The block lies on pieces of different sizes (pieces:adaptive): gpumem sends its own
            # type 'g', which PyTorch's header cannot express (docs/notes/cuda-ipc.md).
            log(f"skip: the block lies on pieces of different sizes (gpumem's 'g' handle), which PyTorch's "
                f"own allocator cannot open: {err[:300]}")
        else:
            check(False, f"PyTorch's own allocator opened gpumem's handle: {err[:500]}")
    check(bool(torch.equal(nat["native"], pattern(BIG // 8, "cuda", 11))),
          "gpumem opened a handle of PyTorch's own allocator (cudaIpc) with the right data")
    check(nat["late_install"].startswith("refused: gpumem.install() must run before CUDA is initialized"),
          f"gpumem.install() after CUDA started raises a clear InstallError ({nat['late_install'][:120]}...)")
    del nat
    n_in.put("done")
    g.join(timeout=30)
    n.join(timeout=30)
    log(f"ipc_check: {len(failures)} failed, children exited {g.exitcode} and {n.exitcode}, {time.time() - t0:.1f} s")
    return 1 if failures or g.exitcode != 0 or n.exitcode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
