"""Shared transformer layers (RMSNorm, RoPE, attention, the gated feed-forward), the op-by-op execution of a block's
description (:class:`EagerOps`) and the decoder-only driver :class:`CausalLM`, with llama.cpp's CPU numerics (flash
attention off). A block describes itself once (``forward(ops, x, keep)``): the compiled plan records it as nodes, and
EagerOps runs it op by op from Python with the same :mod:`kleidipy.ops` functions, so both give the same bits.

The numerics of each op: docs/eager-layers.md."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from kleidipy.errors import InvalidTokenError
from kleidipy.ops import attention as ops_attention
from kleidipy.ops import elementwise
from kleidipy.ops.elementwise import c_libm_f32, gelu_f16_table, libm_f32
from kleidipy.runtime.architecture import Architecture, TensorTable, ValidatedFile, context_size, read_tensors
from kleidipy.runtime.gguf_file import UnsupportedArchitectureError
from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.kv_cache import KVCache, PositionError, check_cache_dtype
from kleidipy.runtime.weights import (
    GEMV_ROWS,
    Embedding,
    EmbeddingFactory,
    FloatLinear,
    Linear,
    LinearFactory,
    RowEmbedding,
)

if TYPE_CHECKING:
    from kleidipy.core.node import NodeKernel
    from kleidipy.graph.model import Ops

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------------------------
# elementwise ops


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm of the rows of x [m, n] times weight [n] (ggml_rms_norm + ggml_mul)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    elementwise.rms_norm(x, np.asarray(weight, np.float32), eps, out, 0, x.shape[0])
    return out


class RMSNorm:
    def __init__(self, weight: np.ndarray, eps: float) -> None:
        self.weight = np.asarray(weight, dtype=np.float32)
        self.eps = eps

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return rms_norm(x, self.weight, self.eps)


# ---------------------------------------------------------------------------------------------------------------
# RoPE


class RoPE:
    """Rotary position embedding with cos/sin tables precomputed for positions 0..n_ctx-1 by the C library's
    ``cosf``/``sinf``, as ggml's rope cache; ``attn_factor`` multiplies both tables in f32 (ggml's rope ``mscale``
    without YaRN ramp: ``cosf(theta) * mscale``)."""

    def __init__(
        self,
        n_rot: int,
        rope_type: RopeType,
        freq_base: float,
        freq_scale: float,
        n_ctx: int,
        freq_factors: np.ndarray | None = None,
        attn_factor: float = 1.0,
    ) -> None:
        self.n_rot = n_rot
        self.neox = rope_type == RopeType.NEOX
        theta_scale = libm_f32(np.power, np.float32(freq_base), np.float32(-2.0) / np.float32(n_rot))
        ff = np.ones(n_rot // 2, np.float32) if freq_factors is None else np.asarray(freq_factors, np.float32)
        theta = np.arange(n_ctx, dtype=np.float32)
        angles = np.empty((n_ctx, n_rot // 2), np.float32)
        for i in range(n_rot // 2):
            angles[:, i] = np.float32(freq_scale) * (theta / ff[i])
            theta = theta * theta_scale
        self.cos = c_libm_f32("cosf", angles) * np.float32(attn_factor)
        self.sin = c_libm_f32("sinf", angles) * np.float32(attn_factor)

    def __call__(self, x: np.ndarray, start: int) -> None:
        """Rotate x [m, n_heads, head_dim] (C-contiguous float32) in place for positions start..start+m-1."""
        elementwise.rope(x, self.cos, self.sin, start, self.neox, 0, x.shape[1])


# ---------------------------------------------------------------------------------------------------------------
# attention


def attention(
    q: np.ndarray, kv: KVCache, layer: int, start: int, scale: np.float32, window: int | None = None, cap: float = 0.0
) -> np.ndarray:
    """Causal attention of q [m, n_head, d] (positions start..start+m-1) over the cells 0..start+m-1 of layer
    ``layer`` of the cache ``kv`` (float16, which also rounds Q and the softmax weights to F16, or float32), over
    the last ``window`` positions of each query when given, scores soft-capped at ``cap`` when > 0; returns
    [m, n_head, d]
    (:func:`kleidipy.ops.attention.attention`)."""
    m, n_head, d = q.shape
    n_kv = start + m
    keys, values = kv.layer(layer)
    out = np.empty((m, n_head * d), np.float32)
    scratch = np.empty(ops_attention.attention_scratch_size(n_kv, d), np.float32)
    q = np.ascontiguousarray(q, np.float32)
    attend = ops_attention.attention_for(d)  # (its path alone: a first run compiles only that)
    attend(q, keys, values, start, m, n_kv, scale, window or 0, kv.f16, out, scratch, 0, n_head, 0, 1, np.float32(cap))
    return out.reshape(m, n_head, d)


@dataclass(frozen=True)
class Segment:
    """Rows lo..hi-1 of a ubatch: tokens of one sequence at positions start.., whose KV cache is ``cache`` (a
    ubatch of one sequence is one segment; a batch of several sequences has one or more each)."""

    cache: KVCache
    start: int
    lo: int
    hi: int


class SelfAttention:
    """GQA self-attention with RoPE (none when ``rope`` is None) and optional q/k/v/output biases, over one layer of
    a KV cache; optionally per-head RMSNorm of Q and K, a Q pre-scale replacing the softmax scale, a sliding
    window, and a soft-cap of the scores (``cap``)."""

    def __init__(
        self,
        layer: int,
        wq: Linear,
        wk: Linear,
        wv: Linear,
        wo: Linear,
        rope: RoPE | None,
        n_head: int,
        n_head_kv: int,
        head_dim: int,
        bq: np.ndarray | None = None,
        bk: np.ndarray | None = None,
        bv: np.ndarray | None = None,
        bo: np.ndarray | None = None,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        q_scale: float | None = None,
        window: int | None = None,
        cap: float | None = None,
    ) -> None:
        self.layer, self.cap = layer, float(np.float32(cap or 0.0))
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.bq, self.bk, self.bv, self.bo = bq, bk, bv, bo
        self.q_norm, self.k_norm, self.window = q_norm, k_norm, window
        self.rope = rope
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.q_scale = None if q_scale is None else np.float32(q_scale)
        self.scale = np.float32(1.0) / np.sqrt(np.float32(head_dim)) if q_scale is None else np.float32(1.0)

    @classmethod
    def from_tensors(
        cls, layer: int, t: dict[str, Any], rope: RoPE | None, hp: HyperParameters, **options: Any
    ) -> SelfAttention:
        """Block ``layer``'s attention from its tensors by field (``wq``, ``wk``, ``wv``, ``wo``, and the biases
        ``bq``, ``bk``, ``bv``, ``bo`` where the table has them) and the model's head counts; ``options``: the
        keyword arguments of the norms, Q scale and window."""
        heads = hp.n_head, hp.n_head_kv, hp.head_dim
        biases = {f: t.get(f) for f in ("bq", "bk", "bv", "bo")}
        return cls(layer, t["wq"], t["wk"], t["wv"], t["wo"], rope, *heads, **biases, **options)

    def forward(self, ops: Ops[T], x: T) -> T:
        """Projections (+ biases, per-head norms), RoPE, Q pre-scale, KV-cache write, attention, output projection.
        (RoPE, the cache write and attention go per segment of the ubatch, each over its own sequence's cache.)"""
        hd = self.head_dim
        q = ops.matmul(self.wq, x, "q", self.bq)
        k = ops.matmul(self.wk, x, "k", self.bk)
        v = ops.matmul(self.wv, x, "v", self.bv)
        if self.q_norm is not None:
            q = ops.rms_norm(q, self.q_norm, "q", head_dim=hd)
        if self.k_norm is not None:
            k = ops.rms_norm(k, self.k_norm, "k", head_dim=hd)
        if self.rope is not None:  # (None: a layer without position encoding, SmolLM3's NoPE layers)
            q = ops.rope(q, self.n_head, self.rope)
            k = ops.rope(k, self.n_head_kv, self.rope)
        if self.q_scale is not None:
            q = ops.scale(q, self.q_scale)
        ops.store_kv(self.layer, k, v)
        out = ops.attention(self.layer, q, self.n_head, self.scale, self.window, "kqv", self.cap)
        return ops.matmul(self.wo, out, "attn_out", self.bo)


class GatedFFN:
    """Gated feed-forward: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or GELU (GeGLU)."""

    def __init__(self, gate: Linear, up: Linear, down: Linear, gelu: bool = False) -> None:
        self.gate, self.up, self.down, self.gelu = gate, up, down, gelu

    def forward(self, ops: Ops[T], x: T) -> T:
        gate = ops.matmul(self.gate, x, "ffn_gate")
        up = ops.matmul(self.up, x, "ffn_up")
        return ops.matmul(self.down, ops.glu(self.gelu, gate, up, "ffn_act"), "ffn_out")


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu(gate) * up with ggml-cpu's F16-table GELU (docs/eager-layers.md)."""
    gate = np.ascontiguousarray(gate, np.float32)
    out = np.empty_like(gate)
    rows = out.reshape(-1, gate.shape[-1])
    elementwise.geglu(
        gate.reshape(rows.shape),
        np.ascontiguousarray(up, np.float32).reshape(rows.shape),
        gelu_f16_table(),
        rows,
        0,
        rows.shape[0],
    )
    return out


class EagerOps:
    """The op-by-op execution of a block's description (:class:`~kleidipy.graph.model.Ops` over arrays): each op
    runs at once, on the ubatch's rows, with the same op functions the compiled plan calls. ``rows``: the rows the
    last block keeps (llama.cpp's out_ids); ``kv_gemm``: the KV-cache GEMM that takes attention's KQV (a batch of
    more than one token on a target whose table has one), or None."""

    def __init__(
        self, ubatch: Sequence[Segment], rows: np.ndarray | slice | None = None, kv_gemm: NodeKernel | None = None
    ) -> None:
        self.ubatch, self.rows, self.kv_gemm = ubatch, rows, kv_gemm

    def _heads(self, x: np.ndarray, n_heads: int) -> Iterator[tuple[Segment, np.ndarray]]:
        """Per segment: its rows of x as [rows, n_heads, head_dim] (views: writes land in x)."""
        heads = x.reshape(x.shape[0], n_heads, -1)
        for seg in self.ubatch:
            yield seg, heads[seg.lo : seg.hi]

    def rms_norm(self, src: np.ndarray, norm: RMSNorm, name: str, head_dim: int = 0) -> np.ndarray:
        return norm(src.reshape(-1, head_dim)).reshape(src.shape) if head_dim else norm(src)

    def matmul(self, linear: Linear, src: np.ndarray, name: str, bias: np.ndarray | None = None) -> np.ndarray:
        y = linear(src)
        if bias is not None:
            y += bias
        return y

    def add(self, a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
        return a + b

    def scale(self, buf: np.ndarray, factor: float) -> np.ndarray:
        buf *= factor
        return buf

    def rope(self, buf: np.ndarray, n_heads: int, rope: RoPE) -> np.ndarray:
        for seg, heads in self._heads(buf, n_heads):
            rope(heads, seg.start)
        return buf

    def store_kv(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        n_head_kv = self.ubatch[0].cache.k.shape[1]  # (every cache of a model has its shape)
        for (seg, keys), (_, values) in zip(self._heads(k, n_head_kv), self._heads(v, n_head_kv), strict=True):
            seg.cache.store(layer, seg.start, keys, values)

    def attention(
        self, layer: int, q: np.ndarray, n_head: int, scale: float, window: int | None, name: str, cap: float = 0.0
    ) -> np.ndarray:
        out = np.empty_like(q)
        heads = out.reshape(out.shape[0], n_head, -1)
        for seg, rows in self._heads(q, n_head):
            if self.kv_gemm is None or not seg.cache.f16:
                heads[seg.lo : seg.hi] = attention(rows, seg.cache, layer, seg.start, scale, window, cap)
                continue
            n_kv = seg.start + seg.hi - seg.lo  # (the KQV through the KV-cache GEMM: ops.attention.attention_kv_gemm)
            args = (seg.start, seg.hi - seg.lo, n_kv, scale, window or 0, out[seg.lo : seg.hi], 0, n_head)
            ops_attention.attention_kv_gemm(rows, *seg.cache.layer(layer), *args, self.kv_gemm.params, np.float32(cap))
        return out

    def softcap(self, buf: np.ndarray, cap: float) -> np.ndarray:
        elementwise.softcap(buf, cap, 0, buf.size)
        return buf

    def glu(self, gelu: bool, gate: np.ndarray, up: np.ndarray, name: str) -> np.ndarray:
        if gelu:
            return geglu(gate, up)
        out = np.empty_like(gate)  # not in place: an observer may hold the matmul outputs
        elementwise.swiglu(gate, up, out, 0, gate.shape[0])
        return out

    def keep(self, *values: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(v[self.rows] for v in values)


# ---------------------------------------------------------------------------------------------------------------
# decoder-only driver


class Block(Protocol):
    """A decoder block: its one description, which the compiled plan records and :class:`EagerOps` runs; the last
    block (``keep``) keeps only the rows whose logits are wanted."""

    def forward(self, ops: Ops[T], x: T, keep: bool) -> T: ...


class CausalLM:
    """Token ids -> logits through embedding, decoder blocks, final RMSNorm and LM head, with a KV cache.

    Built from a validated model file: a subclass (one per architecture module) names its ``rows`` and builds one
    block from that block's tensors (:meth:`block`, after :meth:`prepare`); this class reads the tables, the
    embedding, the final norm and the LM head. Weights go through ``linear`` (the matmul backend).
    """

    #: the architectures (registry rows) the subclass builds
    rows: tuple[Architecture, ...] = ()
    #: the logits' soft-cap (Gemma 2's final_logit_softcapping; :meth:`prepare` sets it), or None
    final_softcap: float | None = None

    def __init__(
        self,
        model: ValidatedFile,
        linear: LinearFactory = FloatLinear.from_gguf,
        embedding: EmbeddingFactory = RowEmbedding.from_gguf,
        n_ctx: int | None = None,
        kv_dtype: type = np.float16,
        n_ubatch: int = 512,
    ) -> None:
        arch = next((row for row in self.rows if row.name == model.architecture), None)
        if arch is None:
            names = "/".join(row.name for row in self.rows)
            raise UnsupportedArchitectureError(f"{model.path}: architecture '{model.architecture}' is not {names}'s")
        self.hparams = hp = model.hparams
        self.n_ctx = context_size(hp, n_ctx, kv_dtype)
        top, block = arch.tensors(arch, hp)
        self.prepare(model, top)
        self.blocks = []
        for i in range(hp.n_layer):  # (a loop: one frame in a trace's call stack, as for the LM head)
            self.blocks.append(self.block(i, self.read_block(model, block, linear, i)))
        embd = model.tensor(top["token_embd"][0])
        self.embedding = self.token_embedding(embedding(top["token_embd"][0], embd.ggml_type, embd.shape, embd.data))
        self.output_norm = RMSNorm(model.vector(top["output_norm"][0]), hp.rms_eps)
        head = top["token_embd" if hp.tied_embeddings else "output"]
        self.lm_head = read_tensors(model, {"head": head}, linear)["head"]
        self.n_ubatch = n_ubatch
        self.kv_dtype = check_cache_dtype(kv_dtype)
        #: the GEMM of the matmul backend's kernel table that takes attention's KQV over the F16 cache for a batch
        #: (llama.cpp master's KleidiAI F16 route: :attr:`~kleidipy.runtime.backend.KleidiBackend.kv_gemm`), or None
        kv_gemm: NodeKernel | None = getattr(linear, "kv_gemm", None)
        self.kv_gemm = kv_gemm if self.kv_dtype == np.float16 else None
        self._cache: KVCache | None = None
        #: told of every forward pass (:class:`~kleidipy.observer.Observer`); an engine shares its list
        self.observers: list = []
        #: the forward pass as a compiled plan (:func:`kleidipy.graph.execute.compile_model`); None runs it op by
        #: op (the reference execution)
        self.compiled = None

    def prepare(self, model: ValidatedFile, top: TensorTable) -> None:
        """What the blocks share, read before them from the model's tensors ``top`` (:attr:`hparams` and
        :attr:`n_ctx` are set)."""

    def rope(
        self, freq_base: float, freq_scale: float, freq_factors: np.ndarray | None = None, attn_factor: float = 1.0
    ) -> RoPE:
        """RoPE tables for this model's context and hyper-parameters."""
        hp = self.hparams
        return RoPE(hp.n_rot, hp.rope_type, freq_base, freq_scale, self.n_ctx, freq_factors, attn_factor)

    #: ``read_block(model, table, linear, layer)``: block ``layer``'s tensors by field — :func:`read_tensors` itself
    #: (no frame of its own: a trace's load stack stays one path with the LM head's); phi3 splits its fused weights
    read_block = staticmethod(read_tensors)

    def block(self, layer: int, t: dict[str, Any]) -> Block:
        """Block ``layer`` from its tensors by field (the architecture's block table)."""
        raise NotImplementedError

    def token_embedding(self, rows: Embedding) -> Embedding:
        """The embedding the model runs (the file's rows, or an architecture's scaling of them)."""
        return rows

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        """An empty KV cache for one sequence of this model (``n_ctx`` positions, default the model's)."""
        hp = self.hparams
        return KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, self.n_ctx if n_ctx is None else n_ctx, self.kv_dtype)

    @property
    def cache(self) -> KVCache:
        """The model's own cache, for callers that run one sequence (made on first use: a server that gives each
        request its own cache never allocates it)."""
        if self._cache is None:
            self._cache = self.new_cache()
        return self._cache

    @property
    def n_past(self) -> int:
        """Number of positions in the KV cache."""
        return self.cache.n_past

    def reset(self) -> None:
        """Empty the KV cache (start a new sequence)."""
        self.cache.clear()

    def forward(
        self,
        token_ids: Sequence[int] | np.ndarray,
        positions: Sequence[int] | np.ndarray | None = None,
        *,
        all_logits: bool = False,
        cache: KVCache | None = None,
        as_decoded: bool = False,
    ) -> np.ndarray:
        """Run m tokens at positions ``positions`` (consecutive, starting at or before the cache's ``n_past``;
        default: right after the cached ones) of the sequence whose KV cache is ``cache`` (default: the model's
        own). Returns float32 logits of the last position [n_vocab], or of every position [m, n_vocab] with
        ``all_logits``. ``as_decoded``: every row computed with the decode step's numerics (each matmul's GEMV),
        bit for bit the logits of the tokens decoded one at a time (a draft's verification)."""
        cache = self.cache if cache is None else cache
        one = positions is None and type(token_ids) is list and len(token_ids) == 1 and type(token_ids[0]) is int
        if one and self.compiled is not None and not self.observers:
            # a decoded token as generation passes it: checked without numpy (a numpy step costs µs when it runs
            # cold after a compiled pass that streamed the weights through the caches)
            token, start = token_ids[0], cache.n_past
            if not 0 <= token < self.hparams.n_vocab:
                raise InvalidTokenError(self._bad_ids(token, token))
            if start >= cache.n_ctx:  # (the one check of cache.check a token at n_past can fail: no call for it)
                cache.check(start, 1)
            return self._forward_one(token, cache, start, all_logits)
        ids = self._check_ids(token_ids)
        start = cache.n_past if positions is None else _first_position(positions, ids.size)
        cache.check(start, ids.size)
        return self._forward_checked([(cache, ids, start)], all_logits, as_decoded)[0]

    def forward_batch(
        self,
        parts: Sequence[tuple[KVCache, Sequence[int] | np.ndarray, int]],
        *,
        all_logits: bool | Sequence[bool] = False,
        as_decoded: bool = False,
    ) -> list[np.ndarray]:
        """Run the tokens of several sequences in shared forward passes, as llama.cpp decodes a batch of many
        sequences: part ``(cache, ids, start)`` is a sequence's tokens at positions start.. (at or before its
        cache's ``n_past``); each cache belongs to one part. The rows go in part order in ubatches of up to
        n_ubatch (a part may span two); every matmul runs once over a ubatch's rows, and RoPE, the cache write and
        attention run per segment (:class:`Segment`) over that sequence's own cache. Returns per part the logits
        of its last token [n_vocab], or of each of its tokens [m, n_vocab] with ``all_logits`` (one flag, or one
        per part).

        A row's logits may depend on the rows it shares its ubatch with (a matmul kernel's GEMM and GEMV may
        round differently, as llama.cpp's do: the F16 ones do) unless ``as_decoded`` (each row as a decoded
        token's, :meth:`forward`); one part alone computes exactly what :meth:`forward` does."""
        seqs = [(kv, self._check_ids(ids), start) for kv, ids, start in parts]
        if len({id(kv) for kv, _, _ in seqs}) < len(seqs):
            raise ValueError("each part of a batch needs a KV cache of its own")
        for kv, ids, start in seqs:
            kv.check(start, ids.size)
        return self._forward_checked(seqs, all_logits, as_decoded)

    def _forward_checked(
        self, seqs: list[tuple[KVCache, np.ndarray, int]], all_logits: bool | Sequence[bool], as_decoded: bool
    ) -> list[np.ndarray]:
        """:meth:`forward_batch` of parts whose ids and positions are checked."""
        wants = [all_logits] * len(seqs) if isinstance(all_logits, bool) else [bool(a) for a in all_logits]
        if len(seqs) == 1 and seqs[0][1].size == 1 and self.compiled is not None and not self.observers:
            cache, ids, start = seqs[0]
            return [self._forward_one(int(ids[0]), cache, start, wants[0])]
        m = sum(ids.size for _, ids, _ in seqs)
        for observer in self.observers:
            observer.on_forward_start(m, seqs[0][2])
        chunks: list[list[np.ndarray]] = [[] for _ in seqs]
        try:
            pending: list[tuple[int, int, int]] = []  # (part, first token, last token + 1) of the ubatch being filled
            rows = 0
            for i, (_, ids, _) in enumerate(seqs):
                lo = 0
                while lo < ids.size:
                    hi = min(ids.size, lo + self.n_ubatch - rows)
                    pending.append((i, lo, hi))
                    rows += hi - lo
                    lo = hi
                    if rows == self.n_ubatch:
                        self._run_ubatch(seqs, pending, wants, chunks, as_decoded)
                        pending, rows = [], 0
            if pending:
                self._run_ubatch(seqs, pending, wants, chunks, as_decoded)
        finally:
            for observer in self.observers:
                observer.on_forward_end(m, seqs[0][2])
        return [np.concatenate(c) if want else c[-1][-1] for c, want in zip(chunks, wants, strict=True)]

    def _forward_one(self, token: int, cache: KVCache, start: int, all_logits: bool) -> np.ndarray:
        """:meth:`forward` of one checked token at position ``start`` of ``cache`` on the compiled plan, unobserved:
        the short way (:meth:`~kleidipy.graph.execute.CompiledForward.decode`)."""
        logits = self.compiled.decode(token, cache, start)
        cache.n_past = start + 1  # (decode wrote the token into cache.tokens)
        return logits[None] if all_logits else logits

    def _run_ubatch(
        self,
        seqs: list[tuple[KVCache, np.ndarray, int]],
        pieces: list[tuple[int, int, int]],
        wants: list[bool],
        chunks: list[list[np.ndarray]],
        as_decoded: bool,
    ) -> None:
        """One ubatch of :meth:`forward_batch`: tokens lo..hi-1 of part i for each piece (i, lo, hi); the logits of
        its kept rows (every row of a part that ``wants`` them all, else each part's last token) are appended to
        chunks[i]."""
        ubatch, keep, row = [], [], 0
        for i, lo, hi in pieces:
            kv, ids, start = seqs[i]
            ubatch.append(Segment(kv, start + lo, row, row + hi - lo))
            if wants[i] or hi == ids.size:
                keep.extend(range(row, row + hi - lo) if wants[i] else [row + hi - lo - 1])
            row += hi - lo
        ids = np.concatenate([seqs[i][1][lo:hi] for i, lo, hi in pieces])
        logits = self._decode(ids, ubatch, np.array(keep, np.int64), as_decoded)
        at = 0
        for i, lo, hi in pieces:
            n = hi - lo if wants[i] else int(hi == seqs[i][1].size)
            if n:
                chunks[i].append(logits[at : at + n])
                at += n

    def embed(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The sequence's final hidden state (after the output norm) mean-pooled over its positions and
        L2-normalized, as llama-server's ``/v1/embeddings`` gives it with ``--pooling mean``; it runs on a KV cache
        of its own. float32 [n_embd]."""
        ids = self._check_ids(token_ids)
        cache = self.new_cache(ids.size)
        rows = []
        for lo in range(0, ids.size, self.n_ubatch):
            hi = min(lo + self.n_ubatch, ids.size)
            rows.append(self._hidden(ids[lo:hi], [Segment(cache, lo, 0, hi - lo)], slice(None)))
        h = self.output_norm(np.concatenate(rows)).astype(np.float64).mean(axis=0)
        return (h / max(float(np.linalg.norm(h)), 1e-12)).astype(np.float32)

    def _check_ids(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise InvalidTokenError(f"token ids must be a non-empty 1-D integer sequence, got {ids.dtype} {ids.shape}")
        lo, hi = (int(ids[0]),) * 2 if ids.size == 1 else (ids.min(), ids.max())  # (a decoded token: no reductions)
        if lo < 0 or hi >= self.hparams.n_vocab:
            raise InvalidTokenError(self._bad_ids(lo, hi))
        return ids

    def _bad_ids(self, lo: int, hi: int) -> str:
        """The message of ids from lo to hi, some outside the vocabulary."""
        return f"token ids must be in [0, {self.hparams.n_vocab}), got {lo}..{hi}"

    def _hidden(self, ids: np.ndarray, ubatch: Sequence[Segment], keep: np.ndarray | slice) -> np.ndarray:
        """One ubatch through the blocks; the last block keeps only the rows ``keep`` (llama.cpp's out_ids)."""
        x = self.embedding(ids)
        ops = EagerOps(ubatch, keep, self.kv_gemm if ids.size > 1 and not GEMV_ROWS.get() else None)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block.forward(ops, x, i == last)
        for seg in ubatch:
            seg.cache.advance(seg.start, ids[seg.lo : seg.hi])
        return x

    def _decode(self, ids: np.ndarray, ubatch: Sequence[Segment], keep: np.ndarray, as_decoded: bool) -> np.ndarray:
        """One ubatch through the network: the logits of the rows ``keep`` (increasing row indices); ``as_decoded``:
        every matmul through its GEMV."""
        if self.compiled is not None:
            logits = self.compiled(ids, ubatch, keep, as_decoded)
            for seg in ubatch:
                seg.cache.advance(seg.start, ids[seg.lo : seg.hi])
            return logits
        if as_decoded:
            token = GEMV_ROWS.set(True)
            try:
                return self._decode(ids, ubatch, keep, False)
            finally:
                GEMV_ROWS.reset(token)
        x = self._hidden(ids, ubatch, keep)
        if x.shape[0] == 0:
            return np.empty((0, self.hparams.n_vocab), np.float32)
        logits = self.lm_head(self.output_norm(x))
        return logits if self.final_softcap is None else EagerOps(ubatch).softcap(logits, self.final_softcap)


def _first_position(positions: Sequence[int] | np.ndarray, m: int) -> int:
    pos = np.asarray(positions)
    if pos.shape != (m,) or pos.dtype.kind not in "iu":
        raise PositionError(f"positions must be {m} integers, got {pos.dtype} {list(pos.shape)}")
    start = int(pos[0])
    if np.any(pos != start + np.arange(m)):
        raise PositionError(f"positions must be consecutive, got {pos[:8].tolist()}...")
    return start
