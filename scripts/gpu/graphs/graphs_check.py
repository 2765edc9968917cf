"""CUDA graphs and memory pools under gpumem, side by side with PyTorch's native allocator (issue 16).

One process per allocator (the allocator is chosen before CUDA starts), then a comparison:

    graphs_check.py run --allocator native --out DIR [--device cuda] [--steps 8]
    graphs_check.py run --allocator gpumem --lib PATH/libgpumem_torch.so --out DIR
    graphs_check.py compare DIR          (prints the table; exit 0 only if every check passed)

A run does, in order, and records every result in DIR/<allocator>.json (outputs in DIR/<allocator>.pt):

  capture   torch.cuda.graph: a small MLP captured, replayed on three inputs (outputs kept); a
            second graph sharing the first one's pool; the pool's segments tagged with its id in
            torch.cuda.memory_snapshot(); after the graphs and their tensors are deleted and
            empty_cache runs, reserved memory is back where it was before the capture.
  graphed   torch.cuda.make_graphed_callables on the MLP: forward + backward, gradients kept.
  mempool   torch.cuda.MemPool + use_mem_pool: data written in the pool reads back; allocations
            after the context go to the default pool; use_count inside and after the context; the
            pool's snapshot holds only its segments; its memory stays while the pool lives and
            returns after the pool is deleted and empty_cache runs.
  compile   torch.compile(mode="reduce-overhead") trains a small transformer for --steps steps
            (with --compile-warmup, after one unmeasured pass: both allocators measured on a warm
            inductor cache)
            (cudagraph trees), then an evaluation forward (a new graph while the training path is
            live: the allocator's checkpoint is restored), then two more training steps; losses and
            peak reserved memory are recorded; after torch._dynamo.reset() and empty_cache the
            memory left is recorded.

--device cpu is the dry run of this machine-independent part (no GPU here): every check that needs
CUDA is recorded as skipped, the compile part runs on the CPU (reduce-overhead without graphs).
Every failure is recorded with its exception and traceback, and the run goes on with the next part.
"""
import argparse
import gc
import json
import os
import sys
import time
import traceback


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run every check under one allocator")
    run.add_argument("--allocator", choices=("native", "gpumem"), required=True)
    run.add_argument("--lib", help="libgpumem_torch.so (required for --allocator gpumem)")
    run.add_argument("--out", required=True, help="directory for <allocator>.json and <allocator>.pt")
    run.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the dry run")
    run.add_argument("--steps", type=int, default=8, help="reduce-overhead training steps before the eval")
    run.add_argument("--compile-warmup", action="store_true",
                     help="run the compile part once unmeasured first (same shapes), so the measured run "
                     "compiles from a warm inductor cache whichever allocator runs first: a cold compile "
                     "autotunes kernels at their first call and allocates memory for it")
    run.add_argument("--snapshot-dir", help="also write <allocator>_compile.pickle there: "
                     "torch.cuda.memory._dump_snapshot() at the end of the reduce-overhead training")
    run.add_argument("--parts", default="capture,graphed,mempool,compile",
                     help="comma-separated subset of capture,graphed,mempool,compile")
    cmp = sub.add_parser("compare", help="compare DIR/native.json with DIR/gpumem.json")
    cmp.add_argument("dir")
    cmp.add_argument("--loss-rtol", type=float, default=1e-4,
                     help="largest relative loss difference accepted (bitwise equality is reported too)")
    cmp.add_argument("--out-atol", type=float, default=1e-5,
                     help="largest absolute output difference accepted for the captured graphs")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.allocator == "gpumem" and not args.lib:
            ap.error("--allocator gpumem needs --lib PATH/libgpumem_torch.so")
        if args.steps < 4:
            ap.error("--steps must be at least 4 (cudagraph trees warm up, record, then replay)")
        unknown = set(args.parts.split(",")) - {"capture", "graphed", "mempool", "compile"}
        if unknown:
            ap.error("unknown part(s) %s in --parts" % ",".join(sorted(unknown)))
    return args


MiB = 1 << 20


# ---------------------------------------------------------------------------------------- run

def load_allocator(torch, args):
    """Installs gpumem (before any CUDA call) and checks that it is torch's CUDA allocator."""
    if args.allocator != "gpumem":
        return "native"
    if not os.path.isfile(args.lib):
        raise SystemExit("no libgpumem_torch.so at %r (built on the CPU machine and staged in BUILD/torch/)" % args.lib)
    os.environ.setdefault("GPUMEM_ALLOC_CONF", "")
    torch.ops.load_library(args.lib)
    if args.device == "cpu":
        return "gpumem (loaded; CPU dry run: not exercised)"
    backend = torch.cuda.get_allocator_backend()
    if backend != "gpumem":
        try:
            why = torch.ops.gpumem.load_error()
        except Exception as err:  # noqa: BLE001 - the library may not have registered its ops
            why = "torch.ops.gpumem.load_error() is unavailable: %s" % err
        raise SystemExit("gpumem is not torch's CUDA allocator after loading %s (backend %r): %s"
                         % (args.lib, backend, why or "no load error was recorded"))
    return backend


def reserved(torch, dev):
    return torch.cuda.memory_reserved(dev) if dev.type == "cuda" else 0


def settle(torch, dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def pool_segments(torch, pool_id, snap=None):
    snap = torch.cuda.memory_snapshot() if snap is None else snap
    want = tuple(pool_id)
    return [s for s in snap if tuple(s.get("segment_pool_id", (0, 0))) == want]


def pool_breakdown(torch):
    """Reserved and allocated MiB and segment counts per pool and segment type, from
    torch.cuda.memory_snapshot(): where the reserved memory is (the default pool is "0,0")."""
    out = {}
    for seg in torch.cuda.memory_snapshot():
        key = "%s,%s %s" % (*tuple(seg.get("segment_pool_id", (0, 0))), seg.get("segment_type", "?"))
        e = out.setdefault(key, {"segments": 0, "reserved_mib": 0.0, "allocated_mib": 0.0, "largest_mib": 0.0})
        e["segments"] += 1
        e["reserved_mib"] += seg["total_size"] / MiB
        e["largest_mib"] = max(e["largest_mib"], seg["total_size"] / MiB)
        e["allocated_mib"] += sum(b["size"] for b in seg.get("blocks", ()) if b.get("state") == "active_allocated") / MiB
    return {k: {f: (round(v, 2) if isinstance(v, float) else v) for f, v in e.items()} for k, e in sorted(out.items())}


def in_segments(ptr, segments):
    return any(s["address"] <= ptr < s["address"] + s["total_size"] for s in segments)


def make_mlp(torch, dev):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                               torch.nn.GELU(), torch.nn.Linear(1024, 64)).to(dev)


def part_capture(torch, dev, rec, tensors):
    model = make_mlp(torch, dev).eval()
    inputs = [torch.randn(32, 256, device=dev, generator=None) for _ in range(3)]
    with torch.no_grad():
        eager = [model(x).clone() for x in inputs]
    tensors["capture_eager"] = [t.cpu() for t in eager]
    if dev.type != "cuda":
        rec["skipped"] = "needs CUDA (dry run: eager outputs only)"
        return
    static_in = torch.zeros(32, 256, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graph's documentation asks
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    # The baseline after the warm-up (it made the side stream's cuBLAS workspace, which stays).
    settle(torch, dev)
    rec["reserved_before_mib"] = reserved(torch, dev) / MiB
    g1 = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g1):
        static_out = model(static_in)
    g2 = torch.cuda.CUDAGraph()  # shares g1's pool
    with torch.no_grad(), torch.cuda.graph(g2, pool=g1.pool()):
        static_out2 = model(static_out[:, :64].repeat(1, 4).contiguous())
    rec["pool_id"] = list(g1.pool())
    outs, outs2 = [], []
    for x in inputs:
        static_in.copy_(x)
        g1.replay()
        g2.replay()
        outs.append(static_out.clone())
        outs2.append(static_out2.clone())
    torch.cuda.synchronize()
    tensors["capture_graph"] = [t.cpu() for t in outs]
    tensors["capture_graph2"] = [t.cpu() for t in outs2]
    rec["graph_equals_eager"] = all(torch.equal(a, b) for a, b in zip(outs, eager))
    rec["graph_vs_eager_max_abs"] = max(float((a - b).abs().max()) for a, b in zip(outs, eager))
    segs = pool_segments(torch, g1.pool())
    rec["pool_segments"] = len(segs)
    rec["pool_segment_mib"] = sum(s["total_size"] for s in segs) / MiB
    rec["outputs_in_pool_segments"] = in_segments(static_out.data_ptr(), segs) and in_segments(
        static_out2.data_ptr(), segs)
    rec["reserved_with_graphs_mib"] = reserved(torch, dev) / MiB
    # a tensor made outside the capture must not come from the pool's memory
    outside = torch.empty(1024, 1024, device=dev)
    rec["outside_not_in_pool"] = not in_segments(outside.data_ptr(), segs)
    del outside, g1, g2, static_out, static_out2, static_in, outs, outs2, segs
    # cuBLAS keeps a workspace per (handle, stream), allocated through the CUDA allocator: the one of
    # the capture stream came from the graph's pool during the capture. cudagraph trees clear them
    # the same way before they release a pool.
    torch._C._cuda_clearCublasWorkspaces()
    settle(torch, dev)
    rec["reserved_after_delete_mib"] = reserved(torch, dev) / MiB
    rec["pool_segments_after_delete"] = len(pool_segments(torch, rec["pool_id"]))
    rec["memory_returned"] = (rec["reserved_after_delete_mib"] <= rec["reserved_before_mib"]
                              and rec["pool_segments_after_delete"] == 0)
    rec["ok"] = bool(rec["outputs_in_pool_segments"] and rec["outside_not_in_pool"] and rec["memory_returned"]
                     and rec["pool_segments"] > 0)


def part_graphed(torch, dev, rec, tensors):
    if dev.type != "cuda":
        rec["skipped"] = "needs CUDA"
        return
    model = make_mlp(torch, dev)
    torch.manual_seed(2)
    x = torch.randn(32, 256, device=dev, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    grads = []
    for i in range(3):
        torch.manual_seed(10 + i)
        xi = torch.randn(32, 256, device=dev, requires_grad=True)
        model.zero_grad(set_to_none=True)
        graphed(xi).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).cpu())
    tensors["graphed_grads"] = grads
    del graphed, model, x
    settle(torch, dev)
    rec["ok"] = True


def part_mempool(torch, dev, rec, tensors):
    if dev.type != "cuda":
        rec["skipped"] = "needs CUDA"
        return
    settle(torch, dev)
    before = reserved(torch, dev)
    pool = torch.cuda.MemPool()
    rec["pool_id"] = list(pool.id)
    rec["use_count_new"] = pool.use_count()
    with torch.cuda.use_mem_pool(pool):
        a = torch.arange(4 * MiB // 4, device=dev, dtype=torch.float32)  # 4 MiB: a large block
        b = torch.full((1000,), 3.0, device=dev)                         # a small block
        rec["use_count_inside"] = pool.use_count()
    c = torch.empty(MiB, device=dev)  # after the context: the default pool
    rec["use_count_after"] = pool.use_count()
    n = a.numel()
    rec["data_ok"] = bool(float(a.double().sum()) == n * (n - 1) / 2 and float(b.sum()) == 3000.0)
    segs = pool_segments(torch, pool.id)
    rec["pool_segments"] = len(segs)
    rec["in_pool"] = in_segments(a.data_ptr(), segs) and in_segments(b.data_ptr(), segs)
    rec["outside_not_in_pool"] = not in_segments(c.data_ptr(), segs)
    own = pool.snapshot()
    rec["pool_snapshot_only_its_segments"] = bool(own) and all(
        tuple(s.get("segment_pool_id", (0, 0))) == tuple(pool.id) for s in own)
    del a, b, c
    settle(torch, dev)
    rec["held_while_pool_lives"] = len(pool_segments(torch, pool.id)) == len(segs) and len(segs) > 0
    pid = list(pool.id)
    del pool
    settle(torch, dev)
    rec["pool_segments_after_delete"] = len(pool_segments(torch, pid))
    rec["reserved_before_mib"] = before / MiB
    rec["reserved_after_delete_mib"] = reserved(torch, dev) / MiB
    rec["memory_returned"] = rec["reserved_after_delete_mib"] <= rec["reserved_before_mib"] and \
        rec["pool_segments_after_delete"] == 0
    rec["ok"] = bool(rec["data_ok"] and rec["in_pool"] and rec["outside_not_in_pool"]
                     and rec["pool_snapshot_only_its_segments"] and rec["held_while_pool_lives"]
                     and rec["memory_returned"])


class TinyLM:
    """A small transformer classifier over float features (no embedding: its backward uses atomics,
    which would make the losses of two runs differ for reasons that have nothing to do with memory)."""

    @staticmethod
    def build(torch, dev):
        torch.manual_seed(0)
        d = 256
        layer = torch.nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
        return torch.nn.Sequential(torch.nn.Linear(64, d), torch.nn.TransformerEncoder(layer, num_layers=2,
                                                                                     enable_nested_tensor=False),
                                   torch.nn.Linear(d, 128)).to(dev)


def part_compile(torch, dev, rec, tensors, steps, snapshot_dir=None, allocator=""):
    model = TinyLM.build(torch, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(5)
    batches = [(torch.randn(8, 64, 64, generator=gen).to(dev), torch.randint(0, 128, (8, 64), generator=gen).to(dev))
               for _ in range(steps + 2)]
    eval_x = torch.randn(8, 64, 64, generator=gen).to(dev)
    compiled = torch.compile(model, mode="reduce-overhead")
    loss_fn = torch.nn.CrossEntropyLoss()

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        out = compiled(x)
        loss = loss_fn(out.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        return float(loss.detach())

    settle(torch, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rec["reserved_before_mib"] = reserved(torch, dev) / MiB
    t0 = time.time()
    losses = [train_step(*batches[i]) for i in range(steps)]
    rec["train_s"] = round(time.time() - t0, 2)
    rec["losses"] = losses  # kept even if the eval below fails
    if dev.type == "cuda":
        rec["peak_reserved_train_mib"] = torch.cuda.max_memory_reserved(dev) / MiB
        rec["pools_after_train"] = pool_breakdown(torch)
    with torch.no_grad():
        model.eval()
        evals = [compiled(eval_x).float().cpu() for _ in range(3)]  # warm-up, record, replay
        model.train()
    losses += [train_step(*batches[i]) for i in range(steps, steps + 2)]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        rec["peak_reserved_mib"] = torch.cuda.max_memory_reserved(dev) / MiB
        rec["peak_allocated_mib"] = torch.cuda.max_memory_allocated(dev) / MiB
        rec["pools_at_end"] = pool_breakdown(torch)
        if snapshot_dir:
            os.makedirs(snapshot_dir, exist_ok=True)
            torch.cuda.memory._dump_snapshot(os.path.join(snapshot_dir, allocator + "_compile.pickle"))
        try:
            from torch._inductor import cudagraph_trees
            mgr = cudagraph_trees.get_container(dev.index or 0).tree_manager
            rec["cudagraph_checkpoints"] = None if mgr is None else mgr.debug_checkpointing_counter
        except Exception as err:  # noqa: BLE001 - internal API; informative only
            rec["cudagraph_checkpoints"] = "unavailable: %s" % err
    rec["losses"] = losses
    tensors["compile_eval"] = evals
    rec["eval_replays_equal"] = all(torch.equal(evals[0], e) for e in evals[1:])
    rec["total_s"] = round(time.time() - t0, 2)
    del compiled, model, opt, batches, evals
    torch._dynamo.reset()
    settle(torch, dev)
    rec["reserved_after_reset_mib"] = reserved(torch, dev) / MiB
    rec["allocated_after_reset_mib"] = (torch.cuda.memory_allocated(dev) / MiB) if dev.type == "cuda" else 0
    rec["ok"] = all(l == l for l in losses) and rec["eval_replays_equal"]


def run(args):
    t_start = time.time()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    result = {"allocator": args.allocator, "device": args.device, "torch": torch.__version__, "parts": {}}
    result["backend"] = load_allocator(torch, args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False (use --device cpu for the dry run)")
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        result["gpu"] = torch.cuda.get_device_name(dev)
    tensors = {}
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, args.allocator + ".json")

    def save():
        result["wall_s"] = round(time.time() - t_start, 2)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
        torch.save(tensors, os.path.join(args.out, args.allocator + ".pt"))

    for part in args.parts.split(","):
        rec = result["parts"].setdefault(part, {})
        t0 = time.time()
        print("[%s] %s ..." % (args.allocator, part), flush=True)
        try:
            if part == "capture":
                part_capture(torch, dev, rec, tensors)
            elif part == "graphed":
                part_graphed(torch, dev, rec, tensors)
            elif part == "mempool":
                part_mempool(torch, dev, rec, tensors)
            elif part == "compile":
                if args.compile_warmup:
                    warm, t_warm = {}, time.time()
                    part_compile(torch, dev, warm, {}, args.steps)
                    rec["warmup"] = {k: warm[k] for k in ("peak_reserved_mib", "peak_allocated_mib", "train_s")
                                     if k in warm}
                    rec["warmup"]["seconds"] = round(time.time() - t_warm, 2)
                part_compile(torch, dev, rec, tensors, args.steps, args.snapshot_dir, args.allocator)
        except Exception as err:  # noqa: BLE001 - recorded; the next part still runs
            rec["ok"] = False
            rec["error"] = "%s: %s" % (type(err).__name__, err)
            rec["traceback"] = traceback.format_exc()
            print(rec["traceback"], file=sys.stderr, flush=True)
        rec["seconds"] = round(time.time() - t0, 2)
        print("[%s] %s: %s" % (args.allocator, part, {k: v for k, v in rec.items() if k != "traceback"}), flush=True)
        save()  # after every part: a run stopped at its budget keeps what it did
    return 0 if all(p.get("ok", p.get("skipped") is not None) for p in result["parts"].values()) else 1


# ---------------------------------------------------------------------------------------- compare

def compare(args):
    import torch
    rows, failed = [], False

    def row(name, verdict, detail=""):
        nonlocal failed
        failed |= verdict == "FAIL"
        rows.append((name, verdict, detail))

    def load(name):
        path = os.path.join(args.dir, name + ".json")
        if not os.path.isfile(path):
            return None, None
        with open(path) as f:
            rec = json.load(f)
        pt = os.path.join(args.dir, name + ".pt")
        tens = torch.load(pt) if os.path.isfile(pt) else {}
        return rec, tens

    nat, nat_t = load("native")
    gm, gm_t = load("gpumem")
    if gm is None:
        row("gpumem run", "FAIL", "no gpumem.json (the run did not start or was stopped before its first part)")
    if nat is None:
        row("native run", "FAIL", "no native.json (the run did not start or was stopped before its first part)")
    if gm is None or nat is None:
        return rows, failed

    def part(rec, name):
        return rec["parts"].get(name)

    def same_tensors(key, atol):
        a, b = nat_t.get(key), gm_t.get(key)
        if a is None or b is None:
            return None, "missing in %s" % ("native" if a is None else "gpumem")
        if len(a) != len(b):
            return False, "%d vs %d tensors" % (len(a), len(b))
        diff = max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))
        exact = all(torch.equal(x, y) for x, y in zip(a, b))
        return diff <= atol, "%s (max abs diff %.3g)" % ("bitwise identical" if exact else "differ", diff)

    for name in ("capture", "graphed", "mempool", "compile"):
        pn, pg = part(nat, name), part(gm, name)
        if pn is None and pg is None:
            continue
        if pg is None or pn is None:
            row(name, "FAIL", "not run under %s (stopped at the budget?)" % ("gpumem" if pg is None else "native"))
            continue
        if "skipped" in pg:
            row(name, "SKIP", pg["skipped"])
            continue
        if not pn.get("ok"):
            row(name + " (native)", "FAIL", pn.get("error", "native's own checks failed: %s" % pn))
        if not pg.get("ok"):
            bad = [k for k, v in pg.items() if v is False]
            row(name, "FAIL", pg.get("error", "gpumem checks false: %s" % ", ".join(bad)))
            # what it did record is still compared below
        try:
            compare_part(name, pn, pg, row, same_tensors, args)
        except (KeyError, TypeError, ValueError) as err:  # a run that recorded less than expected
            row(name, "FAIL", "cannot compare: %s: %s" % (type(err).__name__, err))
    return rows, failed


def compare_part(name, pn, pg, row, same_tensors, args):
    """One part's rows (native and gpumem both ran it; a KeyError means one recorded less)."""
    if name == "capture":
        ok, d1 = same_tensors("capture_graph", args.out_atol)
        ok2, d2 = same_tensors("capture_graph2", args.out_atol)
        row("capture+replay outputs = native", "PASS" if ok and ok2 else "FAIL", "graph 1: %s; graph 2 (shared pool): %s" % (d1, d2))
        row("capture: memory returns after graphs deleted", "PASS" if pg.get("memory_returned") else "FAIL",
            "reserved %.0f -> %.0f (graphs) -> %.0f MiB; pool segments tagged: %d" % (
                pg["reserved_before_mib"], pg["reserved_with_graphs_mib"], pg["reserved_after_delete_mib"],
                pg["pool_segments"]))
    elif name == "graphed":
        ok, d = same_tensors("graphed_grads", args.out_atol)
        row("make_graphed_callables gradients = native", "PASS" if ok else "FAIL", d)
    elif name == "mempool":
        same_counts = all(pn.get(k) == pg.get(k) for k in ("use_count_new", "use_count_inside", "use_count_after"))
        row("MemPool round trip: use counts = native, memory returned",
            "PASS" if same_counts and pg.get("memory_returned") else "FAIL",
            "use_count new/inside/after %s/%s/%s (native %s/%s/%s); reserved after delete %.0f MiB (before %.0f)" % (
                pg.get("use_count_new"), pg.get("use_count_inside"), pg.get("use_count_after"),
                pn.get("use_count_new"), pn.get("use_count_inside"), pn.get("use_count_after"),
                pg["reserved_after_delete_mib"], pg["reserved_before_mib"]))
    elif name == "compile":
        ln, lg = pn["losses"], pg["losses"]
        if len(ln) != len(lg):
            row("reduce-overhead losses = native", "FAIL", "%d vs %d steps" % (len(ln), len(lg)))
        else:
            rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ln, lg))
            row("reduce-overhead losses = native", "PASS" if rel <= args.loss_rtol else "FAIL",
                "%d steps, %s (max rel diff %.3g); last loss %.6f vs %.6f" % (
                    len(ln), "bitwise identical" if ln == lg else "differ", rel, ln[-1], lg[-1]))
        ok, d = same_tensors("compile_eval", args.out_atol * 10)
        row("reduce-overhead eval (after checkpoint restore) = native", "PASS" if ok else "FAIL",
            "%s; checkpoints restored: native %s, gpumem %s" % (d, pn.get("cudagraph_checkpoints"),
                                                                 pg.get("cudagraph_checkpoints")))
        if "peak_reserved_mib" in pg:
            row("reduce-overhead peak reserved (native vs gpumem)", "INFO",
                "%.1f vs %.1f MiB (peak allocated %.1f vs %.1f MiB)" % (
                    pn["peak_reserved_mib"], pg["peak_reserved_mib"], pn["peak_allocated_mib"],
                    pg["peak_allocated_mib"]))
            slack = 2.0  # MiB: one small segment
            left_ok = pg["allocated_after_reset_mib"] <= pn["allocated_after_reset_mib"] + slack
            row("reduce-overhead: memory after torch._dynamo.reset()", "PASS" if left_ok else "FAIL",
                "allocated %.1f MiB, reserved %.1f MiB (native %.1f, %.1f MiB)" % (
                    pg["allocated_after_reset_mib"], pg["reserved_after_reset_mib"],
                    pn["allocated_after_reset_mib"], pn["reserved_after_reset_mib"]))
        for when in ("pools_after_train", "pools_at_end"):
            for who, p in (("native", pn), ("gpumem", pg)):
                if when in p:
                    row("reduce-overhead %s, %s (pool type: segments, reserved/allocated MiB)" % (when, who), "INFO",
                        "; ".join("%s: %d, %.1f/%.1f" % (k, e["segments"], e["reserved_mib"], e["allocated_mib"])
                                  for k, e in p[when].items()))
        if "warmup" in pg and "warmup" in pn:
            row("reduce-overhead unmeasured first pass (compile, autotuning)", "INFO",
                "peak reserved %.1f vs %.1f MiB, peak allocated %.1f vs %.1f MiB, %.1f vs %.1f s (native vs gpumem)" % (
                    pn["warmup"].get("peak_reserved_mib", 0), pg["warmup"].get("peak_reserved_mib", 0),
                    pn["warmup"].get("peak_allocated_mib", 0), pg["warmup"].get("peak_allocated_mib", 0),
                    pn["warmup"].get("train_s", 0), pg["warmup"].get("train_s", 0)))
        row("reduce-overhead time (train steps incl. compile)", "INFO",
            "native %.1f s, gpumem %.1f s%s" % (pn["train_s"], pg["train_s"],
                                                 " (after the unmeasured first pass)" if "warmup" in pg else ""))


def main(argv):
    args = parse_args(argv)
    if args.cmd == "run":
        return run(args)
    rows, failed = compare(args)
    width = max(len(r[0]) for r in rows) if rows else 10
    for name, verdict, detail in rows:
        print("%-*s  %-4s  %s" % (width, name, verdict, detail))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
