#!/usr/bin/env python3
"""The anchor gpumem::zero is measured against: the same GPT-style model and data as
examples/zero_train.cpp, trained in Python with PyTorch's FSDP2 (fully_shard) or DDP.

Launch like zero_train, one process per GPU:

    torchrun --standalone --nproc-per-node N scripts/gpu/zero_fsdp2.py --mode fsdp2 [model flags]

Modes:
  fsdp2          fully_shard on the embeddings, every block, the head and the root, with
                 reshard_after_forward=True (parameters, gradients and optimizer state sharded:
                 ZeRO stage 3's layout)
  fsdp2_keep     the same with reshard_after_forward=False (parameters stay gathered from forward
                 to backward: between ZeRO stages 2 and 3)
  ddp            DistributedDataParallel with bf16 autocast (plain all-reduce data parallelism)

Mixed precision as zero_train's: bf16 forward and backward, gradients reduced in bf16, fp32 master
weights and AdamW moments (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)).

--allocator native keeps PyTorch's CUDA caching allocator; --allocator gpumem loads
libgpumem_torch.so (--lib) and installs it (torch.ops.gpumem.install, GPUMEM_ALLOC_CONF's settings
if set) before CUDA starts, so gpumem is torch's CUDA allocator; the run stops if it is not.

Prints per rank: peak reserved and peak allocated bytes, step time (mean over the steps after
the warm-up), first and last loss of the global batch (the mean over the ranks' slices, so runs on
different GPU counts compare); one RESULT line per rank (the shell script collects them).
"""
import argparse
import math
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fsdp2", "fsdp2_keep", "ddp"], default="fsdp2")
    p.add_argument("--allocator", choices=["native", "gpumem"], default="native")
    p.add_argument("--lib", default="", help="libgpumem_torch.so (for --allocator gpumem)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the step time")
    p.add_argument("--batch", type=int, default=16, help="global batch (rows), split over ranks")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient norm (0 = off), as zero_train")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: a check of this script over Gloo on any machine (no memory numbers)")
    a = p.parse_args()
    if a.width % a.heads:
        p.error(f"--width {a.width} must be a multiple of --heads {a.heads}")
    if a.allocator == "gpumem" and not os.path.isfile(a.lib):
        p.error(f"--allocator gpumem needs --lib pointing at libgpumem_torch.so (got {a.lib!r})")
    if a.steps <= a.warmup:
        p.error(f"--steps {a.steps} must exceed --warmup {a.warmup}")
    return a


args = parse()

import torch  # noqa: E402

if args.allocator == "gpumem":
    # Before anything touches CUDA: gpumem becomes torch's CUDA allocator.
    torch.ops.load_library(args.lib)  # installs gpumem by itself only when GPUMEM_ALLOC_CONF is set
    if args.device == "cuda" and not torch.ops.gpumem.installed():
        torch.ops.gpumem.install("")  # the configuration from the environment (defaults if none)
    if args.device == "cuda" and torch.cuda.get_allocator_backend() != "gpumem":
        # Measuring PyTorch's allocator under gpumem's name would be worse than no number.
        try:
            why = torch.ops.gpumem.load_error()
        except Exception as err:  # noqa: BLE001 - the library may not have registered its ops
            why = f"torch.ops.gpumem.load_error() is unavailable: {err}"
        sys.exit(f"zero_fsdp2.py: gpumem is not torch's CUDA allocator after loading {args.lib} "
                 f"(backend {torch.cuda.get_allocator_backend()!r}): {why or 'no load error was recorded'}")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Embeddings(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tokens = nn.Embedding(a.vocab, a.width)
        self.positions = nn.Embedding(a.seq, a.width)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.tokens(idx) + self.positions(pos).unsqueeze(0)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads = a.heads
        self.ln1 = nn.LayerNorm(a.width)
        self.qkv = nn.Linear(a.width, 3 * a.width)
        self.proj = nn.Linear(a.width, a.width)
        self.ln2 = nn.LayerNorm(a.width)
        self.fc = nn.Linear(a.width, 4 * a.width)
        self.out = nn.Linear(4 * a.width, a.width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, w))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.norm = nn.LayerNorm(a.width)
        self.logits = nn.Linear(a.width, a.vocab, bias=False)

    def forward(self, x):
        return self.logits(self.norm(x))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = Embeddings(a)
        self.blocks = nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.head = Head(a)

    def forward(self, idx):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class MarkovData:
    """zero_train's data: a fixed random Markov chain, each token with four successors."""

    def __init__(self, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(vocab, (vocab, 4), generator=g)
        self.probs = torch.tensor([0.55, 0.25, 0.15, 0.05], dtype=torch.double)
        self.vocab = vocab

    def batch(self, step, rows, seq):
        g = torch.Generator().manual_seed(1_000_003 * (step + 1))
        out = torch.empty(rows, seq + 1, dtype=torch.long)
        cur = torch.randint(self.vocab, (rows,), generator=g)
        out[:, 0] = cur
        choice = torch.multinomial(self.probs.expand(rows * seq, 4), 1, True, generator=g).view(seq, rows)
        for t in range(1, seq + 1):
            cur = self.successors[cur, choice[t - 1]]
            out[:, t] = cur
        return out


def main():
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            sys.exit(f"zero_fsdp2.py: {var} is not set; launch with torchrun --nproc-per-node N")
    rank, world, local = (int(os.environ[v]) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if args.batch % world:
        sys.exit(f"zero_fsdp2.py: --batch {args.batch} must be divisible by WORLD_SIZE={world}")
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    lead = rank == 0

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    torch.manual_seed(args.seed)
    model = Gpt(args).to(device)
    params = sum(p.numel() for p in model.parameters())
    if args.mode.startswith("fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        reshard = args.mode == "fsdp2"
        for unit in [model.embed, *model.blocks, model.head]:
            fully_shard(unit, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
        train_model = model
    else:
        train_model = nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None,
                                                          gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    data = MarkovData(args.vocab, 42)
    rows = args.batch // world
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for step in range(args.steps):
        # Data is made before the clock starts (zero_train does the same).
        tokens = data.batch(step, args.batch, args.seq)[rank * rows:(rank + 1) * rows].to(device)
        sync()
        start = time.perf_counter()
        x, y = tokens[:, :-1], tokens[:, 1:]
        if args.mode == "ddp":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = train_model(x)
        else:
            logits = train_model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), y.reshape(-1))
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        sync()
        times.append(time.perf_counter() - start)
        # The loss of the global batch (mean over the ranks' equal slices), outside the clock:
        # comparable across world sizes.
        global_loss = torch.tensor([loss_value], dtype=torch.float64, device=device)
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
        loss_value = global_loss.item()
        losses.append(loss_value)
        if lead and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:5d}  loss {loss_value:.4f}  {times[-1] * 1e3:8.2f} ms", flush=True)

    timed = times[args.warmup:]
    ms = sum(timed) / len(timed) * 1e3
    stats = torch.cuda.memory_stats(device) if cuda else {}
    mine = dict(rank=rank, peak_reserved=stats.get("reserved_bytes.all.peak", -1),
                peak_allocated=stats.get("allocated_bytes.all.peak", -1), ms=ms,
                first=losses[0], last=losses[-1])
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if lead:
        entropy = -sum(p * math.log(p) for p in (0.55, 0.25, 0.15, 0.05))
        print(f"{args.mode}, allocator {args.allocator}, {world} rank(s), {params} parameters "
              f"({params / 1e6:.1f} M), global batch {args.batch}, loss floor {entropy:.3f}")
        for r in everyone:
            print(f"RESULT impl=fsdp2.py mode={args.mode} allocator={args.allocator} world={world} "
                  f"rank={r['rank']} params={params} first_loss={r['first']:.4f} last_loss={r['last']:.4f} "
                  f"ms_per_step={r['ms']:.3f} peak_reserved_bytes={r['peak_reserved']} "
                  f"peak_allocated_bytes={r['peak_allocated']}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
