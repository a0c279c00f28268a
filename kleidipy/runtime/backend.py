"""The CPU backend, as ggml-cpu's KleidiAI trait: repack every matmul weight once at load (:class:`KleidiBackend`,
through a :class:`~kleidipy.runtime.repack_cache.RepackCache` when given one), then run MUL_MAT
(:func:`compute_forward_mul_mat`: the GEMM when m > 1, the GEMV when m == 1; on a target with ``sme_threads``,
llama.cpp's SME/NEON hybrid over a second packing of the weights for the NEON kernels).

How each GGUF type reaches a packer: docs/weights-and-repacking.md."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from time import perf_counter

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

from kleidipy import formats
from kleidipy.core.buffers import HugePageArena
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.node import NodeKernel
from kleidipy.core.threads import MIN_SPLIT_MACS, sme_columns
from kleidipy.errors import TargetError, WeightsNotExactError
from kleidipy.formats import codes16
from kleidipy.kernels.catalogue import family_of
from kleidipy.observer import KernelCall, Observer, RepackCall
from kleidipy.runtime.repack_cache import CachedWeight, RepackCache
from kleidipy.runtime.weights import GEMV_ROWS
from kleidipy.target import (
    F32_KLEIDIAI,
    KernelPair,
    Target,
    fallback_kernels,
    has_kernels,
    select_kernels,
    select_kv_gemm,
)

#: GGML types the kernels take as stored, and the kernel weight type each maps to (Q4_K: sub-blocks of 32 with an f32
#: scale and minimum, the Q4_1 family; checked exact at load like every type of a family that reads its weights back)
_DIRECT = {
    GGMLType.Q4_0: "q4_0",
    GGMLType.Q8_0: "q8_0",
    GGMLType.Q4_1: "q4_1",
    GGMLType.Q4_K: "q4_1",
    GGMLType.F16: "f16",
    GGMLType.F32: "f16",
}
#: kleidipy's exact-weight family: int8 codes with the file's f32 scale and offset per 16 values
EXACT = "qai8c16"
#: types of 5 bits or more without a KleidiAI kernel: multiplied by the exact-weight family, the file's weights (as
#: llama.cpp's native kernels multiply them; KleidiAI's trait declines these types)
_TO_EXACT = {GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K, GGMLType.IQ4_NL}
#: with exact weights (``--exact-weights``): Q8_0 through the exact-weight family instead of llama.cpp-on-Arm's
#: per-channel int8, float weights kept as f32 (the bf16 kernels of the f16 route round F16 and F32 to bf16)
_EXACT_WEIGHTS = {GGMLType.Q8_0: EXACT, GGMLType.F16: "f32", GGMLType.F32: "f32", GGMLType.BF16: "f32"}
#: rows of a weight compared at a time by the load-time exactness check (bounds its float32 copies)
_CHECK_ELEMENTS = 1 << 22


def exact_weights_default() -> bool:
    """Whether ``KLEIDIPY_EXACT_WEIGHTS`` asks for exact weights (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("KLEIDIPY_EXACT_WEIGHTS", "").strip().lower() in ("1", "true", "yes", "on")


def route(ggml_type: GGMLType, exact_weights: bool = False, target: Target | None = None) -> str:
    """The kernel weight type a GGML weight type is multiplied as (:data:`kleidipy.target.WEIGHT_TYPES`): F32
    through llama.cpp's F32 table when ``target``'s has an entry for it (SME2 on master's: the F32 values as they
    are, so also with ``exact_weights``), the exact-weight family's for the wider types without a KleidiAI kernel,
    "q4_0" for the narrow ones (requantized); ``exact_weights`` takes Q8_0 and the float types exactly too."""
    if ggml_type == GGMLType.F32 and target is not None and has_kernels(F32_KLEIDIAI, target):
        return F32_KLEIDIAI
    if exact_weights and ggml_type in _EXACT_WEIGHTS:
        return _EXACT_WEIGHTS[ggml_type]
    if ggml_type in _TO_EXACT:
        return EXACT
    if ggml_type == GGMLType.BF16:
        return "f16"  # (bf16 values: exact through the bf16 kernels and the f32 one)
    return _DIRECT.get(ggml_type, "q4_0")


def packed_weights_exact(
    pair: KernelPair, packed: np.ndarray, ggml_type: GGMLType, raw: np.ndarray, n: int, k: int, execution: str
) -> bool | None:
    """Whether the weights of a packed RHS read back (the family's GET_ROWS) are the GGUF tensor's dequantized values
    bit for bit (:func:`kleidipy.formats.dequantize`, gguf's and ggml's values); None when the family does not read
    its weights back or the tensor holds floats."""
    get_rows = family_of(pair.gemm).get_rows
    if get_rows is None or ggml_type in (GGMLType.F16, GGMLType.F32, GGMLType.BF16):
        return None
    row_bytes = formats.get_format(ggml_type).row_bytes(k)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    step = max(1, _CHECK_ELEMENTS // k)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        got = get_rows(pair.gemm, packed, np.arange(lo, hi), n, k, execution=execution)
        want = formats.dequantize(data[lo * row_bytes : hi * row_bytes], ggml_type, hi - lo, k)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            return False
    return True


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
    #: whether every weight made so far has exact rows (:attr:`~kleidipy.target.KernelPair.exact_rows`) and the
    #: target's table has no KV-cache GEMM (a batch's attention is not a decoded token's then): a batch of rows
    #: computes each as a decoded token does, so the GEMM may verify a draft
    exact_rows: bool = True
    #: multiply every weight as the file holds it: Q8_0 through the exact-weight family, floats as f32 (default:
    #: ``KLEIDIPY_EXACT_WEIGHTS``; else Q8_0 takes llama.cpp-on-Arm's per-channel int8)
    exact_weights: bool = field(default_factory=exact_weights_default)
    #: where the weights packed at this load are kept (a cache file's are read into huge pages of their own)
    arena: HugePageArena = field(default_factory=HugePageArena)
    _noticed: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.exact_rows = self.exact_rows and select_kv_gemm(self.target) is None

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
            pair, packed, t1, t2 = self._repack(name, source_type, n, k, raw, self.route(source_type))
            packed = self.arena.keep(packed)
        if self.cache is not None:
            self.cache.put(name, CachedWeight(source_type, pair.weight_type, n, k, packed), fresh=hit is None)
        call = RepackCall(name, source_type, pair, n, k, source_bytes, int(packed.nbytes), t0, t2 - t0, t1, t2 - t1)
        call.cached = hit is not None
        repacks, second = [call], None
        self.exact_rows = self.exact_rows and pair.exact_rows
        fallback = fallback_kernels(pair.weight_type, self.target)
        if fallback is not None:  # llama.cpp's second packed copy, for the hybrid's NEON pair (at every load: uncached)
            t0 = perf_counter()
            _, fb_type, fb_data = self.supported(name, source_type, n, k, raw, pair.weight_type)
            t1, fb_packed, t2 = self._pack(fallback, fb_type, n, k, fb_data)
            fb_packed = self.arena.keep(fb_packed)
            size = int(fb_packed.nbytes)
            repacks.append(RepackCall(name, source_type, fallback, n, k, source_bytes, size, t0, t2 - t0, t1, t2 - t1))
            self.exact_rows = self.exact_rows and fallback.exact_rows
            second = RepackedLinear(name, fallback, n, k, fb_packed, self)
        for call in repacks:
            for observer in self.observers:
                observer.on_repack(call)
        return RepackedLinear(name, pair, n, k, packed, self, second)

    def route(self, ggml_type: GGMLType) -> str:
        """:func:`route` on this target (every matmul weight, a tied LM head too: llama.cpp loads the duplicated
        token_embd as the output, whose op is MUL_MAT, ``llama-model-loader.cpp`` ``buft_for_tensor``)."""
        return route(ggml_type, self.exact_weights, self.target)

    def _pack(
        self, pair: KernelPair, ggml_type: GGMLType, n: int, k: int, raw: np.ndarray
    ) -> tuple[float, np.ndarray, float]:
        """The weight packed for ``pair``'s kernels, between the two perf_counter() readings around the packer."""
        rhs, kwargs = packer_inputs(ggml_type, n, k, raw, pair.gemm, self.execution)
        t1 = perf_counter()
        packed = pair.gemm.pack_rhs(n, k, rhs, execution=self.execution, **kwargs)
        return t1, packed, perf_counter()

    @cached_property
    def kv_gemm(self) -> NodeKernel | None:
        """The GEMM the target's table names for the KQV of a batch over the F16 KV cache, as the ops call it (its
        family's routine packing both operands at the call), or None (:func:`~kleidipy.target.select_kv_gemm`)."""
        kern = select_kv_gemm(self.target)
        if kern is None:
            return None
        node = family_of(kern).node(kern, kern.kr)
        if node.gemm_kxn is None:
            raise TargetError(f"{kern.name}: its family has no GEMM of operands packed at the call")
        return node

    def _repack(
        self, name: str, source_type: GGMLType, n: int, k: int, raw: np.ndarray, weight_type: str
    ) -> tuple[KernelPair, np.ndarray, float, float]:
        """(pair, packed, conversion end, packing end) of a weight packed as ``weight_type``, its weights checked
        against the file's: a Q4_1/Q4_K weight the Q4_1 family would not hold exactly goes to the exact-weight family
        (one-line notice), any other difference is a :class:`~kleidipy.errors.WeightsNotExactError`."""
        weight_type_in, ggml_type, data = self.supported(name, source_type, n, k, raw, weight_type)
        pair = select_kernels(weight_type_in, self.target)
        t1, packed, t2 = self._pack(pair, ggml_type, n, k, data)
        if (
            ggml_type == source_type
            and packed_weights_exact(pair, packed, source_type, raw, n, k, self.execution) is False
        ):
            if weight_type != EXACT and source_type in codes16.TYPES:
                self.notice(f"{name}: {source_type.name} weights not exact as {weight_type}: packed as {EXACT}")
                return self._repack(name, source_type, n, k, raw, EXACT)
            raise WeightsNotExactError(
                f"{name}: the {source_type.name} weights packed as {weight_type} differ from the file's"
            )
        return pair, packed, t1, t2

    def _cached(self, name: str, source_type: GGMLType, n: int, k: int) -> tuple[KernelPair, np.ndarray] | None:
        """(pair, packed bytes) from the cache, if it holds the weight packed for this target's kernel (its
        packer and size) as this load routes it (a Q4_1/Q4_K weight packed exactly after its check, also)."""
        hit = self.cache.get(name, source_type, n, k) if self.cache is not None else None
        if hit is None:
            return None
        wanted = self.route(source_type)
        if hit.weight_type != wanted and not (wanted == "q4_1" and hit.weight_type == EXACT):
            return None
        pair = select_kernels(hit.weight_type, self.target)
        if hit.packed.layout.packer != pair.gemm.rhs_packer.name or hit.packed.size != pair.gemm.rhs_packed_size(n, k):
            return None
        return pair, hit.packed

    def supported(
        self, name: str, ggml_type: GGMLType, n: int, k: int, raw: np.ndarray, weight_type: str | None = None
    ) -> tuple[str, GGMLType, np.ndarray]:
        """(kernel weight type, GGML type, data) the family's adaptor takes for a weight routed as ``weight_type``
        (default: :func:`route`'s): the weight as stored, BF16 as its (exact) f32 values, or for a narrow type without
        a KleidiAI kernel routed to the Q4_0 family (one-line notice) its dequantized values' Q4_0 blocks."""
        weight_type = weight_type or self.route(ggml_type)
        if ggml_type == GGMLType.BF16:
            return weight_type, GGMLType.F32, formats.dequantize(raw, ggml_type, n, k)
        if weight_type != "q4_0" or ggml_type == GGMLType.Q4_0:
            return weight_type, ggml_type, raw
        self._notice_requantized(name, ggml_type)
        values = formats.dequantize(raw, ggml_type, n, k)
        return "q4_0", GGMLType.Q4_0, formats.quantize(values, GGMLType.Q4_0)

    def _notice_requantized(self, name: str, ggml_type: GGMLType) -> None:
        """Once per narrow type without a kernel: its weights are requantized to Q4_0 (also when read back from the
        cache)."""
        if self.route(ggml_type) != "q4_0" or ggml_type == GGMLType.Q4_0 or ggml_type in self._noticed:
            return
        self._noticed.add(ggml_type)
        self.notice(f"{ggml_type.name} weights have no KleidiAI kernel: dequantized at load and requantized to Q4_0 "
                    f"(first: {name})")  # fmt: skip


def packer_inputs(
    ggml_type: GGMLType, n: int, k: int, raw: np.ndarray, gemm: MatmulKernel, execution: str
) -> tuple[np.ndarray, dict]:
    """(rhs, packer keywords) for the raw GGUF bytes of a weight the kernels take: the family's GGML adaptor."""
    return family_of(gemm).from_ggml(ggml_type, raw, n, k, gemm.rhs_packer, execution)
