#!/usr/bin/env python3
"""Long runs: the corpus' fixed-shape traces lengthened by many steps and replayed.

usage: scripts/long_runs.py --gpumem BUILD/cli/gpumem [--corpus DIR]... [--steps N] [--policy P]...
                            [--step-markers FILE] [--check] [--json FILE]

The corpus traces are 10-26 steps long; a training run is thousands. What a policy does to memory
over a long run (a footprint that creeps up step after step, driver calls every step) does not show
in them. For every trace named in the step-markers file (`NAME BYTES PER_STEP` lines; default
traces/corpus/step_markers.txt) that some DIR holds as native/NAME.trace.csv.gz or
NAME.native.trace.csv.gz (DIR: each --corpus, default the repository's traces/corpus and traces/),
this writes the trace lengthened by N more repetitions of its last whole step
(scripts/repeat_steps.py; N = --steps, default 100) to a temporary directory, replays it with
`gpumem replay --json --top 0` through the gpumem policies (default: gpumem) and
pytorch:expandable, and prints one row per trace:

  steps       the steps added
  requested   the run's peak requested bytes (GiB)
  P           each gpumem policy's peak reserved / peak requested, 'ok' when its peak reserved is
              at most the expandable model's, 'OVER' when it is more, then its VMM share (driver
              calls and recycling's synchronizations, H200 costs, over the lengthened run)
  pt:exp      the model of PyTorch with expandable segments: the same ratio and share

There is no measurement of a run this long: the model of PyTorch with expandable segments stands
in for it (replaying the corpus, it lands on PyTorch's measured peak to the byte on 30 of the 32
traces with a measurement; the other two are a mixture-of-experts model, 0.12% above, and ZeRO-3's
two streams, 2.3% below).
A trace listed but found in no DIR is reported and left out. Traces whose last step is not closed
(repeat_steps.py refuses them) are reported and left out.

--check: exit 1 if the first gpumem policy's peak reserved is above the expandable model's on any
trace. --json FILE: the rows as JSON.

Exit status: 0 ok, 1 check failed, 2 usage error or a replay that failed.
"""
import argparse
import json
import os
import sys
import tempfile

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
sys.path.insert(0, SCRIPTS)
import corpus_table  # noqa: E402
import repeat_steps  # noqa: E402

GiB = float(1 << 30)
EXPANDABLE = 'pytorch:expandable'


def find_trace(name, corpora):
    """The first DIR/native/NAME.trace.csv.gz, else DIR/NAME.native.trace.csv.gz (traces/ holds resnet50
    so); None if no DIR has it."""
    for d in corpora:
        for path in (os.path.join(d, 'native', name + '.trace.csv.gz'), os.path.join(d, name + '.native.trace.csv.gz')):
            if os.path.isfile(path):
                return path
    return None


def row_for(name, steps, j, ours):
    """One JSON row: the run's peak requested and, per policy, peak reserved, ratio, VMM share and whether
    it is over the expandable model."""
    pols = {p['policy']: p for p in j['policies']}
    exp = pols[EXPANDABLE]['peak_reserved_bytes']
    row = {'trace': name, 'steps_added': steps, 'peak_requested_bytes': j['peak_requested_bytes'],
           'expandable_model_bytes': exp, 'policies': {}}
    for p in ours + [EXPANDABLE]:
        q = pols[p]
        row['policies'][p] = {'peak_reserved_bytes': q['peak_reserved_bytes'], 'ratio': q['ratio'],
                              'call_share': q['call_share'], 'over': q['peak_reserved_bytes'] > exp}
    return row


def format_row(row, ours):
    line = f"{row['trace'][:26]:26s} {row['steps_added']:>5d} {row['peak_requested_bytes'] / GiB:10.3f}"
    for p in ours:
        q = row['policies'][p]
        line += f" {q['ratio']:12.4f} {'OVER' if q['over'] else 'ok':4s} {100 * q['call_share']:5.2f}%"
    e = row['policies'][EXPANDABLE]
    return line + f" {e['ratio']:8.4f} {100 * e['call_share']:5.2f}%"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--gpumem', required=True, help='the gpumem command line tool (BUILD/cli/gpumem)')
    ap.add_argument('--corpus', action='append', help='a directory with native/NAME.trace.csv.gz (repeatable; '
                    "default: the repository's traces/corpus and traces/)")
    ap.add_argument('--steps', type=int, default=100, help='steps added to every trace (default 100)')
    ap.add_argument('--policy', action='append', help='gpumem policy to replay (repeatable; default: gpumem)')
    ap.add_argument('--step-markers', default=os.path.join(ROOT, 'traces', 'corpus', 'step_markers.txt'),
                    help='NAME BYTES PER_STEP lines: the traces to lengthen and their steps '
                    '(default: traces/corpus/step_markers.txt)')
    ap.add_argument('--check', action='store_true',
                    help="exit 1 if the first gpumem policy is over the expandable model on any trace")
    ap.add_argument('--json', help='also write the rows as JSON to this file')
    a = ap.parse_args(argv)
    if not os.access(a.gpumem, os.X_OK):
        corpus_table.usage_error(f"--gpumem {a.gpumem}: not an executable; build the 'gpumem' target and pass "
                                 "BUILD/cli/gpumem")
    if a.steps < 1:
        corpus_table.usage_error(f"--steps {a.steps}: give the number of steps to add, at least 1")
    ours = a.policy or ['gpumem']
    for p in ours:
        if p != 'gpumem' and not p.startswith(('gpumem:', 'gpumem+plan')):
            corpus_table.usage_error(f"--policy {p}: give a gpumem policy (gpumem, gpumem:CONF, gpumem+plan[:CONF]); "
                                     f"{EXPANDABLE} is always replayed beside it")
    corpora = a.corpus or [os.path.join(ROOT, 'traces', 'corpus'), os.path.join(ROOT, 'traces')]
    for d in corpora:
        if not os.path.isdir(d):
            corpus_table.usage_error(f"--corpus {d}: no such directory")
    markers = corpus_table.load_step_markers(a.step_markers)

    head = f"{'trace':26s} {'steps':>5s} {'requested':>10s}"
    for p in ours:
        head += f" {p[:17]:>17s} {'vmm%':>6s}"
    print(head + f" {'pt:exp':>8s} {'vmm%':>6s}")
    rows, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (marker, per_step) in markers.items():
            trace = find_trace(name, corpora)
            if trace is None:
                skipped.append(f"{name}: in no --corpus directory")
                continue
            # Not NAME.trace.csv.gz: gpumem replay would read a NAME.json beside it as PyTorch's
            # measured peaks, and none belongs to a lengthened run.
            longer = os.path.join(tmp, f"{name}.plus{a.steps}.csv.gz")
            try:
                repeat_steps.write_longer(trace, longer, marker, per_step, a.steps)
            except repeat_steps.TraceError as e:
                skipped.append(f"{name}: {e}")
                continue
            j = corpus_table.replay(a.gpumem, longer, ours + [EXPANDABLE])
            os.remove(longer)
            row = row_for(name, a.steps, j, ours)
            print(format_row(row, ours), flush=True)
            rows.append(row)
    for s in skipped:
        print(f"left out: {s}")
    for p in ours:
        over = sum(1 for r in rows if r['policies'][p]['over'])
        vmm = sum(1 for r in rows if r['policies'][p]['call_share'] > 0.01)
        print(f"{p}: {len(rows)} traces {a.steps} steps longer; over the expandable model: {over}; "
              f"VMM share > 1%: {vmm}")
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(rows, f, indent=1)
    if a.check:
        failed = [r for r in rows if r['policies'][ours[0]]['over']]
        for r in failed:
            q = r['policies'][ours[0]]
            print(f"FAIL {r['trace']}: {ours[0]} reserves {q['peak_reserved_bytes']} bytes at its peak "
                  f"{a.steps} steps longer, {(q['peak_reserved_bytes'] / r['expandable_model_bytes'] - 1) * 100:.2f}% "
                  f"over the expandable model ({r['expandable_model_bytes']} bytes)")
        if failed:
            print(f"long-run check failed: {len(failed)} trace(s) over the expandable model")
            return 1
        print(f"long-run check passed: {ours[0]} is at most the expandable model on every lengthened trace")
    return 0


if __name__ == '__main__':
    sys.exit(main())
