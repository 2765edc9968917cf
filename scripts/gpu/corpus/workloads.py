"""The corpus's workloads: real models from transformers and torchvision (random weights, built
from their library configs: the GPU machine has no network) and two of gpumem's own C++ examples.

A Python workload is a function ``build(ctx)`` registered with ``@python_workload``; it builds the
model, optimizer and data on ``ctx.device`` and returns ``Built(step, model, shapes, extra)``:
``step(i)`` runs step i and returns that step's shapes (recorded per step in the JSON), ``model``
and ``shapes`` describe the workload for the manifest. With ``ctx.dry`` (``--dry-run-cpu``) every
size shrinks so that construction and a step run on a CPU in seconds; the code path is the same.

Variable shapes come from ``ctx.rng`` (random.Random(seed)) and data from ``ctx.gen``
(a seeded torch.Generator on the CPU, then copied to the device as a data loader would): a
workload replays identically from its seed.

Two optional hooks serve a runner that compares allocators run by run (scripts/gpu/live.py);
capture.py's context has neither and nothing changes for it:

- ``ctx.observe(name, tensor)``: each step hands over its loss (training, ``"loss"``, detached) or
  its generated tokens (``"tokens"``), so that runs of different allocators can be checked for
  the same results. The runner reads them after its timer stops and drops them before the next
  step.
- ``ctx.model_cache.get(key, factory)``: the model is built on the CPU by ``factory()`` from the
  global torch RNG (which the runner seeds). A runner that forks every run from one parent builds
  it there once and hands the same weights to each child (copy-on-write), with the RNG state the
  build leaves behind; ``key`` names the model class and its configuration.

A C++ workload (``CppWorkload``) names an example binary and its arguments; capture.py runs it with
``--record-native-history`` and converts what it writes.

``est_gib``: a pessimistic guess of PyTorch's native peak reserved plus the CUDA context, used to
decide which captures share the GPU (capture_all.sh refines it with the native run's measured peak
before the expandable run). ``est_s``: seconds alone on an H200 from process start to the written
trace; the scheduler starts the longest first and skips what cannot finish before its deadline.
"""

import collections

Built = collections.namedtuple("Built", "step model shapes extra")


class PythonWorkload:
    kind = "python"

    def __init__(self, name, fn, steps, warmup, est_gib, est_s, summary):
        self.name = name
        self.build = fn
        self.steps = steps  # total steps, warm-up included
        self.warmup = warmup  # steps left out of step_s
        self.est_gib = est_gib
        self.est_s = est_s
        self.summary = summary


class CppWorkload:
    kind = "cpp"

    def __init__(self, name, binary, args, dry_args, steps, warmup, est_gib, est_s, summary,
                 model, shapes, env=None):
        self.name = name
        self.binary = binary
        self.args = args
        self.dry_args = dry_args
        self.steps = steps
        self.warmup = warmup
        self.est_gib = est_gib
        self.est_s = est_s
        self.summary = summary
        self.model = model
        self.shapes = shapes
        self.env = env or {}


WORKLOADS = collections.OrderedDict()


def python_workload(name, steps, warmup, est_gib, est_s, summary):
    def register(fn):
        WORKLOADS[name] = PythonWorkload(name, fn, steps, warmup, est_gib, est_s, summary)
        return fn
    return register


# ---- helpers -------------------------------------------------------------------------------------

def _torch():
    import torch
    return torch


def _observe(ctx, name, value):
    """Hands a step's result to the runner's ctx.observe, if it has one (see the module's doc)."""
    observe = getattr(ctx, "observe", None)
    if observe is not None:
        observe(name, value)


def _new_model(ctx, cls, cfg):
    """cls(cfg) on the CPU (a transformers model class and its config), or the same model from
    ctx.model_cache (see the module's doc), keyed by the class name and the whole config."""
    cache = getattr(ctx, "model_cache", None)
    if cache is None:
        return cls(cfg)
    return cache.get("%s %s" % (cls.__name__, cfg.to_json_string()), lambda: cls(cfg))


def _train_step(ctx, model, optimizer, forward):
    """One training step: forward under bf16 autocast (as the issue's measurements ran), backward
    outside it, AdamW step, gradients set to None."""
    torch = _torch()

    def step(i):
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            loss, info = forward(i)
        _observe(ctx, "loss", loss.detach())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return info
    return step


def _varlen_lm_forward(ctx, model, vocab, batch, lo, hi):
    """A causal LM's forward on random tokens, batch x a sequence length uniform in lo..hi drawn
    each step; returns (loss, the step's shapes) for _train_step."""
    torch = _torch()

    def forward(i):
        seq = ctx.rng.randint(lo, hi)
        ids = torch.randint(vocab, (batch, seq), generator=ctx.gen).to(ctx.device)
        return model(input_ids=ids, labels=ids).loss, {"batch": batch, "seq": seq}
    return forward


def _adamw(model):
    torch = _torch()
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)


def _param_count(model):
    return sum(p.numel() for p in model.parameters())


def _hf_extra(model):
    cfg = model.config
    return {
        "parameters": _param_count(model),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
    }


def _image_classifier(ctx, make_model, batch, image):
    torch = _torch()
    if ctx.dry:
        batch, image = 2, 64
    model = make_model().to(ctx.device)
    model.train()
    opt = _adamw(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward(i):
        x = torch.randn(batch, 3, image, image, generator=ctx.gen).to(ctx.device)
        y = torch.randint(1000, (batch,), generator=ctx.gen).to(ctx.device)
        return loss_fn(model(x), y), {"batch": batch, "image": image}
    shapes = {"batch": batch, "image": [3, image, image], "classes": 1000, "dtype": "bf16 autocast",
              "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward), None, shapes, {"parameters": _param_count(model)})


def _llama(ctx, hidden, intermediate, layers, heads, batch, seq, checkpointing, build_on_device):
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM
    if ctx.dry:
        hidden, intermediate, layers, heads, batch, seq = 64, 172, 2, 4, 2, 32
    vocab = 32000 if not ctx.dry else 256
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                      max_position_embeddings=max(seq, 2048 if not ctx.dry else seq))
    if build_on_device:
        # Initialized on the device: a CPU init of billions of parameters takes minutes.
        with torch.device(ctx.device):
            model = LlamaForCausalLM(cfg)
    else:
        model = _new_model(ctx, LlamaForCausalLM, cfg).to(ctx.device)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = _adamw(model)

    def forward(i):
        ids = torch.randint(vocab, (batch, seq), generator=ctx.gen).to(ctx.device)
        return model(input_ids=ids, labels=ids).loss, {"batch": batch, "seq": seq}
    shapes = {"hidden": hidden, "intermediate": intermediate, "layers": layers, "heads": heads,
              "vocab": vocab, "batch": batch, "seq": seq, "dtype": "bf16 autocast, fp32 weights",
              "optimizer": "AdamW",
              "gradient_checkpointing": "every layer, non-reentrant" if checkpointing else "off",
              "built_on": "device" if build_on_device else "cpu, then .to(device)"}
    name = "transformers LlamaForCausalLM (LlamaConfig, random weights)"
    return Built(_train_step(ctx, model, opt, forward), name, shapes, _hf_extra(model))


def _gpt2_config(ctx, **full):
    from transformers import GPT2Config
    if ctx.dry:
        return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128,
                          bos_token_id=511, eos_token_id=511)
    return GPT2Config(**full)


def _generate(ctx, model, cfg, batch, prompt, new, sample):
    torch = _torch()
    if ctx.dry:
        batch, prompt, new = (1, 2), (4, 16), (2, 6)

    def step(i):
        b = ctx.rng.randint(*batch)
        p = ctx.rng.randint(*prompt)
        n = ctx.rng.randint(*new)
        ids = torch.randint(cfg.vocab_size, (b, p), generator=ctx.gen).to(ctx.device)
        kwargs = dict(do_sample=True, top_k=50) if sample else dict(do_sample=False)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=cfg.eos_token_id, **kwargs)
        assert out.shape == (b, p + n), out.shape
        _observe(ctx, "tokens", out)
        return {"batch": b, "prompt": p, "new_tokens": n}
    return step


# ---- the workloads -------------------------------------------------------------------------------

@python_workload("gpt2_varlen_train", steps=25, warmup=3, est_gib=40, est_s=35,
                 summary="GPT-2 124M training, batch 16, sequence length uniform 64..1024 each step, "
                         "bf16 autocast, AdamW (issue 12's table)")
def gpt2_varlen_train(ctx):
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(ctx)
    batch, lo, hi = (16, 64, 1024) if not ctx.dry else (2, 8, 32)
    model = _new_model(ctx, GPT2LMHeadModel, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)
    forward = _varlen_lm_forward(ctx, model, cfg.vocab_size, batch, lo, hi)
    shapes = {"batch": batch, "seq": "uniform %d..%d per step" % (lo, hi), "layers": cfg.n_layer,
              "hidden": cfg.n_embd, "vocab": cfg.vocab_size, "dtype": "bf16 autocast, fp32 weights",
              "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers GPT2LMHeadModel (GPT2Config(), 124M, random weights)", shapes,
                 _hf_extra(model))


@python_workload("convnext_tiny_train", steps=15, warmup=3, est_gib=30, est_s=30,
                 summary="torchvision ConvNeXt-Tiny training, batch 128, 224x224, bf16 autocast, "
                         "AdamW (fixed shapes)")
def convnext_tiny_train(ctx):
    import torchvision
    b = _image_classifier(ctx, lambda: torchvision.models.convnext_tiny(weights=None), 128, 224)
    return b._replace(model="torchvision convnext_tiny (random weights)")


@python_workload("swin_t_train", steps=15, warmup=3, est_gib=20, est_s=30,
                 summary="torchvision Swin-T vision transformer training, batch 64, 224x224, bf16 "
                         "autocast, AdamW")
def swin_t_train(ctx):
    import torchvision
    b = _image_classifier(ctx, lambda: torchvision.models.swin_t(weights=None), 64, 224)
    return b._replace(model="torchvision swin_t (random weights)")


@python_workload("llama_train", steps=15, warmup=3, est_gib=34, est_s=30,
                 summary="Llama-style 12 layers, hidden 2048, intermediate 5504, 16 heads, vocab 32000, "
                         "batch 4 x seq 2048, bf16 autocast, AdamW, no checkpointing (issue 12, ANCHORS)")
def llama_train(ctx):
    return _llama(ctx, 2048, 5504, 12, 16, 4, 2048, checkpointing=False, build_on_device=False)


@python_workload("llama_train_ckpt", steps=15, warmup=3, est_gib=24, est_s=30,
                 summary="the same Llama-style model with Hugging Face gradient checkpointing "
                         "(gradient_checkpointing_enable, non-reentrant)")
def llama_train_ckpt(ctx):
    return _llama(ctx, 2048, 5504, 12, 16, 4, 2048, checkpointing=True, build_on_device=False)


@python_workload("llama3b_train", steps=12, warmup=3, est_gib=95, est_s=40,
                 summary="Llama-style ~3.4B (OpenLLaMA-3B shape: 26 layers, hidden 3200, intermediate "
                         "8640, 32 heads), batch 2 x seq 2048, bf16 autocast, AdamW: the > 60 GiB one")
def llama3b_train(ctx):
    return _llama(ctx, 3200, 8640, 26, 32, 2, 2048, checkpointing=False, build_on_device=True)


@python_workload("gpt2_generate", steps=10, warmup=1, est_gib=8, est_s=60,
                 summary="GPT-2 124M generate() in bf16, greedy, batch 1..32, prompt 16..512, "
                         "16..128 new tokens per call: a growing KV cache (issue 12's table)")
def gpt2_generate(ctx):
    torch = _torch()
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(ctx)
    model = _new_model(ctx, GPT2LMHeadModel, cfg).to(ctx.device, dtype=torch.bfloat16).eval()
    shapes = {"batch": "uniform 1..32 per call", "prompt": "uniform 16..512", "new_tokens":
              "uniform 16..128 (min_new_tokens = max_new_tokens)", "dtype": "bf16 weights",
              "decoding": "greedy", "steps_are": "generate() calls"}
    return Built(_generate(ctx, model, cfg, (1, 32), (16, 512), (16, 128), sample=False),
                 "transformers GPT2LMHeadModel (124M, random weights), generate()", shapes,
                 _hf_extra(model))


@python_workload("gpt2_decode_small", steps=10, warmup=1, est_gib=3, est_s=50,
                 summary="small footprint (< 2 GiB): GPT-2 124M fp32 generate() with top-k sampling, "
                         "batch 1..4, prompt 16..256, 16..80 new tokens per call")
def gpt2_decode_small(ctx):
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(ctx)
    model = GPT2LMHeadModel(cfg).to(ctx.device).eval()
    # About 660 trace entries per generated token: 10 calls of 16..80 tokens keep the trace near
    # 300k entries.
    shapes = {"batch": "uniform 1..4 per call", "prompt": "uniform 16..256", "new_tokens":
              "uniform 16..80 (min_new_tokens = max_new_tokens)", "dtype": "fp32 weights",
              "decoding": "top-k 50 sampling", "steps_are": "generate() calls"}
    return Built(_generate(ctx, model, cfg, (1, 4), (16, 256), (16, 80), sample=True),
                 "transformers GPT2LMHeadModel (124M, random weights), generate()", shapes,
                 _hf_extra(model))


@python_workload("bert_infer_varbatch", steps=25, warmup=2, est_gib=8, est_s=25,
                 summary="BERT-base inference under no_grad, bf16 weights, batch log-uniform 1..256, "
                         "sequence 16..512, padded rows with an attention mask")
def bert_infer_varbatch(ctx):
    torch = _torch()
    from transformers import BertConfig, BertModel
    cfg = BertConfig() if not ctx.dry else BertConfig(hidden_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=128,
                                                      vocab_size=512)
    model = BertModel(cfg).to(ctx.device, dtype=torch.bfloat16).eval()
    max_batch, (lo, hi) = (256, (16, 512)) if not ctx.dry else (4, (8, 32))

    def step(i):
        b = max(1, min(max_batch, round(2 ** ctx.rng.uniform(0, max_batch.bit_length() - 1))))
        s = ctx.rng.randint(lo, hi)
        ids = torch.randint(cfg.vocab_size, (b, s), generator=ctx.gen)
        lengths = torch.randint(max(1, s // 2), s + 1, (b,), generator=ctx.gen)
        mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
        with torch.no_grad():
            out = model(input_ids=ids.to(ctx.device), attention_mask=mask.to(ctx.device))
            pooled = out.pooler_output.float().cpu()
        assert pooled.shape == (b, cfg.hidden_size)
        return {"batch": b, "seq": s}
    shapes = {"batch": "log-uniform 1..%d per request" % max_batch, "seq": "uniform %d..%d" % (lo, hi),
              "dtype": "bf16 weights", "mode": "torch.no_grad()", "layers": cfg.num_hidden_layers,
              "hidden": cfg.hidden_size}
    return Built(step, "transformers BertModel (BertConfig(), bert-base, random weights)", shapes,
                 _hf_extra(model))


@python_workload("gpt2_compiled_train", steps=15, warmup=3, est_gib=14, est_s=120,
                 summary="torch.compile (default mode) GPT-2 with 4 layers, batch 16 x seq 512 fixed, "
                         "bf16 autocast, AdamW (the compiled graphs' own buffers)")
def gpt2_compiled_train(ctx):
    torch = _torch()
    from transformers import GPT2LMHeadModel
    cfg = _gpt2_config(ctx, n_layer=4)
    batch, seq = (16, 512) if not ctx.dry else (2, 16)
    model = GPT2LMHeadModel(cfg).to(ctx.device)
    model.train()
    compiled = torch.compile(model)  # default mode
    opt = _adamw(model)

    def forward(i):
        ids = torch.randint(cfg.vocab_size, (batch, seq), generator=ctx.gen).to(ctx.device)
        return compiled(input_ids=ids, labels=ids).loss, {"batch": batch, "seq": seq}
    shapes = {"batch": batch, "seq": seq, "layers": cfg.n_layer, "hidden": cfg.n_embd,
              "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW (not compiled)",
              "compile": "torch.compile(model), default mode; the first steps compile"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers GPT2LMHeadModel (GPT2Config(n_layer=4), random weights), torch.compile",
                 shapes, _hf_extra(model))


@python_workload("mixtral_moe_varlen_train", steps=20, warmup=3, est_gib=36, est_s=40,
                 summary="the stress case: Mixtral-style MoE (8 layers, hidden 1024, 8 experts, top-2, "
                         "per-expert loop) training, batch 4, sequence 128..2048 per step, bf16 "
                         "autocast, AdamW: variable tokens per expert inside variable-length steps")
def mixtral_moe_varlen_train(ctx):
    from transformers import MixtralConfig, MixtralForCausalLM
    if ctx.dry:
        dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
        batch, lo, hi = 2, 8, 32
    else:
        dims = dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                    max_position_embeddings=2048)
        batch, lo, hi = 4, 128, 2048
    # The per-expert loop ("eager"): each expert gets a different number of tokens every step, so
    # its gathered inputs and activations have a different size every time (transformers'
    # default "grouped_mm" packs them into one buffer per layer).
    cfg = MixtralConfig(num_local_experts=8, num_experts_per_tok=2, output_router_logits=True,
                        router_aux_loss_coef=0.02, experts_implementation="eager", **dims)
    model = MixtralForCausalLM(cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)
    forward = _varlen_lm_forward(ctx, model, cfg.vocab_size, batch, lo, hi)
    shapes = dict(dims, experts=8, top_k=2, batch=batch, seq="uniform %d..%d per step" % (lo, hi),
                  dtype="bf16 autocast, fp32 weights", optimizer="AdamW",
                  experts_implementation=cfg._experts_implementation)
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers MixtralForCausalLM (MixtralConfig, random weights)", shapes,
                 dict(_hf_extra(model), experts_implementation=cfg._experts_implementation))


@python_workload("t5_varlen_train", steps=20, warmup=3, est_gib=30, est_s=40,
                 summary="T5-base encoder-decoder training, batch 16, encoder length 32..512 and "
                         "decoder length 8..256 drawn independently each step, bf16 autocast, AdamW")
def t5_varlen_train(ctx):
    torch = _torch()
    from transformers import T5Config, T5ForConditionalGeneration
    if ctx.dry:
        cfg = T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=256)
        batch, enc, dec = 2, (8, 16), (4, 8)
    else:
        cfg = T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, vocab_size=32128)
        batch, enc, dec = 16, (32, 512), (8, 256)
    cfg.decoder_start_token_id = 0
    cfg.pad_token_id = 0
    model = T5ForConditionalGeneration(cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)

    def forward(i):
        e = ctx.rng.randint(*enc)
        d = ctx.rng.randint(*dec)
        src = torch.randint(1, cfg.vocab_size, (batch, e), generator=ctx.gen).to(ctx.device)
        tgt = torch.randint(1, cfg.vocab_size, (batch, d), generator=ctx.gen).to(ctx.device)
        return model(input_ids=src, labels=tgt).loss, {"batch": batch, "encoder_seq": e, "decoder_seq": d}
    shapes = {"batch": batch, "encoder_seq": "uniform %d..%d per step" % enc,
              "decoder_seq": "uniform %d..%d per step" % dec, "d_model": cfg.d_model,
              "layers": cfg.num_layers, "vocab": cfg.vocab_size, "dtype": "bf16 autocast, fp32 weights",
              "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers T5ForConditionalGeneration (T5Config t5-base sizes, random weights)",
                 shapes, _hf_extra(model))


# ---- held out (2026-12-04): added after the policy's tuning, to check it on workloads it was not
# tuned on (docs/notes/allocation-policy.md, "Held-out workloads"). Each differs in kind from the
# ones above: detection with per-image shapes and per-image targets, a fixed-shape 24-layer encoder,
# an audio encoder-decoder, grouped-query decoding with a 152k vocabulary and sampling, progressive
# resizing, and checkpointing combined with variable length.

@python_workload("maskrcnn_varsize_train", steps=12, warmup=3, est_gib=64, est_s=30,
                 summary="torchvision Mask R-CNN (ResNet-50 FPN) training in fp32, 8 images per step of "
                         "random sizes 480..1024 per side, 1..20 random boxes and masks each, SGD")
def maskrcnn_varsize_train(ctx):
    torch = _torch()
    import torchvision
    batch, (lo, hi), max_objects = (8, (480, 1024), 20) if not ctx.dry else (2, (64, 96), 3)
    kwargs = dict(min_size=64, max_size=96) if ctx.dry else {}
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=91, **kwargs).to(ctx.device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, weight_decay=1e-4)

    def target(h, w):
        n = ctx.rng.randint(1, max_objects)
        boxes, masks = [], torch.zeros(n, h, w, dtype=torch.uint8)
        for k in range(n):
            bw, bh = ctx.rng.randint(8, w // 2), ctx.rng.randint(8, h // 2)
            x0, y0 = ctx.rng.randint(0, w - bw), ctx.rng.randint(0, h - bh)
            boxes.append([x0, y0, x0 + bw, y0 + bh])
            masks[k, y0:y0 + bh, x0:x0 + bw] = 1
        labels = torch.randint(1, 91, (n,), generator=ctx.gen)
        return {"boxes": torch.tensor(boxes, dtype=torch.float32).to(ctx.device),
                "labels": labels.to(ctx.device), "masks": masks.to(ctx.device)}

    def step(i):
        sizes = [(ctx.rng.randint(lo, hi), ctx.rng.randint(lo, hi)) for _ in range(batch)]
        images = [torch.rand(3, h, w, generator=ctx.gen).to(ctx.device) for h, w in sizes]
        targets = [target(h, w) for h, w in sizes]
        losses = model(images, targets)
        loss = sum(losses.values())
        _observe(ctx, "loss", loss.detach())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"images": [list(x) for x in sizes], "objects": [len(t["labels"]) for t in targets]}
    shapes = {"batch": batch, "image": "3 x uniform %d..%d x uniform %d..%d per image" % (lo, hi, lo, hi),
              "objects": "1..%d random boxes and box masks per image" % max_objects, "classes": 91,
              "dtype": "fp32", "optimizer": "SGD momentum 0.9",
              "transform": "the model's own GeneralizedRCNNTransform (resize to 800..1333, batched)"}
    return Built(step, "torchvision maskrcnn_resnet50_fpn (random weights)", shapes,
                 {"parameters": _param_count(model)})


@python_workload("bert_large_mlm_train", steps=12, warmup=3, est_gib=32, est_s=30,
                 summary="BERT-large masked-LM training, batch 32 x seq 512 fixed, 15% of tokens "
                         "labelled, bf16 autocast, AdamW")
def bert_large_mlm_train(ctx):
    torch = _torch()
    from transformers import BertConfig, BertForMaskedLM
    if ctx.dry:
        cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, vocab_size=512)
        batch, seq = 2, 32
    else:
        cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096, vocab_size=30522)
        batch, seq = 32, 512
    model = _new_model(ctx, BertForMaskedLM, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)

    def forward(i):
        ids = torch.randint(cfg.vocab_size, (batch, seq), generator=ctx.gen)
        labels = torch.where(torch.rand(batch, seq, generator=ctx.gen) < 0.15, ids,
                             torch.full_like(ids, -100))
        out = model(input_ids=ids.to(ctx.device), labels=labels.to(ctx.device))
        return out.loss, {"batch": batch, "seq": seq}
    shapes = {"batch": batch, "seq": seq, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
              "vocab": cfg.vocab_size, "labels": "15% of tokens", "dtype": "bf16 autocast, fp32 weights",
              "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers BertForMaskedLM (bert-large sizes, random weights)", shapes, _hf_extra(model))


@python_workload("whisper_varlen_train", steps=15, warmup=3, est_gib=28, est_s=35,
                 summary="Whisper (small sizes: 12+12 layers, d_model 768) training on 30 s of random "
                         "log-mel features, batch 16, transcript length 16..448 per step, bf16 "
                         "autocast, AdamW")
def whisper_varlen_train(ctx):
    torch = _torch()
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    if ctx.dry:
        cfg = WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                            num_mel_bins=80, max_source_positions=50, max_target_positions=64,
                            vocab_size=512, decoder_start_token_id=1, pad_token_id=0, eos_token_id=2,
                            bos_token_id=1)
        batch, frames, (lo, hi) = 2, 100, (4, 16)
    else:
        cfg = WhisperConfig(d_model=768, encoder_layers=12, decoder_layers=12, encoder_attention_heads=12,
                            decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                            num_mel_bins=80, max_source_positions=1500, max_target_positions=448,
                            vocab_size=51865)
        batch, frames, (lo, hi) = 16, 3000, (16, 448)
    model = _new_model(ctx, WhisperForConditionalGeneration, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)

    def forward(i):
        t = ctx.rng.randint(lo, hi)
        feats = torch.randn(batch, cfg.num_mel_bins, frames, generator=ctx.gen).to(ctx.device)
        labels = torch.randint(3, cfg.vocab_size, (batch, t), generator=ctx.gen).to(ctx.device)
        return model(input_features=feats, labels=labels).loss, {"batch": batch, "labels": t}
    shapes = {"batch": batch, "input_features": [cfg.num_mel_bins, frames],
              "labels": "uniform %d..%d tokens per step" % (lo, hi), "d_model": cfg.d_model,
              "layers": "%d encoder + %d decoder" % (cfg.encoder_layers, cfg.decoder_layers),
              "vocab": cfg.vocab_size, "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers WhisperForConditionalGeneration (whisper-small sizes, random weights)",
                 shapes, _hf_extra(model))


@python_workload("qwen2_generate_sampled", steps=8, warmup=1, est_gib=6, est_s=60,
                 summary="Qwen2-style 24-layer decoder (hidden 1024, grouped-query attention 16/2 heads, "
                         "vocab 151,936) generate() in bf16 with top-p sampling, batch 1..64, prompt "
                         "32..1024, 16..64 new tokens per call")
def qwen2_generate_sampled(ctx):
    torch = _torch()
    from transformers import Qwen2Config, Qwen2ForCausalLM
    if ctx.dry:
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                          max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    else:
        cfg = Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
                          num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                          max_position_embeddings=2048, tie_word_embeddings=True,
                          bos_token_id=151643, eos_token_id=151643)
    model = _new_model(ctx, Qwen2ForCausalLM, cfg).to(ctx.device, dtype=torch.bfloat16).eval()
    batch, prompt, new = ((1, 64), (32, 1024), (16, 64)) if not ctx.dry else ((1, 2), (4, 16), (2, 6))

    def step(i):
        b, p, n = ctx.rng.randint(*batch), ctx.rng.randint(*prompt), ctx.rng.randint(*new)
        ids = torch.randint(3, cfg.vocab_size, (b, p), generator=ctx.gen).to(ctx.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=True, top_p=0.9, top_k=0,
                                 pad_token_id=cfg.eos_token_id)
        assert out.shape == (b, p + n), out.shape
        _observe(ctx, "tokens", out)
        return {"batch": b, "prompt": p, "new_tokens": n}
    shapes = {"batch": "uniform %d..%d per call" % batch, "prompt": "uniform %d..%d" % prompt,
              "new_tokens": "uniform %d..%d (min_new_tokens = max_new_tokens)" % new,
              "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
              "heads": "%d query / %d key-value" % (cfg.num_attention_heads, cfg.num_key_value_heads),
              "vocab": cfg.vocab_size, "dtype": "bf16 weights", "decoding": "top-p 0.9 sampling",
              "steps_are": "generate() calls"}
    return Built(step, "transformers Qwen2ForCausalLM (Qwen2Config, ~0.5B, random weights), generate()",
                 shapes, _hf_extra(model))


@python_workload("efficientnet_progressive_train", steps=18, warmup=3, est_gib=12, est_s=25,
                 summary="torchvision EfficientNet-B0 training with progressive resizing: image side "
                         "128 -> 320 in six stages of 3 steps, batch 512 -> 80 (pixels per step about "
                         "constant), bf16 autocast, AdamW")
def efficientnet_progressive_train(ctx):
    torch = _torch()
    import torchvision
    if ctx.dry:
        stages = [(32, 4), (48, 2)]
    else:
        stages = [(128, 512), (160, 320), (192, 224), (224, 160), (256, 128), (320, 80)]
    per_stage = 3 if not ctx.dry else 1
    model = torchvision.models.efficientnet_b0(weights=None).to(ctx.device)
    model.train()
    opt = _adamw(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward(i):
        image, batch = stages[min(i // per_stage, len(stages) - 1)]
        x = torch.randn(batch, 3, image, image, generator=ctx.gen).to(ctx.device)
        y = torch.randint(1000, (batch,), generator=ctx.gen).to(ctx.device)
        return loss_fn(model(x), y), {"batch": batch, "image": image}
    shapes = {"stages": ["%dx%d batch %d" % (s, s, b) for s, b in stages], "steps_per_stage": per_stage,
              "classes": 1000, "dtype": "bf16 autocast", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward), "torchvision efficientnet_b0 (random weights)",
                 shapes, {"parameters": _param_count(model)})


@python_workload("gptneox_ckpt_varlen_train", steps=20, warmup=3, est_gib=28, est_s=35,
                 summary="GPT-NeoX-style 410M (24 layers, hidden 1024) with Hugging Face gradient "
                         "checkpointing, batch 8, sequence length 256..2048 per step, bf16 autocast, "
                         "AdamW")
def gptneox_ckpt_varlen_train(ctx):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    if ctx.dry:
        cfg = GPTNeoXConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, vocab_size=512, max_position_embeddings=64)
        batch, lo, hi = 2, 8, 32
    else:
        cfg = GPTNeoXConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                            num_attention_heads=16, vocab_size=50304, max_position_embeddings=2048)
        batch, lo, hi = 8, 256, 2048
    model = _new_model(ctx, GPTNeoXForCausalLM, cfg).to(ctx.device)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = _adamw(model)
    forward = _varlen_lm_forward(ctx, model, cfg.vocab_size, batch, lo, hi)
    shapes = {"batch": batch, "seq": "uniform %d..%d per step" % (lo, hi), "layers": cfg.num_hidden_layers,
              "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "dtype": "bf16 autocast, fp32 weights",
              "optimizer": "AdamW", "gradient_checkpointing": "every layer, non-reentrant"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers GPTNeoXForCausalLM (pythia-410m sizes, random weights)", shapes,
                 _hf_extra(model))


# ---- the second held-out set ---------------------------------------------------------------------
# Added on 2026-12-04 (session 16) to check a footprint-scaled piece length (docs/notes/
# allocation-policy.md, "Pieces that follow the footprint") on workloads that were not in the
# corpus when it was chosen. Small and medium footprints, where the piece length matters most.

def _beam_generate(ctx, model, vocab, pad, batch, prompt, new, beams, encoder_decoder):
    """generate() with beam search: every step reorders the KV cache by beam (index_select)."""
    torch = _torch()
    if ctx.dry:
        batch, prompt, new, beams = (1, 2), (4, 16), (2, 6), 2

    def step(i):
        b, p, n = ctx.rng.randint(*batch), ctx.rng.randint(*prompt), ctx.rng.randint(*new)
        ids = torch.randint(3, vocab, (b, p), generator=ctx.gen).to(ctx.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, num_beams=beams, do_sample=False, early_stopping=False,
                                 pad_token_id=pad)
        # A decoder-only model returns the prompt too; an encoder-decoder one its start token.
        want = (b, (1 if encoder_decoder else p) + n)
        assert tuple(out.shape) == want, (tuple(out.shape), want)
        _observe(ctx, "tokens", out)
        return {"batch": b, "prompt": p, "new_tokens": n}
    return step


@python_workload("t5_beam_generate", steps=6, warmup=1, est_gib=4, est_s=40,
                 summary="T5-base encoder-decoder generate() in bf16 with beam search (4 beams), "
                         "batch 1..16, input 32..512, 8..48 new tokens per call")
def t5_beam_generate(ctx):
    torch = _torch()
    from transformers import T5Config, T5ForConditionalGeneration
    if ctx.dry:
        cfg = T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=512,
                       decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    else:
        cfg = T5Config(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_heads=12, vocab_size=32128,
                       decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = _new_model(ctx, T5ForConditionalGeneration, cfg).to(ctx.device, dtype=torch.bfloat16).eval()
    batch, prompt, new, beams = (1, 16), (32, 512), (8, 48), 4
    shapes = {"batch": "uniform %d..%d per call" % batch, "input": "uniform %d..%d" % prompt,
              "new_tokens": "uniform %d..%d (min_new_tokens = max_new_tokens)" % new, "num_beams": beams,
              "layers": "%d encoder + %d decoder" % (cfg.num_layers, cfg.num_layers), "d_model": cfg.d_model,
              "dtype": "bf16 weights", "steps_are": "generate() calls"}
    return Built(_beam_generate(ctx, model, cfg.vocab_size, cfg.pad_token_id, batch, prompt, new, beams,
                                encoder_decoder=True),
                 "transformers T5ForConditionalGeneration (t5-base sizes, random weights), generate()",
                 shapes, _hf_extra(model))


@python_workload("opt_beam_generate", steps=6, warmup=1, est_gib=6, est_s=40,
                 summary="OPT-350M-style decoder generate() in bf16 with beam search (3 beams), "
                         "batch 1..12, prompt 16..768, 8..40 new tokens per call")
def opt_beam_generate(ctx):
    torch = _torch()
    from transformers import OPTConfig, OPTForCausalLM
    if ctx.dry:
        cfg = OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                        word_embed_proj_dim=64, vocab_size=512, max_position_embeddings=128,
                        pad_token_id=1, bos_token_id=2, eos_token_id=2)
    else:
        cfg = OPTConfig(hidden_size=1024, ffn_dim=4096, num_hidden_layers=24, num_attention_heads=16,
                        word_embed_proj_dim=512, vocab_size=50272, max_position_embeddings=2048,
                        do_layer_norm_before=False, pad_token_id=1, bos_token_id=2, eos_token_id=2)
    model = _new_model(ctx, OPTForCausalLM, cfg).to(ctx.device, dtype=torch.bfloat16).eval()
    batch, prompt, new, beams = (1, 12), (16, 768), (8, 40), 3
    shapes = {"batch": "uniform %d..%d per call" % batch, "prompt": "uniform %d..%d" % prompt,
              "new_tokens": "uniform %d..%d (min_new_tokens = max_new_tokens)" % new, "num_beams": beams,
              "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
              "dtype": "bf16 weights", "steps_are": "generate() calls"}
    return Built(_beam_generate(ctx, model, cfg.vocab_size, cfg.pad_token_id, batch, prompt, new, beams,
                                encoder_decoder=False),
                 "transformers OPTForCausalLM (opt-350m sizes, random weights), generate()", shapes,
                 _hf_extra(model))


@python_workload("gptneo_small_train", steps=16, warmup=3, est_gib=10, est_s=30,
                 summary="GPT-Neo 125M (local and global attention layers) training, batch 4, sequence "
                         "length 128..1024 per step, bf16 autocast, AdamW: a small-footprint LM")
def gptneo_small_train(ctx):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    if ctx.dry:
        cfg = GPTNeoConfig(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                           vocab_size=512, max_position_embeddings=64, window_size=16, bos_token_id=1,
                           eos_token_id=1)
        batch, lo, hi = 2, 8, 32
    else:
        cfg = GPTNeoConfig(hidden_size=768, num_layers=12, num_heads=12,
                           attention_types=[[["global", "local"], 6]], vocab_size=50257,
                           max_position_embeddings=2048, window_size=256)
        batch, lo, hi = 4, 128, 1024
    model = _new_model(ctx, GPTNeoForCausalLM, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)
    forward = _varlen_lm_forward(ctx, model, cfg.vocab_size, batch, lo, hi)
    shapes = {"batch": batch, "seq": "uniform %d..%d per step" % (lo, hi), "layers": cfg.num_layers,
              "hidden": cfg.hidden_size, "attention": "global and local (window %d) alternating" % cfg.window_size,
              "vocab": cfg.vocab_size, "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers GPTNeoForCausalLM (gpt-neo-125m sizes, random weights)", shapes,
                 _hf_extra(model))


@python_workload("roberta_cls_dynpad_train", steps=20, warmup=3, est_gib=14, est_s=30,
                 summary="RoBERTa-base sequence classification fine-tuning with dynamic padding: batch "
                         "8..64 and padded length 32..320 drawn per step, bf16 autocast, AdamW")
def roberta_cls_dynpad_train(ctx):
    torch = _torch()
    from transformers import RobertaConfig, RobertaForSequenceClassification
    if ctx.dry:
        cfg = RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            vocab_size=512, max_position_embeddings=80, num_labels=3)
        (blo, bhi), (lo, hi) = (2, 4), (8, 32)
    else:
        cfg = RobertaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, vocab_size=50265, max_position_embeddings=514,
                            num_labels=3)
        (blo, bhi), (lo, hi) = (8, 64), (32, 320)
    model = _new_model(ctx, RobertaForSequenceClassification, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)

    def forward(i):
        b, s = ctx.rng.randint(blo, bhi), ctx.rng.randint(lo, hi)
        ids = torch.randint(3, cfg.vocab_size, (b, s), generator=ctx.gen)
        lengths = torch.randint(max(1, s // 4), s + 1, (b,), generator=ctx.gen)
        mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
        ids = ids.masked_fill(mask == 0, cfg.pad_token_id)
        labels = torch.randint(cfg.num_labels, (b,), generator=ctx.gen)
        out = model(input_ids=ids.to(ctx.device), attention_mask=mask.to(ctx.device),
                    labels=labels.to(ctx.device))
        return out.loss, {"batch": b, "seq": s}
    shapes = {"batch": "uniform %d..%d per step" % (blo, bhi), "seq": "uniform %d..%d (padded per batch)" % (lo, hi),
              "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "labels": cfg.num_labels,
              "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers RobertaForSequenceClassification (roberta-base sizes, random weights)", shapes,
                 _hf_extra(model))


@python_workload("deeplabv3_varsize_train", steps=16, warmup=3, est_gib=20, est_s=30,
                 summary="torchvision DeepLabV3 (MobileNetV3-Large backbone) segmentation training, batch 16, "
                         "square images of a random side 256..640 (multiple of 32) per step, bf16 autocast, AdamW")
def deeplabv3_varsize_train(ctx):
    torch = _torch()
    import torchvision
    batch, (lo, hi) = (16, (8, 20)) if not ctx.dry else (2, (2, 3))
    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=False).to(ctx.device)
    model.train()
    opt = _adamw(model)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=255)

    def forward(i):
        side = 32 * ctx.rng.randint(lo, hi)
        x = torch.randn(batch, 3, side, side, generator=ctx.gen).to(ctx.device)
        y = torch.randint(21, (batch, side, side), generator=ctx.gen).to(ctx.device)
        return loss_fn(model(x)["out"], y), {"batch": batch, "image": side}
    shapes = {"batch": batch, "image": "square, side 32 x uniform %d..%d per step" % (lo, hi), "classes": 21,
              "dtype": "bf16 autocast", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "torchvision deeplabv3_mobilenet_v3_large (random weights)", shapes,
                 {"parameters": _param_count(model)})


# ---- The third held-out set (held_out_c): kinds of model none of the sets above has ----------------

@python_workload("r3d18_video_train", steps=14, warmup=3, est_gib=30, est_s=40,
                 summary="torchvision R3D-18 video classification training (3D convolutions), batch 16, "
                         "112x112 clips of 8..32 frames drawn per step, bf16 autocast, AdamW")
def r3d18_video_train(ctx):
    torch = _torch()
    import torchvision
    batch, side, (lo, hi) = (16, 112, (8, 32)) if not ctx.dry else (2, 32, (2, 4))
    model = torchvision.models.video.r3d_18(weights=None, num_classes=400).to(ctx.device)
    model.train()
    opt = _adamw(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward(i):
        frames = ctx.rng.randint(lo, hi)
        x = torch.randn(batch, 3, frames, side, side, generator=ctx.gen).to(ctx.device)
        y = torch.randint(400, (batch,), generator=ctx.gen).to(ctx.device)
        return loss_fn(model(x), y), {"batch": batch, "frames": frames}
    shapes = {"batch": batch, "clip": "3 x uniform %d..%d frames x %d x %d per step" % (lo, hi, side, side),
              "classes": 400, "dtype": "bf16 autocast", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward), "torchvision video r3d_18 (random weights)", shapes,
                 {"parameters": _param_count(model)})


class _LstmLm:
    """A word-level LSTM language model (embedding, a stacked cuDNN LSTM, a projection to the
    vocabulary): recurrent, not attention, so cuDNN's RNN workspaces follow the sequence length."""

    @staticmethod
    def make(vocab, embed, hidden, layers):
        torch = _torch()

        class LstmLm(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(vocab, embed)
                self.lstm = torch.nn.LSTM(embed, hidden, num_layers=layers, batch_first=True, dropout=0.1)
                self.proj = torch.nn.Linear(hidden, vocab)

            def forward(self, ids):
                out, _ = self.lstm(self.embed(ids))
                return self.proj(out)
        return LstmLm()


@python_workload("lstm_lm_varlen_train", steps=16, warmup=3, est_gib=24, est_s=40,
                 summary="a 3-layer LSTM language model (cuDNN, hidden 2048, vocab 32,000), batch 8..48 "
                         "and sequence length 64..512 drawn per step, bf16 autocast, AdamW")
def lstm_lm_varlen_train(ctx):
    torch = _torch()
    if ctx.dry:
        vocab, embed, hidden, layers, (blo, bhi), (lo, hi) = 256, 32, 64, 2, (2, 4), (8, 32)
    else:
        vocab, embed, hidden, layers, (blo, bhi), (lo, hi) = 32000, 1024, 2048, 3, (8, 48), (64, 512)
    cache = getattr(ctx, "model_cache", None)
    key = "LstmLm %d %d %d %d" % (vocab, embed, hidden, layers)
    model = (cache.get(key, lambda: _LstmLm.make(vocab, embed, hidden, layers)) if cache is not None
             else _LstmLm.make(vocab, embed, hidden, layers)).to(ctx.device)
    model.train()
    opt = _adamw(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward(i):
        b, s = ctx.rng.randint(blo, bhi), ctx.rng.randint(lo, hi)
        ids = torch.randint(vocab, (b, s + 1), generator=ctx.gen).to(ctx.device)
        logits = model(ids[:, :-1])
        return loss_fn(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1)), {"batch": b, "seq": s}
    shapes = {"batch": "uniform %d..%d per step" % (blo, bhi), "seq": "uniform %d..%d per step" % (lo, hi),
              "layers": layers, "embed": embed, "hidden": hidden, "vocab": vocab,
              "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "torch.nn.LSTM language model (embedding, %d-layer LSTM, linear; random weights)" % layers,
                 shapes, {"parameters": _param_count(model)})


@python_workload("clip_contrastive_train", steps=14, warmup=3, est_gib=40, est_s=40,
                 summary="CLIP (ViT-B/16 image tower, 12-layer text tower) contrastive training: batch "
                         "32..256 image-text pairs and text length 8..77 drawn per step, bf16 autocast, AdamW")
def clip_contrastive_train(ctx):
    torch = _torch()
    from transformers import CLIPConfig, CLIPModel
    if ctx.dry:
        cfg = CLIPConfig(text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                      "num_attention_heads": 2, "vocab_size": 256, "max_position_embeddings": 16,
                                      "bos_token_id": 1, "eos_token_id": 2},
                         vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                        "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
                         projection_dim=16)
        (blo, bhi), (lo, hi) = (2, 4), (4, 16)
    else:
        cfg = CLIPConfig(text_config={"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                                      "num_attention_heads": 8, "vocab_size": 49408,
                                      "max_position_embeddings": 77},
                         vision_config={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                        "num_attention_heads": 12, "image_size": 224, "patch_size": 16},
                         projection_dim=512)
        (blo, bhi), (lo, hi) = (32, 256), (8, 77)
    model = _new_model(ctx, CLIPModel, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)
    image = cfg.vision_config.image_size
    vocab = cfg.text_config.vocab_size

    def forward(i):
        b, t = ctx.rng.randint(blo, bhi), ctx.rng.randint(lo, hi)
        ids = torch.randint(vocab, (b, t), generator=ctx.gen).to(ctx.device)
        pixels = torch.randn(b, 3, image, image, generator=ctx.gen).to(ctx.device)
        return model(input_ids=ids, pixel_values=pixels, return_loss=True).loss, {"batch": b, "text": t}
    shapes = {"batch": "uniform %d..%d image-text pairs per step" % (blo, bhi),
              "text": "uniform %d..%d tokens" % (lo, hi), "image": [3, image, image],
              "vision": "ViT, hidden %d, %d layers, patch %d" % (cfg.vision_config.hidden_size,
                                                                cfg.vision_config.num_hidden_layers,
                                                                cfg.vision_config.patch_size),
              "text_tower": "hidden %d, %d layers" % (cfg.text_config.hidden_size,
                                                      cfg.text_config.num_hidden_layers),
              "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers CLIPModel (clip-vit-base-patch16 sizes, random weights)", shapes,
                 _hf_extra(model))


@python_workload("wav2vec2_ctc_varlen_train", steps=14, warmup=3, est_gib=30, est_s=40,
                 summary="wav2vec 2.0 (base sizes) CTC training on raw 16 kHz audio: batch 8, clips of "
                         "2..15 s and 10..min(120, samples / 640) target characters drawn per step, bf16 autocast, AdamW")
def wav2vec2_ctc_varlen_train(ctx):
    torch = _torch()
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    if ctx.dry:
        cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             conv_dim=(16, 16, 16, 16, 16, 16, 16), vocab_size=32, num_conv_pos_embeddings=16,
                             num_conv_pos_embedding_groups=2, pad_token_id=0, ctc_zero_infinity=True)
        batch, (slo, shi), (tlo, thi) = 2, (4000, 8000), (2, 6)
    else:
        cfg = Wav2Vec2Config(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                             intermediate_size=3072, vocab_size=32, pad_token_id=0,
                             ctc_loss_reduction="mean", ctc_zero_infinity=True)
        batch, (slo, shi), (tlo, thi) = 8, (32000, 240000), (10, 120)
    model = _new_model(ctx, Wav2Vec2ForCTC, cfg).to(ctx.device)
    model.train()
    opt = _adamw(model)

    def forward(i):
        # Targets no longer than the clip's output frames allow (one per 320 samples) at half rate.
        n = ctx.rng.randint(slo, shi)
        t = ctx.rng.randint(tlo, max(tlo, min(thi, n // 640)))
        audio = torch.randn(batch, n, generator=ctx.gen).to(ctx.device)
        labels = torch.randint(1, cfg.vocab_size, (batch, t), generator=ctx.gen).to(ctx.device)
        return model(input_values=audio, labels=labels).loss, {"batch": batch, "samples": n, "labels": t}
    shapes = {"batch": batch, "audio": "uniform %d..%d samples at 16 kHz per step" % (slo, shi),
              "labels": "uniform %d..min(%d, samples / 640) characters" % (tlo, thi), "hidden": cfg.hidden_size,
              "layers": cfg.num_hidden_layers, "loss": "CTC", "dtype": "bf16 autocast, fp32 weights",
              "optimizer": "AdamW"}
    return Built(_train_step(ctx, model, opt, forward),
                 "transformers Wav2Vec2ForCTC (wav2vec2-base sizes, random weights)", shapes,
                 _hf_extra(model))


# ---- C++ examples --------------------------------------------------------------------------------

_CKPT_MODEL = ["--hidden", "2048", "--intermediate", "5504", "--layers", "12", "--heads", "16",
               "--vocab", "32000", "--batch", "4", "--seq", "2048"]

WORKLOADS["checkpoint_llama_planner"] = CppWorkload(
    "checkpoint_llama_planner", "checkpoint_llama",
    args=["--device", "cuda", "--probe", "cuda-native", "--mode", "planner", "--budget-fraction", "0.5",
          *_CKPT_MODEL, "--steps", "10", "--warmup", "3", "--seed", "0"],
    dry_args=["--device", "cpu", "--probe", "cpu-events", "--mode", "planner", "--budget-fraction",
              "0.5", "--hidden", "64", "--intermediate", "172", "--layers", "4", "--heads", "4",
              "--vocab", "256", "--batch", "4", "--seq", "128", "--steps", "1", "--warmup", "1"],
    steps=15, warmup=5, est_gib=34, est_s=30,
    summary="gpumem's own activation-checkpointing planner (examples/checkpoint_llama, libtorch C++): "
            "the Llama-style 12-layer model, planner at half the activation memory, bf16 autocast, AdamW",
    model="examples/checkpoint_llama (libtorch C++ Llama-style decoder)",
    shapes={"hidden": 2048, "intermediate": 5504, "layers": 12, "heads": 16, "vocab": 32000,
            "batch": 4, "seq": 2048, "mode": "planner, --budget-fraction 0.5",
            "steps_are": "3 warm-up, chain profiling, 2 settling, 10 measured",
            "dtype": "bf16 autocast, fp32 weights", "optimizer": "AdamW"})

WORKLOADS["zero3_prefetch"] = CppWorkload(
    "zero3_prefetch", "zero_train",
    args=["--device", "cuda", "--allocator", "native", "--stage", "3", "--layers", "12", "--width",
          "1024", "--heads", "16", "--seq", "512", "--batch", "16", "--vocab", "256", "--steps", "20",
          "--log-every", "5", "--lr", "6e-4", "--seed", "0"],
    dry_args=["--device", "cpu", "--allocator", "native", "--stage", "3", "--layers", "2", "--width",
              "32", "--heads", "4", "--seq", "16", "--batch", "4", "--vocab", "64", "--steps", "1"],
    steps=20, warmup=5, est_gib=12, est_s=25,
    summary="gpumem's ZeRO stage 3 (examples/zero_train, one rank over NCCL) with side-stream "
            "prefetch of the next unit's all-gather: the multi-stream workload",
    model="examples/zero_train (libtorch C++ GPT-style, gpumem::zero::ShardedTrainer)",
    shapes={"layers": 12, "width": 1024, "heads": 16, "seq": 512, "batch": 16, "vocab": 256,
            "stage": 3, "prefetch": "on (side stream)", "reshard_after_forward": True,
            "world_size": 1, "dtype": "bf16 compute", "optimizer": "AdamW (ZeRO)"},
    env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
