"""Shared transformer ops and the decoder-only driver, with llama.cpp's CPU numerics (flash attention off).

* RMSNorm (ggml_rms_norm then ggml_mul): squares in f32 summed in f64, ``mean`` rounded to f32,
  ``scale = 1/sqrtf(mean + eps)`` in f32, ``y = x * scale * w``.
* RoPE (ggml_rope_ext): per position p the angle of pair i is ``theta_i = freq_scale * (p * theta_scale^i) / ff_i``
  with ``theta_scale = powf(base, -2/n_rot)`` and ``p * theta_scale^i`` built by repeated f32 multiplication, as
  ggml's rope cache does; pairs are adjacent (NORM, llama) or halves (NEOX, qwen2); dims past n_rot pass through.
* Attention (KQ -> soft_max_ext -> KQV): K and V come from the cache; with an F16 cache Q is rounded to F16 for KQ,
  and the softmax weights are rounded to F16 for KQV (ggml converts the f32 operand to the f16 operand's vec_dot
  type); products of F16 values are exact in f32. Softmax: ``s*scale`` (f32, 1/sqrtf(head_dim)), causal mask,
  ``exp(s - max)`` in f32 summed in f64, weights ``e * (float)(1/sum)``. GQA: query head h reads KV head h / n_group.
  A sliding window of w positions (llama.cpp's LLAMA_SWA_TYPE_STANDARD) also masks key p0 for query p1 when
  ``p1 - p0 >= w``. Optional per-head RMSNorm of Q and K (before RoPE), and a Q pre-scale (``ggml_scale`` of Q in
  f32 after RoPE, then a softmax scale of 1) for architectures that set the attention scale themselves.
* SwiGLU: ``down(silu(gate(x)) * up(x))``, ``silu(g) = g / (1 + expf(-g))`` in f32.
* GeGLU: ``down(gelu(gate(x)) * up(x))`` as ggml-cpu computes it (GGML_GELU_FP16): gate <= -10 gives 0, >= 10
  gives the gate itself, otherwise the gate is rounded to F16 and looked up in a table of
  ``0.5f*x*(1.0f + tanhf(sqrt(2/pi)*x*(1.0f + 0.044715f*x*x)))`` over every F16 x, rounded to F16; times up in f32.

:class:`CausalLM` runs a stack of decoder blocks over a token batch (prefill, any m, split in ubatches) or one
token (decode) with a preallocated :class:`~kleidipy.runtime.kv_cache.KVCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numba
import numpy as np

from kleidipy.runtime.hparams import HyperParameters, RopeType
from kleidipy.runtime.kv_cache import KVCache, PositionError, check_cache_dtype
from kleidipy.runtime.weights import Embedding, InvalidTokenError, Linear

# ---------------------------------------------------------------------------------------------------------------
# elementwise ops


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm of the rows of x [m, n] times weight [n] (ggml_rms_norm + ggml_mul)."""
    mean = (np.square(x).sum(axis=1, dtype=np.float64) / x.shape[1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale[:, None]) * weight


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)) in float32."""
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


class RMSNorm:
    def __init__(self, weight: np.ndarray, eps: float) -> None:
        self.weight = np.asarray(weight, dtype=np.float32)
        self.eps = eps

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return rms_norm(x, self.weight, self.eps)


# ---------------------------------------------------------------------------------------------------------------
# RoPE


@numba.njit(cache=True, nogil=True)
def _rope_inplace(x, cos, sin, neox):  # pragma: no cover - compiled
    """Rotate x [m, n_heads, head_dim] in place by the angles of cos/sin [m, n_rot/2]."""
    m, n_heads, _ = x.shape
    half = cos.shape[1]
    for t in range(m):
        for h in range(n_heads):
            for i in range(half):
                a = i if neox else 2 * i
                b = a + half if neox else a + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                c = cos[t, i]
                s = sin[t, i]
                x[t, h, a] = x0 * c - x1 * s
                x[t, h, b] = x0 * s + x1 * c


class RoPE:
    """Rotary position embedding with cos/sin tables precomputed for positions 0..n_ctx-1."""

    def __init__(
        self,
        n_rot: int,
        rope_type: RopeType,
        freq_base: float,
        freq_scale: float,
        n_ctx: int,
        freq_factors: np.ndarray | None = None,
    ) -> None:
        self.n_rot = n_rot
        self.neox = rope_type == RopeType.NEOX
        theta_scale = np.power(np.float32(freq_base), np.float32(-2.0) / np.float32(n_rot))
        ff = np.ones(n_rot // 2, np.float32) if freq_factors is None else np.asarray(freq_factors, np.float32)
        theta = np.arange(n_ctx, dtype=np.float32)
        angles = np.empty((n_ctx, n_rot // 2), np.float32)
        for i in range(n_rot // 2):
            angles[:, i] = np.float32(freq_scale) * (theta / ff[i])
            theta = theta * theta_scale
        self.cos = np.cos(angles)
        self.sin = np.sin(angles)

    def __call__(self, x: np.ndarray, start: int) -> None:
        """Rotate x [m, n_heads, head_dim] (C-contiguous float32) in place for positions start..start+m-1."""
        m = x.shape[0]
        _rope_inplace(x, self.cos[start : start + m], self.sin[start : start + m], self.neox)


# ---------------------------------------------------------------------------------------------------------------
# attention


@numba.njit(cache=True, nogil=True)
def _round_f16_inplace(x):  # pragma: no cover - compiled
    """Round a flat float32 array to F16 values in place (F32->F16 nearest-even, overflow to inf, NaN kept)."""
    u = x.view(np.uint32)
    for i in range(x.size):
        a = u[i] & np.uint32(0x7FFFFFFF)
        if a < np.uint32(0x38800000):  # below 2^-14: F16 subnormals, spaced 2^-24
            x[i] = np.float32(np.rint(x[i] * np.float32(16777216.0)) * np.float32(5.9604645e-08))
        elif a >= np.uint32(0x477FF000):  # >= 65520 rounds to inf; inf and NaN stay
            if a <= np.uint32(0x7F800000):
                u[i] = (u[i] & np.uint32(0x80000000)) | np.uint32(0x7F800000)
        else:  # keep 10 of the 23 mantissa bits, ties to even
            a = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
            u[i] = (u[i] & np.uint32(0x80000000)) | a


def round_to_f16(x: np.ndarray) -> np.ndarray:
    """F16 values of a float32 array, as float32 (what ggml's F32->F16 operand conversion keeps)."""
    out = np.array(x, dtype=np.float32, order="C")
    _round_f16_inplace(out.reshape(-1))
    return out


def attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    start: int,
    scale: np.float32,
    f16: bool,
    window: int | None = None,
):
    """Causal attention of q [m, n_head, d] (positions start..start+m-1) over keys/values [n_head_kv, n_kv, d]
    (float32; F16 values when ``f16``, which also rounds Q and the softmax weights to F16), over the last ``window``
    positions of each query when given; returns [m, n_head, d]."""
    m, n_head, d = q.shape
    n_head_kv, n_kv, _ = keys.shape
    g = n_head // n_head_kv
    qh = q.transpose(1, 0, 2).reshape(n_head_kv, g * m, d)
    if f16:
        qh = round_to_f16(qh)
    s = np.matmul(qh, keys.transpose(0, 2, 1))
    s *= scale
    slides = window is not None and n_kv > window
    if m > 1 or slides:  # causal (and window) mask, added (-inf or 0) with broadcasting: cheaper than assignment
        distance = (start + np.arange(m))[:, None] - np.arange(n_kv)[None, :]
        masked = (distance < 0) | (distance >= window) if slides else distance < 0
        s.reshape(n_head_kv, g, m, n_kv)[...] += np.where(masked, np.float32(-np.inf), np.float32(0))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s *= (1.0 / s.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)
    if f16:
        _round_f16_inplace(s.reshape(-1))  # s is matmul's fresh C-contiguous result: reshape is a view
    o = np.matmul(s, values)
    return o.reshape(n_head, m, d).transpose(1, 0, 2)


class SelfAttention:
    """GQA self-attention with RoPE and optional q/k/v/output biases, over one layer of a KV cache; optionally
    per-head RMSNorm of Q and K, a Q pre-scale replacing the softmax scale, and a sliding window."""

    def __init__(
        self,
        layer: int,
        wq: Linear,
        wk: Linear,
        wv: Linear,
        wo: Linear,
        rope: RoPE,
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
    ) -> None:
        self.layer = layer
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.bq, self.bk, self.bv, self.bo = bq, bk, bv, bo
        self.q_norm, self.k_norm, self.window = q_norm, k_norm, window
        self.rope = rope
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.q_scale = None if q_scale is None else np.float32(q_scale)
        self.scale = np.float32(1.0) / np.sqrt(np.float32(head_dim)) if q_scale is None else np.float32(1.0)

    @staticmethod
    def _project(
        w: Linear, b: np.ndarray | None, x: np.ndarray, n_heads: int, head_dim: int, norm: RMSNorm | None = None
    ) -> np.ndarray:
        y = w(x)
        if b is not None:
            y += b
        if norm is not None:  # per head: rows of head_dim values
            y = norm(y.reshape(-1, head_dim))
        return y.reshape(x.shape[0], n_heads, head_dim)

    def __call__(self, x: np.ndarray, start: int, cache: KVCache) -> np.ndarray:
        m = x.shape[0]
        q = self._project(self.wq, self.bq, x, self.n_head, self.head_dim, self.q_norm)
        k = self._project(self.wk, self.bk, x, self.n_head_kv, self.head_dim, self.k_norm)
        v = self._project(self.wv, self.bv, x, self.n_head_kv, self.head_dim)
        self.rope(q, start)
        self.rope(k, start)
        if self.q_scale is not None:
            q *= self.q_scale
        cache.store(self.layer, start, k, v)
        keys, values = cache.read(self.layer, start + m)
        o = attention(q, keys, values, start, self.scale, cache.f16, self.window)
        y = self.wo(np.ascontiguousarray(o.reshape(m, self.n_head * self.head_dim)))
        if self.bo is not None:
            y += self.bo
        return y


class SwiGLU:
    """Gated feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, gate: Linear, up: Linear, down: Linear) -> None:
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down(silu(self.gate(x)) * self.up(x))


@cache
def _gelu_f16_table() -> np.ndarray:
    """ggml's GELU table: for every F16 bit pattern, the tanh-approximated GELU in f32 rounded to F16 (as f32)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        inner = np.float32(0.7978845608028654) * x * (np.float32(1.0) + np.float32(0.044715) * x * x)
        gelu = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))
    return gelu.astype(np.float16).astype(np.float32)


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu(gate) * up with ggml-cpu's F16-table GELU (module docstring)."""
    looked_up = _gelu_f16_table()[gate.astype(np.float16).view(np.uint16)]
    gelu = np.where(gate <= np.float32(-10.0), np.float32(0.0), np.where(gate >= np.float32(10.0), gate, looked_up))
    return gelu * up


class GeGLU:
    """Gated feed-forward with GELU: down(gelu(gate(x)) * up(x))."""

    def __init__(self, gate: Linear, up: Linear, down: Linear) -> None:
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down(geglu(self.gate(x), self.up(x)))


# ---------------------------------------------------------------------------------------------------------------
# decoder-only driver

#: a decoder block: (hidden [m, n_embd], first position, cache, rows to keep or None) -> hidden [rows, n_embd]
Block = Callable[[np.ndarray, int, KVCache, "np.ndarray | slice | None"], np.ndarray]


class CausalLM:
    """Token ids -> logits through embedding, decoder blocks, final RMSNorm and LM head, with a KV cache.

    Subclasses (one per architecture) build the blocks from a GGUF file and call ``__init__``.
    """

    def __init__(
        self,
        hparams: HyperParameters,
        embedding: Embedding,
        blocks: Sequence[Block],
        output_norm: RMSNorm,
        lm_head: Linear,
        n_ctx: int,
        kv_dtype: type = np.float16,
        n_ubatch: int = 512,
    ) -> None:
        self.hparams = hparams
        self.embedding = embedding
        self.blocks = list(blocks)
        self.output_norm = output_norm
        self.lm_head = lm_head
        self.n_ctx = n_ctx
        self.n_ubatch = n_ubatch
        self.kv_dtype = check_cache_dtype(kv_dtype)
        self._cache: KVCache | None = None
        #: told of every forward pass (:class:`~kleidipy.runtime.observer.Observer`); an engine shares its list
        self.observers: list = []

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
    ) -> np.ndarray:
        """Run m tokens at positions ``positions`` (consecutive, starting at or before the cache's ``n_past``;
        default: right after the cached ones) of the sequence whose KV cache is ``cache`` (default: the model's
        own). Returns float32 logits of the last position [n_vocab], or of every position [m, n_vocab] with
        ``all_logits``."""
        cache = self.cache if cache is None else cache
        ids = self._check_ids(token_ids)
        m = ids.size
        start = cache.n_past if positions is None else _first_position(positions, m)
        cache.check(start, m)
        for observer in self.observers:
            observer.on_forward_start(m, start)
        try:
            chunks = []
            for lo in range(0, m, self.n_ubatch):
                hi = min(lo + self.n_ubatch, m)
                keep = slice(None) if all_logits else slice(hi - lo - 1, None) if hi == m else slice(0, 0)
                chunks.append(self._decode(ids[lo:hi], start + lo, keep, cache))
        finally:
            for observer in self.observers:
                observer.on_forward_end(m, start)
        logits = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        return logits if all_logits else logits[-1]

    def embed(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The sequence's final hidden state (after the output norm) mean-pooled over its positions and
        L2-normalized, as llama-server's ``/v1/embeddings`` gives it with ``--pooling mean``; it runs on a KV cache
        of its own. float32 [n_embd]."""
        ids = self._check_ids(token_ids)
        cache = self.new_cache(ids.size)
        rows = [
            self._hidden(ids[lo : lo + self.n_ubatch], lo, slice(None), cache)
            for lo in range(0, ids.size, self.n_ubatch)
        ]
        h = self.output_norm(np.concatenate(rows)).astype(np.float64).mean(axis=0)
        return (h / max(float(np.linalg.norm(h)), 1e-12)).astype(np.float32)

    def _check_ids(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise InvalidTokenError(f"token ids must be a non-empty 1-D integer sequence, got {ids.dtype} {ids.shape}")
        if ids.min() < 0 or ids.max() >= self.hparams.n_vocab:
            raise InvalidTokenError(f"token ids must be in [0, {self.hparams.n_vocab}), got {ids.min()}..{ids.max()}")
        return ids

    def _hidden(self, ids: np.ndarray, start: int, keep: slice, cache: KVCache) -> np.ndarray:
        """One ubatch through the blocks; the last block keeps only the rows ``keep`` (llama.cpp's out_ids)."""
        x = self.embedding(ids)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, start, cache, keep if i == last else None)
        cache.advance(start, ids)
        return x

    def _decode(self, ids: np.ndarray, start: int, keep: slice, cache: KVCache) -> np.ndarray:
        """One ubatch through the network: the logits of the rows ``keep``."""
        x = self._hidden(ids, start, keep, cache)
        if x.shape[0] == 0:
            return np.empty((0, self.hparams.n_vocab), np.float32)
        return self.lm_head(self.output_norm(x))


def _first_position(positions: Sequence[int] | np.ndarray, m: int) -> int:
    pos = np.asarray(positions)
    if pos.shape != (m,) or pos.dtype.kind not in "iu":
        raise PositionError(f"positions must be {m} integers, got {pos.dtype} {list(pos.shape)}")
    start = int(pos[0])
    if np.any(pos != start + np.arange(m)):
        raise PositionError(f"positions must be consecutive, got {pos[:8].tolist()}...")
    return start
