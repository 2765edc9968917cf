#!/usr/bin/env python3
"""Tests of the corpus tooling that run without a GPU (standard library only):

- snapshot_csv: a synthetic snapshot shaped like torch.cuda.memory._snapshot()'s (see
  torch/cuda/_memory_viz.py: device_traces entries with action/addr/size/stream/time_us/frames,
  frames innermost first, `device_free` on oom) converts to the exact CSV lines expected, with the
  trace's own peaks, and its errors name the problem;
- the CSV it writes is read by gpumem's own reader: `gpumem replay` on the CSV and on the pickle of
  the same snapshot prints the same table (given --gpumem PATH, as ctest does);
- capture.py's GPU path with torch.cuda's recording calls stood in (needs torch), its C++ path with
  a stand-in example, its checks; manifest.py's manifest and summary; run_corpus.py end to end
  with a stand-in capture;
- schedule.py's admission policy (EASY backfilling) on the corpus's own plan;
- every Python workload's dry run (tiny shapes, one step on the CPU; needs torch, transformers and
  torchvision).

    test_corpus_tools.py [--gpumem PATH_TO_gpumem] [unittest options]
"""

import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # scripts/: unittest_status

import capture  # noqa: E402
import manifest  # noqa: E402
import schedule  # noqa: E402
import snapshot_csv  # noqa: E402
import workloads  # noqa: E402

GPUMEM = None  # set from --gpumem
MiB = 1 << 20
BASE = 139_900_000_000_000  # a device address in the range PyTorch's traces show

TORCH_FRAME = {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}
CPP_FRAME = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}
USER = {"filename": "/work/model.py", "line": 42, "name": "forward"}
COMMA = {"filename": "/work/train,v2.py", "line": 7, "name": "<lambda, inner>"}


def entry(action, addr, size, t, frames=(), stream=0):
    e = {"action": action, "size": size, "stream": stream, "time_us": t,
         "compile_context": "N/A", "user_metadata": "", "frames": list(frames)}
    e["device_free" if action == "oom" else "addr"] = addr
    return e


def synthetic_snapshot():
    """Device 1 holds a consistent history: two segments, allocations from Python frames (through
    torch's own frames), a record_stream'd free completed later, a side-stream allocation, an
    expandable map/unmap pair, an OOM and the snapshot marker. Device 0 is empty."""
    shared = [TORCH_FRAME, USER]  # PyTorch shares one list between equal tracebacks
    t = 1_700_000_000_000_000
    side = 94_000_000_000_000  # a cudaStream_t as an integer
    h = [
        entry("segment_alloc", BASE, 20 * MiB, t + 0, [CPP_FRAME, TORCH_FRAME, USER]),
        entry("alloc", BASE, 3 * MiB + 100, t + 1, shared),
        entry("alloc", BASE + 4 * MiB, 8 * MiB, t + 2, shared),
        entry("free_requested", BASE, 3 * MiB + 100, t + 3, [COMMA]),
        entry("free_completed", BASE, 3 * MiB + 100, t + 3, [COMMA]),
        entry("segment_alloc", BASE + 32 * MiB, 2 * MiB, t + 4, [], stream=side),
        entry("alloc", BASE + 32 * MiB, 512, t + 5, [TORCH_FRAME], stream=side),
        entry("free_requested", BASE + 4 * MiB, 8 * MiB, t + 6, shared),
        entry("segment_map", BASE + 64 * MiB, 40 * MiB, t + 7, [USER]),
        entry("alloc", BASE + 64 * MiB, 30 * MiB, t + 8, [USER]),
        entry("free_completed", BASE + 4 * MiB, 8 * MiB, t + 9, []),  # after record_stream's event
        entry("oom", 123 * MiB, 200 * MiB, t + 10, [USER]),
        entry("free_requested", BASE + 64 * MiB, 30 * MiB, t + 11, [USER]),
        entry("free_completed", BASE + 64 * MiB, 30 * MiB, t + 11, [USER]),
        entry("segment_unmap", BASE + 64 * MiB, 40 * MiB, t + 12, [USER]),
        entry("snapshot", 0, 512, t + 13, []),
    ]
    h[0]["frames"] = [CPP_FRAME, TORCH_FRAME, USER]
    for e in h[1:3] + [h[7]]:
        e["frames"] = shared
    seg = lambda addr, size, stream: {  # noqa: E731
        "device": 1, "address": addr, "total_size": size, "allocated_size": 0, "active_size": 0,
        "requested_size": 0, "stream": stream, "segment_type": "large", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [], "blocks": [{"address": addr, "size": size,
                                                          "requested_size": 0, "state": "inactive",
                                                          "frames": []}]}
    return {
        "segments": [seg(BASE, 20 * MiB, 0), seg(BASE + 32 * MiB, 2 * MiB, side)],
        "device_traces": [[], h],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
        "external_annotations": [],
    }


EXPECTED_LINES = [
    "action,addr,size,stream,time_us,where",
    "segment_alloc,%d,%d,0,1700000000000000,model.py:42:forward" % (BASE, 20 * MiB),
    "alloc,%d,%d,0,1700000000000001,model.py:42:forward" % (BASE, 3 * MiB + 100),
    "alloc,%d,%d,0,1700000000000002,model.py:42:forward" % (BASE + 4 * MiB, 8 * MiB),
    "free_requested,%d,%d,0,1700000000000003,train;v2.py:7:<lambda; inner>" % (BASE, 3 * MiB + 100),
    "free_completed,%d,%d,0,1700000000000003,train;v2.py:7:<lambda; inner>" % (BASE, 3 * MiB + 100),
    "segment_alloc,%d,%d,94000000000000,1700000000000004," % (BASE + 32 * MiB, 2 * MiB),
    "alloc,%d,512,94000000000000,1700000000000005," % (BASE + 32 * MiB),
    "free_requested,%d,%d,0,1700000000000006,model.py:42:forward" % (BASE + 4 * MiB, 8 * MiB),
    "segment_map,%d,%d,0,1700000000000007,model.py:42:forward" % (BASE + 64 * MiB, 40 * MiB),
    "alloc,%d,%d,0,1700000000000008,model.py:42:forward" % (BASE + 64 * MiB, 30 * MiB),
    "free_completed,%d,%d,0,1700000000000009," % (BASE + 4 * MiB, 8 * MiB),
    "oom,0,%d,0,1700000000000010,model.py:42:forward" % (200 * MiB),
    "free_requested,%d,%d,0,1700000000000011,model.py:42:forward" % (BASE + 64 * MiB, 30 * MiB),
    "free_completed,%d,%d,0,1700000000000011,model.py:42:forward" % (BASE + 64 * MiB, 30 * MiB),
    "segment_unmap,%d,%d,0,1700000000000012,model.py:42:forward" % (BASE + 64 * MiB, 40 * MiB),
    "snapshot,0,512,0,1700000000000013,",
]


class ConvertTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self, snap, name="t.trace.csv.gz", device=None):
        path = os.path.join(self.dir, name)
        dev, stats = snapshot_csv.write_csv(snap, path, device)
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return dev, stats, f.read()

    def test_exact_lines(self):
        dev, stats, text = self.convert(synthetic_snapshot())
        self.assertEqual(dev, 1)  # the first device with entries
        self.assertEqual(text, "\n".join(EXPECTED_LINES) + "\n")

    def test_stats_are_the_traces_own_peaks(self):
        _, stats, _ = self.convert(synthetic_snapshot())
        self.assertEqual(stats.entries, len(EXPECTED_LINES) - 1)
        # Reserved: 20 MiB + 2 MiB segments, then a 40 MiB map before anything is released.
        self.assertEqual(stats.peak_reserved, 62 * MiB)
        # Requested: live bytes peak after the 30 MiB alloc while 8 MiB (free requested but not
        # completed) and 512 B (side stream) are still live.
        self.assertEqual(stats.peak_requested, 8 * MiB + 512 + 30 * MiB)
        d = stats.as_dict()
        self.assertEqual(d["actions"]["alloc"], 4)
        self.assertEqual(d["actions"]["oom"], 1)
        self.assertEqual(d["alloc_streams"], {"0": 3, "94000000000000": 1})
        self.assertEqual(d["traced_us"], 13)
        self.assertEqual(d["time_regressions"], 0)
        self.assertEqual(d["entries_with_where"], 12)

    def test_call_site_rule(self):
        self.assertEqual(snapshot_csv.call_site([CPP_FRAME, TORCH_FRAME, USER]), "model.py:42:forward")
        self.assertEqual(snapshot_csv.call_site([TORCH_FRAME]), "")
        self.assertEqual(snapshot_csv.call_site([]), "")
        self.assertEqual(snapshot_csv.call_site(None), "")
        rel = {"filename": "torch/_tensor.py", "line": 1, "name": "f"}
        self.assertEqual(snapshot_csv.call_site([rel, USER]), "model.py:42:forward")
        inductor = {"filename": "/tmp/torchinductor_root/ab/cabc.py", "line": 9, "name": "call"}
        self.assertEqual(snapshot_csv.call_site([inductor]), "cabc.py:9:call")
        nl = {"filename": "x.py", "line": 1, "name": "a\nb\rc,d"}
        self.assertEqual(snapshot_csv.call_site([nl]), "x.py:1:a;b;c;d")

    def test_explicit_device_and_empty_trace(self):
        snap = synthetic_snapshot()
        dev, stats, text = self.convert(snap, device=0)
        self.assertEqual((dev, stats.entries, text), (0, 0, EXPECTED_LINES[0] + "\n"))
        with self.assertRaisesRegex(snapshot_csv.SnapshotError, "device 5 is not in the snapshot"):
            self.convert(snap, device=5)

    def test_errors_name_the_problem(self):
        with self.assertRaisesRegex(snapshot_csv.SnapshotError, "_record_memory_history"):
            self.convert({"segments": []})
        bad = synthetic_snapshot()
        bad["device_traces"][1][2]["action"] = "allocate"
        with self.assertRaisesRegex(snapshot_csv.SnapshotError, "entry 2 has action 'allocate'"):
            self.convert(bad)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "t.trace.csv.gz")))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "t.trace.csv.gz.tmp")))
        bad = synthetic_snapshot()
        del bad["device_traces"][1][3]["time_us"]
        with self.assertRaisesRegex(snapshot_csv.SnapshotError, "entry 3 .*time_us"):
            self.convert(bad)

    def test_dropped_entries_fail_loudly(self):
        _, stats, _ = self.convert(synthetic_snapshot())
        snapshot_csv.check_complete(stats, stats.entries + 1)
        with self.assertRaisesRegex(snapshot_csv.SnapshotError, "older entries were dropped"):
            snapshot_csv.check_complete(stats, stats.entries)
        checks = capture.trace_checks(stats, stats.entries, 62 * MiB, 8 * MiB + 512 + 30 * MiB)
        self.assertEqual(checks["entries_below_max_entries"], False)
        self.assertTrue(checks["trace_peak_reserved_matches"] and checks["trace_peak_requested_matches"])
        checks = capture.trace_checks(stats, 10**6, 64 * MiB, 0)
        self.assertEqual(checks, {"entries_below_max_entries": True, "trace_peak_reserved_matches": False,
                                  "trace_peak_requested_matches": False, "time_monotonic": True})

    def test_cli_on_a_pickle_and_a_bad_file(self):
        pkl = os.path.join(self.dir, "s.pickle")
        with open(pkl, "wb") as f:
            pickle.dump(synthetic_snapshot(), f, protocol=2)
        out = os.path.join(self.dir, "s.trace.csv.gz")
        r = subprocess.run([sys.executable, os.path.join(HERE, "snapshot_csv.py"), pkl, out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["entries"], len(EXPECTED_LINES) - 1)
        r = subprocess.run([sys.executable, os.path.join(HERE, "snapshot_csv.py"), pkl, out,
                            "--max-entries", str(len(EXPECTED_LINES) - 1)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("older entries were dropped", r.stderr)
        junk = os.path.join(self.dir, "junk.pickle")
        with open(junk, "wb") as f:
            f.write(b"action,addr\n")
        r = subprocess.run([sys.executable, os.path.join(HERE, "snapshot_csv.py"), junk, out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a snapshot pickle", r.stderr)

    def test_segments_end(self):
        segs = snapshot_csv.segments_end(synthetic_snapshot(), 1)
        self.assertEqual([s["total_size"] for s in segs], [20 * MiB, 2 * MiB])
        self.assertEqual(set(segs[0]), {"address", "total_size", "allocated_size", "active_size",
                                        "stream", "segment_type", "is_expandable"})
        self.assertEqual(snapshot_csv.segments_end(synthetic_snapshot(), 0), [])


class ReplayReadBackTest(unittest.TestCase):
    """`gpumem replay` reads the CSV, and the CSV replays exactly as the snapshot it came from."""

    def setUp(self):
        if not (GPUMEM or os.environ.get("GPUMEM_CLI")):
            self.skipTest("gpumem CLI not given (--gpumem PATH): the replay read-back is not tested")

    def replay(self, path):
        # The same memory for both: a snapshot that records an OOM otherwise replays under the memory
        # it had there, which the CSV does not carry.
        r = subprocess.run([GPUMEM or os.environ["GPUMEM_CLI"], "replay", path, "--top", "3", "--memory-limit", "185MiB"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # The first line names the file and its format; replay times are wall-clock.
        return [l for l in r.stdout.splitlines()[1:] if not l.startswith("replay time")]

    def test_csv_replays_like_the_snapshot(self):
        with tempfile.TemporaryDirectory() as d:
            snap = synthetic_snapshot()
            # gpumem's snapshot reader takes the first device with entries: keep one device.
            snap["device_traces"] = [snap["device_traces"][1]]
            for s in snap["segments"]:
                s["device"] = 0
            pkl = os.path.join(d, "s.pickle")
            with open(pkl, "wb") as f:
                pickle.dump(snap, f, protocol=2)
            csv = os.path.join(d, "s.trace.csv.gz")
            snapshot_csv.write_csv(snap, csv)
            from_csv, from_pickle = self.replay(csv), self.replay(pkl)
            self.assertEqual(from_csv, from_pickle)
            text = "\n".join(from_csv)
            self.assertIn("model.py:42:forward", text)  # the call sites came through
            self.assertIn("1 out-of-memory", text)


class ManifestTest(unittest.TestCase):
    def test_manifest_and_summary(self):
        with tempfile.TemporaryDirectory() as corpus:
            for mode, reserved in (("native", 30 * MiB), ("expandable", 22 * MiB)):
                os.makedirs(os.path.join(corpus, mode))
                snapshot_csv.write_csv(synthetic_snapshot(), os.path.join(corpus, mode, "w.trace.csv.gz"))
                with open(os.path.join(corpus, mode, "w.json"), "w") as f:
                    json.dump({"workload": "w", "alloc_conf": capture.MODES[mode], "torch": "2.11.0",
                               "trace_entries": 16, "peak_allocated": 21 * MiB, "peak_reserved": reserved,
                               "peak_requested": 20 * MiB, "ratio_reserved_to_requested": reserved / (20 * MiB),
                               "step_s": 0.5, "steps": 10, "seed": 0, "model": "m", "shapes": {"batch": 2},
                               "summary": "a test", "timed_with_other_captures": True,
                               "checks": {"entries_below_max_entries": True},
                               "trace": {"alloc_streams": {"0": 3, "94000000000000": 1}}}, f)
            man = manifest.build(corpus)
            w = man["workloads"]["w"]
            self.assertAlmostEqual(w["native_over_expandable_reserved"], 30 / 22)
            self.assertEqual(w["modes"]["native"]["trace"], "native/w.trace.csv.gz")
            manifest.write(corpus, man)
            with open(os.path.join(corpus, "MANIFEST.md")) as f:
                md = f.read()
            self.assertIn("| w | native | 16 | 0.021 | 0.020 | 0.029 | 1.5000 | 0.500 | ok |", md)
            self.assertIn("not benchmarks", md)
            self.assertIn("allocations on 2 streams (1 off the default stream)", md)
            records = [{"capture": "w.native", "status": "ok", "seconds": 12.0},
                       {"capture": "w.expandable", "status": "ok", "seconds": 11.0},
                       {"capture": "zero3_prefetch.native", "status": "SKIPPED (no binary x)", "seconds": None}]
            table = manifest.summary_table(man, records)
            self.assertRegex(table, r"w\s+native\s+ok\s+16\s+0\.021\s+0\.020\s+0\.029\s+1\.5000\s+2\s+12\.0")
            self.assertIn("zero3_prefetch.native: SKIPPED (no binary x)", table)


class FakeJob:
    def __init__(self, name, gib, s, alone=False, start=None, seen=0.0):
        self.key, self.est_gib, self.est_s, self.alone, self.start, self.seen_gib = name, gib, s, alone, start, seen

    def __repr__(self):
        return self.key


class ScheduleTest(unittest.TestCase):
    def keys(self, jobs):
        return [j.key for j in jobs]

    def test_fills_up_to_the_budget_and_the_slots(self):
        jobs = [FakeJob("a", 40, 30), FakeJob("b", 40, 30), FakeJob("c", 40, 30), FakeJob("d", 10, 30)]
        self.assertEqual(self.keys(schedule.choose(0, jobs, [], 100, 5, 1000)), ["a", "b", "d"])
        self.assertEqual(self.keys(schedule.choose(0, jobs, [], 1000, 2, 1000)), ["a", "b"])

    def test_the_head_is_not_starved(self):
        big = FakeJob("big.native", 95, 60, start=0)
        head = FakeJob("big.expandable", 95, 60)
        short = FakeJob("short", 10, 20)  # ends before big.native is expected to end: backfills
        long_small = FakeJob("long_small", 14, 150)  # fits beside the head later: backfills
        long_big = FakeJob("long_big", 50, 150)  # would delay the head: waits
        got = schedule.choose(1, [head, long_big, long_small, short], [big], 137, 5, 1000)
        self.assertEqual(self.keys(got), ["long_small", "short"])
        # Once big.native is done, the head starts beside what backfilled.
        long_small.start, short.start = 1, 1
        got = schedule.choose(70, [head, long_big], [long_small], 137, 5, 1000)
        self.assertEqual(self.keys(got), ["big.expandable"])

    def test_seen_memory_and_free_memory_count(self):
        running = [FakeJob("r", 10, 100, start=0, seen=60)]
        self.assertEqual(self.keys(schedule.choose(1, [FakeJob("a", 50, 10)], running, 100, 5, 1000)), [])
        self.assertEqual(self.keys(schedule.choose(1, [FakeJob("a", 30, 10)], running, 100, 5, 1000)), ["a"])
        self.assertEqual(self.keys(schedule.choose(1, [FakeJob("a", 30, 10)], running, 100, 5, 1000,
                                                   free_gib=25)), [])

    def test_deadline_and_alone(self):
        late = FakeJob("late", 1, 100)
        ok = FakeJob("ok", 1, 10)
        self.assertEqual(self.keys(schedule.choose(0, [late, ok], [], 100, 5, 50)), ["ok"])
        alone = FakeJob("alone", 5, 10, alone=True)
        other = FakeJob("other", 5, 5)
        running = [FakeJob("r", 5, 30, start=0)]
        self.assertEqual(self.keys(schedule.choose(1, [alone, other], running, 100, 5, 1000)), ["other"])
        self.assertEqual(self.keys(schedule.choose(1, [alone, other], [], 100, 5, 1000)), ["alone"])
        self.assertEqual(schedule.choose(1, [other], [alone], 100, 5, 1000), [])

    def test_the_corpus_plan_fits_the_h200(self):
        """Every capture of the corpus fits the planning budget (an H200: 139.8 GiB - 4), and each
        group's estimated work fits one call's deadline with the default parallelism."""
        import run_corpus
        self.assertEqual(set(run_corpus.PRIORITY), set(workloads.WORKLOADS))
        self.assertEqual(len(run_corpus.PRIORITY), len(workloads.WORKLOADS))  # each in one group
        for w in workloads.WORKLOADS.values():
            self.assertLessEqual(w.est_gib, 135, w.name)
        for group, names in run_corpus.GROUPS.items():
            # Simulate: every capture takes its estimate (stretched when shared), both modes.
            jobs = [FakeJob("%s.%s" % (n, m), workloads.WORKLOADS[n].est_gib, workloads.WORKLOADS[n].est_s)
                    for n in names for m in ("native", "expandable")]
            pending, running, t = list(jobs), [], 0.0
            while pending or running:
                for r in [r for r in running if schedule.expected_end(r, t, schedule.SLOWDOWN_SHARED) <= t]:
                    running.remove(r)
                for j in schedule.choose(t, pending, running, 135.8, 5, 420):
                    j.start = t
                    pending.remove(j)
                    running.append(j)
                if not running and pending:
                    self.fail("group %s: not started by the deadline: %s" % (group, pending))
                t += 1
            self.assertLessEqual(t, 420, group)

    def test_only_takes_groups(self):
        import run_corpus
        a = run_corpus.parse_args(["--out", "o", "--work", "w", "--only", "held_out,gpt2_generate"])
        self.assertEqual(a.names, run_corpus.GROUPS["held_out"] + ["gpt2_generate"])
        a = run_corpus.parse_args(["--out", "o", "--work", "w", "--only", "tuned,llama_train"])
        self.assertEqual(a.names, run_corpus.GROUPS["tuned"])
        with self.assertRaises(SystemExit):
            run_corpus.parse_args(["--out", "o", "--work", "w", "--only", "no_such_group"])


FAKE_CAPTURE = r"""#!%(python)s
# Stands in for `python3 capture.py ...`: writes the synthetic trace and a JSON like capture.py's.
import json, os, sys, time
sys.path.insert(0, %(here)r)
import snapshot_csv, test_corpus_tools as t
args = sys.argv[2:]
opt = dict(zip(args[::2], args[1::2]))
name, mode = opt["--workload"], opt["--mode"]
if name == "swin_t_train":
    print("Traceback: a failing capture"); sys.exit(1)
d = os.path.join(opt["--out-root"], mode)
os.makedirs(d, exist_ok=True)
_, st = snapshot_csv.write_csv(t.synthetic_snapshot(), os.path.join(d, name + ".trace.csv.gz"))
json.dump({"workload": name, "alloc_conf": "", "trace_entries": st.entries, "peak_allocated": 1 << 30,
           "peak_reserved": 3 << 29, "peak_requested": 1 << 30, "ratio_reserved_to_requested": 1.5,
           "num_alloc_retries": 0, "num_ooms": 0, "step_s": 0.1, "steps": 3, "summary": name,
           "timed_with_other_captures": "--shared-gpu" in args,
           "checks": {"entries_below_max_entries": True}}, open(os.path.join(d, name + ".json"), "w"))
time.sleep(0.3)
"""


class RunnerTest(unittest.TestCase):
    """run_corpus.py end to end with a stand-in for capture.py: scheduling, packing into tars as
    captures finish, the manifest, the summary, SKIPPED C++ workloads and a failing capture."""

    def test_run(self):
        import run_corpus
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "fake-python")
            with open(fake, "w") as f:
                f.write(FAKE_CAPTURE % {"python": sys.executable, "here": HERE})
            os.chmod(fake, 0o755)
            out, work = os.path.join(d, "out"), os.path.join(d, "work")
            argv = ["--out", out, "--work", work, "--python", fake, "--gpu-gib", "200",
                    "--deadline-s", "120", "--only",
                    "bert_infer_varbatch,gpt2_decode_small,swin_t_train,zero3_prefetch"]
            import contextlib
            import io
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = run_corpus.main(argv)
            text = buf.getvalue()
            self.assertEqual(rc, 1, text)  # swin_t_train failed
            self.assertEqual(sorted(os.listdir(out)), ["MANIFEST.md", "corpus-logs.tar.gz", "corpus-traces-1.tar"])
            import tarfile
            with tarfile.open(os.path.join(out, "corpus-traces-1.tar")) as tar:
                names = sorted(tar.getnames())
            self.assertEqual(names, sorted("traces/corpus/%s/%s%s" % (m, w, ext)
                                           for w in ("bert_infer_varbatch", "gpt2_decode_small")
                                           for m in ("native", "expandable")
                                           for ext in (".trace.csv.gz", ".json")))
            with tarfile.open(os.path.join(out, "corpus-logs.tar.gz")) as tar:
                logs = tar.getnames()
            self.assertIn("traces/corpus/MANIFEST.md", logs)
            self.assertIn("corpus-logs/summary.txt", logs)
            self.assertIn("corpus-logs/swin_t_train.native.log", logs)
            self.assertIn("SKIPPED zero3_prefetch.native", text)
            self.assertRegex(text, r"bert_infer_varbatch\s+native\s+ok\s+16\s+1\.000\s+1\.000\s+1\.500")
            # The failure was beside others, so it ran again alone, and failed again.
            self.assertIn("swin_t_train.native will run again alone", text)
            self.assertIn("swin_t_train.native: FAILED (exit 1)", text)
            with open(os.path.join(work, "logs", "run.json")) as f:
                runs = {r["capture"]: r for r in json.load(f)}
            self.assertEqual(runs["swin_t_train.native"]["attempts"], 2)
            self.assertEqual(runs["bert_infer_varbatch.native"]["status"], "ok")


class CapturePathTest(unittest.TestCase):
    """capture.py's GPU path (recording, steps, stats, snapshot, CSV, JSON, checks) with torch.cuda's
    recording and statistics calls replaced by stand-ins that return the synthetic snapshot: the
    glue runs here exactly as on the GPU, minus the GPU. Needs torch (skips without it)."""

    def setUp(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not importable by %s: capture.py's GPU path is not tested" % sys.executable)
        self.torch = torch
        self.calls = []
        self.saved = {}

        def patch(obj, name, value):
            self.saved[(obj, name)] = getattr(obj, name)
            setattr(obj, name, value)
        cuda = torch.cuda
        patch(cuda, "is_available", lambda: True)
        patch(cuda, "synchronize", lambda *a: None)
        patch(cuda, "get_device_name", lambda *a: "stand-in")
        patch(cuda.memory, "_record_memory_history", lambda *a, **k: self.calls.append(("record", a, k)))
        patch(cuda.memory, "_snapshot", lambda *a, **k: synthetic_snapshot())
        patch(capture, "capture_device", lambda torch: torch.device("cpu"))
        self.stats = {"allocated_bytes.all.peak": 40 * MiB, "reserved_bytes.all.peak": 62 * MiB,
                      "requested_bytes.all.peak": 8 * MiB + 512 + 30 * MiB, "num_alloc_retries": 0,
                      "num_ooms": 0, "allocated_bytes.all.current": 0}
        patch(cuda, "memory_stats", lambda *a: dict(self.stats))

        def build(ctx):
            lin = torch.nn.Linear(4, 4)

            def step(i):
                lin(torch.randn(2, 4, generator=ctx.gen)).sum().backward()
                return {"batch": 2, "i": i, "n": ctx.rng.randint(1, 9)}
            return workloads.Built(step, "a stand-in model", {"batch": 2}, {"parameters": 20})
        workloads.WORKLOADS["stand_in"] = workloads.PythonWorkload("stand_in", build, steps=4, warmup=1,
                                                                   est_gib=1, est_s=1, summary="test")

    def tearDown(self):
        for (obj, name), value in self.saved.items():
            setattr(obj, name, value)
        workloads.WORKLOADS.pop("stand_in", None)

    def run_capture(self, out):
        args = capture.parse_args(["--workload", "stand_in", "--mode", "expandable", "--out-root", out,
                                   "--shared-gpu", "--max-entries", "5000"])
        return capture.run_python(workloads.WORKLOADS["stand_in"], args, "expandable_segments:True")

    def test_capture_writes_trace_and_json(self):
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(self.run_capture(out), 0)
            self.assertEqual(self.calls[0], ("record", (), {"max_entries": 5000, "stacks": "python"}))
            self.assertEqual(self.calls[-1], ("record", (), {"enabled": None}))
            with gzip.open(os.path.join(out, "expandable", "stand_in.trace.csv.gz"), "rt") as f:
                self.assertEqual(f.read(), "\n".join(EXPECTED_LINES) + "\n")
            with open(os.path.join(out, "expandable", "stand_in.json")) as f:
                text = f.read()
            doc = json.loads(text)
            # The shared traces' keys come first, in their order (gpumem replay reads the first match).
            self.assertEqual(list(doc)[:10], ["workload", "alloc_conf", "torch", "trace_entries", "peak_allocated",
                                              "peak_reserved", "num_alloc_retries", "num_ooms", "step_s", "steps"])
            self.assertEqual(doc["alloc_conf"], "expandable_segments:True")
            self.assertEqual(doc["peak_reserved"], 62 * MiB)
            self.assertEqual(doc["peak_requested"], 8 * MiB + 512 + 30 * MiB)
            self.assertEqual(doc["trace_entries"], len(EXPECTED_LINES) - 1)
            self.assertEqual((doc["steps"], doc["warmup_steps"], len(doc["step_s_all"])), (4, 1, 4))
            self.assertEqual([s["i"] for s in doc["step_shapes"]], [0, 1, 2, 3])
            self.assertTrue(all(doc["checks"].values()), doc["checks"])
            self.assertFalse(doc["history_dropped"])
            self.assertTrue(doc["timed_with_other_captures"])
            self.assertEqual(doc["allocator_settings"]["expandable_segments"], False)  # the stand-in's
            self.assertEqual(len(doc["segments_end"]), 2)
            self.assertEqual(doc["max_entries"], 5000)

    def test_a_check_that_fails_is_loud(self):
        self.stats["reserved_bytes.all.peak"] = 64 * MiB
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(self.run_capture(out), capture.EXIT_CHECK_FAILED)
            with open(os.path.join(out, "expandable", "stand_in.json")) as f:
                doc = json.load(f)
            self.assertEqual(doc["checks"]["trace_peak_reserved_matches"], False)

    def test_alloc_conf_is_set_per_mode_and_never_mixed(self):
        old = os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        try:
            self.assertEqual(capture.set_alloc_conf("expandable"), "expandable_segments:True")
            self.assertEqual(os.environ["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True")
            with self.assertRaisesRegex(SystemExit, "--mode native means ''"):
                capture.set_alloc_conf("native")
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF")
            self.assertEqual(capture.set_alloc_conf("native"), "")
            self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", os.environ)
        finally:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if old is not None:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = old


FAKE_EXAMPLE = r"""#!%(python)s
# Stands in for a C++ example run with --record-native-history FILE: writes the synthetic snapshot
# as the pickle and FILE.stats.json, and prints the example's RESULT line.
import json, os, pickle, sys
sys.path.insert(0, %(here)r)
import test_corpus_tools as t
path = sys.argv[sys.argv.index("--record-native-history") + 1]
assert "--allocator" in sys.argv and os.environ["RANK"] == "0", sys.argv
pickle.dump(t.synthetic_snapshot(), open(path, "wb"), protocol=2)
json.dump({"peak_allocated": 40 << 20, "peak_reserved": 62 << 20, "peak_requested": (38 << 20) + 512,
           "num_alloc_retries": 0, "num_ooms": 0, "allocated_end": 0, "reserved_end": 0,
           "peak_resets_noted": 0, "max_entries": 20000000, "device": 0}, open(path + ".stats.json", "w"))
print("step 0 ...")
print('RESULT allocator=native stage=3 ms_per_step=12.500 plan="a b"')
"""


class WorkloadDryRunTest(unittest.TestCase):
    """Every Python workload of the corpus builds with its tiny (dry) shapes and runs one step on the
    CPU, as `capture.py --workload NAME --dry-run-cpu` does: a workload that a transformers or
    torchvision change broke fails here, not on the GPU machine. Needs torch, transformers and
    torchvision (skips without them). gpt2_compiled_train is left out: its step is torch.compile's
    CPU code generation (about 40 s, and a C++ toolchain with Python's headers); the GPU capture
    runs it."""

    LEFT_OUT = {"gpt2_compiled_train"}

    def setUp(self):
        try:
            import torch  # noqa: F401
            import torchvision  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            self.skipTest("%s: the workloads' dry runs are not tested with %s" % (e, sys.executable))

    def test_every_python_workload_builds_and_steps(self):
        import torch
        names = [n for n, w in workloads.WORKLOADS.items() if w.kind == "python" and n not in self.LEFT_OUT]
        self.assertGreaterEqual(len(names), 26)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for name in names:
                with self.subTest(workload=name):
                    torch.manual_seed(0)
                    built = workloads.WORKLOADS[name].build(capture.Ctx(torch, torch.device("cpu"), True, 0))
                    info = built.step(0)
                    self.assertIsInstance(info, dict)
                    self.assertTrue(info, "step 0 of %s returned no shapes" % name)
                    self.assertTrue(built.shapes, "%s describes no shapes" % name)
        finally:
            torch.set_num_threads(threads)


class CaptureCppPathTest(unittest.TestCase):
    """capture.py's C++ path with a stand-in example: runs it with --record-native-history and its
    launcher variables, converts the pickle, writes the JSON (stats from FILE.stats.json, the step
    time from the RESULT line, the side stream found), removes the pickle."""

    def test_cpp_capture(self):
        with tempfile.TemporaryDirectory() as d:
            bins = os.path.join(d, "bin")
            os.makedirs(bins)
            fake = os.path.join(bins, "zero_train")
            with open(fake, "w") as f:
                f.write(FAKE_EXAMPLE % {"python": sys.executable, "here": HERE})
            os.chmod(fake, 0o755)
            out = os.path.join(d, "corpus")
            args = capture.parse_args(["--workload", "zero3_prefetch", "--mode", "native", "--out-root", out,
                                       "--bin-dir", bins])
            w = workloads.WORKLOADS["zero3_prefetch"]
            old = capture.cpp_library_path
            capture.cpp_library_path = lambda bin_dir: bin_dir  # torch may be absent here
            try:
                rc = capture.run_cpp(w, args, "")
            finally:
                capture.cpp_library_path = old
            self.assertEqual(rc, 0)
            with open(os.path.join(out, "native", "zero3_prefetch.json")) as f:
                doc = json.load(f)
            self.assertEqual(doc["step_s"], 0.0125)
            self.assertEqual(doc["peak_reserved"], 62 * MiB)
            self.assertTrue(doc["side_streams_used"])
            self.assertTrue(all(doc["checks"].values()), doc["checks"])
            self.assertEqual(doc["result_line"]["plan"], '"a b"')
            self.assertEqual(sorted(os.listdir(os.path.join(out, "native"))),
                             ["zero3_prefetch.json", "zero3_prefetch.trace.csv.gz"])
            # Without the binary: SKIPPED, exit 4.
            args.bin_dir = os.path.join(d, "nothing")
            self.assertEqual(capture.run_cpp(w, args, ""), capture.EXIT_SKIPPED)


if __name__ == "__main__":
    if "--gpumem" in sys.argv:
        i = sys.argv.index("--gpumem")
        GPUMEM = sys.argv[i + 1]
        if not os.access(GPUMEM, os.X_OK):
            sys.exit("test_corpus_tools.py: --gpumem %s is not an executable" % GPUMEM)
        del sys.argv[i:i + 2]
    from unittest_status import exit_status  # noqa: E402
    sys.exit(exit_status(unittest.main(verbosity=2, exit=False).result))
