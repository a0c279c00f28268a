"""GGUF fuzzing: mutated tiny models (tests/gguf_mutations.py) loaded and run end to end (GGUF validation, tensor
check, tokenizer, chat template, repack, prefill, decode). Each must load and generate, or fail with a KleidipyError.

The default run is short and seeded; ``python -m pytest -m fuzz -s tests/test_fuzz_gguf.py`` runs the long one
(``KLEIDIPY_FUZZ_GGUF_CASES`` cases, 10,000 by default) and prints the count of each outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzing import Tally, cases, outcome
from gguf_mutations import BASES, make_case
from tiny_models import write_model

from kleidipy.runtime.generate import Engine

USER = [{"role": "user", "content": "hi there"}]


def load_and_generate(path: Path) -> None:
    engine = Engine(path, n_ctx=64, progress=False, notice=lambda message: None)
    for _ in engine.generate(engine.chat_prompt(USER), 2):
        pass


def fuzz(tmp_path: Path, seed: int, n: int) -> Tally:
    base = {(arch, w): write_model(tmp_path / f"{arch}-{w.name}.gguf", arch, w).read_bytes() for arch, w in BASES}
    for path in map(Path, (tmp_path / f"{arch}-{w.name}.gguf" for arch, w in BASES)):
        assert outcome(lambda p=path: load_and_generate(p)) == "ok"  # the models mutated are sound
    tally = Tally()
    case_path = tmp_path / "case.gguf"
    for case in range(n):
        what = make_case(seed, case, base, case_path)
        tally.add(outcome(lambda: load_and_generate(case_path)), f"seed {seed} case {case} ({what})")
    return tally


NUMERIC_NOISE = ("ignore::RuntimeWarning", "ignore::DeprecationWarning")  # mutated weights and template escapes


@pytest.mark.filterwarnings(*NUMERIC_NOISE)
def test_fuzz_gguf_short(tmp_path: Path) -> None:
    tally = fuzz(tmp_path, seed=0, n=cases("KLEIDIPY_FUZZ_GGUF_SHORT", 1000))
    assert not tally.failures, tally.report("GGUF fuzz")
    assert len(tally.counts) > 5  # the mutations reach many different checks


@pytest.mark.fuzz
@pytest.mark.filterwarnings(*NUMERIC_NOISE)
def test_fuzz_gguf_long(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tally = fuzz(tmp_path, seed=1, n=cases("KLEIDIPY_FUZZ_GGUF_CASES", 10_000))
    with capsys.disabled():
        print("\n" + tally.report("GGUF fuzz (long)"))
    assert not tally.failures
