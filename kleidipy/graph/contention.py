"""How many threads a run of the compiled plan takes (:class:`ThreadChoice`), and how many of this process's cores
other processes want right now (:func:`free_cores`).

Hand-written because no maintained library reads the instantaneous run queue: ``os.getloadavg`` is a one-minute
average, ``psutil`` reads the same files per process.

How they are counted and used: docs/threads-and-barriers.md."""

from __future__ import annotations

import math
import os
from pathlib import Path


def _running_tasks(proc: Path) -> int | None:
    """Tasks runnable now, machine-wide: the 4th field of ``proc/loadavg`` (``running/total``; the kernel's
    ``procs_running``), or None when it cannot be read."""
    try:
        with open(proc / "loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _own_running_threads(proc: Path) -> int:
    """This process's threads in state R (running or runnable) under ``proc/self/task``."""
    count = 0
    try:
        tasks = list(os.scandir(proc / "self" / "task"))
    except OSError:
        return 1
    for task in tasks:
        try:
            with open(os.path.join(task.path, "stat"), "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        # pid (comm) state ...: comm may hold spaces and parentheses, the state follows its last ')'
        at = stat.rfind(b")") + 2
        if stat[at : at + 1] == b"R":
            count += 1
    return max(count, 1)  # the caller itself runs


def free_cores(proc: Path | str = "/proc") -> int | None:
    """The cores of this process's affinity that no other process's runnable task wants right now (at least 0), or
    None where the run queue cannot be read (not Linux)."""
    proc = Path(proc)
    running = _running_tasks(proc)
    if running is None:
        return None
    others = max(0, running - _own_running_threads(proc))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, cores - others)


class ThreadChoice:
    """How many threads a decode run (one token) takes, chosen by measurement: all the workers, or only the calling
    thread when that is faster — as when another process holds the other cores, where every barrier can wait a time
    slice for a thread that is off-CPU (ggml waits there). The choice follows the running costs, the other count
    being re-measured every PROBE_EVERY runs, or less often by the ratio of the two costs (a probe of all workers on
    a busy machine can cost 40 one-thread runs: waiting PROBE_EVERY x that ratio keeps the probes to about
    1/PROBE_EVERY of the time; the chosen count is timed one run in UNTIMED + 1), and a probe of all workers skipped
    while other processes want their cores (:func:`free_cores`, read only then: tens of µs every PROBE_EVERY or more
    runs). A prefill run (a probe would
    cost a whole batch) takes every worker when there are as many cores that no other process wants at its start
    (:func:`free_cores`; also where that cannot be read), else the calling thread alone — unless it is a run of at
    most SMALL_BATCH rows (a server's step over its decoding slots: cheap to probe, as a decode run), which then
    chooses as a decode run does, by its measured cost per row while the cores were wanted. The result is the same
    bits at either count."""

    PROBE_EVERY = 16
    #: looks at the run queue before the cores count as wanted by another process
    LOOKS = 3
    #: weight of a new measurement in the running cost
    NEW = 0.3
    #: one thread is chosen only when it costs this fraction of all the workers' cost or less (noise is not a reason)
    MARGIN = 0.8
    #: decode runs after a timed one that take the count it chose without being timed (nor choosing): a decoded
    #: token's Python runs cold after the plan, ~1 µs a line, and choosing and timing every run cost it 10-30 µs
    UNTIMED = 3
    #: rows of a run at most that chooses by its measured cost when the cores are wanted (above: the caller alone)
    SMALL_BATCH = 32

    def __init__(self, threads: int, adaptive: bool = True) -> None:
        self.threads, self.adaptive = threads, adaptive
        self._cost: dict[int, float] = {}
        self._since_probe = 0
        #: decode runs left that take ``_held`` threads untimed, and how many will once the last pick's run is
        #: recorded
        self._hold, self._held, self._pending = 0, threads, 0
        #: whether the run of the last pick is to be timed (:meth:`record`)
        self.timing = True
        #: seconds per row of small batches run while the cores were wanted, by thread count; picks of them since
        #: the last probe of the other count; whether the last pick was one of them
        self._busy_cost: dict[int, float] = {}
        self._busy_since_probe = 0
        self._busy = False

    def pick(self, m: int) -> int:
        """The thread count for a run of m tokens; :attr:`timing` says whether to :meth:`record` the run's cost."""
        if self.threads == 1 or not self.adaptive:
            return self.threads
        if m == 1 and self._hold:
            self._hold -= 1
            self.timing = False
            return self._held
        self.timing = True
        self._busy = False
        if m != 1:  # (the plan runs on every worker or on the caller alone)
            if self._cores_free():
                return self.threads
            if m > self.SMALL_BATCH:
                return 1
            self._busy = True
            return self._pick_busy()
        if self.threads not in self._cost:  # every worker is measured first, once their cores are free (looked at
            if 1 in self._cost:  # every PROBE_EVERY runs: a run on every worker then can cost ~40 on one)
                self._since_probe += 1
                if self._since_probe < self.PROBE_EVERY:
                    return 1
                self._since_probe = 0
            return self.threads if self._cores_free() else 1
        if 1 not in self._cost:
            return 1
        best, other, every = self._ranked(self._cost)
        self._since_probe += 1
        if self._since_probe < every:  # once this run is recorded, the next up to the probe (at most UNTIMED) take
            self._pending = min(self.UNTIMED, math.ceil(every - self._since_probe) - 1)  # the same count untimed
            self._held = best
            return best
        self._since_probe = 0
        if other == self.threads and not self._cores_free():
            return best  # another process holds the cores: every barrier of the probe would wait for it
        return other

    def _pick_busy(self) -> int:
        """A small batch's count while other processes want the cores: every worker and the caller alone are each
        measured once, then the cheaper per row, the other every PROBE_EVERY picks times the ratio of their costs
        (as a decode run's probes)."""
        for count in (self.threads, 1):
            if count not in self._busy_cost:
                return count
        best, other, every = self._ranked(self._busy_cost)
        self._busy_since_probe += 1
        if self._busy_since_probe < every:
            return best
        self._busy_since_probe = 0
        return other

    def _ranked(self, cost: dict[int, float]) -> tuple[int, int, float]:
        """(the count to take, the other, picks between probes of the other) by the measured costs of both counts:
        the caller alone only when it costs MARGIN of every worker's or less; the other probed every PROBE_EVERY
        picks times the ratio of their costs."""
        best, other = (1, self.threads) if cost[1] <= self.MARGIN * cost[self.threads] else (self.threads, 1)
        return best, other, self.PROBE_EVERY * max(1.0, cost[other] / cost[best])

    def _cores_free(self) -> bool:
        """Whether no other process wants the cores of every worker now (or that cannot be read). A look that finds
        them wanted is taken again, up to LOOKS times: a task runnable for a moment (a kernel worker) is no reason to
        run a whole prefill on one thread (it made one repetition in a few of `benchmarks/e2e.py` run at the
        one-thread speed), while a busy process is seen at every look."""
        for _ in range(self.LOOKS):
            free = free_cores()
            if free is None or free >= self.threads:
                return True
        return False

    def record(self, m: int, threads: int, seconds: float) -> None:
        """A run of m tokens on ``threads`` threads took ``seconds``."""
        if m != 1 and self._busy:
            self._average(self._busy_cost, threads, seconds / m)
        if m == 1:
            self._hold, self._pending = self._pending, 0
            self._since_probe += self._hold
            self._average(self._cost, threads, seconds)

    def _average(self, cost: dict[int, float], threads: int, value: float) -> None:
        """Take a new measurement into the running cost of ``threads`` (weight NEW; the first is the cost)."""
        old = cost.get(threads)
        cost[threads] = value if old is None else (1 - self.NEW) * old + self.NEW * value
