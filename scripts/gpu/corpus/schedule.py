"""Which captures to start now: the corpus runner's admission policy, a pure function.

Captures share one GPU. Each has an estimated memory (GiB) and duration (s); a running one also
has what nvidia-smi saw it hold. The policy is EASY backfilling over a priority list:

- The first pending capture that can still finish before the deadline (the head) starts as soon
  as it fits: fewer than max_parallel running, its memory fits in the budget beside what the
  running ones hold (the larger of estimate and seen), and the GPU reports that much free.
- While the head waits, it holds a reservation: the time at which, by the running captures'
  expected ends, enough memory frees up for it, and the memory spare beside it then. A later
  capture starts now only if it fits now and either ends before that time or fits in the spare
  memory: small captures fill the gaps without starving a big one.
- A capture marked `alone` (a rerun after memory pressure from neighbours) starts only on an idle
  GPU, and nothing starts beside it.

Not thread-safe; holds no state: the runner calls choose() with the current lists.
"""

SLOWDOWN_SHARED = 1.3  # expected stretch of a capture's duration when others run beside it


def held_gib(job):
    return max(job.est_gib, job.seen_gib)


def expected_end(job, now, slow):
    start = job.start if job.start is not None else now
    return start + job.est_s * (1.0 if job.alone else slow)


def _reservation(head, run, budget, now, slow):
    """(time the head can start, GiB spare beside it then), from the running captures' ends."""
    if head.alone:
        return max([now] + [expected_end(r, now, slow) for r in run]), 0.0
    free = budget - sum(held_gib(r) for r in run)
    t = now
    for r in sorted(run, key=lambda r: expected_end(r, now, slow)):
        if free >= head.est_gib:
            break
        free += held_gib(r)
        t = expected_end(r, now, slow)
    return t, free - head.est_gib


def choose(now, pending, running, budget_gib, max_parallel, deadline_t, free_gib=None,
           slow=SLOWDOWN_SHARED):
    """The captures of `pending` (in priority order) to start at time `now`.

    Jobs need: est_gib, est_s, seen_gib, start (None until started), alone.
    free_gib: what the GPU reports free now (None: unknown, not checked)."""
    if any(r.alone for r in running):
        return []
    run = list(running)
    chosen = []
    reservation = None
    for job in pending:
        s = 1.0 if job.alone else slow
        if now + job.est_s * s > deadline_t:
            continue  # cannot finish: later captures may still
        if job.alone:
            fits_now = not run
        else:
            held = sum(held_gib(r) for r in run)
            gpu_ok = (free_gib is None or not run
                      or free_gib - 2.0 - sum(c.est_gib for c in chosen) >= job.est_gib)
            fits_now = len(run) < max_parallel and held + job.est_gib <= budget_gib and gpu_ok
        if reservation is None:
            if fits_now:
                chosen.append(job)
                run.append(job)
                if job.alone:
                    break
            else:
                reservation = _reservation(job, run, budget_gib, now, slow)
            continue
        if job.alone or not fits_now:
            continue
        t_head, spare = reservation
        ends_before = now + job.est_s * s <= t_head
        if ends_before or job.est_gib <= spare:
            chosen.append(job)
            run.append(job)
            if not ends_before:
                reservation = (t_head, spare - job.est_gib)
    return chosen
