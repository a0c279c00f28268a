"""The compiled plan against the op-by-op (eager) path, bit for bit: logits and KV cache, prefill (several ubatches,
all logits or the last) and decode, at 1 and 2 threads, for every architecture (tiny llama / qwen2 models for each
weight type and target, tiny qwen3 / smollm3 / phi3 / gemma2 too, and the real SmolLM2, Qwen2.5 Q4_K_M and Gemma 3 as
shipped)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from model_files import GEMMA3, QWEN25, SMOLLM2, model_file
from tiny_models import write_model

from kleidipy.errors import InvalidTokenError, NonFiniteInputError
from kleidipy.graph import contention, nodes, workers
from kleidipy.graph.contention import ThreadChoice
from kleidipy.graph.execute import compile_model
from kleidipy.graph.plan import OP_KEEP, OP_MATMUL, build_plan
from kleidipy.observer import NodeRun, Observer, RepackCall
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.kv_cache import ContextOverflowError
from kleidipy.runtime.layers import CausalLM, Segment
from kleidipy.runtime.model_file import ModelFile
from kleidipy.target import parse_target


def _build(path: Path, target: str, n_ubatch: int = 512, n_ctx: int = 64, **backend_options) -> CausalLM:
    model = ModelFile(path)
    backend = KleidiBackend(parse_target(target), notice=lambda msg: None, **backend_options)
    return model.arch.build(model, linear=backend, n_ctx=n_ctx, n_ubatch=n_ubatch)


class RepackRecorder(Observer):
    """Keeps every repack event."""

    def __init__(self) -> None:
        self.calls: list[RepackCall] = []

    def on_repack(self, call: RepackCall) -> None:
        self.calls.append(call)


def _run(lm: CausalLM, prompt: np.ndarray, steps: list[int]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """All logits of the prompt, then the last logits of each decode step; and the cache's K and V."""
    cache = lm.new_cache()
    out = [lm.forward(prompt, all_logits=True, cache=cache), lm.forward(prompt[:3], positions=[0, 1, 2], cache=cache)]
    out.append(lm.forward(prompt[3:], cache=cache))  # rewound and prefilled again: the last row only
    out += [lm.forward([t], cache=cache) for t in steps]
    return out, cache.k.copy(), cache.v.copy()  # (cells past n_past: 0 in both)


def _assert_same(lm: CausalLM, prompt: np.ndarray, steps: list[int]) -> None:
    lm.compiled = None
    want = _run(lm, prompt, steps)
    for threads in (1, 2):
        assert compile_model(lm, threads, adaptive=False)  # every run on all the threads
        got = _run(lm, prompt, steps)
        for g, w in zip(got[0], want[0], strict=True):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32), err_msg=f"threads={threads}")
        np.testing.assert_array_equal(got[1].view(np.uint16), want[1].view(np.uint16))
        np.testing.assert_array_equal(got[2].view(np.uint16), want[2].view(np.uint16))
        lm.compiled.close()
    lm.compiled = None


@pytest.mark.parametrize("target", ["sme2:svl=512", "i8mm", "dotprod"])
@pytest.mark.parametrize("weights", [T.Q4_0, T.Q8_0, T.Q4_1, T.F16])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "smollm3", "phi3", "gemma2"])
def test_tiny_models_bit_for_bit(tmp_path: Path, arch: str, weights: T, target: str) -> None:
    lm = _build(write_model(tmp_path / "m.gguf", arch, weights), target, n_ubatch=4)  # 3 ubatches for the prompt
    prompt = np.array([1, 260, 258, 259, 5, 9, 40, 7, 257, 3], np.int64)
    _assert_same(lm, prompt, [17, 200, 256])


@pytest.mark.parametrize("target", ["sme2:svl=512", "dotprod"])
@pytest.mark.parametrize("weights", [T.Q5_0, T.Q5_1, T.Q8_0])
def test_exact_weight_family_bit_for_bit(tmp_path: Path, weights: T, target: str) -> None:
    """The exact-weight family's routines (Q5_0, Q5_1, and Q8_0 with exact weights) in the plan."""
    repacks = RepackRecorder()
    path = write_model(tmp_path / "m.gguf", "qwen2", weights)
    lm = _build(path, target, n_ubatch=4, exact_weights=True, observers=[repacks])
    assert {call.pair.weight_type for call in repacks.calls} == {"qai8c16"}
    prompt = np.array([1, 260, 258, 259, 5, 9, 40, 7, 257, 3], np.int64)
    _assert_same(lm, prompt, [17, 200, 256])


@pytest.mark.parametrize("name", [SMOLLM2, QWEN25, GEMMA3])
def test_shipped_models_bit_for_bit(name: str) -> None:
    lm = _build(model_file(name), "sme2:svl=512", n_ctx=48)
    prompt = np.arange(100, 121, dtype=np.int64) * 7
    _assert_same(lm, prompt, [11, 4242, 9])


def test_plan_is_the_blocks_description(tmp_path: Path) -> None:
    """One KEEP (the last block), and a MUL_MAT per weight use (7 per block + the LM head)."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512")
    plan = build_plan(lm)
    ops = plan.nodes[:, 0]
    assert (ops == OP_KEEP).sum() == 1
    assert (ops == OP_MATMUL).sum() == 7 * len(lm.blocks) + 1


def test_a_plan_compiles_the_routines_of_its_nodes_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each op's routine compiles on its own at a plan's first run (kleidipy.graph.nodes): a llama plan over an F16
    cache takes the routines of its ops — the F16 STORE_KV and the one attention path of its head_dim — and no
    GEGLU, no F32-cache routine, no other attention path."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "i8mm")
    compiled: list[object] = []
    monkeypatch.setattr(nodes, "cfunc_address", lambda fn, signature: compiled.append(fn) or 1)
    addresses = nodes.routine_addresses(build_plan(lm), f16=True)
    attend = nodes.attention_tiled_f16 if lm.hparams.head_dim % 16 == 0 else nodes.attention_rows_f16
    assert set(compiled) == {nodes.rms_norm, nodes.add, nodes.rope, nodes.swiglu, nodes.store_kv_f16, attend}
    ops = build_plan(lm).nodes[:, 0]
    assert ((addresses == 0) == np.isin(ops, (OP_MATMUL, OP_KEEP))).all()  # (the walk runs those itself)


def test_a_master_sme2_plan_runs_attention_through_the_kv_gemm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On sme2 (llama.cpp master's table) the plan carries the table's KV-cache GEMM and attention over the F16 cache
    takes its routine (which runs ggml's path for one token); with the seeds' table, the attention path of its
    head_dim; over an F32 cache, that path whatever the table."""
    compiled: list[object] = []
    monkeypatch.setattr(nodes, "cfunc_address", lambda fn, signature: compiled.append(fn) or 1)
    gemm = "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa"
    for spec, kv_gemm in (("sme2:svl=512", gemm), ("sme2:svl=512,table=seeds", None)):
        lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), spec)
        plan = build_plan(lm)
        assert (plan.kv_gemm and plan.kv_gemm.name) == kv_gemm
        attend = nodes.attention_tiled_f16 if lm.hparams.head_dim % 16 == 0 else nodes.attention_rows_f16
        compiled.clear()
        nodes.routine_addresses(plan, f16=True)
        assert (nodes.attention_kv_gemm_f16 in compiled, attend in compiled) == (bool(kv_gemm), not kv_gemm)
        compiled.clear()
        nodes.routine_addresses(plan, f16=False)
        assert nodes.attention_kv_gemm_f16 not in compiled


@pytest.mark.parametrize("weights", [T.Q4_0, T.Q8_0])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_seeds_table_bit_for_bit(tmp_path: Path, arch: str, weights: T) -> None:
    """The seeds' table (no KV-cache GEMM, the GGUF's token rows) compiled as op by op, as master's is in
    test_tiny_models_bit_for_bit."""
    lm = _build(write_model(tmp_path / "m.gguf", arch, weights), "sme2:svl=512,table=seeds", n_ubatch=4)
    assert lm.kv_gemm is None
    prompt = np.array([1, 260, 258, 259, 5, 9, 40, 7, 257, 3], np.int64)
    _assert_same(lm, prompt, [17, 200, 256])


def _batch_token_decoded(lm: CausalLM, kv_gemm: object, threads: int | None) -> list[np.ndarray]:
    """With ``kv_gemm`` as the model's KV-cache GEMM, op by op (``threads`` None) or compiled: a batch's last logits,
    a token's alone, and the batch's rows as decoded tokens'."""
    lm.kv_gemm = kv_gemm
    if threads:
        assert compile_model(lm, threads, adaptive=False)
    prompt = np.array([1, 260, 258, 259, 5, 9, 40, 7, 257, 3], np.int64)
    out = [lm.forward(prompt, cache=lm.new_cache()), lm.forward([260], cache=lm.new_cache())]
    out.append(lm.forward(prompt, all_logits=True, cache=lm.new_cache(), as_decoded=True))
    if threads:
        lm.compiled.close()
    lm.compiled = None
    return out


def test_the_kv_gemm_takes_batches_only(tmp_path: Path) -> None:
    """The KV-cache GEMM changes a batch's logits, not a token's alone (llama.cpp: src1->ne[1] > 1), nor the rows of
    a batch computed as decoded tokens (``as_decoded``: each row as a decoded token's), op by op and compiled."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q8_0), "sme2:svl=512")
    kv_gemm = lm.kv_gemm
    for threads in (None, 2):
        got, ggml = _batch_token_decoded(lm, kv_gemm, threads), _batch_token_decoded(lm, None, threads)
        assert not np.array_equal(got[0], ggml[0])
        np.testing.assert_array_equal(got[1].view(np.uint32), ggml[1].view(np.uint32))
        np.testing.assert_array_equal(got[2].view(np.uint32), ggml[2].view(np.uint32))


def test_matmuls_of_one_input_share_its_packed_lhs(tmp_path: Path) -> None:
    """K and V take Q's packed LHS and up takes gate's (same input, same packing): no pack and no barrier of their
    own; a weight whose kernel packs another way (block 0's V from a Q8_0 model) packs again — bit for bit."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512", n_ubatch=4)
    q8 = _build(write_model(tmp_path / "q8.gguf", "llama", T.Q8_0), "sme2:svl=512")
    lm.blocks[0].attention.wv = q8.blocks[0].attention.wv
    plan = build_plan(lm)
    shared = [plan.weights[w].name for op, _, _, w, flag, *_ in plan.nodes.tolist() if op == OP_MATMUL and flag == 1]
    want = [f"blk.{i}.{name}.weight" for i in range(len(lm.blocks)) for name in ("attn_k", "attn_v", "ffn_up")]
    assert shared == [name for name in want if name != "blk.0.attn_v.weight"]
    _assert_same(lm, np.array([1, 260, 258, 259, 5, 9, 40, 7, 257, 3], np.int64), [17, 200])


def test_warm_up_readies_both_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 2 adaptive threads a decode probe may run on one thread: warm_up loads both compiled entry points (the
    workers' lead and the lone run) before the first real token, and leaves a fresh thread choice."""
    monkeypatch.setattr(contention, "free_cores", lambda: 2)  # idle cores, whatever else runs on this machine
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512")
    assert compile_model(lm, 2)
    lm.compiled.warm_up()
    assert lm.compiled._lead is not None and lm.compiled._alone is not None
    assert lm.compiled.choice.threads == 2 and lm.compiled.choice.adaptive
    lm.compiled.close()
    assert compile_model(lm, 2, adaptive=False)  # no probes: every run on the workers, nothing else loaded
    lm.compiled.warm_up()
    assert lm.compiled._lead is not None and lm.compiled._alone is None
    lm.compiled.close()


def test_nonfinite_activations_raise_and_the_plan_goes_on(tmp_path: Path) -> None:
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512")
    assert compile_model(lm, 2)
    good = lm.forward([1, 260], cache=lm.new_cache())
    lm.blocks[0].attn_norm.weight[:] = np.inf
    with pytest.raises(NonFiniteInputError):
        lm.forward([1, 260], cache=lm.new_cache())
    lm.blocks[0].attn_norm.weight[:] = 1.0
    lm.compiled.close()
    assert compile_model(lm, 1)
    assert np.isfinite(lm.forward([1, 260], cache=lm.new_cache())).all() and good.shape == (lm.hparams.n_vocab,)
    lm.compiled.close()


def test_thread_choice_follows_the_measured_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contention, "free_cores", lambda: 2)  # (a probe of both threads is skipped on busy cores)
    choice = ThreadChoice(2)
    assert choice.pick(1) == 2  # each count measured once first
    choice.record(1, 2, 0.010)
    assert choice.pick(1) == 1
    choice.record(1, 1, 0.004)  # the second core is busy: one thread is faster
    picks = [choice.pick(1) for _ in range(80)]
    # the other count re-measured every PROBE_EVERY runs times the cost ratio (2.5): probes cost ~1/16 of the time
    assert picks.count(2) == 2 and picks.index(2) == 39
    for _ in range(20):
        choice.record(1, 2, 0.002)  # the core is free again
    assert choice.pick(1) == 2
    assert ThreadChoice(2, adaptive=False).pick(1) == 2 and ThreadChoice(1).pick(1) == 1


def test_thread_choice_times_one_decode_run_in_untimed_plus_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a timed run of the chosen count is recorded, UNTIMED runs take that count untimed (a decoded token's
    Python is short); a probe is never among them and comes when it would without them."""
    monkeypatch.setattr(contention, "free_cores", lambda: 2)
    cost = {1: 0.004, 2: 0.010}  # (the second core busy: one thread is faster)
    choice = ThreadChoice(2)
    picks = []
    for _ in range(44):
        count = choice.pick(1)
        picks.append((count, choice.timing))
        if choice.timing:
            choice.record(1, count, cost[count])
    untimed = [(1, False)] * ThreadChoice.UNTIMED
    assert picks[:2] == [(2, True), (1, True)]  # each count measured once first
    assert picks[2:10] == ([(1, True)] + untimed) * 2
    # the probe: the 40th pick once both counts are measured (PROBE_EVERY × the cost ratio 2.5), timed
    assert [p for p in picks if p[0] == 2] == [(2, True)] * 2 and picks.index((2, True), 1) == 2 + 39
    assert picks[42] == (1, True)  # (a choice afresh after it)
    choice.pick(1)
    for _ in range(20):
        choice.record(1, 2, 0.001)  # the cores are free again
    assert choice.pick(1) == 2


def test_decode_probes_every_worker_only_on_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """One thread measured faster (another process on the second core): while that process wants the core, the
    probes of both threads (each waits at every barrier for it) are skipped, and taken again once it is free."""
    free = [1]
    monkeypatch.setattr(contention, "free_cores", lambda: free[0])
    choice = ThreadChoice(2)
    choice.record(1, 2, 0.010)
    choice.record(1, 1, 0.004)
    assert [choice.pick(1) for _ in range(200)] == [1] * 200
    free[0] = 2
    assert 2 in [choice.pick(1) for _ in range(40)]
    free[0] = 1  # busy from the start: every worker is first measured once the cores are free
    choice = ThreadChoice(2)
    assert choice.pick(1) == 1
    choice.record(1, 1, 0.004)
    assert [choice.pick(1) for _ in range(100)] == [1] * 100
    free[0] = 2
    assert 2 in [choice.pick(1) for _ in range(ThreadChoice.PROBE_EVERY)]


@pytest.mark.parametrize(
    ("threads", "free", "picked"), [(2, 2, 2), (2, 3, 2), (2, 1, 1), (2, 0, 1), (2, None, 2), (3, 2, 1), (3, 3, 3)]
)
def test_prefill_takes_the_free_cores(
    monkeypatch: pytest.MonkeyPatch, threads: int, free: int | None, picked: int
) -> None:
    """A prefill run takes every worker when no other process wants their cores (or that is unknown), else the caller
    alone (a run takes one or all), whatever decode measured; not adaptive, every worker."""
    monkeypatch.setattr(contention, "free_cores", lambda: free)
    choice = ThreadChoice(threads)
    choice.record(1, threads, 1.0)
    assert choice.pick(64) == picked
    assert ThreadChoice(threads, adaptive=False).pick(64) == threads


def test_a_small_batch_on_busy_cores_chooses_by_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of at most SMALL_BATCH rows (a server's step) while other processes want the cores measures every
    worker and the caller alone (per row), then takes the cheaper, probing the other every PROBE_EVERY picks times
    their cost ratio; a larger batch takes the caller alone; on free cores every worker, unmeasured."""
    monkeypatch.setattr(contention, "free_cores", lambda: 1)
    choice = ThreadChoice(2)
    assert choice.pick(ThreadChoice.SMALL_BATCH + 1) == 1
    m = ThreadChoice.SMALL_BATCH
    assert choice.pick(m) == 2
    choice.record(m, 2, 0.010 * m)
    assert choice.pick(m) == 1
    choice.record(m, 1, 0.020 * m)  # the workers are faster even with the cores wanted
    picks = [choice.pick(m) for _ in range(2 * ThreadChoice.PROBE_EVERY * 2)]
    assert picks.count(1) == 2 and picks.count(2) == len(picks) - 2  # probes of the caller alone, ratio 2 apart
    choice = ThreadChoice(2)
    for count, per_row in ((2, 0.050), (1, 0.010)):  # a busy loop on the other core: the caller alone
        assert choice.pick(m) == count
        choice.record(m, count, per_row * m)
    assert [choice.pick(m) for _ in range(ThreadChoice.PROBE_EVERY)].count(2) == 0
    monkeypatch.setattr(contention, "free_cores", lambda: 2)
    assert choice.pick(m) == 2


def test_a_task_runnable_for_a_moment_does_not_take_the_prefill_to_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run queue is looked at again when it shows the cores wanted: a transient task seen once (or LOOKS - 1
    times) leaves the prefill every worker; a process seen at every look takes it to the caller alone."""
    looks = iter([1] * (ThreadChoice.LOOKS - 1) + [2] + [1] * ThreadChoice.LOOKS)
    monkeypatch.setattr(contention, "free_cores", lambda: next(looks))
    choice = ThreadChoice(2)
    assert choice.pick(512) == 2
    assert choice.pick(512) == 1


def test_free_cores_reads_the_run_queue(tmp_path: Path) -> None:
    """Runnable tasks machine-wide (/proc/loadavg) less this process's running threads (/proc/self/task/*/stat)."""
    (tmp_path / "loadavg").write_text("0.50 0.40 0.30 4/120 999\n")
    for tid, state in ((10, "R"), (11, "S"), (12, "R")):
        (tmp_path / "self" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "self" / "task" / str(tid) / "stat").write_text(f"{tid} (py (x) t) {state} 1 2 3\n")
    cores = len(os.sched_getaffinity(0))
    assert contention.free_cores(tmp_path) == max(0, cores - 2)  # 4 running, 2 of them ours
    (tmp_path / "loadavg").write_text("garbled")
    assert contention.free_cores(tmp_path) is None
    assert contention.free_cores(tmp_path / "missing") is None


def test_float_weights_stay_eager(tmp_path: Path) -> None:
    model = ModelFile(write_model(tmp_path / "m.gguf", "llama", T.Q4_0))
    lm = model.arch.build(model, n_ctx=32)  # FloatLinear: not a KleidiAI matmul
    assert not compile_model(lm, 2) and lm.compiled is None


def test_the_plan_embeds_the_tokens_and_refuses_bad_ids(tmp_path: Path) -> None:
    """With a compiled GET_ROWS the run embeds the tokens itself; an id out of range (a caller that skipped the
    forward pass's check) is an InvalidTokenError and nothing runs, not a read out of bounds."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q8_0), "sme2:svl=512")
    assert compile_model(lm, 2, adaptive=False)
    assert lm.compiled._embd[0] >= 0
    cache = lm.new_cache()
    with pytest.raises(InvalidTokenError):
        lm.compiled(np.array([1, lm.hparams.n_vocab]), [Segment(cache, 0, 0, 2)], np.array([1]))
    assert np.isfinite(lm.forward([1, 2], cache=lm.new_cache())).all()
    lm.compiled.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_timed_prefill_of_several_ubatches_tells_the_nodes_that_ran(tmp_path: Path, threads: int) -> None:
    """An observed prompt of 3 ubatches (as `kleidipy trace` runs a long prompt): the LM head runs in the last
    ubatch only (the others keep no row) and is told once; every node told ends after it starts (a node that did
    not run was once told with a start and no end: minus an hour in the trace)."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512", n_ubatch=4)
    nodes: list[NodeRun] = []

    class Nodes(Observer):
        wants_matmuls = True

        def on_node(self, node: NodeRun) -> None:
            nodes.append(node)

    assert compile_model(lm, threads, adaptive=False)
    lm.observers.append(Nodes())
    lm.forward(np.arange(1, 11, dtype=np.int64))
    lm.compiled.close()
    head = build_plan(lm).weights[-1].name
    assert [n.rows for n in nodes if n.label == head] == [1]
    assert len([n for n in nodes if n.op == "KEEP"]) == 3
    assert all(len(n.threads) == threads and all(0 < end - start < 60 for start, _, end in n.threads) for n in nodes)


@pytest.mark.parametrize("threads", [1, 2])
def test_decoded_tokens_take_the_short_way_bit_for_bit(tmp_path: Path, threads: int) -> None:
    """A decoded token (a list of one int, or an int array of one) runs through CompiledForward.decode: the same bits
    as the op-by-op path, and its id in the cache's token record; after a cache's first decoded token the next take
    the short way (no setup), two caches decoded in turns each their own first; its logits array is reused only when
    the caller dropped it (one kept is never written again); a bad id is refused before anything runs; the plan's
    clock counts the runs."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512")
    tokens = [5, 260, 7, 9, 11]

    def decode_all() -> tuple[list[np.ndarray], np.ndarray]:
        cache = lm.new_cache()
        lm.forward([1, 2, 3], cache=cache)
        out = []
        for i, t in enumerate(tokens):
            logits = lm.forward([t] if i % 2 else np.array([t]), cache=cache)
            out.append(logits.copy())
            del logits  # (dropped: the next token may reuse the array)
        return out, cache.tokens[: cache.n_past].copy()

    def in_turns() -> list[np.ndarray]:
        caches = [lm.new_cache(), lm.new_cache()]
        return [lm.forward([t], cache=caches[i % 2]).copy() for i, t in enumerate(tokens + tokens)]

    want, want_ids = decode_all()
    want_turns = in_turns()
    assert compile_model(lm, threads, adaptive=False)
    setups = []
    setup = lm.compiled._decode_setup
    lm.compiled._decode_setup = lambda *a: (setups.append(a[1]), setup(*a))[1]
    got, got_ids = decode_all()
    assert len(setups) == 1
    for g, w in zip(got + in_turns(), want + want_turns, strict=True):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    np.testing.assert_array_equal(got_ids, want_ids)
    assert len(setups) == 1 + 2 * len(tokens)  # (in turns: every token its cache's first since the other's)
    del lm.compiled._decode_setup
    cache = lm.new_cache()
    kept = lm.forward([1], cache=cache)
    before, clock = kept.copy(), lm.compiled.run_seconds
    later = lm.forward([2], cache=cache)
    assert later is not kept and not np.shares_memory(later, kept)
    np.testing.assert_array_equal(kept, before)
    assert lm.compiled.run_seconds > clock
    assert lm.forward([3], cache=cache, all_logits=True).shape == (1, lm.hparams.n_vocab)
    for bad in ([lm.hparams.n_vocab], [-1], [True]):
        with pytest.raises(InvalidTokenError):
            lm.forward(bad, cache=cache)
    assert cache.n_past == 3 and cache.tokens[:3].tolist() == [1, 2, 3]
    lm.compiled.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_decoded_token_past_the_context_is_refused_on_the_short_way(tmp_path: Path, threads: int) -> None:
    """The short way checks the context's end itself: a token at n_past = n_ctx raises ContextOverflowError before
    anything runs, the cache keeps its positions, and a rewound cache decodes on."""
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512", n_ctx=8)
    assert compile_model(lm, threads, adaptive=False)
    cache = lm.new_cache()
    lm.forward([1, 2, 3, 4, 5, 6], cache=cache)
    lm.forward([7], cache=cache)
    lm.forward([8], cache=cache)  # (the short way from the second decoded token on)
    clock = lm.compiled.run_seconds
    with pytest.raises(ContextOverflowError, match="n_ctx=8"):
        lm.forward([9], cache=cache)
    assert cache.n_past == 8 and lm.compiled.run_seconds == clock
    cache.n_past = 7
    assert lm.forward([9], cache=cache).shape == (lm.hparams.n_vocab,)
    assert cache.n_past == 8 and cache.tokens[:8].tolist() == [1, 2, 3, 4, 5, 6, 7, 9]
    lm.compiled.close()


def test_decoded_tokens_wake_sleeping_workers_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that sleep as soon as a run ends (no idle spin) and have the time to: each decoded token's lead_plan
    sets the token's run table, publishes the run and finds the worker asleep, so Python wakes it and runs thread 0's
    share — the same bits as the op-by-op path, token after token."""
    monkeypatch.setattr(workers, "IDLE_SPIN_US", 0.0)
    lm = _build(write_model(tmp_path / "m.gguf", "llama", T.Q4_0), "sme2:svl=512")
    tokens = [5, 260, 7, 9, 11, 3]

    def decode_all() -> list[np.ndarray]:
        cache = lm.new_cache()
        lm.forward([1, 2, 3], cache=cache)
        out = []
        for t in tokens:
            threading.Event().wait(0.005)  # (the worker goes to sleep meanwhile)
            out.append(lm.forward([t], cache=cache).copy())
        return out

    want = decode_all()
    assert compile_model(lm, 2, adaptive=False)
    pool, woken = lm.compiled.workers._pool, []
    wake = pool.wake_sleepers
    pool.wake_sleepers = lambda: (woken.append(int(pool.ctl[workers._CTL_SLEEPERS])), wake())[1]
    got = decode_all()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    assert sum(1 for n in woken if n) >= len(tokens) - 2  # (the first two runs take other ways)
    lm.compiled.close()
