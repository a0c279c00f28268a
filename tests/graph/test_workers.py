"""kleidipy.graph.atomics and kleidipy.graph.workers: the atomics, the compiled barrier and the worker threads.

Nothing here times anything: a deadlock shows as a hang catcher (a join with a generous timeout) failing.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import pytest
from numba.core.errors import TypingError

from kleidipy.errors import InvalidArgumentError
from kleidipy.graph.atomics import (
    HAS_CLOCK,
    atomic_add,
    atomic_load,
    atomic_store,
    cpu_pause,
    monotonic_ns,
    sched_yield,
)
from kleidipy.graph.workers import (
    SYNC_FIRST_FREE,
    WorkerAborted,
    Workers,
    aligned_zeros,
    barrier,
    next_run,
    pool_arrays,
    post_again,
    wait_done,
)

HANG_SECONDS = 120.0


def within(fn: Callable[[], Any], seconds: float = HANG_SECONDS) -> Any:
    """``fn()`` on another thread; fails (instead of hanging the session) when it does not return in time."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: a deadlock"
    if errors:
        raise errors[0]
    return result[0]


@pytest.fixture(params=[1, 2, 3, 4])
def workers(request: pytest.FixtureRequest) -> Workers:
    with Workers(request.param) as w:
        yield w


# --------------------------------------------------------------------------------------------- atomics


@numba.njit(nogil=True)
def _atomics_once(a):
    old = atomic_add(a, 0, 5)
    atomic_store(a, 1, old + 100)
    cpu_pause()
    sched_yield()
    return old, atomic_load(a, 1)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_atomics_read_and_write_one_element(dtype: type) -> None:
    a = np.array([10, 0, 0, 3], dtype)
    assert _atomics_once(a) == (10, 110)
    assert a.tolist() == [15, 110, 0, 3]


@numba.njit(nogil=True)
def _two_stamps():
    first = monotonic_ns()
    return first, monotonic_ns()


def test_monotonic_ns_is_pythons_monotonic_clock() -> None:
    """The plan's per-node stamps: CLOCK_MONOTONIC in ns, the clock of time.monotonic_ns(), never going back."""
    assert HAS_CLOCK  # a Linux or macOS C library has clock_gettime
    before = time.monotonic_ns()
    first, second = _two_stamps()
    after = time.monotonic_ns()
    assert before <= first <= second <= after


def test_atomics_refuse_float_arrays() -> None:
    with pytest.raises(TypingError):
        _atomics_once(np.zeros(4, np.float64))


@numba.njit(nogil=True)
def _count(ith, nth, sync, counter, n):
    for _ in range(n):
        atomic_add(counter, 0, 1)


def test_atomic_add_loses_no_increment(workers: Workers) -> None:
    counter = np.zeros(1, np.int64)
    within(lambda: workers.run(_count, (counter, 100_000)))
    assert counter[0] == workers.n_threads * 100_000


# --------------------------------------------------------------------------------------------- barrier


@numba.njit(nogil=True)
def _phases(ith, nth, sync, stamps, bad, phases):
    """Each phase: write my stamp, barrier, check everyone's stamp is this phase, barrier."""
    for phase in range(1, phases + 1):
        stamps[ith * 8] = phase  # a cache line each
        barrier(sync, nth)
        for j in range(nth):
            if stamps[j * 8] != phase:
                bad[ith] += 1
        barrier(sync, nth)


def test_barrier_lets_no_thread_through_early(workers: Workers) -> None:
    nth = workers.n_threads
    stamps = np.zeros(nth * 8, np.int64)
    bad = np.zeros(nth, np.int64)
    within(lambda: workers.run(_phases, (stamps, bad, 2000)))
    assert bad.tolist() == [0] * nth
    assert stamps[::8].tolist() == [2000] * nth


def test_barrier_returns_at_once_for_one_thread() -> None:
    sync = aligned_zeros(SYNC_FIRST_FREE)
    within(lambda: barrier(sync, 1))
    assert not sync.any()


# --------------------------------------------------------------------------------------------- runs


@numba.njit(nogil=True)
def _write(ith, nth, sync, out, scale):
    out[ith] = (ith + 1) * scale
    out[nth + ith] = nth


def test_run_returns_what_every_thread_wrote(workers: Workers) -> None:
    nth = workers.n_threads
    out = np.zeros(2 * nth, np.int64)
    within(lambda: workers.run(_write, (out, 10)))
    assert out.tolist() == [10 * (i + 1) for i in range(nth)] + [nth] * nth


def test_many_runs_in_a_row(workers: Workers) -> None:
    nth = workers.n_threads
    out = np.zeros(2 * nth, np.int64)

    def runs() -> None:
        for i in range(2000):
            workers.run(_write, (out, i))
            assert out[nth - 1] == nth * i

    within(runs)


def test_runs_after_the_workers_went_to_sleep(workers: Workers) -> None:
    out = np.zeros(2 * workers.n_threads, np.int64)
    for i in range(3):
        threading.Event().wait(0.02)  # well past the idle spin: the workers sleep
        within(lambda i=i: workers.run(_write, (out, i + 1)))
        assert out[0] == i + 1


@numba.njit(nogil=True)
def _use_free_slots(ith, nth, sync, bad, rounds):
    """The executor's slots: zero at the start of a run, kept across barriers, shared through atomics."""
    mine = SYNC_FIRST_FREE + 1 + ith
    if sync[mine] != 0:
        bad[ith] += 1
    for r in range(1, rounds + 1):
        sync[mine] = r
        atomic_add(sync, SYNC_FIRST_FREE, 1)
        barrier(sync, nth)
        if atomic_load(sync, SYNC_FIRST_FREE) != r * nth:
            bad[ith] += 1
        for j in range(nth):
            if sync[SYNC_FIRST_FREE + 1 + j] != r:
                bad[ith] += 1
        barrier(sync, nth)


def test_the_executors_sync_slots_are_its_own(workers: Workers) -> None:
    nth = workers.n_threads
    bad = np.zeros(nth, np.int64)
    for _ in range(20):  # and sync is zeroed between runs: each run checks its slot starts at 0
        within(lambda: workers.run(_use_free_slots, (bad, 50)))
    assert bad.tolist() == [0] * nth


def test_sync_is_cache_line_aligned_with_the_slots_asked_for() -> None:
    seen: list[np.ndarray] = []
    with Workers(2, sync_slots=40) as w:
        w.run(lambda ith, nth, sync: seen.append(sync))
        assert w.sync_slots == 40
    assert seen[0].shape == (40,) and seen[0].ctypes.data % 64 == 0


# --------------------------------------------------------------------------------------------- serve loops


@numba.njit(nogil=True)
def _step(ith, nth, sync, state, out, log):
    """One run: every thread writes what the run's ``state`` (changed between runs by the caller) says, counts its
    run in ``log`` and checks the others wrote theirs (a barrier between); ``state[1] == ith`` raises."""
    if state[1] == ith:
        raise ValueError("serve failed")
    out[ith] = state[0] * (ith + 1)
    log[ith] += 1
    barrier(sync, nth)
    for j in range(nth):
        if out[j] != state[0] * (j + 1):
            log[nth + ith] += 1
    return ith + 1


@numba.njit(nogil=True)
def _lead_step(nth, ctl_addr, seq, args):
    ctl, sync = pool_arrays(ctl_addr)
    if not post_again(ctl, sync, seq):
        return None
    out = _step(0, nth, sync, *args)
    wait_done(ctl, nth - 1)
    return out


@numba.njit(nogil=True)
def _serve_step(ith, nth, sync, ctl, seq, spins, *args):
    while True:
        _step(ith, nth, sync, *args)
        nxt = next_run(ctl, seq, spins)
        if nxt < 0:
            return seq
        seq = nxt


def _serve_args(nth: int) -> tuple:
    return np.array([0, -1], np.int64), np.zeros(nth, np.int64), np.zeros(2 * nth, np.int64)


@pytest.mark.parametrize("lead", [None, _lead_step])
def test_a_serve_loop_takes_run_after_run_of_the_same_args(workers: Workers, lead: object) -> None:
    nth = workers.n_threads
    args = _serve_args(nth)
    state, out, log = args

    def runs() -> None:
        for i in range(1, 2001):
            state[0] = i
            assert workers.run(_step, args, _serve_step, lead) == 1  # (thread 0's result)
            assert out.tolist() == [i * (j + 1) for j in range(nth)]

    within(runs)
    assert log.tolist() == [2000] * nth + [0] * nth


@pytest.mark.parametrize("lead", [None, _lead_step])
def test_a_serve_loop_gives_way_to_other_jobs_and_to_sleep(workers: Workers, lead: object) -> None:
    nth = workers.n_threads
    first, second = _serve_args(nth), _serve_args(nth)
    plain = np.zeros(2 * nth, np.int64)
    for i in range(1, 31):
        args = first if i % 3 else second  # other args: the loop returns to Python and takes the new job
        args[0][0] = i
        if i % 10 == 0:
            threading.Event().wait(0.02)  # well past the idle spin: the workers sleep
        if i % 10 == 0:  # again after the workers went to sleep: a lead publishes the run and hands it back
            within(lambda args=args: workers.run(_step, args, _serve_step, lead))
            args[0][0] = i
            threading.Event().wait(0.02)
        within(lambda args=args: workers.run(_step, args, _serve_step, lead))
        assert args[1].tolist() == [i * (j + 1) for j in range(nth)]
        if i % 7 == 0:  # a job without a serve loop in between
            within(lambda i=i: workers.run(_write, (plain, i)))
            assert plain[0] == i
    assert first[2].tolist() == [22] * nth + [0] * nth and second[2].tolist() == [11] * nth + [0] * nth


@pytest.mark.parametrize("lead", [None, _lead_step])
@pytest.mark.parametrize("culprit", [0, 1])
def test_an_exception_in_a_serve_loop_is_reraised_and_the_pool_goes_on(culprit: int, lead: object) -> None:
    with Workers(3) as w:
        args = _serve_args(3)
        state, out, _ = args
        within(lambda: w.run(_step, args, _serve_step, lead))
        state[:] = (5, culprit)
        with pytest.raises(ValueError, match="serve failed"):
            within(lambda: w.run(_step, args, _serve_step, lead))
        state[:] = (7, -1)
        within(lambda: w.run(_step, args, _serve_step, lead))
        assert out.tolist() == [7, 14, 21]


# --------------------------------------------------------------------------------------------- errors


@numba.njit(nogil=True)
def _raise_on(ith, nth, sync, culprit, out):
    barrier(sync, nth)
    if ith == culprit:
        raise ValueError("thread failed")
    barrier(sync, nth)  # the others wait here for the culprit, who never comes
    out[ith] = 1


@pytest.mark.parametrize("culprit", [0, 1])
def test_an_exception_is_reraised_and_the_pool_goes_on(culprit: int) -> None:
    with Workers(3) as w:
        out = np.zeros(3, np.int64)
        with pytest.raises(ValueError, match="thread failed"):
            within(lambda: w.run(_raise_on, (culprit, out)))
        within(lambda: w.run(_raise_on, (-1, out)))
        assert out.tolist() == [1, 1, 1]


def test_a_python_exception_is_reraised_as_is() -> None:
    error = KeyError("mine")

    def fail_on_last(ith: int, nth: int, sync: np.ndarray) -> None:
        if ith == nth - 1:
            raise error

    with Workers(2) as w, pytest.raises(KeyError) as caught:
        within(lambda: w.run(fail_on_last))
    assert caught.value is error


def test_worker_aborted_is_a_runtime_error() -> None:
    assert issubclass(WorkerAborted, RuntimeError)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        Workers(0)
    with pytest.raises(ValueError):
        Workers(2, sync_slots=SYNC_FIRST_FREE - 1)


# --------------------------------------------------------------------------------------------- lifetime


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kleidipy-graph-")]


def test_close_joins_the_threads() -> None:
    before = len(_pool_threads())
    w = Workers(4)
    assert w.n_threads == 4 and len(_pool_threads()) == before + 3
    within(w.close)
    within(w.close)  # idempotent
    assert len(_pool_threads()) == before
    with pytest.raises(RuntimeError, match="closed"):
        w.run(_write, (np.zeros(8, np.int64), 1))


def test_the_context_manager_and_the_finalizer_stop_the_threads() -> None:
    gc.collect()  # (a pool an earlier test left unreferenced would otherwise end during the count below)
    before = len(_pool_threads())
    with Workers(3):
        assert len(_pool_threads()) == before + 2
    assert len(_pool_threads()) == before
    w = Workers(3)
    w.run(_write, (np.zeros(6, np.int64), 1))
    del w
    gc.collect()
    assert len(_pool_threads()) == before


def test_one_thread_runs_inline() -> None:
    before = threading.active_count()
    with Workers(1) as w:
        assert threading.active_count() == before
        out = np.zeros(2, np.int64)
        w.run(_write, (out, 3))
        assert out.tolist() == [3, 1]
        with pytest.raises(ValueError):
            w.run(_raise_on, (0, out))
