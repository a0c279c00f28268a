"""The CPU backend, as ggml-cpu's KleidiAI trait: repack every matmul weight once at load (:class:`KleidiBackend`,
through a :class:`~kleidipy.runtime.repack_cache.RepackCache` when given one), then run MUL_MAT
(:func:`compute_forward_mul_mat`: the GEMM when m > 1, the GEMV when m == 1; on a target with ``sme_threads``,
llama.cpp's SME/NEON hybrid over a second packing of the weights for the NEON kernels).

How each GGUF type reaches a packer: docs/weights-and-repacking.md."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy import formats
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.threads import MIN_SPLIT_MACS, sme_columns
from kleidipy.kernels.catalogue import family_of
from kleidipy.observer import KernelCall, Observer, RepackCall
from kleidipy.runtime.repack_cache import CachedWeight, RepackCache
from kleidipy.runtime.weights import GEMV_ROWS
from kleidipy.target import KernelPair, Target, fallback_kernels, select_kernels

#: GGML types the kernels take directly, and the kernel weight type each maps to.
_DIRECT = {
    GGMLType.Q4_0: "q4_0",
    GGMLType.Q8_0: "q8_0",
    GGMLType.Q4_1: "q4_1",
    GGMLType.Q4_K: "q4_1",  # sub-blocks of 32 with an f32 scale and minimum: the Q4_1 family, exactly
    GGMLType.F16: "f16",
    GGMLType.F32: "f16",
}
#: Other types of 5 bits or more: requantized per channel to int8 (the Q8_0 family); narrower ones go to Q4_0.
_REQUANT_TO_Q8_0 = {GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K, GGMLType.BF16}


class RepackedLinear:
    """A weight repacked for one KernelPair: ``y = x @ Wᵀ`` through the KleidiAI kernels.

    The packed buffer is validated once here; each call only quantizes+packs the activations and runs the
    pair's GEMV (m == 1) or GEMM (m > 1).
    """

    def __init__(
        self,
        name: str,
        pair: KernelPair,
        n: int,
        k: int,
        packed: np.ndarray,
        backend: KleidiBackend,
        fallback: RepackedLinear | None = None,
    ):
        self.name, self.pair, self.n, self.k, self.packed, self.backend = name, pair, n, k, packed, backend
        opts = {"execution": backend.execution, "min_split_macs": backend.min_split_macs}
        self.gemm = pair.gemm.prepare(n, k, packed, **opts)
        self.gemv = pair.gemv.prepare(n, k, packed, **opts) if pair.gemv is not pair.gemm else self.gemm
        #: the weight packed again for the NEON pair llama.cpp runs on the threads past ``sme_threads``, or None
        self.fallback = fallback
        self.sme_threads = 0 if fallback is None else int(backend.target.sme_threads or 0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return compute_forward_mul_mat(self, x)

    def sme_columns(self, m: int, threads: int) -> int:
        """The leading columns this pair computes of m rows on ``threads`` threads, the fallback the others
        (:func:`~kleidipy.core.threads.sme_columns`; all of them without a fallback)."""
        if self.fallback is None:
            return self.n
        steps = self.pair.gemm.n_step, self.fallback.pair.gemm.n_step
        return sme_columns(m, self.n, threads, self.sme_threads, *steps)


def compute_forward_mul_mat(weight: RepackedLinear, x: np.ndarray) -> np.ndarray:
    """MUL_MAT: quantize+pack the m activation rows, then GEMV if m == 1 else GEMM (llama.cpp's rule; the GEMV for
    every m while :data:`~kleidipy.runtime.weights.GEMV_ROWS` is set). With a fallback, llama.cpp's hybrid
    (:meth:`RepackedLinear.sme_columns`): the fallback alone, or each pair packing the rows with its own packer and
    computing its columns, told to the observers as one call each."""
    m = x.shape[0]
    if m == 0:  # no rows wanted (a prefill ubatch whose logits nobody reads): nothing to multiply
        return np.empty((0, weight.n), np.float32)
    cols = weight.sme_columns(1 if GEMV_ROWS.get() else m, weight.backend.threads)
    if cols == 0:  # (every column on the NEON fallback)
        weight, cols = weight.fallback, weight.n
    run = weight.gemv if m == 1 else weight.gemm
    if run is not weight.gemv and GEMV_ROWS.get():  # (the GEMV takes one row: row by row, as m decoded tokens)
        return np.concatenate([compute_forward_mul_mat(weight, x[i : i + 1]) for i in range(m)])
    parts = [(weight, run, 0, cols)]
    if cols < weight.n:  # (the SME GEMM on the columns [0, cols), the NEON GEMM on the others)
        parts.append((weight.fallback, weight.fallback.gemm, cols, weight.n))
    threads = weight.backend.threads
    watchers = [o for o in weight.backend.observers if o.wants_matmuls]
    outs = []
    for part, run, n0, n1 in parts:
        t0 = perf_counter()
        lhs = run.pack(x, threads)
        t1 = perf_counter()
        outs.append(run.matmul(lhs, m, threads, n0, n1))
        if watchers:  # traced: the same prepared matmul, its two halves (LHS quantize+pack, kernel) timed apart
            rhs_bytes = part.packed.nbytes if n1 - n0 == part.n else run.kernel.rhs_packed_size(n1 - n0, part.k)
            call = KernelCall(part.name, run.kernel, m, n1 - n0, part.k, int(lhs.nbytes), int(rhs_bytes))
            call.lhs_seconds, call.matmul_seconds, call.start = t1 - t0, perf_counter() - t1, t0
            for observer in watchers:
                observer.on_matmul(call)
    return outs[0] if len(outs) == 1 else np.concatenate(outs, 1)


@dataclass
class KleidiBackend:
    """LinearFactory that repacks GGUF weights for the target's kernels (see docs/weights-and-repacking.md)."""

    target: Target
    execution: str = "jit"
    threads: int = 1
    #: matmuls smaller than this many multiply-adds run on one thread (tests pass 0 to split tiny shapes)
    min_split_macs: int = MIN_SPLIT_MACS
    notice: Callable[[str], None] = field(default=lambda msg: print(f"kleidipy: {msg}", file=sys.stderr))
    #: who watches repacks and MUL_MATs (:mod:`kleidipy.observer`); an engine shares its list
    observers: list[Observer] = field(default_factory=list)
    #: packed weights of earlier loads (:mod:`kleidipy.runtime.repack_cache`), read instead of repacking
    cache: RepackCache | None = None
    #: whether every weight made so far has exact rows (:attr:`~kleidipy.target.KernelPair.exact_rows`): a batch
    #: of rows computes each as a decoded token does, so the GEMM may verify a draft
    exact_rows: bool = True
    _noticed: set = field(default_factory=set)

    def __call__(self, name: str, ggml_type: GGMLType, shape: tuple[int, ...], raw: np.ndarray) -> RepackedLinear:
        t0 = perf_counter()
        k, n = int(shape[0]), int(shape[1])
        source_type, source_bytes = GGMLType(ggml_type), int(raw.nbytes)
        hit = self._cached(name, source_type, n, k)
        if hit is not None:
            self._notice_requantized(name, source_type)
            pair, packed = hit
            t1 = t2 = perf_counter()
        else:
            weight_type, ggml_type, raw = self.supported(name, source_type, n, k, raw)
            pair = select_kernels(weight_type, self.target)
            t1, packed, t2 = self._pack(pair, ggml_type, n, k, raw)
        if self.cache is not None:
            self.cache.put(name, CachedWeight(source_type, pair.weight_type, n, k, packed), fresh=hit is None)
        call = RepackCall(name, source_type, pair, n, k, source_bytes, int(packed.nbytes), t0, t2 - t0, t1, t2 - t1)
        call.cached = hit is not None
        repacks, second = [call], None
        self.exact_rows = self.exact_rows and pair.exact_rows
        fallback = fallback_kernels(pair.weight_type, self.target)
        if fallback is not None:  # llama.cpp's second packed copy, for the hybrid's NEON pair (at every load: uncached)
            t0 = perf_counter()
            if hit is not None:
                _, ggml_type, raw = self.supported(name, source_type, n, k, raw)
            t1, fb_packed, t2 = self._pack(fallback, ggml_type, n, k, raw)
            size = int(fb_packed.nbytes)
            repacks.append(RepackCall(name, source_type, fallback, n, k, source_bytes, size, t0, t2 - t0, t1, t2 - t1))
            self.exact_rows = self.exact_rows and fallback.exact_rows
            second = RepackedLinear(name, fallback, n, k, fb_packed, self)
        for call in repacks:
            for observer in self.observers:
                observer.on_repack(call)
        return RepackedLinear(name, pair, n, k, packed, self, second)

    def _pack(
        self, pair: KernelPair, ggml_type: GGMLType, n: int, k: int, raw: np.ndarray
    ) -> tuple[float, np.ndarray, float]:
        """The weight packed for ``pair``'s kernels, between the two perf_counter() readings around the packer."""
        rhs, kwargs = packer_inputs(ggml_type, n, k, raw, pair.gemm, self.execution)
        t1 = perf_counter()
        packed = pair.gemm.pack_rhs(n, k, rhs, execution=self.execution, **kwargs)
        return t1, packed, perf_counter()

    def _cached(self, name: str, source_type: GGMLType, n: int, k: int) -> tuple[KernelPair, np.ndarray] | None:
        """(pair, packed bytes) from the cache, if it holds the weight packed for this target's kernel (its
        packer and size)."""
        hit = self.cache.get(name, source_type, n, k) if self.cache is not None else None
        if hit is None:
            return None
        pair = select_kernels(hit.weight_type, self.target)
        if hit.packed.layout.packer != pair.gemm.rhs_packer.name or hit.packed.size != pair.gemm.rhs_packed_size(n, k):
            return None
        return pair, hit.packed

    def supported(
        self, name: str, ggml_type: GGMLType, n: int, k: int, raw: np.ndarray
    ) -> tuple[str, GGMLType, np.ndarray]:
        """(kernel weight type, GGML type, data) the family's adaptor takes: the weight as stored, or for a type
        without a kernel (one-line notice) its dequantized values (the Q8_0 family quantizes them per channel) or
        their Q4_0 blocks."""
        if ggml_type in _DIRECT:
            return _DIRECT[ggml_type], ggml_type, raw
        self._notice_requantized(name, ggml_type)
        values = formats.dequantize(raw, ggml_type, n, k)
        if ggml_type in _REQUANT_TO_Q8_0:
            return "q8_0", GGMLType.F32, values
        return "q4_0", GGMLType.Q4_0, formats.quantize(values, GGMLType.Q4_0)

    def _notice_requantized(self, name: str, ggml_type: GGMLType) -> None:
        """Once per type without a kernel: its weights are requantized (also when read back from the cache)."""
        if ggml_type in _DIRECT or ggml_type in self._noticed:
            return
        self._noticed.add(ggml_type)
        self.notice(
            f"{ggml_type.name} weights have no KleidiAI kernel: dequantized at load and requantized to "
            f"{'int8 per channel' if ggml_type in _REQUANT_TO_Q8_0 else 'Q4_0'} (first: {name})"
        )


def packer_inputs(
    ggml_type: GGMLType, n: int, k: int, raw: np.ndarray, gemm: MatmulKernel, execution: str
) -> tuple[np.ndarray, dict]:
    """(rhs, packer keywords) for the raw GGUF bytes of a weight the kernels take: the family's GGML adaptor."""
    return family_of(gemm).from_ggml(ggml_type, raw, n, k, gemm.rhs_packer, execution)
