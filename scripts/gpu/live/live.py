#!/usr/bin/env python3
"""Live side by side on one GPU: PyTorch's allocator, expandable segments and gpumem on the same
real workloads, every run in a fresh process, the modes alternated, step time and peak memory with
their spread over repetitions (issues 12, 13 and 14; ANCHORS.md "Live side by side").

    live.py --lib PATH/libgpumem_torch.so [--out DIR] [--reps 3] [--deadline-s 380]
    live.py --plan                       (the runs and their estimated wall time; runs nothing)
    live.py --dry-run-cpu [--lib PATH]   (tiny shapes on the CPU: the same fork server, modes,
                                          alternation, deadline and report; no allocator stats)

Workloads (scripts/gpu/corpus/workloads.py builds them; their shapes are issue 12's table):
gpt2_varlen_train, llama_train, llama_train_ckpt, gpt2_generate by default; `--workloads held_out`
(`held_out_b`, `held_out_c`) runs the corpus's six (five, four) held-out workloads instead (shortened:
WORKLOAD_DEFAULTS); names and groups mix. Modes:

    native          PyTorch's CUDA caching allocator as shipped
    expandable      the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    gpumem          GPUMEM_ALLOC_CONF set (empty: gpumem's defaults), then
                    torch.ops.load_library(libgpumem_torch.so), which installs gpumem on load
    gpumem_trace    gpumem with trace_entries:100000 (its event ring)
    gpumem_ops      gpumem with record_ops:True (per-operator attribution)
    native_history  native with torch.cuda.memory._record_memory_history(max_entries=100000)
                    started before the model (PyTorch's own history, the anchor of issue 14)

--cpus LIST pins every run (os.sched_setaffinity in the child, before its threads and CUDA start)
and makes len(LIST) the runs' torch threads unless --threads says otherwise; the header says
whether the runs were pinned.

--no-cudnn-sdp turns cuDNN's attention off in every run (torch.backends.cuda.enable_cudnn_sdp(False),
before the model runs), so scaled_dot_product_attention takes the flash, memory-efficient or math
kernel. On the H200, cuDNN's attention compiles a plan with NVRTC for every new shape (every new
KV-cache length of generate()): 70% of generate()'s CPU time under either allocator
(docs/notes/fast-path.md), which is run-to-run noise that no allocator controls. The header says
when it is off.

--mode-conf NAME=CONF adds a gpumem mode (or redefines one): e.g.
--mode-conf gpumem_classic=expandable_segments:False. Every workload runs native, expandable and
gpumem (plus the modes --mode-conf adds); gpt2_varlen_train also runs gpumem_trace, gpumem_ops and
native_history. --modes A,B,... replaces the set for every workload.

Fresh processes cheaply: this process imports torch, transformers and torchvision without
initializing CUDA, builds each workload's model on the CPU once (seeded; see workloads.py's
model_cache), and forks one child per run. The child sets its mode's environment before its first
CUDA call, loads gpumem if the mode asks for it, checks that the settings took effect (the
allocator backend; PyTorch's allocator_settings and the first segment's kind in a snapshot taken
right after CUDA starts), moves the model to the GPU, runs the steps, and sends its result as JSON
through a pipe. --no-fork starts `python3 live.py --child-spec` instead (imports in every run).

Order: for each repetition, every workload, its modes in an order rotated by repetition (so no
mode is always first). Each run has a timeout; a run that fails is reported and the others go
on; runs not started by --deadline-s (from this process's start) are listed as NOT RUN.

Results: OUT/live.jsonl (one line per run, written as it finishes), OUT/summary.txt (rewritten
after every run; the table), OUT/summary.json (its rows, bytes), OUT/live-logs.tar.gz (each
child's log). The table prints last: per (workload, mode) the median of the runs' step times (training: median of the timed steps;
generate: mean of the timed calls, the same calls in every mode) with min..max over repetitions,
the ratio to native within each repetition (median, min..max), the process's CPU time per step
and its difference to the mode's base within each repetition, the gpumem modes' driver and
stream-wait milliseconds per timed step (gpumem.driver.* / gpumem.wait.* keys read around every
step, outside the timed region; a second table breaks them down by call), peak reserved / requested (bytes
in the JSON, GiB in the table) and their ratio, and whether losses / generated tokens equal
native's.
"""

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import tarfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(os.path.dirname(HERE), "corpus")
sys.path.insert(0, HERE)
sys.path.insert(0, CORPUS)

import report  # noqa: E402  (standard library only)

T_START = time.monotonic()

ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
              "GPUMEM_ALLOC_CONF")
HISTORY_ENTRIES = 100_000


class Mode:
    """An allocator setting a run is made under. kind "torch": PyTorch's allocator configured by
    PYTORCH_CUDA_ALLOC_CONF=conf ('' = unset); kind "gpumem": GPUMEM_ALLOC_CONF=conf and gpumem
    loaded. history: PyTorch's _record_memory_history started before the model."""

    def __init__(self, name, kind, conf, history=False):
        self.name, self.kind, self.conf, self.history = name, kind, conf, history

    def env(self):
        """{variable: value or None (unset)} for every allocator variable."""
        env = dict.fromkeys(ALLOC_VARS)
        if self.kind == "torch" and self.conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = self.conf
        if self.kind == "gpumem":
            env["GPUMEM_ALLOC_CONF"] = self.conf
        return env

    def as_dict(self):
        return {"name": self.name, "kind": self.kind, "conf": self.conf, "history": self.history}

    @staticmethod
    def from_dict(d):
        return Mode(d["name"], d["kind"], d["conf"], d["history"])


BUILTIN_MODES = {
    "native": Mode("native", "torch", ""),
    "expandable": Mode("expandable", "torch", "expandable_segments:True"),
    "gpumem": Mode("gpumem", "gpumem", ""),
    "gpumem_trace": Mode("gpumem_trace", "gpumem", "trace_entries:%d" % HISTORY_ENTRIES),
    "gpumem_ops": Mode("gpumem_ops", "gpumem", "record_ops:True"),
    "native_history": Mode("native_history", "torch", "", history=True),
}
PLAIN_MODES = ["native", "expandable", "gpumem"]
EXTRA_MODES = {"gpt2_varlen_train": ["gpumem_trace", "gpumem_ops", "native_history"]}

# Steps per run (warm-up included) and warm-up steps left out of the step time. The peak of the
# GPT-2 run comes at step 11 (its longest sequence, 1004; step 18 has 977) in the corpus traces and
# the Llama ones at step 2; every training step after the first is steady. generate(): the first three calls of
# seed 0 (batch 25/3/32, prompt 404/148/223, 69/81/116 new tokens), the first one as warm-up.
# step_metric: how a run's timed steps make its step time (generate's calls differ in size, so
# their mean, over the same calls in every mode; training steps: the median).
WORKLOAD_DEFAULTS = {
    "gpt2_varlen_train": {"steps": 18, "warmup": 3, "metric": "median"},
    "llama_train": {"steps": 12, "warmup": 3, "metric": "median"},
    "llama_train_ckpt": {"steps": 12, "warmup": 3, "metric": "median"},
    "gpt2_generate": {"steps": 3, "warmup": 1, "metric": "mean"},
    # The corpus's held-out workloads (scripts/gpu/corpus/workloads.py), shortened: Qwen2's peak
    # comes in its first generate() call, EfficientNet's stages take 18 steps.
    "qwen2_generate_sampled": {"steps": 4, "warmup": 1, "metric": "mean"},
    "maskrcnn_varsize_train": {"steps": 8, "warmup": 3, "metric": "median"},
    "bert_large_mlm_train": {"steps": 8, "warmup": 3, "metric": "median"},
    "whisper_varlen_train": {"steps": 10, "warmup": 3, "metric": "median"},
    "efficientnet_progressive_train": {"steps": 18, "warmup": 3, "metric": "median"},
    "gptneox_ckpt_varlen_train": {"steps": 12, "warmup": 3, "metric": "median"},
    # The second held-out set (held_out_b), shortened the same way.
    "deeplabv3_varsize_train": {"steps": 10, "warmup": 3, "metric": "median"},
    "roberta_cls_dynpad_train": {"steps": 12, "warmup": 3, "metric": "median"},
    "gptneo_small_train": {"steps": 10, "warmup": 3, "metric": "median"},
    "t5_beam_generate": {"steps": 4, "warmup": 1, "metric": "mean"},
    "opt_beam_generate": {"steps": 4, "warmup": 1, "metric": "mean"},
    # The third held-out set (held_out_c), shortened the same way.
    "clip_contrastive_train": {"steps": 10, "warmup": 3, "metric": "median"},
    "r3d18_video_train": {"steps": 10, "warmup": 3, "metric": "median"},
    "wav2vec2_ctc_varlen_train": {"steps": 10, "warmup": 3, "metric": "median"},
    "lstm_lm_varlen_train": {"steps": 12, "warmup": 3, "metric": "median"},
}
# What a run without --workloads measures: issue 12's four live workloads.
DEFAULT_WORKLOADS = ["gpt2_varlen_train", "llama_train", "llama_train_ckpt", "gpt2_generate"]
HELD_OUT_WORKLOADS = ["qwen2_generate_sampled", "maskrcnn_varsize_train", "bert_large_mlm_train",
                      "whisper_varlen_train", "efficientnet_progressive_train", "gptneox_ckpt_varlen_train"]
HELD_OUT_B_WORKLOADS = ["deeplabv3_varsize_train", "roberta_cls_dynpad_train", "gptneo_small_train",
                        "t5_beam_generate", "opt_beam_generate"]
HELD_OUT_C_WORKLOADS = ["clip_contrastive_train", "r3d18_video_train", "wav2vec2_ctc_varlen_train",
                        "lstm_lm_varlen_train"]
GROUPS = {"held_out": HELD_OUT_WORKLOADS, "held_out_b": HELD_OUT_B_WORKLOADS, "held_out_c": HELD_OUT_C_WORKLOADS}
DRY_STEPS = 4
# Workloads whose builder takes its model from ctx.model_cache (built once in this process).
PREBUILT = {"gpt2_varlen_train", "llama_train", "llama_train_ckpt", "gpt2_generate", "qwen2_generate_sampled",
            "bert_large_mlm_train", "whisper_varlen_train", "gptneox_ckpt_varlen_train", "roberta_cls_dynpad_train",
            "gptneo_small_train", "t5_beam_generate", "opt_beam_generate"}

# Wall-time estimates for --plan, seconds on an H200 host (README.md says where they come from):
# per run, process start to CUDA ready plus exit; per workload, moving the prebuilt model to the
# GPU, the first step, each later step, and building the CPU model once in this process (one
# thread); mode factors on the steps.
EST_PROCESS_S = 2.0
EST_WORKLOAD = {
    "gpt2_varlen_train": {"build": 0.5, "first": 1.0, "step": 0.19, "prebuild": 2.0},
    "llama_train": {"build": 1.0, "first": 1.0, "step": 0.135, "prebuild": 8.0},
    "llama_train_ckpt": {"build": 1.0, "first": 1.0, "step": 0.16, "prebuild": 0.0},
    "gpt2_generate": {"build": 0.5, "first": 3.5, "step": 4.5, "prebuild": 0.0},
    # Held out: from their corpus captures (history recorded, GPU shared), not yet from live runs.
    "qwen2_generate_sampled": {"build": 1.0, "first": 4.0, "step": 2.4, "prebuild": 4.0},
    "maskrcnn_varsize_train": {"build": 2.0, "first": 2.0, "step": 0.62, "prebuild": 0.0},
    "bert_large_mlm_train": {"build": 1.5, "first": 1.5, "step": 0.18, "prebuild": 4.0},
    "whisper_varlen_train": {"build": 1.5, "first": 1.5, "step": 0.42, "prebuild": 3.0},
    "efficientnet_progressive_train": {"build": 1.0, "first": 1.5, "step": 0.31, "prebuild": 0.0},
    "gptneox_ckpt_varlen_train": {"build": 1.5, "first": 1.5, "step": 0.30, "prebuild": 4.0},
    # The second held-out set: from its corpus captures (2026-12-04, five at once on one GPU).
    "deeplabv3_varsize_train": {"build": 1.0, "first": 2.0, "step": 0.8, "prebuild": 0.0},
    "roberta_cls_dynpad_train": {"build": 1.0, "first": 1.5, "step": 0.9, "prebuild": 2.0},
    "gptneo_small_train": {"build": 1.0, "first": 1.5, "step": 0.8, "prebuild": 2.0},
    "t5_beam_generate": {"build": 1.0, "first": 4.0, "step": 6.0, "prebuild": 2.0},
    "opt_beam_generate": {"build": 1.0, "first": 4.0, "step": 6.0, "prebuild": 2.0},
    # The third held-out set: guesses until its corpus captures (transformers models built in the
    # parent; the torchvision and LSTM ones in each run).
    "clip_contrastive_train": {"build": 1.5, "first": 2.0, "step": 0.6, "prebuild": 3.0},
    "r3d18_video_train": {"build": 1.0, "first": 3.0, "step": 0.8, "prebuild": 0.0},
    "wav2vec2_ctc_varlen_train": {"build": 1.0, "first": 2.0, "step": 0.6, "prebuild": 2.0},
    "lstm_lm_varlen_train": {"build": 1.0, "first": 2.0, "step": 0.5, "prebuild": 2.0},
}
EST_MODE_FACTOR = {"gpumem_trace": 1.2, "gpumem_ops": 1.22, "native_history": 1.2}
EST_IMPORTS_S = 6.0


def log(msg):
    print(msg, flush=True)


class RunError(Exception):
    """A run that cannot go on, with the one message that says why."""


# ---- command line and plan ---------------------------------------------------------------------

def parse_pairs(items, what, value_type=str):
    """['a=1', 'b=2,c=3'] -> {'a': 1, 'b': 2, 'c': 3}; raises ValueError naming the bad item."""
    out = {}
    for item in items or []:
        for part in item.split(",") if value_type is not str else [item]:
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or not name:
                raise ValueError("%s expects NAME=VALUE, got %r" % (what, part))
            try:
                out[name] = value_type(value)
            except ValueError:
                raise ValueError("%s %s=%r: not a valid %s" % (what, name, value, value_type.__name__))
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libgpumem_torch.so for the gpumem modes")
    ap.add_argument("--gpumem-via", choices=("library", "package"), default="library",
                    help="library: torch.ops.load_library(--lib); package: `import gpumem; gpumem.install()`")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help="comma-separated workloads of scripts/gpu/corpus/workloads.py, or held_out / "
                         "held_out_b / held_out_c for the corpus's held-out sets (default: %(default)s)")
    ap.add_argument("--modes", help="comma-separated modes for every workload (default: per workload)")
    ap.add_argument("--mode-conf", action="append", default=[], metavar="NAME=CONF",
                    help="add or redefine a gpumem mode: NAME runs with GPUMEM_ALLOC_CONF=CONF")
    ap.add_argument("--steps", action="append", default=[], metavar="W=N",
                    help="steps per run for workload W, warm-up included (repeatable, or W=N,V=M)")
    ap.add_argument("--warmup", action="append", default=[], metavar="W=N",
                    help="warm-up steps left out of W's step time")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every (workload, mode)")
    ap.add_argument("--deadline-s", type=float, default=380.0,
                    help="no run starts later than this many seconds after this process started")
    ap.add_argument("--grace-s", type=float, default=45.0,
                    help="a run still going at deadline + grace is stopped")
    ap.add_argument("--run-timeout-s", type=float, default=None,
                    help="seconds one run may take (default: 4x its estimate, at least 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads in each run (default: the number of --cpus, else torch's default)")
    ap.add_argument("--cpus", default=None, metavar="LIST",
                    help="pin every run to these CPUs (e.g. 0-7 or 0,2,4-7; os.sched_setaffinity in the child "
                         "before it sets its threads or starts CUDA); default: not pinned")
    ap.add_argument("--no-cudnn-sdp", action="store_true",
                    help="torch.backends.cuda.enable_cudnn_sdp(False) in every run (no NVRTC plan builds)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "live-out",
                    help="results directory (default: $OUT, else ./live-out)")
    ap.add_argument("--work", default=None,
                    help="scratch directory for the runs' logs (default: a new /tmp/gpumem-live-*; "
                         "OUT gets them as one archive)")
    ap.add_argument("--no-fork", action="store_true",
                    help="start every run as `python3 live.py --child-spec` instead of forking")
    ap.add_argument("--no-prebuild", action="store_true",
                    help="each child builds its model on the CPU itself instead of inheriting it")
    ap.add_argument("--history-stacks", choices=("all", "python"), default="all",
                    help="native_history's stacks= (PyTorch's default: all)")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="tiny shapes on the CPU, no allocator statistics: the same code path")
    ap.add_argument("--plan", action="store_true", help="print the runs and the estimated wall time")
    ap.add_argument("--child-spec", help=argparse.SUPPRESS)
    ap.add_argument("--result-fd", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_spec:
        return args
    try:
        args.steps_by = parse_pairs(args.steps, "--steps", int)
        args.warmup_by = parse_pairs(args.warmup, "--warmup", int)
        args.mode_defs = mode_definitions(args.mode_conf)
    except ValueError as err:
        ap.error(str(err))
    args.workload_list = []
    for w in (w.strip() for w in args.workloads.split(",")):
        for x in GROUPS.get(w, [w] if w else []):
            if x not in args.workload_list:
                args.workload_list.append(x)
    if not args.workload_list:
        ap.error("--workloads is empty")
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.deadline_s <= 0 or (args.run_timeout_s is not None and args.run_timeout_s <= 0) or args.grace_s < 0:
        ap.error("--deadline-s and --run-timeout-s must be positive, --grace-s not negative")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be at least 1")
    try:
        args.cpu_list = parse_cpu_list(args.cpus) if args.cpus is not None else None
    except ValueError as err:
        ap.error(str(err))
    for name, n in list(args.steps_by.items()) + list(args.warmup_by.items()):
        if name not in args.workload_list:
            ap.error("--steps/--warmup name %r, which is not among --workloads (%s)"
                     % (name, ", ".join(args.workload_list)))
        if n < 0:
            ap.error("--steps/--warmup %s=%d: must not be negative" % (name, n))
    for name, n in args.steps_by.items():
        if n < 1:
            ap.error("--steps %s=%d: a run needs at least one step" % (name, n))
    args.modes_by = {}
    for w in args.workload_list:
        if args.modes:
            modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        else:
            added = [m for m in args.mode_defs if m not in BUILTIN_MODES]
            modes = PLAIN_MODES + EXTRA_MODES.get(w, []) + added
        unknown = [m for m in modes if m not in args.mode_defs]
        if unknown:
            ap.error("unknown mode(s) %s; known: %s (--mode-conf NAME=CONF adds gpumem modes)"
                     % (", ".join(unknown), ", ".join(args.mode_defs)))
        if len(set(modes)) != len(modes):
            ap.error("--modes names a mode twice: %s" % args.modes)
        args.modes_by[w] = modes
    return args


def format_cpu_list(cpus):
    """[0, 1, 2, 3, 6] -> '0-3,6'."""
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(parts)


def parse_cpu_list(text, allowed=None):
    """--cpus: '0-7', '0,2,4-7' -> the sorted CPU numbers. Raises ValueError naming the problem and
    the fix when the list is malformed or names CPUs this process may not run on (allowed: a set,
    default os.sched_getaffinity(0))."""
    cpus = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError("--cpus %r: %r is not a CPU number or a range like 0-7; write e.g. --cpus 0-7 or "
                             "--cpus 0,2,4-7" % (text, part))
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ValueError("--cpus %r: the range %s runs backwards; write %d-%d" % (text, part, hi, lo))
        cpus.update(range(lo, hi + 1))
    if allowed is None:
        allowed = os.sched_getaffinity(0)
    missing = sorted(cpus - set(allowed))
    if missing:
        raise ValueError("--cpus %r: CPU(s) %s are not available to this process (it may run on %s); "
                         "choose among those" % (text, format_cpu_list(missing), format_cpu_list(sorted(allowed))))
    return sorted(cpus)


def mode_definitions(mode_confs):
    """The built-in modes plus --mode-conf NAME=CONF (gpumem modes). Raises ValueError."""
    modes = dict(BUILTIN_MODES)
    for name, conf in parse_pairs(mode_confs, "--mode-conf").items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError("--mode-conf %r: a mode name is letters, digits, '_', '.', '-'" % name)
        if name in BUILTIN_MODES and BUILTIN_MODES[name].kind != "gpumem":
            raise ValueError("--mode-conf %s=...: %s is PyTorch's allocator, not a gpumem mode; "
                             "--mode-conf defines gpumem modes (GPUMEM_ALLOC_CONF)" % (name, name))
        modes[name] = Mode(name, "gpumem", conf.strip())
    return modes


def rotation(rep, reps, n):
    """How far repetition `rep` rotates a list of n modes: spread over the repetitions when there
    are no more of them than modes (each mode first at most once), else one step per repetition."""
    if n == 0:
        return 0
    return (rep * n // reps) % n if reps <= n else rep % n


def workload_order(workloads):
    """The longest runs first within a repetition, so that a deadline cuts the short ones."""
    def est(w):
        e = EST_WORKLOAD.get(w)
        return -(e["first"] + e["step"] * WORKLOAD_DEFAULTS[w]["steps"]) if e else 0.0
    return sorted(workloads, key=est)


def make_plan(args):
    """Every run in the order it will be made: dicts with the run's index, rep, workload, mode,
    position in its repetition, steps, warm-up, step metric."""
    plan = []
    for rep in range(args.reps):
        for w in workload_order(args.workload_list):
            modes = args.modes_by[w]
            k = rotation(rep, args.reps, len(modes))
            d = WORKLOAD_DEFAULTS.get(w, {"steps": None, "warmup": None, "metric": "median"})
            steps, warmup = d["steps"], d["warmup"]
            if args.dry_run_cpu and steps is not None:  # tiny shapes: a few steps show the path
                steps, warmup = min(steps, DRY_STEPS), min(warmup, 1)
            steps = args.steps_by.get(w, steps)
            warmup = args.warmup_by.get(w, warmup)
            for pos, mode in enumerate(modes[k:] + modes[:k]):
                plan.append({
                    "index": len(plan), "rep": rep, "workload": w, "mode": mode, "position": pos,
                    "steps": steps, "warmup": warmup, "metric": d["metric"],
                })
    return plan


def estimate_run_s(spec):
    e = EST_WORKLOAD.get(spec["workload"])
    if e is None:
        return None
    steps = spec["steps"] or WORKLOAD_DEFAULTS[spec["workload"]]["steps"]
    f = EST_MODE_FACTOR.get(spec["mode"], 1.0)
    return EST_PROCESS_S + e["build"] + (e["first"] + e["step"] * max(0, steps - 1)) * f


def print_plan(plan, args):
    total = EST_IMPORTS_S + sum(EST_WORKLOAD.get(w, {}).get("prebuild", 0) for w in args.workload_list)
    log("startup (imports, CPU models): ~%.0f s" % total)
    for spec in plan:
        est = estimate_run_s(spec)
        total += est or 0
        log("%3d rep %d %-18s %-15s steps %-3s warm-up %-2s ~%5.1f s  (ends ~%.0f s)"
            % (spec["index"] + 1, spec["rep"] + 1, spec["workload"], spec["mode"], spec["steps"],
               spec["warmup"], est or 0, total))
    log("%d runs, estimated %.0f s (%.1f min); deadline for starting a run %.0f s"
        % (len(plan), total, total / 60, args.deadline_s))


# ---- the child: one run in a fresh process ------------------------------------------------------

def apply_mode_env(mode):
    """Sets this process's allocator variables to the mode's (the others unset)."""
    for var, value in mode.env().items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def conf_pairs(conf):
    """'a:1,b:True' -> {'a': '1', 'b': 'True'} (top level only; enough for the keys checked here)."""
    out = {}
    for part in re.split(r",(?![^\[]*\])", conf or ""):
        key, _, value = part.strip().partition(":")
        if key:
            out[key.strip()] = value.strip()
    return out


def load_gpumem(torch, spec):
    """Installs gpumem the way the spec says and checks that it is torch's CUDA allocator now."""
    if spec["gpumem_via"] == "package":
        try:
            import gpumem  # noqa: F401  (a future Python package)
        except ImportError as err:
            raise RunError("--gpumem-via package: `import gpumem` failed (%s); use --lib PATH instead" % err)
        if not hasattr(gpumem, "install"):
            raise RunError("--gpumem-via package: the gpumem package (%s) has no install(); use --lib PATH"
                           % getattr(gpumem, "__file__", "?"))
        if torch.cuda.get_allocator_backend() != "gpumem":
            gpumem.install()
    else:
        lib = spec["lib"]
        if not lib or not os.path.isfile(lib):
            raise RunError("no libgpumem_torch.so at %r: pass --lib PATH (built on the CPU machine and carried)"
                           % lib)
        try:
            torch.ops.load_library(lib)
        except OSError as err:
            # A failed load-time install raises in Python (torch wraps it in OSError); the library
            # is loaded all the same, and the check below reports gpumem's own message.
            if err.__cause__ is None:
                raise
    backend = torch.cuda.get_allocator_backend()
    if backend != "gpumem":
        why = ""
        try:
            why = torch.ops.gpumem.load_error()
        except Exception as err:  # noqa: BLE001 - the library may not even have registered its ops
            why = "torch.ops.gpumem.load_error() is unavailable: %s" % err
        raise RunError("gpumem is not torch's CUDA allocator after loading it (backend %r, GPUMEM_ALLOC_CONF=%r): %s"
                       % (backend, os.environ.get("GPUMEM_ALLOC_CONF"), why or "no load error was recorded"))
    return backend


def probe_settings(torch, device, mode):
    """Starts CUDA with one small tensor and reads back what the allocator says it is: the backend,
    PyTorch's allocator_settings from a snapshot (taken before any history is recorded, so it is
    small) and whether the first segment is expandable. Raises RunError when a PyTorch mode's
    allocator_settings contradict its PYTORCH_CUDA_ALLOC_CONF (the setting did not take effect);
    anything the snapshot does not show is noted as unverified rather than failing the run."""
    probe = torch.empty(1, device=device)
    out = {"backend": torch.cuda.get_allocator_backend(), "verified": []}
    try:
        snap = torch.cuda.memory._snapshot()
    except Exception as err:  # noqa: BLE001 - the settings stay unverified, the run goes on
        snap = {}
        out["verified"].append("UNVERIFIED: torch.cuda.memory._snapshot() failed: %s" % err)
    del probe
    settings = snap.get("allocator_settings") or {}
    index = device.index if device.index is not None else 0
    segs = [s for s in snap.get("segments", []) if s.get("device", index) == index]
    seg_expandable = sorted({bool(s["is_expandable"]) for s in segs if "is_expandable" in s})
    out["allocator_settings"] = {k: v for k, v in settings.items() if not isinstance(v, dict)}
    out["first_segments_expandable"] = seg_expandable
    if mode.kind == "torch":
        want = conf_pairs(mode.conf).get("expandable_segments", "False") == "True"
        have = settings.get("expandable_segments")
        if have is not None:
            if bool(have) != want:
                raise RunError("PYTORCH_CUDA_ALLOC_CONF=%r was set before CUDA started, but PyTorch's allocator "
                               "settings say expandable_segments=%s: the setting did not take effect in this "
                               "process (rerun with --no-fork to set it before torch is imported)"
                               % (os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), have))
            out["verified"].append("allocator_settings expandable_segments=%s" % bool(have))
        if seg_expandable == [want]:
            out["verified"].append("first segment is_expandable=%s" % want)
        elif seg_expandable:
            out["verified"].append("WARNING: the first segments' is_expandable=%s, expected %s"
                                   % (seg_expandable, want))
        if have is None and seg_expandable != [want]:
            out["verified"].append("UNVERIFIED: the snapshot shows neither allocator_settings nor segment kinds")
    else:
        out["verified"].append("backend gpumem")
        flat = " ".join(str(v) for v in settings.values()).replace(" ", "")
        missing = ["%s:%s" % kv for kv in conf_pairs(mode.conf).items() if "%s:%s" % kv not in flat]
        if settings and missing:
            out["verified"].append("WARNING: gpumem's allocator_settings do not show %s (they say: %s)"
                                   % (", ".join(missing), flat[:300]))
        elif missing:
            out["verified"].append("gpumem's settings not shown in the snapshot")
        elif mode.conf:
            out["verified"].append("settings show %s" % mode.conf)
    return out


def make_ctx_class():
    """capture.Ctx (shapes from ctx.rng, data from ctx.gen) plus the two hooks workloads.py knows:
    observe (losses / tokens) and model_cache."""
    import capture

    class LiveCtx(capture.Ctx):
        def __init__(self, torch, device, dry, seed, model_cache):
            super().__init__(torch, device, dry, seed)
            self.model_cache = model_cache
            self.observed = {}

        def observe(self, name, value):
            self.observed[name] = value

        def take_observed(self):
            """The last step's outputs as plain values (read after the step's timer stopped):
            the loss as a float, generated tokens as a checksum of their values and shape."""
            import hashlib
            out = {}
            if "loss" in self.observed:
                out["loss"] = float(self.observed["loss"].float().item())
            if "tokens" in self.observed:
                t = self.observed["tokens"].cpu()
                h = hashlib.sha1(repr((tuple(t.shape), t.flatten().tolist())).encode()).hexdigest()[:16]
                out["tokens"] = h
            self.observed.clear()
            return out
    return LiveCtx


class ModelCache:
    """Models built once on the CPU in the forking parent and inherited by every child. In the
    parent (prebuild), get() builds the model with the global torch RNG seeded as a child seeds it,
    keeps it with the RNG state the build leaves, and stops the builder (Prebuilt). In a child,
    get() hands out the kept model and puts that RNG state back, so the child is where it would
    have been had it built the model itself; an unknown key builds normally."""

    class Prebuilt(Exception):
        pass

    def __init__(self, torch):
        self.torch = torch
        self.models = {}
        self.prebuilding = False
        self.seed = None

    def get(self, key, factory):
        torch = self.torch
        if self.prebuilding:
            if key not in self.models:
                self.models[key] = (factory(), torch.random.get_rng_state())
            raise ModelCache.Prebuilt(key)
        if key in self.models:
            model, state = self.models[key]
            torch.random.set_rng_state(state)
            return model
        return factory()

    def prebuild(self, workload, seed, dry):
        """Runs the workload's builder up to its model (seeded like a child). Returns the seconds
        it took, or None when the builder does not take its model from the cache."""
        torch = self.torch
        if self.seed is not None and self.seed != seed:
            raise RuntimeError("one ModelCache serves one seed")
        self.seed = seed
        ctx = make_ctx_class()(torch, torch.device("cpu"), dry, seed, self)
        t0 = time.monotonic()
        torch.manual_seed(seed)
        self.prebuilding = True
        try:
            workload.build(ctx)
        except ModelCache.Prebuilt:
            return time.monotonic() - t0
        finally:
            self.prebuilding = False
        return None


MODEL_CACHE = None  # the parent's ModelCache (fork mode), inherited by the children


def gpu_device(torch):
    """The device the runs measure (a function so that the tests can stand a CPU in for it)."""
    return torch.device("cuda", 0)


def cuda_available(torch):
    return torch.cuda.is_available()


# ---- driver calls and stream waits per step (gpumem modes) --------------------------------------
# gpumem.stats / torch.ops.gpumem.memory_stats carry cumulative host times of the CUDA VMM source's
# driver calls and of the CUDA events' waits (docs/torch_adapter.md, "gpumem's own keys"). A gpumem
# run reads them before its first step and after each step's closing synchronize (outside the timed
# region) and keeps each step's differences.

DRIVER_CALLS = ("address_reserve", "address_free", "create", "release", "map", "set_access", "unmap")
WAIT_CALLS = ("sync_stream", "sync_event")
EVENT_CALLS = ("record", "query")
CALL_KEYS = (tuple("gpumem.driver." + c for c in DRIVER_CALLS) + tuple("gpumem.wait." + c for c in WAIT_CALLS)
             + tuple("gpumem.event." + c for c in EVENT_CALLS))


def read_call_times(stats):
    """The driver / wait / event counters of one memory_stats read: {"timed": {"driver", "wait"},
    "calls": {short key: (calls, ns, max_ns)}} (short key: "driver.map", "wait.sync_stream", ...).
    Keys that are absent (a gpumem without them) read as 0."""
    out = {"timed": {"driver": bool(stats.get("gpumem.driver.timed", 0)),
                     "wait": bool(stats.get("gpumem.wait.timed", 0))}, "calls": {}}
    for k in CALL_KEYS:
        out["calls"][k[len("gpumem."):]] = (int(stats.get(k + ".calls", 0)), int(stats.get(k + ".ns", 0)),
                                           int(stats.get(k + ".max_ns", 0)))
    return out


def step_call_deltas(reads):
    """reads: one read_call_times() before the first step and one after each step. Per step: the
    driver ns and calls (all driver calls), the wait ns and calls (sync_stream + sync_event), the
    event ns and calls (record + query), and each call kind's (calls, ns) difference."""
    steps = []
    for a, b in zip(reads, reads[1:]):
        d = {k: (b["calls"][k][0] - a["calls"][k][0], b["calls"][k][1] - a["calls"][k][1]) for k in b["calls"]}
        step = {"by_call": d}
        for group in ("driver", "wait", "event"):
            step[group + "_calls"] = sum(c for k, (c, _) in d.items() if k.startswith(group + "."))
            step[group + "_ns"] = sum(ns for k, (_, ns) in d.items() if k.startswith(group + "."))
        steps.append(step)
    return steps


def call_time_result(reads, warm, step_s):
    """What a run's result keeps of the per-step reads: per-step lists over every step
    (driver_ns_all, driver_calls_all, wait_ns_all, wait_calls_all, event_ns_all, event_calls_all),
    means per timed step in seconds and counts (driver_s, wait_s, event_s, driver_calls_per_step,
    wait_calls_per_step), their shares of the timed steps' summed wall time (driver_share,
    wait_share), per call kind over the timed steps {calls, ns, max_ns_run} (calls_timed; max_ns_run
    is the longest call of the whole run), and whether the keys were measured (calls_timed_by)."""
    steps = step_call_deltas(reads)
    out = {}
    for group in ("driver", "wait", "event"):
        out[group + "_ns_all"] = [s[group + "_ns"] for s in steps]
        out[group + "_calls_all"] = [s[group + "_calls"] for s in steps]
    timed = steps[warm:]
    n = len(timed)
    wall = sum(step_s[warm:])
    for group in ("driver", "wait", "event"):
        ns = sum(s[group + "_ns"] for s in timed)
        out[group + "_s"] = ns / 1e9 / n if n else None
        out[group + "_calls_per_step"] = sum(s[group + "_calls"] for s in timed) / n if n else None
        out[group + "_share"] = ns / 1e9 / wall if n and wall > 0 else None
    last = reads[-1]["calls"]
    out["calls_timed"] = {k: {"calls": sum(s["by_call"][k][0] for s in timed),
                              "ns": sum(s["by_call"][k][1] for s in timed),
                              "max_ns_run": last[k][2]} for k in last}
    out["calls_timed_by"] = reads[-1]["timed"]
    return out


def run_child(spec):
    """One run, in this (fresh) process: returns the result dict. Raises RunError with the reason
    when the run cannot be made."""
    t = {"start": time.time()}
    t0 = time.monotonic()
    mode = Mode.from_dict(spec["mode_def"])
    apply_mode_env(mode)
    if spec.get("cpus"):
        # Before torch's thread pools start and before CUDA: every thread this run makes inherits it.
        os.sched_setaffinity(0, spec["cpus"])
    import torch
    if torch.cuda.is_initialized():
        raise RunError("CUDA was already initialized when the run began: the forking parent must not use CUDA")
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    if spec.get("no_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    res = {"pid": os.getpid(), "alloc_env": {k: v for k, v in mode.env().items() if v is not None},
           "torch": torch.__version__, "cpus": format_cpu_list(sorted(os.sched_getaffinity(0))),
           "pinned": bool(spec.get("cpus")),
           "cudnn_sdp": bool(torch.backends.cuda.cudnn_sdp_enabled())}
    phases = {}
    if mode.kind == "gpumem":
        t1 = time.monotonic()
        load_gpumem(torch, spec)
        phases["gpumem_load_s"] = time.monotonic() - t1
    res["backend"] = torch.cuda.get_allocator_backend()
    cuda = spec["cuda"]
    torch.manual_seed(spec["seed"])
    if not cuda:
        device = torch.device("cpu")
        res["settings"] = {"backend": res["backend"], "verified": ["not checked: --dry-run-cpu has no CUDA"]}
    else:
        if not cuda_available(torch):
            raise RunError("no CUDA device is visible; use --dry-run-cpu on a machine without a GPU")
        device = gpu_device(torch)
        res["settings"] = probe_settings(torch, device, mode)
        res["device_name"] = torch.cuda.get_device_name(device)
    if mode.history:
        if not cuda:
            res["history"] = "not recorded: --dry-run-cpu"
        else:
            torch.cuda.memory._record_memory_history(max_entries=spec["history_entries"],
                                                     stacks=spec["history_stacks"])
            res["history"] = "torch.cuda.memory._record_memory_history(max_entries=%d, stacks=%r)" % (
                spec["history_entries"], spec["history_stacks"])
    phases["ready_s"] = time.monotonic() - t0
    print("run %d (repetition %d): %s under %s; %s; backend %s; %s%s" % (
        spec["index"] + 1, spec["rep"] + 1, spec["workload"], mode.name,
        ", ".join("%s=%r" % kv for kv in res["alloc_env"].items()) or "no allocator variables",
        res["backend"], "; ".join(res["settings"].get("verified", [])),
        "" if res["cudnn_sdp"] else "; cuDNN attention off"), flush=True)

    import workloads
    w = workloads.WORKLOADS[spec["workload"]]
    cache = MODEL_CACHE if spec["prebuilt"] else None
    ctx = make_ctx_class()(torch, device, spec["tiny"], spec["seed"], cache)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t1 = time.monotonic()
    built = w.build(ctx)
    sync()
    phases["build_s"] = time.monotonic() - t1

    steps = spec["steps"] if spec["steps"] is not None else w.steps
    warm = min(spec["warmup"] if spec["warmup"] is not None else w.warmup, max(0, steps - 1))
    step_s, infos, losses, tokens = [], [], [], []
    # Beside each step's wall time, what the CPU did while the step's Python call ran (before the
    # synchronize that ends the step; its busy wait would count as CPU time): the process's CPU
    # time (every thread: the caller, autograd's device threads) and the calling thread's.
    call_s, cpu_s, thread_cpu_s = [], [], []
    allocs_before = None
    # gpumem modes: the driver / wait counters before the first step and after each step.
    read_calls = None
    if mode.kind == "gpumem":
        read_calls = lambda: read_call_times(torch.ops.gpumem.memory_stats(device))  # noqa: E731
    call_reads = [read_calls()] if read_calls else []
    t1 = time.monotonic()
    for i in range(steps):
        if cuda and i == warm:
            allocs_before = torch.cuda.memory_stats(device).get("allocation.all.allocated")
        sync()
        ts = time.perf_counter()
        c0, tc0 = time.process_time(), time.thread_time()
        infos.append(built.step(i))
        c1, tc1 = time.process_time(), time.thread_time()
        call_s.append(time.perf_counter() - ts)
        sync()
        step_s.append(time.perf_counter() - ts)
        cpu_s.append(c1 - c0)
        thread_cpu_s.append(tc1 - tc0)
        if read_calls:
            call_reads.append(read_calls())
        outs = ctx.take_observed()
        if "loss" in outs:
            losses.append(outs["loss"])
        if "tokens" in outs:
            tokens.append(outs["tokens"])
        print("step %d/%d %.4f s %s %s" % (i + 1, steps, step_s[-1], infos[-1], outs), flush=True)
    phases["steps_s"] = time.monotonic() - t1
    timed = step_s[warm:]
    import statistics
    res.update({
        "steps": steps, "warmup": warm, "step_metric": spec["metric"],
        "step_s": statistics.fmean(timed) if spec["metric"] == "mean" else statistics.median(timed),
        "step_s_median": statistics.median(timed), "step_s_mean": statistics.fmean(timed),
        "step_s_all": step_s, "step_shapes": infos,
        # CPU per timed step: the mean (a total over the same steps in every mode, so modes compare
        # step for step; shapes differ between steps), and each step's value.
        "cpu_s": statistics.fmean(cpu_s[warm:]), "thread_cpu_s": statistics.fmean(thread_cpu_s[warm:]),
        "call_s": statistics.fmean(call_s[warm:]),
        "cpu_s_all": cpu_s, "thread_cpu_s_all": thread_cpu_s, "call_s_all": call_s,
        "outputs": ({"kind": "loss", "values": losses} if losses else
                    {"kind": "tokens", "values": tokens} if tokens else None),
        "model": built.model, "threads": torch.get_num_threads(),
    })
    if call_reads:
        res.update(call_time_result(call_reads, warm, step_s))
    if cuda:
        stats = torch.cuda.memory_stats(device)
        res.update({
            "peak_reserved": stats.get("reserved_bytes.all.peak"),
            "peak_requested": stats.get("requested_bytes.all.peak"),
            "peak_allocated": stats.get("allocated_bytes.all.peak"),
            "num_alloc_retries": stats.get("num_alloc_retries"),
            "num_ooms": stats.get("num_ooms"),
            "memory_stats": {k: v for k, v in stats.items() if k.endswith(".all.peak") or k.startswith("num_")},
        })
        if mode.kind == "gpumem":
            # gpumem's own counters (driver calls, recycling's waits): not in torch's memory_stats.
            res["gpumem_stats"] = {k: int(v) for k, v in torch.ops.gpumem.memory_stats(device).items()
                                   if k.startswith("gpumem.")}
        allocs_after = stats.get("allocation.all.allocated")
        if allocs_before is not None and allocs_after is not None and len(timed) > 0:
            res["allocs_per_step"] = (allocs_after - allocs_before) / len(timed)
    phases["child_s"] = time.monotonic() - t0
    res["phases"] = phases
    res["child_start_unix"] = t["start"]
    return res


def child_entry(spec, fd, child_fn):
    """Runs child_fn(spec) and writes {"status": ..., ...} as JSON to fd. Returns the exit code."""
    code = 0
    try:
        result = child_fn(spec)
        result["status"] = "ok"
    except RunError as err:
        print("RUN FAILED: %s" % err, flush=True)
        result, code = {"status": "failed", "error": str(err), "error_is_reason": True}, 3
    except BaseException as err:  # noqa: BLE001 - everything a run can raise is reported
        traceback.print_exc()
        lines = [l for l in str(err).strip().splitlines() if l.strip()]
        first = lines[0] if lines else ""
        result, code = {"status": "failed", "error": "%s: %s" % (type(err).__name__, first[:400])}, 1
    try:
        data = json.dumps(result, default=repr).encode()
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)
    return code


# ---- the parent: launching runs -----------------------------------------------------------------

class Launched:
    """A child process started by fork or by subprocess, with the read end of its result pipe."""

    def __init__(self, pid, fd, proc=None):
        self.pid, self.fd, self.proc = pid, fd, proc

    def poll(self):
        """The exit status text once the process is gone, else None."""
        if self.proc is not None:
            rc = self.proc.poll()
            return None if rc is None else ("exit %d" % rc if rc >= 0 else "signal %d" % -rc)
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        if os.WIFSIGNALED(status):
            return "signal %d" % os.WTERMSIG(status)
        return "exit %d" % os.WEXITSTATUS(status)

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Runner:
    """Starts one child per run (fork, or a subprocess of this script), reads its JSON result
    within the time it has, and makes sure the process is gone before the next run starts."""

    def __init__(self, use_fork, child_fn, log_dir, torch=None, exit_timeout_s=60.0):
        self.use_fork = use_fork
        self.child_fn = child_fn
        self.log_dir = log_dir
        self.torch = torch
        self.exit_timeout_s = exit_timeout_s

    def launch(self, spec, log_path):
        r, w = os.pipe()
        if self.use_fork:
            if self.torch is not None and self.torch.cuda.is_initialized():
                raise RuntimeError("live.py: CUDA is initialized in the forking parent; forked children "
                                   "could not use it (a bug in live.py; --no-fork avoids forking)")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child
                code = 1
                try:
                    os.close(r)
                    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(out, 1)
                    os.dup2(out, 2)
                    os.close(out)
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    code = child_entry(spec, w, self.child_fn)
                finally:
                    try:
                        sys.stdout.flush()
                        sys.stderr.flush()
                    finally:
                        os._exit(code)
            os.close(w)
            return Launched(pid, r)
        spec_path = log_path[:-4] + ".spec.json"
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        for var, value in Mode.from_dict(spec["mode_def"]).env().items():
            if value is None:
                env.pop(var, None)
            else:
                env[var] = value
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-spec", spec_path,
                                     "--result-fd", str(w)], pass_fds=(w,), stdout=out,
                                    stderr=subprocess.STDOUT, env=env)
        os.close(w)
        return Launched(proc.pid, r, proc)

    @staticmethod
    def _read_result(child, t_end):
        """Everything the child writes to its pipe until it closes it, or until t_end
        (monotonic): (bytes, timed_out). Closes the read end."""
        chunks = []
        try:
            while True:
                left = t_end - time.monotonic()
                if left <= 0:
                    return b"".join(chunks), True
                ready, _, _ = select.select([child.fd], [], [], min(left, 1.0))
                if ready:
                    data = os.read(child.fd, 1 << 16)
                    if not data:
                        return b"".join(chunks), False
                    chunks.append(data)
        finally:
            os.close(child.fd)

    def _reap(self, child):
        """Waits for the process to be gone (killing it after exit_timeout_s): (status, note)."""
        t0 = time.monotonic()
        note = None
        while True:
            status = child.poll()
            if status is not None:
                return status, note
            if note is None and time.monotonic() - t0 > self.exit_timeout_s:
                child.kill()
                note = "the process had not exited %.0f s after its result; killed" % self.exit_timeout_s
            time.sleep(0.02)

    def run(self, spec, timeout_s, log_path):
        """The child's result dict with status ok / failed / timeout / crashed, and "timing":
        launch_to_result_s, exit_s (result -> process gone), wall_s."""
        t0 = time.monotonic()
        child = self.launch(spec, log_path)
        try:
            data, timed_out = self._read_result(child, t0 + timeout_s)
            t_result = time.monotonic()
            if timed_out:
                child.kill()
            status, note = self._reap(child)
        except BaseException:
            child.kill()  # interrupted (SIGTERM, ^C): the run does not outlive this process
            raise
        t_gone = time.monotonic()
        timing = {"launch_to_result_s": t_result - t0, "exit_s": t_gone - t_result, "wall_s": t_gone - t0}
        if timed_out:
            res = {"status": "timeout", "error": "no result within %.0f s; the process was killed" % timeout_s}
        elif not data:
            res = {"status": "crashed", "error": "the process ended (%s) without a result" % status}
        else:
            try:
                res = json.loads(data.decode())
            except ValueError as err:
                res = {"status": "crashed", "error": "unreadable result (%s), process %s" % (err, status)}
        if note:
            res.setdefault("notes", []).append(note)
        res["exit_status"] = status
        res["timing"] = timing
        res["wall_s"] = timing["wall_s"]
        res["launcher"] = "fork" if self.use_fork else "subprocess"
        return res


def log_tail(path, n=12):
    try:
        with open(path, errors="replace") as f:
            return [l.rstrip("\n") for l in f.readlines()[-n:]]
    except OSError:
        return []


CUDA_FORK_ERRORS = ("initialization error", "cudaErrorInitializationError",
                    "Cannot re-initialize CUDA in forked subprocess", "CUDA driver initialization failed")


# ---- the parent: main ---------------------------------------------------------------------------

def describe_run(spec, res, native):
    """The line printed when a run finishes."""
    head = "[live %2d] rep %d %s/%s" % (spec["index"] + 1, spec["rep"] + 1, spec["workload"], spec["mode"])
    t = res.get("timing", {})
    ph = res.get("phases", {})
    times = "%.1f s (ready %.1f, build %.1f, steps %.1f, exit %.1f)" % (
        t.get("wall_s", 0), ph.get("ready_s", 0), ph.get("build_s", 0), ph.get("steps_s", 0), t.get("exit_s", 0))
    if res["status"] == "not_run":
        return "%s NOT RUN: %s" % (head, res.get("error"))
    if res["status"] != "ok":
        return "%s %s: %s; %s" % (head, res["status"].upper(), res.get("error"), times)
    parts = ["step %.1f ms (%s of %d)" % (res["step_s"] * 1000, res["step_metric"],
                                          res["steps"] - res["warmup"])]
    if res.get("cpu_s") is not None:
        parts.append("CPU %.1f ms per step (calling thread %.1f ms; the step's call %.1f ms wall)" % (
            res["cpu_s"] * 1000, res.get("thread_cpu_s", 0) * 1000, res.get("call_s", 0) * 1000))
    if res.get("allocs_per_step") is not None:
        parts.append("%.0f allocations per step" % res["allocs_per_step"])
    if res.get("driver_s") is not None:
        parts.append("driver %.2f ms per step (%.1f calls), waits %.2f ms (%.1f), events %.2f ms (%.1f)%s" % (
            res["driver_s"] * 1000, res["driver_calls_per_step"], res["wait_s"] * 1000, res["wait_calls_per_step"],
            res["event_s"] * 1000, res["event_calls_per_step"],
            "" if res.get("calls_timed_by", {}).get("driver") else " (driver calls not timed: not the CUDA VMM source)"))
    if res.get("peak_reserved") is not None:
        parts.append("peak reserved %.3f GiB, requested %.3f GiB (%.4f)" % (
            res["peak_reserved"] / report.GiB, res["peak_requested"] / report.GiB,
            res["peak_reserved"] / max(1, res["peak_requested"])))
    if native is not None and native is not res:
        c = report.compare_outputs(res, native)
        if c:
            parts.append("%s %s native's in %d/%d steps%s" % (
                c["kind"], "equal" if c["equal"] == c["compared"] else "differ from", c["equal"], c["compared"],
                ", max |diff| %.3g" % c["max_abs_diff"] if c.get("max_abs_diff") else ""))
    caches_on = res.get("gpumem_stats", {}).get("gpumem.thread_caches.on")
    if caches_on is not None:
        # Whether the engine's lock was ever contended: the thread caches and their growth rule
        # (docs/notes/thread-caches.md) can touch the peak only in a run where this is on.
        parts.append("thread caches %s" % ("on" if caches_on else "off"))
    engines = res.get("gpumem_stats", {}).get("gpumem.arenas")
    if engines is not None:
        # With arenas:N, how many engines the run's threads ended up in (1: no thread moved).
        parts.append("engines %d" % engines)
    gs = res.get("gpumem_stats", {})
    openings = gs.get("gpumem.recycle_churn.openings")
    if openings:
        # The churn allowance (recycle_churn, on by default) opened: growth bought memory instead of
        # moving the same pieces again, so this run's peak may be above one without it.
        parts.append("churn allowance opened %d time(s)" % openings)
    if gs.get("gpumem.step_plan.on"):
        # The step planner (step_plan:True): what it found and served (docs/notes/allocation-policy.md).
        parts.append("step plan: %d step(s) found, %d plan(s), %d fallback(s), %d steps and %d allocations served, "
                     "arena %.3f GiB, last layout %.1f ms, %d rest(s)"
                     % (gs.get("gpumem.step_plan.steps_found", 0), gs.get("gpumem.step_plan.plans", 0),
                        gs.get("gpumem.step_plan.fallbacks", 0), gs.get("gpumem.step_plan.served_steps", 0),
                        gs.get("gpumem.step_plan.served_allocations", 0),
                        gs.get("gpumem.step_plan.arena_bytes", 0) / report.GiB,
                        gs.get("gpumem.step_plan.last_layout_us", 0) / 1000.0,
                        gs.get("gpumem.step_plan.dormant_periods", 0)))
    if res.get("pinned"):
        parts.append("pinned to CPUs %s" % res.get("cpus"))
    if res.get("cudnn_sdp") is False:
        parts.append("cuDNN attention off")
    s = res.get("settings", {})
    env = ", ".join("%s=%r" % kv for kv in res.get("alloc_env", {}).items()) or "no allocator variables"
    parts.append("%s; backend %s; %s" % (env, s.get("backend"), "; ".join(s.get("verified", []))))
    if res.get("history"):
        parts.append(res["history"])
    return "%s ok: %s; %s" % (head, "; ".join(parts), times)


def write_summary(path, header, results, order):
    """summary.txt (the table and the rest, as printed) and summary.json beside it (the rows, with
    bytes and unrounded ratios). Returns the text."""
    rows = report.summarize(results, order)
    json_path = os.path.join(os.path.dirname(path), "summary.json")
    with open(json_path + ".tmp", "w") as f:
        json.dump({"header": header, "rows": rows, "targets": report.targets(rows)}, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    text = [header, "", report.format_table(rows)]
    tg = report.targets(rows)
    if tg:
        text += ["", "targets (median over repetitions; min..max in brackets):"] + ["  " + l for l in tg]
    pr = report.problems(results)
    if pr:
        text += ["", "runs that did not finish ok:"] + ["  " + l for l in pr]
    dt = report.driver_table(rows)
    if dt:
        text += ["", "driver calls and stream waits per timed step (gpumem modes; host wall time in the calls, "
                 "outside them nothing; share = of the summed step time):", dt]
    wr = report.whole_run_table(results, order)
    if wr:
        text += ["", "whole runs, warm-up steps included (median (min..max) over repetitions; driver time of "
                 "the gpumem modes):", wr]
    text += ["", "where the time went (means per run):", report.phase_table(results)]
    body = "\n".join(text) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(body)
    os.replace(tmp, path)
    return body


def driver_loaded():
    """Whether libcuda.so is mapped into this process (something may have started the driver,
    which a forked child cannot use)."""
    try:
        with open("/proc/self/maps") as f:
            return re.search(r"/libcuda\.so", f.read()) is not None
    except OSError:
        return False


def default_lib():
    """The first libgpumem_torch.so among the places the lead carries builds to."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    for rel in (".gpu/build/torch", ".gpu/build/allocator/torch", ".gpu/bin", "build-gpu/torch",
                "build-gpu/allocator/torch"):
        p = os.path.join(root, rel, "libgpumem_torch.so")
        if os.path.isfile(p):
            return p
    return None


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child_spec:
        with open(args.child_spec) as f:
            spec = json.load(f)
        return child_entry(spec, args.result_fd, run_child)

    plan = make_plan(args)
    if args.plan:
        print_plan(plan, args)
        return 0
    uses_gpumem = any(args.mode_defs[s["mode"]].kind == "gpumem" for s in plan)
    if uses_gpumem and args.gpumem_via == "library":
        args.lib = os.path.abspath(args.lib) if args.lib else default_lib()
        if not args.lib or not os.path.isfile(args.lib):
            log("live.py: the gpumem modes need libgpumem_torch.so, and %s; pass --lib PATH (build it on the "
                "CPU machine and carry it), or leave the gpumem modes out with --modes native,expandable"
                % ("%s does not exist" % args.lib if args.lib else "none was found under .gpu/ or build-gpu/"))
            return 2
    if uses_gpumem and args.gpumem_via == "package":
        import importlib.util
        if importlib.util.find_spec("gpumem") is None:
            log("live.py: --gpumem-via package, but no Python package 'gpumem' is importable; use --lib PATH")
            return 2

    os.makedirs(args.out, exist_ok=True)
    if args.work:
        work = args.work
        os.makedirs(work, exist_ok=True)
    else:
        import tempfile
        work = tempfile.mkdtemp(prefix="gpumem-live-")
    jsonl = os.path.join(args.out, "live.jsonl")
    open(jsonl, "w").close()
    summary_path = os.path.join(args.out, "summary.txt")

    inherited = {v: os.environ.pop(v) for v in ALLOC_VARS if v in os.environ}
    if inherited:
        log("live.py: unset %s here; every run sets its own mode's variables" % inherited)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() without cuInit
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    use_fork = not args.no_fork
    import warnings
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks.*")

    t0 = time.monotonic()
    torch = None
    if use_fork:
        import torch
        default_threads = torch.get_num_threads()
        # One intra-op thread here: GNU OpenMP's thread pool does not survive fork(), and a child
        # whose parent ran a parallel region hangs in its own first one. Children set their own.
        torch.set_num_threads(1)
        import transformers  # noqa: F401
        import torchvision  # noqa: F401
        from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401  (the lazy modules)
        import transformers.generation  # noqa: F401
        import workloads
        versions = "torch %s, transformers %s, torchvision %s" % (
            torch.__version__, transformers.__version__, torchvision.__version__)
        if torch.cuda.is_initialized():
            log("live.py: importing the libraries initialized CUDA in the parent; falling back to --no-fork")
            use_fork = False
    else:
        import workloads
        default_threads = None  # each run keeps torch's default
        versions = "(libraries imported by each run)"
    threads = args.threads or (len(args.cpu_list) if args.cpu_list else default_threads)
    import_s = time.monotonic() - t0
    unknown = [w for w in args.workload_list if w not in workloads.WORKLOADS
               or workloads.WORKLOADS[w].kind != "python"]
    if unknown:
        log("live.py: unknown or non-Python workload(s): %s; choose from: %s" % (
            ", ".join(unknown), ", ".join(n for n, w in workloads.WORKLOADS.items() if w.kind == "python")))
        return 2

    global MODEL_CACHE
    prebuild = use_fork and not args.no_prebuild
    if prebuild:
        MODEL_CACHE = ModelCache(torch)
    prebuilt = {}
    runner = Runner(use_fork, run_child, work, torch)
    order = [(w, args.modes_by[w]) for w in workload_order(args.workload_list)]
    header = "\n".join([
        "live side by side: %s; %s" % (versions, "DRY RUN on the CPU (tiny shapes)" if args.dry_run_cpu else "GPU 0"),
        "%d repetition%s, %s, seed %d, %s per run%s" % (
            args.reps, "" if args.reps == 1 else "s", "each run forked from one parent" if use_fork else "each run a new interpreter",
            args.seed, ("%d threads" % threads if threads else "torch's default threads") + (
                ", pinned to CPUs %s (%d)" % (format_cpu_list(args.cpu_list), len(args.cpu_list))
                if args.cpu_list else ", not pinned") + (
                ", cuDNN attention off (--no-cudnn-sdp)" if args.no_cudnn_sdp else ""),
            "" if not uses_gpumem else "; gpumem: %s" % (
                args.lib if args.gpumem_via == "library" else "the Python package")),
        "step ms: each run's step time (median of its timed steps; generate: mean of its timed calls), then the "
        "median over repetitions (min..max); vs native / vs base: ratios within each repetition, then their "
        "median (min..max)"])
    log(header)
    log("parent: imports %.1f s, %d OS threads, CUDA driver library %s; %d runs planned, deadline %.0f s"
        % (import_s, len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1,
           "loaded (a forked child may not start CUDA: then the runs become subprocesses)"
           if driver_loaded() else "not loaded", len(plan), args.deadline_s))

    hard_end = args.deadline_s + args.grace_s
    by_key = {}
    jsonl_file = open(jsonl, "a")

    def start_run(spec, now):
        return one_run(spec, args, runner, prebuild, prebuilt, work, hard_end, now, threads, timeouts)

    def finished(spec, res, results):
        if res["status"] == "ok":
            by_key[(spec["workload"], spec["mode"], spec["rep"])] = res
        log(describe_run(spec, res, by_key.get((spec["workload"], "native", spec["rep"]))))
        if res["status"] != "not_run":
            if res["status"] != "ok" and res.get("log") and not res.get("error_is_reason"):
                for line in log_tail(os.path.join(work, res["log"])):
                    log("    | " + line)
        jsonl_file.write(json.dumps(res, default=repr) + "\n")
        jsonl_file.flush()
        if res["status"] != "not_run":
            write_summary(summary_path, header, results, order)

    timeouts = run_timeouts(plan, args)
    results = run_plan(plan, args.deadline_s, lambda: time.monotonic() - T_START, start_run, finished)
    jsonl_file.close()
    not_run = [r for r in results if r["status"] == "not_run"]
    if not_run:
        log("%d run(s) NOT RUN: %s" % (len(not_run), not_run[0].get("error")))

    total = time.monotonic() - T_START
    body = write_summary(summary_path, header + "\nwall time %.0f s (%.1f min)" % (total, total / 60),
                         results, order)
    try:
        with tarfile.open(os.path.join(args.out, "live-logs.tar.gz"), "w:gz") as tar:
            tar.add(work, arcname="live-logs")
    except OSError as err:
        log("live.py: could not archive the logs: %s" % err)
    log("")
    log(body)
    bad = [r for r in results if r["status"] not in ("ok", "not_run")]
    return 1 if bad else 0


class Stopped(Exception):
    """SIGTERM reached the parent (the wrapper's timeout): finish the report with what is done."""


def run_plan(plan, deadline_s, clock, start_run, finished):
    """Makes the planned runs in order: start_run(spec, now) -> result dict; a run whose turn comes
    at or after deadline_s (clock() is seconds since the start) is not started and gets status
    "not_run". SIGTERM stops the run in progress (status "stopped") and leaves the rest not run.
    finished(spec, result, results_so_far) is called after each. Returns every result, in plan
    order, each with started_at_s."""
    results, stopped, running = [], [], [False]

    def on_term(signum, frame):
        stopped.append(signum)
        if running[0]:
            raise Stopped()
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for spec in plan:
            now = clock()
            if stopped or now >= deadline_s:
                why = ("stopped by signal %d before it started" % stopped[0] if stopped
                       else "deadline: %.0f s had passed when its turn came" % deadline_s)
                res = dict(spec, status="not_run", error=why)
            else:
                try:
                    running[0] = True
                    res = start_run(spec, now)
                except (Stopped, KeyboardInterrupt):
                    stopped.append(signal.SIGTERM)
                    res = dict(spec, status="stopped", error="stopped by a signal while it ran")
                finally:
                    running[0] = False
                for k in ("index", "rep", "workload", "mode", "position"):
                    res.setdefault(k, spec[k])
            res["started_at_s"] = now
            results.append(res)
            finished(spec, res, results)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return results


def run_timeouts(plan, args):
    """{run index: seconds it may take}: --run-timeout-s when given, else four times its estimate
    and at least 60 s (150 s for a workload without an estimate)."""
    out = {}
    for spec in plan:
        if args.run_timeout_s:
            out[spec["index"]] = args.run_timeout_s
        else:
            est = estimate_run_s(spec)
            out[spec["index"]] = max(60.0, 4 * est) if est else 150.0
    return out


def one_run(spec, args, runner, prebuild, prebuilt, work, hard_end, now, threads, timeouts):
    """Makes one planned run (building its workload's CPU model first if this process has not)."""
    import workloads
    w = spec["workload"]
    if prebuild and w in PREBUILT and w not in prebuilt:
        try:
            secs = MODEL_CACHE.prebuild(workloads.WORKLOADS[w], args.seed, args.dry_run_cpu)
            prebuilt[w] = secs is not None
            log("parent: %s's model built on the CPU in %s" % (
                w, "%.1f s" % secs if secs is not None else "- (its builder does not use the cache)"))
        except Exception as err:  # noqa: BLE001 - the children then build it themselves
            prebuilt[w] = False
            log("parent: building %s's model on the CPU failed (%s: %s); each run builds its own"
                % (w, type(err).__name__, err))
    mode = args.mode_defs[spec["mode"]]
    full = dict(spec, mode_def=mode.as_dict(), seed=args.seed, tiny=args.dry_run_cpu,
                cuda=not args.dry_run_cpu, threads=threads, cpus=args.cpu_list, no_cudnn_sdp=args.no_cudnn_sdp,
                lib=args.lib, gpumem_via=args.gpumem_via, prebuilt=bool(prebuilt.get(w)),
                history_entries=HISTORY_ENTRIES, history_stacks=args.history_stacks)
    log_name = "%02d-rep%d-%s-%s.log" % (spec["index"] + 1, spec["rep"] + 1, w, spec["mode"])
    log_path = os.path.join(work, log_name)
    res = runner.run(full, min(timeouts[spec["index"]], max(1.0, hard_end - now)), log_path)
    if (runner.use_fork and res["status"] == "failed"
            and any(e in (res.get("error") or "") for e in CUDA_FORK_ERRORS)):
        log("live.py: CUDA does not start in a forked child (%s); every run from now on is a subprocess"
            % res.get("error"))
        runner.use_fork = False
        full["prebuilt"] = False
        left = hard_end - (time.monotonic() - T_START)
        res = runner.run(full, min(timeouts[spec["index"]], max(1.0, left)), log_path)
    res.update({k: spec[k] for k in ("index", "rep", "workload", "mode", "position")})
    res["log"] = log_name
    return res


if __name__ == "__main__":
    sys.exit(main())
