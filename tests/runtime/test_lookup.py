"""Prompt-lookup decoding (``--lookup``): the drafts' rule, and the text it gives equal token for token to the text
generated without drafts — greedy and sampled with a seed, on every target, at 1 and 2 threads, through the compiled
plan and op by op, on kernels whose GEMM rows are exact (verified by the GEMM) and on F16 ones (by every matmul's
GEMV); the KV cache rolled back past rejected drafts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from model_files import SMOLLM2, model_file
from tiny_models import write_model

from kleidipy.kernels.catalogue import family_of
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.lookup import MAX_DRAFT, DraftError, check_lookup, draft
from kleidipy.runtime.sampler import SamplingParams
from kleidipy.target import parse_target, select_kv_gemm

GREEDY = SamplingParams(temperature=0.0)
#: a prompt the answer repeats: a list to copy
COPY = "Repeat this list exactly: apples, pears, plums, cherries, apples, pears, figs, dates, apples, pears, plums."


def test_draft_takes_the_longest_ngram_first_occurrence() -> None:
    assert draft([5, 6, 7, 8, 9, 6, 7], 3) == [8, 9, 6]  # "6 7" occurred at 1: what followed it
    assert draft([1, 2, 3, 9, 2, 3, 4, 1, 2, 3], 2) == [9, 2]  # "1 2 3" beats "2 3"; its first occurrence
    assert draft([1, 2, 3, 1], 10) == [2, 3, 1]  # (up to the end of the context)
    assert draft([1, 2, 3, 4], 5) == []  # the last token never occurred before
    assert draft([7, 7], 4) == [7] and draft([7], 4) == [] and draft([1, 2, 1], 0) == []


@pytest.mark.parametrize("n", [-1, MAX_DRAFT + 1, True, 2.0])
def test_bad_lookup_is_a_one_line_error(n: object) -> None:
    with pytest.raises(DraftError, match="--lookup must be"):
        check_lookup(n)


def _same_text(engine: Engine, ids: list[int], params: SamplingParams, seed: int | None, n: int = 48) -> None:
    plain = "".join(engine.generate(ids, n, params, seed=seed))
    after = engine.lm.cache.n_past
    looked = "".join(engine.generate(ids, n, params, seed=seed, lookup=8))
    assert looked == plain
    assert engine.timings.n_accepted > 0, "no draft was accepted: the test proves nothing"
    assert engine.lm.cache.n_past == after  # (rolled back past every rejected draft: what plain decoding holds)


@pytest.fixture(scope="module")
def smollm2_file() -> Path:
    return model_file(SMOLLM2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", ["sme2:svl=512", "i8mm", "dotprod"])
def test_greedy_text_is_the_plain_text(smollm2_file: Path, target: str, threads: int) -> None:
    engine = Engine(smollm2_file, target=parse_target(target), threads=threads, n_ctx=512, progress=False)
    ids = engine.chat_prompt([{"role": "user", "content": COPY}])
    _same_text(engine, ids, GREEDY, None)
    # (Q4_1 and Q8_0 kernels: the GEMM verified the drafts — but on master's SME2 table, whose KV-cache GEMM takes a
    # batch's attention: the GEMVs did, as decoded tokens)
    assert engine.backend.exact_rows == (select_kv_gemm(engine.target) is None)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_text_is_the_plain_text_for_each_seed(smollm2_file: Path, seed: int) -> None:
    """Each row is sampled with the sampler's next draw, as plain decoding samples that position: the same seed
    gives the same text, so the distribution of texts is the plain one."""
    engine = Engine(smollm2_file, n_ctx=512, progress=False)
    ids = engine.chat_prompt([{"role": "user", "content": COPY}])
    _same_text(engine, ids, SamplingParams(temperature=0.7, top_k=5), seed)


@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("weights", [T.F16, T.Q4_0])
def test_f16_weights_verify_with_the_gemv(tmp_path: Path, weights: T, graph: bool) -> None:
    """F16 kernels round a GEMM row and a GEMV differently: a draft is verified by every matmul's GEMV (as
    decoded tokens are), through the compiled plan and op by op; the int8 kernels' GEMM rows are exact."""
    engine = Engine(write_model(tmp_path / "m.gguf", "llama", weights), graph=graph, threads=2, progress=False)
    assert engine.backend.exact_rows == (weights == T.Q4_0)
    ids = [1, *[260, 258, 259, 5, 9, 40, 7] * 3]
    clock = engine.lm.compiled.start_clock() if graph else None
    rows_as_decoded = engine.lm.forward(ids, all_logits=True, as_decoded=True)
    if clock is not None:  # the plan's clock (the Inside view's) books the rows to the GEMVs that ran
        _, calls, shapes = clock.take()
        ran = {g.name for g, c in zip(clock.groups, calls.tolist(), strict=True) if c and g.role in ("gemm", "gemv")}
        assert ran == {"kai_run_" + w.linear.gemv.kernel.name for w in engine.lm.compiled.plan.weights}
        assert shapes == {(len(ids), len(ids), True): 1}
    engine.lm.reset()
    one_by_one = np.stack([engine.lm.forward([t]) for t in ids])
    assert np.array_equal(rows_as_decoded, one_by_one)
    engine.lm.reset()
    _same_text(engine, ids, GREEDY, None, n=24)


@pytest.mark.parametrize("target", ["sme2:svl=512", "sme:svl=512", "i8mm", "dotprod"])
@pytest.mark.parametrize("weights", [T.Q4_0, T.Q4_1, T.Q8_0, T.F16])
def test_exact_rows_families_give_each_gemm_row_as_the_gemv(target: str, weights: T) -> None:
    """What ``KernelPair.exact_rows`` says (one kernel, or a family that declares ``exact_rows``: every int8 one),
    on a shape with tails: each GEMM row bit for bit the GEMV of that row alone; the pairs that do not say it
    verify drafts by the GEMV instead."""
    import gguf

    from kleidipy.runtime.backend import KleidiBackend

    rng = np.random.default_rng(int(weights))
    n, k, m = 72, 512, 13
    raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), weights)
    backend = KleidiBackend(parse_target(target), notice=lambda _m: None)
    linear = backend("w", weights, (k, n), raw.view(np.uint8).reshape(n, -1))
    x = rng.standard_normal((m, k)).astype(np.float32)
    rows = np.concatenate([linear(x[i : i + 1]) for i in range(m)])
    assert backend.exact_rows == (linear.pair.exact_rows and select_kv_gemm(backend.target) is None)
    two_families = family_of(linear.pair.gemm) is not family_of(linear.pair.gemv)  # (master's F16-LHS SME2 GEMM)
    assert linear.pair.exact_rows or weights == T.F16 or two_families
    if linear.pair.exact_rows:
        assert np.array_equal(linear(x), rows)
