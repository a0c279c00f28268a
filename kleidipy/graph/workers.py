"""Persistent worker threads and the barrier they meet at, the way ggml-cpu's threadpool runs a graph: owns
:func:`barrier` (callable from ``@njit`` code), :class:`Workers` (the threads) and the layout of the ``sync`` array
they share. Built on :mod:`kleidipy.graph.atomics`.

Hand-written because no maintained library offers a barrier usable inside numba code, and a Python-level pool
(``concurrent.futures``, ``threading.Barrier``) costs tens of µs per hand-off, which a decode step pays per node.

Details (the ``sync`` slots, idle waiting, serve and lead runs): docs/threads-and-barriers.md."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from kleidipy.core.buffers import check_threads
from kleidipy.core.pointers import i64_at
from kleidipy.graph.atomics import atomic_add, atomic_load, atomic_store, cpu_pause, monotonic_ns, sched_yield

#: threads at the current barrier.
SYNC_ARRIVED = 0
#: barriers passed since the run started (the sense a waiting thread watches).
SYNC_GENERATION = 1
#: nonzero once a thread raised: waiting threads raise WorkerAborted.
SYNC_ABORT = 2
#: the first slot the executor may use (slots below it are the barrier's).
SYNC_FIRST_FREE = 8
#: slots of the sync array a Workers gives each run, unless told otherwise.
DEFAULT_SYNC_SLOTS = 64
#: pause-spins of a waiting thread before it calls sched_yield between spins (~0.75 µs at ~23 ns a pause): past
#: that, the thread it waits for may be off-CPU (sharing a core with this one or another process), so give the core
#: away. Measured on 2 cores with another process busy: 32 → ~2 µs a barrier, 128 → ~4 µs; idle, a yield with
#: nothing else to run costs ~0.4 µs, so a long wait notices its release that much later.
BARRIER_SPINS = 32
#: what a sched_yield costs in pauses (~0.4 µs), for the idle spin's budget.
YIELD_PAUSES = 16
#: how long an idle worker spins on the job counter before it sleeps: longer than a decoded token's Python between two
#: runs (sampling included; ~60-130 µs cold, and a sampler chain over the vocabulary more), so that a decode loop finds
#: its workers awake — one asleep costs the next run a wake and the GIL (at 50 µs, the 1.1B model's host time at 2
#: threads measured ~125 µs a token, at 2000 ~95). ggml's threadpool polls far longer by default; the spin yields the
#: core between rounds after BARRIER_SPINS pauses, so another process still gets it.
IDLE_SPIN_US = 2000.0

#: longest a worker waits after seeing a job before it takes the GIL (see _Pool._loop).
GIL_DELAY_MAX_US = 20.0
#: shortest such wait, in spin rounds (~0.7 µs).
GIL_DELAY_MIN = 32
#: a worker that gets the GIL later than its delay + this many spin rounds (~4 µs) took the slow path.
GIL_LATE_ROUNDS = 200

# the control array of a Workers (its own cache lines, apart from sync): the job counter, whether the job is the
# previous one again (a serve loop takes it without going back to Python), the number of workers asleep or going to
# sleep (counted before they read the job counter a last time: a job published before a look at it reaches them),
# the address and the size of sync (set once: a lead gets both arrays from ctl's address, see pool_arrays), and the
# number of workers that finished the current job.
_CTL_JOB = 0
_CTL_AGAIN = 1
_CTL_SLEEPERS = 2
_CTL_SYNC = 3
_CTL_SYNC_SLOTS = 4
_CTL_DONE = 8
_CTL_SLOTS = 16


class WorkerAborted(RuntimeError):
    """Raised by :func:`barrier` in the threads still waiting when another thread of the run raised."""


def aligned_zeros(n: int, align: int = 64) -> np.ndarray:
    """A zeroed int64 array of ``n`` slots starting on an ``align``-byte boundary (a cache line)."""
    raw = np.zeros(n + align // 8, np.int64)
    skip = (-raw.ctypes.data % align) // 8
    return raw[skip : skip + n]


@numba.njit(nogil=True, cache=True, inline="always")
def share(total: int, ith: int, nth: int) -> tuple[int, int]:
    """[lo, hi) of ``total`` items (rows, heads, mr-row groups) for thread ith of nth: contiguous, as even as
    possible."""
    return ith * total // nth, (ith + 1) * total // nth


@numba.njit(nogil=True, cache=True)
def _spin_wait(spins: int) -> int:
    """One step of a waiting loop: a pause while ``spins`` < BARRIER_SPINS, then a sched_yield and a pause;
    returns ``spins`` plus the step's cost in pauses (YIELD_PAUSES for a sched_yield)."""
    cpu_pause()
    if spins < BARRIER_SPINS:
        return spins + 1
    sched_yield()
    return spins + YIELD_PAUSES


@numba.njit(nogil=True, cache=True)
def barrier(sync: np.ndarray, nth: int) -> None:
    """Wait until all ``nth`` threads of the run have called it (their writes before it are then visible to all).

    Counter + generation: the last thread to arrive resets ``SYNC_ARRIVED`` and bumps ``SYNC_GENERATION``; the
    others wait for the bump, spinning with a pause hint, after BARRIER_SPINS pauses calling sched_yield between
    pauses (so that a thread waiting for one that is off-CPU gives its time slice away). Returns at once when
    ``nth == 1``; raises WorkerAborted when a thread of the run raised.
    """
    if nth <= 1:
        return
    generation = atomic_load(sync, SYNC_GENERATION)
    if atomic_add(sync, SYNC_ARRIVED, 1) == nth - 1:
        atomic_store(sync, SYNC_ARRIVED, 0)
        atomic_add(sync, SYNC_GENERATION, 1)
        return
    spins = 0
    while atomic_load(sync, SYNC_GENERATION) == generation:
        if atomic_load(sync, SYNC_ABORT) != 0:
            raise WorkerAborted("another thread of this run raised")
        spins = _spin_wait(spins)


@numba.njit(nogil=True, cache=True)
def _wait_job(ctl: np.ndarray, last: int, spin_ns: int, delay: int) -> int:
    """Spin (then yield, as barriers do) for ``spin_ns`` ns of wall time while the job counter is ``last``; returns
    the counter as last seen, ``delay`` pauses after seeing it change (see _Pool._loop). Bounded by the clock, not
    by a count of rounds: with another process on the core each sched_yield can last a time slice."""
    n = 0
    end = monotonic_ns() + spin_ns
    while True:
        seq = atomic_load(ctl, _CTL_JOB)
        if seq != last:
            for _ in range(delay):
                cpu_pause()
            return seq
        n = _spin_wait(n)
        if n >= BARRIER_SPINS and monotonic_ns() >= end:  # (the clock is read in the yielding rounds only)
            return atomic_load(ctl, _CTL_JOB)


@numba.njit(nogil=True, cache=True)
def _pauses(count: int) -> None:
    """``count`` pause hints (the unit of the GIL delay, timed by _spin_seconds)."""
    for _ in range(count):
        cpu_pause()


@numba.njit(nogil=True, cache=True)
def _finish_and_wait(ctl: np.ndarray, last: int, spin_ns: int, delay: int) -> int:
    """A worker's end of job ``last`` (counted once the GIL is released) and its spin for the next one."""
    atomic_add(ctl, _CTL_DONE, 1)
    return _wait_job(ctl, last, spin_ns, delay)


@numba.njit(cache=True)
def _post(ctl: np.ndarray, sync: np.ndarray, seq: int, again: int) -> None:
    """Publish job ``seq`` (``again``: 1 when it is the previous job again): clear sync and the done count, then
    the job counter (a seq_cst store). Keeps the GIL, so that a worker seeing the job cannot take it from Python
    before thread 0 reaches ``fn``."""
    sync[:] = 0
    atomic_store(ctl, _CTL_DONE, 0)
    atomic_store(ctl, _CTL_AGAIN, again)
    atomic_store(ctl, _CTL_JOB, seq)


@numba.njit(nogil=True, cache=True, inline="always")
def pool_arrays(ctl_addr: int) -> tuple[np.ndarray, np.ndarray]:
    """The control and the sync array of a Workers from the control array's address (what a ``lead`` is given: an
    int argument costs nothing to unbox, an array ~4 µs when the call runs cold, after a plan streamed the weights
    through the caches)."""
    ctl = i64_at(ctl_addr, _CTL_SLOTS)
    return ctl, i64_at(ctl[_CTL_SYNC], ctl[_CTL_SYNC_SLOTS])


@numba.njit(nogil=True, cache=True)
def post_again(ctl: np.ndarray, sync: np.ndarray, seq: int) -> bool:
    """A ``lead``'s start (see :meth:`Workers.run`): publish job ``seq`` as the previous job again (what
    :func:`_post` does, without the GIL). False when a worker is asleep or going to sleep: the job is published but
    the lead must return at once, so that Python wakes that worker and runs thread 0's share itself."""
    _post(ctl, sync, seq, 1)
    return atomic_load(ctl, _CTL_SLEEPERS) == 0


@numba.njit(nogil=True, cache=True)
def _sleeping(ctl: np.ndarray, change: int) -> int:
    """Count a worker in (+1) or out (-1) of the sleepers; returns the job counter as read after that."""
    atomic_add(ctl, _CTL_SLEEPERS, change)
    return atomic_load(ctl, _CTL_JOB)


@numba.njit(nogil=True, cache=True)
def next_run(ctl: np.ndarray, seq: int, spin_ns: int) -> int:
    """A serve loop's end of run ``seq`` and its wait for the next (see :meth:`Workers.run`): the next run's job
    number when it is the same job again, else -1 (none came within ``spin_ns`` ns, or a new job did: the worker goes
    back to Python, to sleep or to take it)."""
    atomic_add(ctl, _CTL_DONE, 1)
    nxt = _wait_job(ctl, seq, spin_ns, 0)
    if nxt == seq or atomic_load(ctl, _CTL_AGAIN) == 0:
        return -1
    return nxt


@numba.njit(nogil=True, cache=True)
def wait_done(ctl: np.ndarray, workers: int) -> None:
    """Wait until ``workers`` workers have finished the current job."""
    spins = 0
    while atomic_load(ctl, _CTL_DONE) < workers:
        spins = _spin_wait(spins)


_SPIN_SECONDS: list[float] = []


def _spin_seconds() -> float:
    """How long one pause takes on this host (measured once)."""
    if not _SPIN_SECONDS:
        _pauses(1)
        rounds = BARRIER_SPINS // 2
        start = time.perf_counter()
        _pauses(rounds)
        _SPIN_SECONDS.append(max((time.perf_counter() - start) / rounds, 1e-9))
    return _SPIN_SECONDS[0]


class _Pool:
    """The state the worker threads share with :class:`Workers` (kept apart so the threads hold no reference to
    the Workers and its finalizer can run)."""

    def __init__(self, n_threads: int, sync_slots: int) -> None:
        self.nth = n_threads
        self.sync = aligned_zeros(sync_slots)
        self.ctl = aligned_zeros(_CTL_SLOTS)
        self.ctl[_CTL_SYNC], self.ctl[_CTL_SYNC_SLOTS] = self.sync.ctypes.data, self.sync.size
        self.ctl_addr = self.ctl.ctypes.data
        self.spin_s = _spin_seconds()
        self.spin_ns = int(IDLE_SPIN_US * 1e3)
        self.max_delay = max(1, int(GIL_DELAY_MAX_US * 1e-6 / self.spin_s))
        self.seq = 0
        self.posted_at = 0.0
        self.job: tuple[Callable[..., Any], tuple, Callable[..., Any] | None] | None = None
        self.errors: list[BaseException] = []
        self.stopping = False
        self.wake = threading.Condition(threading.Lock())
        self.run_lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._loop, args=(ith,), name=f"kleidipy-graph-{ith}", daemon=True)
            for ith in range(1, n_threads)
        ]
        for t in self.threads:
            t.start()

    def _sleep(self, last: int) -> int:
        with self.wake:
            seq = _sleeping(self.ctl, 1)
            while seq == last:
                self.wake.wait()
                seq = int(self.ctl[_CTL_JOB])
            return _sleeping(self.ctl, -1)

    def _loop(self, ith: int) -> None:
        """A worker thread. Taking the GIL while another thread holds it costs a futex sleep and wake (~10 µs):
        after seeing a job, the worker spins ``delay`` pauses so that thread 0 is past its own call of ``fn``
        (which releases the GIL) first. ``delay`` adapts: doubled when the GIL came late, shrunk when on time."""
        last, delay = 0, 2 * GIL_DELAY_MIN
        seq = _wait_job(self.ctl, last, self.spin_ns, delay)
        while True:
            if seq == last:
                seq = self._sleep(last)
            elif time.perf_counter() - self.posted_at > (delay + GIL_LATE_ROUNDS) * self.spin_s:
                delay = min(2 * delay, self.max_delay)
            else:
                delay = max(GIL_DELAY_MIN, delay - (delay >> 4))
            if self.stopping:
                return
            fn, args, serve = self.job  # type: ignore[misc]
            try:
                if serve is not None:  # runs job seq and the same job again until none comes or another does
                    last = serve(ith, self.nth, self.sync, self.ctl, seq, self.spin_ns, *args)
                    seq = int(self.ctl[_CTL_JOB])
                    continue
                fn(ith, self.nth, self.sync, *args)
            except BaseException as exc:  # re-raised by run() on thread 0
                self.fail(exc)
                seq = int(self.ctl[_CTL_JOB])  # (thread 0 waits for this job's end before it posts another)
            last = seq
            seq = _finish_and_wait(self.ctl, last, self.spin_ns, delay)

    def fail(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.sync[SYNC_ABORT] = 1

    def post(self, job: tuple[Callable[..., Any], tuple, Callable[..., Any] | None] | None) -> None:
        """Hand ``job`` to the workers (None: stop them) and wake the sleeping ones."""
        old, self.job = self.job, job
        again = job is not None and old is not None and job[2] is not None and job[2] is old[2] and job[1] is old[1]
        self.errors.clear()
        self.stopping = job is None
        self.seq += 1
        self.posted_at = time.perf_counter()
        _post(self.ctl, self.sync, self.seq, int(again))
        self.wake_sleepers()

    def wake_sleepers(self) -> None:
        """Wake the workers asleep (a worker counts itself in under the lock, then re-reads the job counter)."""
        if self.ctl[_CTL_SLEEPERS]:
            with self.wake:
                self.wake.notify_all()

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple,
        serve: Callable[..., Any] | None,
        lead: Callable[..., Any] | None,
        lead_args: tuple,
    ) -> Any:
        with self.run_lock:
            if self.stopping:
                raise RuntimeError("these Workers are closed")
            out, job, led = None, self.job, False
            try:
                if lead is not None and job is not None and job[2] is serve is not None and job[1] is args:
                    self.seq += 1
                    self.posted_at = time.perf_counter()
                    out = lead(self.nth, self.ctl_addr, self.seq, args, *lead_args)
                    led = out is not None
                    if not led:  # a worker sleeps: the run is published, thread 0's share still to run
                        self.wake_sleepers()
                        out = fn(0, self.nth, self.sync, *args)
                else:
                    self.post((fn, args, serve))
                    out = fn(0, self.nth, self.sync, *args)
            except BaseException as exc:
                self.fail(exc)
            if not led:
                wait_done(self.ctl, self.nth - 1)
            if self.errors:
                errors = [e for e in self.errors if not isinstance(e, WorkerAborted)] or self.errors
                self.errors.clear()
                raise errors[0]
            return out

    def close(self, timeout: float | None = None) -> None:
        with self.run_lock:
            if not self.stopping:
                self.post(None)
        for t in self.threads:
            t.join(timeout)


class Workers:
    """``n_threads`` threads that run compiled functions together: the caller is thread 0, threads 1..n-1 are
    started here and wait between runs (spinning ~IDLE_SPIN_US, then asleep).

    ``run(fn, args)`` calls ``fn(ith, nth, sync, *args)`` on every thread, ``fn`` a numba function compiled with
    ``nogil=True`` (a Python ``fn`` works too, the threads then taking turns on the GIL). ``n_threads == 1`` runs
    ``fn`` inline, without threads.
    """

    def __init__(self, n_threads: int, sync_slots: int = DEFAULT_SYNC_SLOTS) -> None:
        self._n = check_threads(n_threads)
        if sync_slots < SYNC_FIRST_FREE:
            raise ValueError(f"sync needs at least {SYNC_FIRST_FREE} slots (the barrier's), got {sync_slots}")
        self._sync_slots = int(sync_slots)
        self._pool: _Pool | None = None
        self._inline_sync: np.ndarray | None = None
        if self._n == 1:
            self._inline_sync = aligned_zeros(self._sync_slots)
        else:
            self._pool = _Pool(self._n, self._sync_slots)
            self._finalizer = weakref.finalize(self, self._pool.close, 1.0)
        self._closed = False

    @property
    def n_threads(self) -> int:
        return self._n

    @property
    def sync_slots(self) -> int:
        return self._sync_slots

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple = (),
        serve: Callable[..., Any] | None = None,
        lead: Callable[..., Any] | None = None,
        lead_args: tuple = (),
    ) -> Any:
        """Run ``fn(ith, nth, sync, *args)`` on every thread; returns what thread 0's call returned when all
        returned, re-raising the exception a thread raised (the first one that is not the others' WorkerAborted).
        ``sync`` is all zeros at the start of each run (see docs/threads-and-barriers.md for its slots).

        ``serve``: a compiled (nogil) loop ``serve(ith, nth, sync, ctl, seq, spin_ns, *args) -> int`` that
        threads 1..nth-1 call instead of ``fn``: it runs ``fn``'s work for job ``seq``, then ``seq = next_run(ctl,
        seq, spin_ns)`` until that is -1, and returns the last job it ran. A run whose ``serve`` and ``args`` are
        the objects of the previous run (``is``) is then taken inside the loop, without the GIL: what changes from run
        to run must live in the arrays ``args`` holds.

        ``lead``: with ``serve``, a compiled (nogil) function ``lead(nth, ctl_addr, seq, args, *lead_args)`` (``args``
        the tuple) that thread 0 calls for such a run instead of ``fn``: it starts with ``ctl, sync =
        pool_arrays(ctl_addr)`` and ``if not post_again(ctl, sync, seq): return None``, then returns ``fn(0, nth,
        sync, *args)`` after ``wait_done(ctl, nth - 1)``. ``fn``'s result must not be None.
        """
        if self._closed:
            raise RuntimeError("these Workers are closed")
        if self._pool is not None:
            return self._pool.run(fn, args, serve, lead, lead_args)
        sync = self._inline_sync
        sync[:] = 0
        return fn(0, 1, sync, *args)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop and join the threads (waits for a run in progress). Idempotent."""
        self._closed = True
        if self._pool is not None:
            self._finalizer.detach()
            self._pool.close(timeout)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Workers(n_threads={self._n}, sync_slots={self._sync_slots})"
