"""The compiled plan's first build on a machine, in a background process: a first run answers op by op (the
reference execution, whose kernels compile in seconds), then a child process compiles the plan (minutes) into
numba's cache and marks it ready; a later load, or this process once the child is done, loads it from there.

The marker is keyed as numba's cache is (every kleidipy source file, this CPU's code generation, the KV cache's
type); an exclusive lock beside it lets one process build at a time, and a process that must compile in the
foreground waits for a build in progress instead of compiling the same functions beside it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from kleidipy.core import jit_cache

#: KLEIDIPY_BACKGROUND_COMPILE=0 compiles a first run's plan in the foreground, as every run did before
ENV = "KLEIDIPY_BACKGROUND_COMPILE"


def enabled() -> bool:
    """Whether a first run may build the plan in the background (``$KLEIDIPY_BACKGROUND_COMPILE`` is not 0)."""
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


def _cache_dir() -> Path:
    from kleidipy.graph.walk import run_plan

    return Path(run_plan._cache._cache_path)


def _marker(kv_dtype: type) -> Path:
    from kleidipy.graph.walk import run_plan

    machine = repr(run_plan.targetctx.codegen().magic_tuple()).encode()
    key = hashlib.sha256(jit_cache.package_stamp().encode() + machine).hexdigest()[:24]
    return _cache_dir() / f"kleidipy-plan-{key}-{np.dtype(kv_dtype).name}.ready"


def _lock_path() -> Path:
    return _cache_dir() / "kleidipy-plan-build.lock"


def ready(kv_dtype: type) -> bool:
    """Whether the plan for a KV cache of ``kv_dtype`` is in numba's cache for these sources and this CPU."""
    return _marker(kv_dtype).is_file()


def mark_ready(kv_dtype: type) -> None:
    """Record that the plan's code is in numba's cache (after a run compiled and saved it)."""
    path = _marker(kv_dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def building() -> bool:
    """Whether some process holds the build lock now."""
    try:
        with _lock_path().open("a") as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


@contextmanager
def exclusive() -> Iterator[bool]:
    """The build lock if no other process holds it (True), else nothing (False)."""
    path = _lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def wait_for_build() -> None:
    """Return once no other process builds the plan (it saves what this process would compile again)."""
    try:
        with _lock_path().open("a") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
    except OSError:
        return


class PlanBuild:
    """A child process building the plan of ``model`` (a GGUF path) for ``target`` into numba's cache, once
    :meth:`start` is called (after this process's first answer: the two would share the CPU); this process writes
    nothing to numba's cache from then on until the build is over (:func:`~kleidipy.core.jit_cache.pause_saving`)."""

    def __init__(self, model: Path, target: str, kv_dtype: type, exact_weights: bool = False) -> None:
        kv = np.dtype(kv_dtype).name
        self.command = [sys.executable, "-m", "kleidipy.runtime.plan_child", str(model), "--target", target, "--kv", kv]
        self.command += ["--exact-weights"] if exact_weights else []
        self.process: subprocess.Popen | None = None

    @property
    def started(self) -> bool:
        return self.process is not None

    def start(self) -> str | None:
        """Start the child (its output goes to a log beside numba's cache); it outlives this process if need be.
        Returns why it could not start (an OSError's message: e.g. an interpreter this system cannot exec), else
        None."""
        if self.process is not None:
            return None
        log = _cache_dir() / "kleidipy-plan-build.log"
        jit_cache.pause_saving(True)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("w") as out:
                self.process = subprocess.Popen(
                    self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
        except OSError as exc:
            jit_cache.pause_saving(False)
            return f"{exc.strerror or exc}: {exc.filename or self.command[0]}"
        return None

    def finished(self) -> bool:
        """Whether the build is over (this child's and any other process's): numba's cache may be written again."""
        if self.process is None or self.process.poll() is None or building():
            return False
        jit_cache.pause_saving(False)
        return True
