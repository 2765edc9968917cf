#!/usr/bin/env python3
"""PyTorch memory snapshot -> gpumem CSV trace (the format of traces/README.md).

A snapshot is the dict torch.cuda.memory._snapshot() returns (or the pickle that
torch.cuda.memory._dump_snapshot and torch::cuda::_memory_snapshot_pickled() write):
``device_traces[device]`` is the allocator's history, one dict per entry with ``action``,
``addr`` (``device_free`` for ``oom``), ``size``, ``stream``, ``time_us`` and ``frames``
(innermost first). The CSV keeps one device's history, in order:

    action,addr,size,stream,time_us,where

``where`` is the innermost frame outside torch as ``basename:line:function``: the same rule as
gpumem's snapshot reader (forensics/src/snapshot.cpp, ``call_site``), so a snapshot and its CSV
give `gpumem replay` the same call sites. Frames with an empty filename or ``??`` (C++) and
frames whose path contains ``/torch/`` (or starts with ``torch/``) are skipped; commas and line
breaks become ``;``.

Besides the conversion this module measures what the trace itself says (the peak of its segment
entries = PyTorch's peak reserved; the peak of live requested bytes = PyTorch's peak requested),
so a capture can check that its trace is complete.

Only the standard library: it runs wherever the snapshot is, with or without torch.

    snapshot_csv.py SNAPSHOT.pickle OUT.trace.csv.gz [--device N] [--max-entries N]
"""

import argparse
import collections
import gzip
import json
import os
import pickle
import sys

HEADER = "action,addr,size,stream,time_us,where"
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)


class SnapshotError(ValueError):
    """A snapshot that cannot be converted; the message names the problem and the fix."""


def _inside_torch(filename):
    return "/torch/" in filename or filename.startswith("torch/")


def call_site(frames):
    """The innermost frame outside torch as 'basename:line:function', or '' if there is none."""
    for f in frames or ():
        filename = f.get("filename") or ""
        if not filename or filename == "??" or _inside_torch(filename):
            continue
        site = "%s:%s:%s" % (filename.rsplit("/", 1)[-1], f.get("line", 0), f.get("name", ""))
        return site.replace(",", ";").replace("\n", ";").replace("\r", ";")
    return ""


def traced_device(snapshot, device=None):
    """The device whose history to take: `device`, else the first with entries (else 0)."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise SnapshotError(
            "the snapshot has no 'device_traces' list: it was taken without "
            "torch.cuda.memory._record_memory_history(...) (or is not a PyTorch snapshot)")
    if device is not None:
        if not 0 <= device < len(traces):
            raise SnapshotError("device %d is not in the snapshot, which has traces for %d device(s)"
                                % (device, len(traces)))
        return device
    for d, t in enumerate(traces):
        if t:
            return d
    return 0


class TraceStats:
    """What a trace says about itself, gathered while it is written."""

    def __init__(self):
        self.entries = 0
        self.actions = collections.Counter()
        self.streams = collections.Counter()  # stream -> alloc count
        self.peak_reserved = 0  # from segment_alloc/map - segment_free/unmap
        self.peak_requested = 0  # from alloc - free_completed sizes
        self.first_time_us = None
        self.last_time_us = None
        self.time_regressions = 0  # entries whose time_us is below the previous one
        self.sites = 0  # entries with a non-empty where

    def as_dict(self):
        return {
            "entries": self.entries,
            "actions": dict(sorted(self.actions.items())),
            "alloc_streams": {str(k): v for k, v in sorted(self.streams.items())},
            "trace_peak_reserved": self.peak_reserved,
            "trace_peak_requested": self.peak_requested,
            "traced_us": (self.last_time_us - self.first_time_us) if self.entries else 0,
            "time_regressions": self.time_regressions,
            "entries_with_where": self.sites,
        }


def _csv_lines(entries, stats):
    reserved = 0
    requested = 0
    cache = {}  # id(frames list) -> where; PyTorch shares one list between equal tracebacks
    last_t = None
    for i, e in enumerate(entries):
        action = e.get("action")
        if action not in ACTIONS:
            raise SnapshotError("entry %d has action %r, not one of %s" % (i, action, ", ".join(ACTIONS)))
        addr = e.get("device_free" if action == "oom" else "addr")
        if action == "oom" or action == "snapshot":
            addr = 0  # no address: oom carries the device's free bytes, snapshot nothing
        try:
            addr = int(addr)
            size = int(e["size"])
            stream = int(e.get("stream", 0))
            t = int(e["time_us"])
        except (KeyError, TypeError, ValueError) as err:
            raise SnapshotError("entry %d (%s) lacks a numeric addr/size/stream/time_us: %r (%s)"
                                % (i, action, e, err)) from None
        if addr < 0 or size < 0 or stream < 0:
            raise SnapshotError("entry %d (%s) has a negative addr, size or stream: %r" % (i, action, e))
        frames = e.get("frames")
        key = id(frames)
        where = cache.get(key)
        if where is None:
            where = call_site(frames)
            if frames is not None:
                cache[key] = where
        if action in ("segment_alloc", "segment_map"):
            reserved += size
            stats.peak_reserved = max(stats.peak_reserved, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        elif action == "alloc":
            requested += size
            stats.peak_requested = max(stats.peak_requested, requested)
            stats.streams[stream] += 1
        elif action == "free_completed":
            requested -= size
        stats.entries += 1
        stats.actions[action] += 1
        if where:
            stats.sites += 1
        if stats.first_time_us is None:
            stats.first_time_us = t
        if last_t is not None and t < last_t:
            stats.time_regressions += 1
        last_t = t
        stats.last_time_us = t
        yield "%s,%d,%d,%d,%d,%s\n" % (action, addr, size, stream, t, where)


def write_csv(snapshot, path, device=None):
    """Writes one device's history of `snapshot` to `path` (gzip if it ends in .gz) and returns
    (device, TraceStats). The file is written to path + '.tmp' and renamed, so a failure leaves
    no half-written trace behind."""
    device = traced_device(snapshot, device)
    entries = snapshot["device_traces"][device] if snapshot["device_traces"] else []
    stats = TraceStats()
    tmp = path + ".tmp"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(tmp, "wt", encoding="utf-8", newline="") as out:
            out.write(HEADER + "\n")
            out.writelines(_csv_lines(entries, stats))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return device, stats


def segments_end(snapshot, device):
    """The segments that existed when the snapshot was taken, as the shared traces' JSON lists
    them (no blocks, no frames)."""
    out = []
    for s in snapshot.get("segments", []):
        if s.get("device", device) != device:
            continue
        out.append({
            "address": s.get("address"),
            "total_size": s.get("total_size"),
            "allocated_size": s.get("allocated_size"),
            "active_size": s.get("active_size"),
            "stream": s.get("stream"),
            "segment_type": s.get("segment_type"),
            "is_expandable": s.get("is_expandable"),
        })
    return out


def load_snapshot(path):
    """Reads a snapshot pickle (optionally gzip-compressed) with the standard library."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            snap = pickle.load(f)
    except FileNotFoundError:
        raise SnapshotError("%s: no such file" % path) from None
    except (pickle.UnpicklingError, EOFError, gzip.BadGzipFile, AttributeError, ImportError) as err:
        raise SnapshotError("%s: not a snapshot pickle (%s); give the file that "
                            "torch.cuda.memory._dump_snapshot or --record-native-history wrote"
                            % (path, err)) from None
    if not isinstance(snap, dict):
        raise SnapshotError("%s: the pickle holds a %s, not a snapshot dict" % (path, type(snap).__name__))
    return snap


def check_complete(stats, max_entries):
    """Raises SnapshotError if the history may have dropped entries: PyTorch's ring buffer keeps
    the newest max_entries, so a trace that holds max_entries of them may have lost older ones."""
    if max_entries is not None and stats.entries >= max_entries:
        raise SnapshotError(
            "the trace holds %d entries, the recorder's max_entries (%d): older entries were "
            "dropped. Record again with a larger max_entries" % (stats.entries, max_entries))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", help="snapshot pickle (.pickle or .pickle.gz)")
    ap.add_argument("out", help="CSV trace to write (.trace.csv.gz)")
    ap.add_argument("--device", type=int, default=None, help="device (default: first with entries)")
    ap.add_argument("--max-entries", type=int, default=None,
                    help="the recorder's max_entries: fail if the trace may have dropped entries")
    args = ap.parse_args(argv)
    try:
        snap = load_snapshot(args.snapshot)
        device, stats = write_csv(snap, args.out, args.device)
        check_complete(stats, args.max_entries)
    except SnapshotError as err:
        print("snapshot_csv: %s" % err, file=sys.stderr)
        return 1
    print(json.dumps(dict(device=device, **stats.as_dict()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
