"""How many of this process's cores other processes want right now: the runnable tasks on the machine that are not
this process's own threads (Linux: the running count of ``/proc/loadavg`` less this process's threads in state R,
under ``/proc/self/task``), and the cores this process may run on (its CPU affinity).

The compiled plan asks before a prefill run (:class:`~kleidipy.graph.execute.ThreadChoice`): a run split statically
over every worker waits at each barrier for a thread that another process has pushed off its core, so with the
cores taken it is faster on fewer threads. A decode run measures both counts instead (it is cheap to probe); a
prefill run is too long to probe, and this look costs tens of µs. Hand-written because no maintained library reads the
instantaneous run queue: ``os.getloadavg`` is a one-minute average, ``psutil`` reads the same files per process.
"""

from __future__ import annotations

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
