"""A first run's compiled plan built in the background (kleidipy.runtime.plan_build): the engine answers op by op
meanwhile with the same bits, takes the plan once the build is over, writes no numba cache while another process
builds, and a foreground compile waits for a build in progress."""

import importlib
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from model_files import SMOLLM2

from kleidipy.core import jit_cache
from kleidipy.runtime import plan_build, plan_child
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class _FakeBuild:
    """A build without a child process (the plan is compiled when the engine takes it), over when ``done`` says."""

    def __init__(self, model: Path, target: str, kv_dtype: type, exact_weights: bool = False) -> None:
        self.model, self.target, self.started, self.done = model, target, False, False

    def start(self) -> None:
        self.started = True
        jit_cache.pause_saving(True)

    def finished(self) -> bool:
        if self.started and self.done:
            jit_cache.pause_saving(False)
        return self.started and self.done


def _tokens(engine: Engine, prompt: str, n: int) -> list[str]:
    return list(engine.generate(engine.prompt(prompt), max_tokens=n, params=GREEDY))


def test_first_run_answers_op_by_op_then_takes_the_plan_with_the_same_bits(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(plan_build.ENV, "1")
    ready = {"now": False}
    monkeypatch.setattr(plan_build, "ready", lambda kv_dtype: ready["now"])
    monkeypatch.setattr(plan_build, "mark_ready", lambda kv_dtype: None)
    monkeypatch.setattr(plan_build, "PlanBuild", _FakeBuild)
    notices: list[str] = []
    engine = Engine(SMOLLM2, target=None, progress=False, background_compile=True, notice=notices.append)
    build = engine.build
    assert engine.lm.compiled is None and isinstance(build, _FakeBuild) and not build.started
    assert build.target == engine.target.spec() and any("background" in n for n in notices)
    first = _tokens(engine, "The capital of France is", 8)  # op by op; the build starts after the answer
    assert engine.lm.compiled is None and build.started and not jit_cache._saving
    second = _tokens(engine, "The capital of France is", 8)  # still building: op by op
    assert engine.lm.compiled is None and engine.build is build
    ready["now"] = build.done = True
    third = _tokens(engine, "The capital of France is", 8)  # built: the compiled plan
    assert engine.lm.compiled is not None and engine.build is None and jit_cache._saving
    assert any("ready" in n for n in notices)
    assert first == second == third
    engine.lm.compiled.close()


def test_a_server_starts_the_build_at_its_second_round(monkeypatch) -> None:
    monkeypatch.setenv(plan_build.ENV, "1")
    monkeypatch.setattr(plan_build, "ready", lambda kv_dtype: False)
    monkeypatch.setattr(plan_build, "PlanBuild", _FakeBuild)
    engine = Engine(SMOLLM2, target=None, progress=False, background_compile=True, notice=lambda msg: None)
    assert not engine.poll_compiled() and not engine.build.started  # before the first round
    assert not engine.poll_compiled() and engine.build.started  # before the second
    jit_cache.pause_saving(False)


def test_a_build_that_cannot_start_is_a_notice_and_the_answers_go_on(monkeypatch, tmp_path) -> None:
    """A child the system cannot exec (as an aarch64 interpreter under qemu-user without binfmt): one notice, the
    engine keeps answering op by op, numba's cache is written again."""
    monkeypatch.setenv(plan_build.ENV, "1")
    monkeypatch.setattr(plan_build, "ready", lambda kv_dtype: False)
    not_a_program = tmp_path / "python3"
    not_a_program.write_bytes(b"\x7fELF not for this machine")
    not_a_program.chmod(0o755)
    monkeypatch.setattr(plan_build.sys, "executable", str(not_a_program))
    notices: list[str] = []
    engine = Engine(SMOLLM2, target=None, progress=False, background_compile=True, notice=notices.append)
    first = _tokens(engine, "The capital of France is", 4)
    assert engine.build is None and engine.lm.compiled is None and jit_cache._saving
    assert [n for n in notices if "cannot build in the background" in n and str(not_a_program) in n]
    assert _tokens(engine, "The capital of France is", 4) == first


def test_no_background_build_when_disabled_or_not_asked(monkeypatch) -> None:
    monkeypatch.setenv(plan_build.ENV, "0")
    assert not plan_build.enabled()
    monkeypatch.setenv(plan_build.ENV, "1")
    assert plan_build.enabled()


def test_saving_paused_writes_no_numba_cache(monkeypatch, tmp_path) -> None:
    (tmp_path / "kp_cached_mod.py").write_text(
        textwrap.dedent(
            """
            import numba

            @numba.njit(cache=True)
            def twice(x):
                return 2 * x
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("kp_cached_mod")
    cache = tmp_path / "__pycache__"
    jit_cache.pause_saving(True)
    try:
        assert module.twice(3) == 6
        assert not list(cache.glob("*.nbi"))
    finally:
        jit_cache.pause_saving(False)
    assert module.twice(3.0) == 6.0
    assert list(cache.glob("*.nbi"))
    sys.modules.pop("kp_cached_mod", None)


def test_one_builder_at_a_time_and_foreground_waits(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(plan_build, "_cache_dir", lambda: tmp_path)
    assert not plan_build.building()
    with plan_build.exclusive() as mine:
        assert mine and plan_build.building()
        with plan_build.exclusive() as second:
            assert not second
    assert not plan_build.building()
    plan_build.wait_for_build()  # nothing in progress: returns at once


def test_marker_is_keyed_by_kv_type(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(plan_build, "_cache_dir", lambda: tmp_path)
    assert not plan_build.ready(np.float16)
    plan_build.mark_ready(np.float16)
    assert plan_build.ready(np.float16) and not plan_build.ready(np.float32)


@pytest.mark.parametrize("spec", ["i8mm", "dotprod", "sme2:svl=256", "sme:svl=512"])
def test_target_spec_names_the_target_again(spec) -> None:
    from kleidipy.target import parse_target

    assert parse_target(parse_target(spec).spec()) == parse_target(spec)


def test_the_child_builds_the_plan_and_marks_it_ready(monkeypatch, tmp_path) -> None:
    marker = {}
    monkeypatch.setattr(plan_build, "mark_ready", lambda kv_dtype: marker.setdefault("kv", np.dtype(kv_dtype)))
    assert plan_child.main([str(SMOLLM2), "--target", "i8mm", "--kv", "float16"]) == 0
    assert marker == {"kv": np.dtype(np.float16)}
