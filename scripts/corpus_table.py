#!/usr/bin/env python3
"""The corpus table: every trace of the corpus replayed through gpumem's engine and PyTorch's models.

usage: scripts/corpus_table.py --gpumem BUILD/cli/gpumem [--corpus DIR]... [--policy P]...
                               [--check] [--known-over FILE] [--json FILE] [--steady]
                               [--step-markers FILE]

For every DIR/native/NAME.trace.csv.gz (DIR defaults to the repository's traces/corpus), runs
`gpumem replay TRACE --json --top 0` with the policies gpumem, pytorch and pytorch:expandable (and
any --policy given: they replace gpumem in the gpumem columns) and prints one row per trace:

  requested   the trace's peak requested bytes (GiB)
  exp meas    PyTorch's measured peak reserved with expandable segments / peak requested
              (DIR/expandable/NAME.json; '-' when there is none)
  gpumem      gpumem's replayed peak reserved / peak requested, then 'ok' when it is at most the
              expandable measurement, 'OVER' when it is more
  vmm%        gpumem's driver calls (create/map/unmap/release, H200 costs) and the stream
              synchronizations recycling makes (1 ms each, call_costs.h) as a share of the
              traced run
  pytorch     the model of PyTorch's native allocator, same ratio
  pt:exp      the model of PyTorch with expandable segments, same ratio

then a summary: traces over the expandable measurement, traces at most 1.01 x requested, traces
whose VMM share passes 1%.

--steady: also replays the first half of each trace (its entries up to the middle of its traced
time) and prints, after each vmm%, `2nd%`: the VMM share of the second half alone ((calls of the
whole run - calls of the first half) over the second half's duration), and the same two columns for
pytorch:expandable. The traces are a few steps long, so the whole-run share is mostly the one-time
building of the footprint; the second half is closer to what a long run pays per step.

--check: exit 1 if gpumem's peak reserved is above the expandable measurement on any trace
that has one, beyond what --known-over allows. The known-over file (default
traces/corpus/known_over.txt) lists `NAME MAX_RATIO` lines (`#` starts a comment): gpumem may
exceed the measurement on NAME by at most MAX_RATIO (gpumem reserved / expandable reserved).
A listed trace that is now within the measurement is reported, so the entry can go.
A policy with the step planner (gpumem, whose default has it on, or gpumem+plan; not one that says
step_plan:False) finds the steps itself. With --step-markers FILE
(`NAME BYTES PER_STEP` lines, such as traces/corpus/step_markers.txt) a listed trace is replayed
with `--step-marker BYTES --per-step K` instead (its ratio is followed by 'm'): the program's marks.

Exit status: 0 ok, 1 check failed, 2 usage error or a replay that failed.
"""
import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = float(1 << 30)


def usage_error(message):
    sys.stderr.write(message + "\n")
    sys.exit(2)


def name_lines(path):
    """(line number, words, text) of each line of a NAME ... file, comments (#) and blank lines left out."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split('#', 1)[0].strip()
            if line:
                yield n, line.split(), line


def load_known_over(path):
    known = {}
    if not path:
        return known
    if not os.path.isfile(path):
        usage_error(f"--known-over {path}: no such file (give an empty file to allow no excess)")
    for n, parts, line in name_lines(path):
        try:
            if len(parts) != 2:
                raise ValueError
            known[parts[0]] = float(parts[1])
        except ValueError:
            usage_error(f"{path}:{n}: expected 'NAME MAX_RATIO' (e.g. 'swin_t_train 1.003'), got {line!r}")
    return known


def load_step_markers(path):
    """{NAME: (BYTES, PER_STEP)} from a step-markers file."""
    if not os.path.isfile(path):
        usage_error(f"--step-markers {path}: no such file")
    markers = {}
    for n, parts, line in name_lines(path):
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts[1:]):
            usage_error(f"{path}:{n}: expected 'NAME BYTES PER_STEP' (two positive whole numbers), got {line!r}")
        markers[parts[0]] = (int(parts[1]), int(parts[2]))
    return markers


def is_plan(policy):
    """A gpumem policy with the step planner: gpumem+plan, or gpumem (the planner is on by default)
    unless its configuration says step_plan:False."""
    family, _, conf = policy.partition(':')
    if family == 'gpumem+plan':
        return True
    return family == 'gpumem' and 'step_plan:false' not in conf.lower().replace(' ', '')


def replay(gpumem, trace, policies, marker=None):
    """Replays trace through policies; a policy with the step planner gets the step marks when there is a
    marker."""
    args = [gpumem, 'replay', trace, '--json', '--top', '0']
    for p in policies:
        args += ['--policy', p]
    if marker and any(is_plan(p) for p in policies):
        args += ['--step-marker', str(marker[0]), '--per-step', str(marker[1])]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(f"gpumem replay {trace} failed (exit {out.returncode}):\n{out.stderr}")
        sys.exit(2)
    return json.loads(out.stdout)


def first_half(trace, directory):
    """Writes the entries of trace up to the middle of its traced time to directory; returns the path
    and the sizes of the allocations it keeps."""
    with gzip.open(trace, 'rt') as f:
        lines = f.read().splitlines()
    col = lines[0].split(',').index('time_us')

    def time_of(line):
        parts = line.split(',', col + 1)
        return int(parts[col]) if len(parts) > col and parts[col].isdigit() else None

    times = [t for t in map(time_of, lines[1:]) if t is not None]
    mid = (min(times) + max(times)) // 2
    keep = [lines[0]] + [l for l in lines[1:] if (time_of(l) or 0) <= mid]
    path = os.path.join(directory, os.path.basename(trace))
    with gzip.open(path, 'wt') as f:
        f.write('\n'.join(keep) + '\n')
    head = lines[0].split(',')
    action, size = head.index('action'), head.index('size')
    sizes = set()
    for line in keep[1:]:
        parts = line.split(',')
        if len(parts) > max(action, size) and parts[action] == 'alloc' and parts[size].isdigit():
            sizes.add(int(parts[size]))
    return path, sizes


def second_half_share(whole, half, p_whole, p_half):
    """VMM share of the second half: the calls the first half did not make, over its duration."""
    seconds = (whole['duration_us'] - half['duration_us']) * 1e-6
    return (p_whole['call_seconds'] - p_half['call_seconds']) / seconds if seconds > 0 else float('nan')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--gpumem', required=True, help='the gpumem command line tool (BUILD/cli/gpumem)')
    ap.add_argument('--corpus', action='append', help='a directory with native/ and expandable/ (repeatable; '
                    'default: the repository\'s traces/corpus)')
    ap.add_argument('--policy', action='append', help='gpumem policy for the gpumem columns (default: gpumem)')
    ap.add_argument('--check', action='store_true', help='exit 1 if gpumem is over the expandable measurement')
    ap.add_argument('--known-over', default=os.path.join(ROOT, 'traces', 'corpus', 'known_over.txt'),
                    help='allowed excesses for --check (default: traces/corpus/known_over.txt)')
    ap.add_argument('--json', help='also write the rows as JSON to this file')
    ap.add_argument('--steady', action='store_true', help='also the VMM share of the second half of each trace')
    ap.add_argument('--step-markers', help='where steps start, for gpumem+plan (e.g. traces/corpus/step_markers.txt; '
                    'default: none, the planner finds the steps)')
    a = ap.parse_args()
    if not os.access(a.gpumem, os.X_OK):
        usage_error(f"--gpumem {a.gpumem}: not an executable; build the 'gpumem' target and pass BUILD/cli/gpumem")
    corpora = a.corpus or [os.path.join(ROOT, 'traces', 'corpus')]
    ours = a.policy or ['gpumem']
    known = load_known_over(a.known_over) if a.check or os.path.exists(a.known_over) else {}
    markers = load_step_markers(a.step_markers) if a.step_markers else {}

    traces = []
    for d in corpora:
        found = sorted(glob.glob(os.path.join(d, 'native', '*.trace.csv.gz')))
        if not found:
            sys.stderr.write(f"--corpus {d}: no native/*.trace.csv.gz there\n")
            sys.exit(2)
        traces += [(d, t) for t in found]

    head = f"{'trace':26s} {'requested':>10s} {'exp meas':>9s}"
    for p in ours:
        head += f" {p[:18]:>18s} {'vmm%':>6s}" + (f" {'2nd%':>6s}" if a.steady else '')
    head += f" {'pytorch':>8s} {'pt:exp':>8s}" + (f" {'vmm%':>6s} {'2nd%':>6s}" if a.steady else '')
    tmp = tempfile.TemporaryDirectory() if a.steady else None
    print(head)
    rows, failures, stale = [], [], []
    for d, t in traces:
        name = os.path.basename(t)[:-len('.trace.csv.gz')]
        marker = markers.get(name)
        j = replay(a.gpumem, t, ours + ['pytorch', 'pytorch:expandable'], marker)
        req = j['peak_requested_bytes']
        ej = os.path.join(d, 'expandable', name + '.json')
        exp = json.load(open(ej))['peak_reserved'] if os.path.exists(ej) else None
        pols = j['policies']
        steady = [None] * len(pols)
        if a.steady:
            half, half_sizes = first_half(t, tmp.name)
            # A first half with no marker request (torch.compile's warm-up can fill it) has no mark: the
            # planner detects there, as it does in the whole run until the first mark.
            h = replay(a.gpumem, half, ours + ['pytorch', 'pytorch:expandable'],
                       marker if marker and marker[0] in half_sizes else None)
            steady = [second_half_share(j, h, pw, ph) for pw, ph in zip(pols, h['policies'])]
        row = {'trace': name, 'corpus': d, 'peak_requested_bytes': req, 'expandable_measured_bytes': exp,
               'policies': {}}
        line = f"{name[:26]:26s} {req / GiB:10.3f} {exp / req if exp else float('nan'):9.4f}" if exp else \
            f"{name[:26]:26s} {req / GiB:10.3f} {'-':>9s}"
        for p, s2, asked in zip(pols, steady, ours + ['pytorch', 'pytorch:expandable']):
            p['policy'] = asked  # a gpumem+plan column is keyed by its name even where gpumem stood in
            row['policies'][p['policy']] = {'peak_reserved_bytes': p['peak_reserved_bytes'], 'ratio': p['ratio'],
                                            'call_share': p['call_share']}
            if s2 is not None:
                row['policies'][p['policy']]['second_half_call_share'] = s2
        for p, s2 in zip(pols[:len(ours)], steady):
            over = exp is not None and p['peak_reserved_bytes'] > exp
            mark = '' if exp is None else ('OVER' if over else 'ok')
            marked = 'm' if is_plan(p['policy']) and marker else ' '
            line += f" {p['ratio']:12.4f}{marked} {mark:4s} {100 * p['call_share']:5.2f}%"
            if a.steady:
                line += f" {100 * s2:5.2f}%"
            if exp is not None and p is pols[0]:
                excess = p['peak_reserved_bytes'] / exp
                allowed = known.get(name)
                if over and (allowed is None or excess > allowed):
                    failures.append(f"{name}: {p['policy']} reserves {p['peak_reserved_bytes']} bytes at its peak, "
                                    f"{(excess - 1) * 100:.2f}% over PyTorch's expandable measurement ({exp} bytes)"
                                    + (f"; known_over allows {allowed}" if allowed else ''))
                if not over and allowed is not None:
                    stale.append(name)
        line += f" {pols[-2]['ratio']:8.4f} {pols[-1]['ratio']:8.4f}"
        if a.steady:
            line += f" {100 * pols[-1]['call_share']:5.2f}% {100 * steady[-1]:5.2f}%"
        print(line)
        rows.append(row)

    for p in ours + (['pytorch:expandable'] if a.steady else []):
        within = [r for r in rows if r['expandable_measured_bytes'] is not None]
        over = sum(1 for r in within if r['policies'][p]['peak_reserved_bytes'] > r['expandable_measured_bytes'])
        tight = sum(1 for r in rows if r['policies'][p]['ratio'] <= 1.01)
        vmm = sum(1 for r in rows if r['policies'][p]['call_share'] > 0.01)
        steady_part = ''
        if a.steady:
            vmm2 = sum(1 for r in rows if r['policies'][p]['second_half_call_share'] > 0.01)
            steady_part = f"; second half > 1%: {vmm2}"
        print(f"{p}: {len(rows)} traces; over the expandable measurement: {over} of {len(within)}; "
              f"<= 1.01 x requested: {tight}; VMM share > 1%: {vmm}{steady_part}")
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(rows, f, indent=1)
    for name in stale:
        print(f"note: {name} is listed in {a.known_over} but is now within the expandable measurement: "
              f"remove its line")
    if a.check:
        for f in failures:
            print(f"FAIL {f}")
        if failures:
            print(f"corpus check failed: {len(failures)} trace(s) over PyTorch's expandable-segments peak")
            return 1
        print("corpus check passed: gpumem's peak reserved is at most PyTorch's expandable-segments peak "
              "on every trace (beyond the known_over entries)")
    return 0


if __name__ == '__main__':
    sys.exit(main())
