#!/usr/bin/env python3
"""scripts/long_runs.py: the corpus' fixed-shape traces lengthened and replayed (ctest long_runs).

Without arguments: the script's parts and its errors, with a stand-in for `gpumem replay` (a small
Python program that writes the JSON the real one would and records what it was asked). With
--gpumem BUILD/cli/gpumem: also one real run over a synthetic trace, whose rows must come from the
real replay (the lengthened trace's peak requested is the step's)."""
import csv
import gzip
import json
import os
import stat
import subprocess
import sys
import tempfile

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
SCRIPT = os.path.join(SCRIPTS, "long_runs.py")
HEADER = ["action", "addr", "size", "stream", "time_us", "where"]

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def write_trace(path, steps):
    """A trace of `steps` closed steps: a 4096-byte block and a 1000-byte marker, allocated and freed."""
    rows = [["alloc", "7", "512", "0", "0", "weights"]]
    for k in range(steps):
        t = 10 * (k + 1)
        rows += [["alloc", "1024", "4096", "0", str(t), "a"], ["alloc", "8192", "1000", "0", str(t + 1), "logits"],
                 ["free_completed", "8192", "1000", "0", str(t + 2), "logits"],
                 ["free_completed", "1024", "4096", "0", str(t + 3), "a"]]
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(rows)


FAKE = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
policies = [args[i + 1] for i, a in enumerate(args) if a == "--policy"]
trace = args[1]
n = sum(1 for _ in __import__("gzip").open(trace, "rt")) - 1
# gpumem over the model on the trace named "creeps", within it elsewhere.
over = "creeps" in os.path.basename(trace)
out = {"peak_requested_bytes": 1000 * n, "duration_us": 10, "policies": []}
for p in policies:
    reserved = 1000 * n + (50 if p == "pytorch:expandable" else (80 if over else 20))
    out["policies"].append({"policy": p, "peak_reserved_bytes": reserved, "ratio": reserved / (1000 * n),
                            "call_share": 0.02 if p == "gpumem" else 0.001})
print(json.dumps(out))
'''


def run(*args, env=None):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env)


def main():
    real = None
    if len(sys.argv) == 3 and sys.argv[1] == "--gpumem":
        real = sys.argv[2]
    elif len(sys.argv) != 1:
        print("usage: test_long_runs.py [--gpumem BUILD/cli/gpumem]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus")
        os.makedirs(os.path.join(corpus, "native"))
        write_trace(os.path.join(corpus, "native", "steady.trace.csv.gz"), 4)
        write_trace(os.path.join(corpus, "native", "creeps.trace.csv.gz"), 4)
        # A trace shipped as traces/NAME.native.trace.csv.gz (resnet50 is) is found too.
        write_trace(os.path.join(corpus, "flat.native.trace.csv.gz"), 3)
        markers = os.path.join(d, "markers.txt")
        with open(markers, "w") as f:
            f.write("steady 1000 1\ncreeps 1000 1\nflat 1000 1\nabsent 1000 1  # in no corpus\n")
        fake = os.path.join(d, "gpumem")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
        log = os.path.join(d, "log.jsonl")
        env = dict(os.environ, FAKE_LOG=log)
        js = os.path.join(d, "rows.json")

        r = run("--gpumem", fake, "--corpus", corpus, "--step-markers", markers, "--steps", "5",
                "--policy", "gpumem", "--policy", "gpumem+plan", "--json", js, env=env)
        check(r.returncode == 0, f"plain run: exit {r.returncode}: {r.stderr}")
        calls = [json.loads(line) for line in open(log)]
        check(len(calls) == 3, f"one replay per trace found: {calls}")
        for c in calls:
            pol = [c[i + 1] for i, a in enumerate(c) if a == "--policy"]
            check(pol == ["gpumem", "gpumem+plan", "pytorch:expandable"], f"policies asked: {pol}")
            check(c[0] == "replay" and "--json" in c, f"command: {c}")
            # Not NAME.trace.csv.gz: a NAME.json beside it would be read as PyTorch's measurement.
            check(not c[1].endswith(".trace.csv.gz"), f"lengthened trace named like a corpus trace: {c[1]}")
        rows = json.load(open(js))
        by = {x["trace"]: x for x in rows}
        check(sorted(by) == ["creeps", "flat", "steady"], f"rows: {sorted(by)}")
        check(by["creeps"]["policies"]["gpumem"]["over"] and not by["steady"]["policies"]["gpumem"]["over"],
              f"over flags: {by['creeps']['policies']['gpumem']}, {by['steady']['policies']['gpumem']}")
        check(by["steady"]["steps_added"] == 5, f"steps added: {by['steady']['steps_added']}")
        check("left out: absent: in no --corpus directory" in r.stdout, f"absent trace not reported: {r.stdout}")
        check("gpumem: 3 traces 5 steps longer; over the expandable model: 1; VMM share > 1%: 3" in r.stdout,
              f"summary: {r.stdout}")
        check("gpumem+plan: 3 traces 5 steps longer; over the expandable model: 1" in r.stdout,
              f"plan summary: {r.stdout}")

        # --check: exit 1 naming the trace over the model; 0 when none is.
        r = run("--gpumem", fake, "--corpus", corpus, "--step-markers", markers, "--steps", "5", "--check", env=env)
        check(r.returncode == 1 and "FAIL creeps:" in r.stdout and "FAIL steady" not in r.stdout,
              f"--check with a trace over: exit {r.returncode}: {r.stdout}")
        with open(markers, "w") as f:
            f.write("steady 1000 1\n")
        r = run("--gpumem", fake, "--corpus", corpus, "--step-markers", markers, "--steps", "5", "--check", env=env)
        check(r.returncode == 0 and "long-run check passed" in r.stdout, f"--check, none over: {r.stdout}{r.stderr}")

        # A step that is not closed is left out with repeat_steps' reason, not a crash.
        with gzip.open(os.path.join(corpus, "native", "open.trace.csv.gz"), "wt") as f:
            f.write(",".join(HEADER) + "\nalloc,1,1000,0,1,x\nalloc,2,1000,0,2,x\nalloc,3,1000,0,3,x\n")
        with open(markers, "w") as f:
            f.write("open 1000 1\n")
        r = run("--gpumem", fake, "--corpus", corpus, "--step-markers", markers, env=env)
        check(r.returncode == 0 and "left out: open: the step (entries" in r.stdout and "is not closed" in r.stdout,
              f"open step: exit {r.returncode}: {r.stdout}{r.stderr}")

        # Usage errors: one line each, exit 2.
        for args, says in ((["--gpumem", os.path.join(d, "none")], "not an executable"),
                           (["--gpumem", fake, "--steps", "0"], "at least 1"),
                           (["--gpumem", fake, "--policy", "pytorch"], "give a gpumem policy"),
                           (["--gpumem", fake, "--corpus", os.path.join(d, "nope")], "no such directory"),
                           (["--gpumem", fake, "--step-markers", os.path.join(d, "nope.txt")], "no such file")):
            r = run(*args, env=env)
            check(r.returncode == 2 and says in r.stderr, f"{args}: exit {r.returncode}, stderr {r.stderr!r}")

        if real:
            with open(markers, "w") as f:
                f.write("steady 1000 1\n")
            r = run("--gpumem", real, "--corpus", corpus, "--step-markers", markers, "--steps", "7",
                    "--json", js, "--check")
            check(r.returncode == 0, f"real replay: exit {r.returncode}: {r.stdout}{r.stderr}")
            rows = json.load(open(js))
            # At the peak: the weights and the step's two blocks, requested (not rounded).
            check(len(rows) == 1 and rows[0]["peak_requested_bytes"] == 512 + 4096 + 1000,
                  f"real rows: {rows}")
    for f in failures:
        print("FAIL", f)
    print(f"test_long_runs: {'FAILED' if failures else 'passed'}" + ("" if real else " (no --gpumem: the real replay "
                                                                                       "was not run)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
