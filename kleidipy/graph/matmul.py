"""The MUL_MAT node of the compiled plan: which kernel routine runs a prepared matmul, its LHS packing and the
thread split, callable from numba code.

:func:`node_kernel` turns a :class:`~kleidipy.core.matmul.PreparedMatmul` (``jit`` execution) into a
:class:`NodeKernel`: an integer ``code`` naming the compiled routine and an int64 ``params`` array (the ``P_*``
slots below). Two compiled (``nogil``, cached) entry points dispatch on the code:

* :func:`pack_lhs` ``(code, params, x, m, out, ith, nth) -> bool``: thread ith quantizes+packs its share of whole
  mr-row groups of the float32 rows ``x[:m]`` into the uint8 buffer ``out`` (at least
  :meth:`NodeKernel.lhs_bytes` (m) bytes) — together the threads write exactly the bytes ``prepared.pack(x[:m])``
  gives (for the f32 kernel: the rows' bytes). Returns False when the rows of its share hold a NaN/Inf (nothing
  of that share is then packed); the caller puts a barrier after it.
* :func:`matmul` ``(code, params, m, n, k, lhs, rhs, out, ith, nth)``: thread ith computes its block of the
  packed LHS × the packed weights ``rhs`` (``prepared.rhs``) into ``out[:m]`` (float32 [≥ m, n]), clamped to
  ±FLT_MAX: llama.cpp's share of the columns — per = roundup(ceil(n / nth), n_step), columns [ith·per, min(n,
  (ith + 1)·per)) — or, when that splits unevenly and whole mr-row groups split better, a share of the row groups
  with all the columns (:func:`split`). Every output is computed alone, so it is the bits
  ``prepared.matmul(prepared.pack(x), m)`` gives, at every nth and either split. The Q4_0 SME2-layout GEMM and GEMV on
  the VNNI (or portable) tiles stores and clamps into out itself (``vnni.compute_into``); the other routines
  return their block, which is copied in clamped (``_store_clamped``: for a 512 × 1536 GEMM a 3 MB copy, ~13 % of
  the node on a 576-deep one).

Each code calls the numba functions the family's ``_jit`` methods call (``kleidipy/kernels/<family>/jit.py`` and,
for the SME2 layouts, the AVX-512 VNNI tiles of ``vnni.py`` where the host has them), so both paths run the same
code. Hand-written because the graph executor needs the kernels without Python in between (the family classes
are Python objects numba cannot call) and no library maps KleidiAI kernels to compiled routines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from kleidipy.core import vnni
from kleidipy.core.matmul import PreparedMatmul
from kleidipy.errors import KleidipyError
from kleidipy.graph.atomics import monotonic_ns
from kleidipy.graph.workers import barrier, share
from kleidipy.kernels.bf16p_bf16p import jit as bf16_jit
from kleidipy.kernels.bf16p_bf16p import native as bf16_native
from kleidipy.kernels.bf16p_bf16p import ukernels as bf16_ukernels
from kleidipy.kernels.f32_f32p import ukernels as f32_ukernels
from kleidipy.kernels.qai8dxp_qsi8cxp import jit as q8_jit
from kleidipy.kernels.qai8dxp_qsi8cxp import neon as q8_native
from kleidipy.kernels.qai8dxp_qsi8cxp import sme as q8_sme
from kleidipy.kernels.qai8dxp_qsi8cxp import sme2 as q8_sme2
from kleidipy.kernels.qai8dxp_qsi8cxp import ukernels as q8_ukernels
from kleidipy.kernels.qai8dxp_qsi8cxp import vnni as q8_vnni
from kleidipy.kernels.qsi8d32p_qai4c32p import jit as q41_jit
from kleidipy.kernels.qsi8d32p_qai4c32p import neon as q41_native
from kleidipy.kernels.qsi8d32p_qai4c32p import sme2 as q41_sme2
from kleidipy.kernels.qsi8d32p_qai4c32p import ukernels as q41_ukernels
from kleidipy.kernels.qsi8d32p_qai4c32p import vnni as q41_vnni
from kleidipy.kernels.qsi8d32p_qsi4c32p import jit as q40_jit
from kleidipy.kernels.qsi8d32p_qsi4c32p import neon as q40_native
from kleidipy.kernels.qsi8d32p_qsi4c32p import sme2 as q40_sme2
from kleidipy.kernels.qsi8d32p_qsi4c32p import ukernels as q40_ukernels
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni as q40_vnni
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni_neon as q40_neon
from kleidipy.kernels.qsi8d32p_qsi4c32p import vnni_pack as q40_pack


class NotCompilableError(KleidipyError, ValueError):
    """A prepared matmul the compiled plan cannot run: another execution than ``jit``, or a kernel without a
    compiled routine here."""


# --- codes: the compiled routine of a kernel ---------------------------------------------------------
#: Q4_0 NEON kernels (dotprod / i8mm): the native aarch64 tiles ``neon.compute``, the VNNI tiles
#: ``vnni_neon._compute_neon`` (``jit.matmul_qsi8d32p_qsi4c32pscalef16`` on hosts with neither)
Q4_0_NEON = 1
#: Q4_0 SME2 kernels: the VNNI tiles (portable IR on hosts without AVX-512 VNNI), ``vnni._compute``; the native
#: SME2 tiles ``sme2._compute`` on a host with SME2
Q4_0_SME2 = 2
#: Q4_0 SME1 kernels: the family's ``ukernels.SME_COMPUTE`` (the native SME tiles ``sme.compute_s4s0`` on aarch64
#: with SME, the VNNI tiles ``vnni_s4s0.compute_s4s0`` where the host has AVX-512 VNNI, else the portable jit)
Q4_0_SME = 3
#: Q4_1 kernels on the portable numba loops (hosts without AVX-512 VNNI): ``jit.matmul``
Q4_1 = 4
#: Q4_1 kernels (NEON and SME2 layouts) on the VNNI tiles: ``vnni._matmul`` (on aarch64 with DotProd: the native
#: tiles of the NEON layout, ``neon.matmul``)
Q4_1_VNNI = 5
#: Q8_0 kernels on the portable numba loop (hosts without AVX-512 VNNI): ``jit.matmul_qai8dxp``
Q8_0 = 6
#: Q8_0 kernels (SME/SME2 and NEON layouts) on the VNNI tiles: ``vnni._matmul`` (on aarch64 with DotProd: the NEON
#: layouts on the native tiles, ``neon.matmul``)
Q8_0_VNNI = 7
#: BF16 kernels (F16 weights): ``jit.matmul_bf16``
BF16 = 8
#: the f32 FMLA kernel (F16 weights, no LHS packer): ``jit.matmul_f32_fma``
F32 = 9

# --- params slots ------------------------------------------------------------------------------------
#: geometry of the kernel
P_MR, P_NR, P_KR, P_SR, P_N_STEP, P_K = 0, 1, 2, 3, 4, 5
#: bytes of one packed LHS group of mr rows, of one packed RHS group of nr columns
P_LHS_STRIDE, P_RHS_STRIDE = 6, 7
#: K values per row per interleaved chunk of the LHS packer (kbl)
P_KBL = 8
#: the MOPA kernels' first block is an FMUL (accumulators from −0)
P_FIRST_BLOCK_FMUL = 9
#: Q4_0: the LHS layout id (``jit.LHS_QSI8D32P*``) and whether the packer rounds ties to even
P_LHS_LAYOUT, P_TIES_EVEN = 10, 11
#: Q4_1: bytes per column per chunk of the RHS layout and whether it is the NEON layout
P_CHUNK, P_NEON = 12, 13
#: Q8_0: the float epilogue (``Recipe``) and K rounded up to a multiple of 32
P_RECIPE, P_K_INT = 14, 15
#: BF16: LHS padding rows copy the group's first row; the GEMV's two accumulators
P_PAD_FIRST_ROW, P_TWO_ACCUMULATORS = 16, 17
N_PARAMS = 18

#: the ISA the Q4_0 SME2 tiles are compiled for (a global: the cache holds the host's version)
_Q4_0_ISA = vnni.HOST_ISA
#: the Q4_0 NEON kernels run on the VNNI tiles (as ``ukernels.NEON_COMPUTE``) where the host has them
_Q4_0_NEON_VNNI = vnni.HAS_AVX512_VNNI


@numba.njit(cache=True, nogil=True)
def _q4_1_vnni_portable(m, n, k, mr, nr, kbl, lhs, rhs, neon, first_block_fmul):  # pragma: no cover - compiled
    """The VNNI ``_matmul``'s stand-in on hosts without AVX-512 VNNI (where Q4_1_VNNI is never given out): the
    portable loops with its signature and result type."""
    chunk = kbl if neon else q41_jit.SME_CHUNK
    return q41_jit.matmul(m, n, k, mr, nr, kbl, chunk, lhs, rhs, neon, first_block_fmul)


@numba.njit(cache=True, nogil=True)
def _q8_0_vnni_portable(m, n, k_int, mr, nr, kbl, kr, lhs_i8, rhs_u8, fma_bias, out):  # pragma: no cover - compiled
    """Never called (Q8_0_VNNI is only given out with AVX-512 VNNI or native tiles): the tiles' stand-in elsewhere."""
    raise RuntimeError("Q8_0_VNNI needs AVX-512 VNNI or the native aarch64 tiles")


@numba.njit(cache=True, nogil=True)
def _q4_0_neon_numba(m, n, k, mr, nr, kr, sr, lhs, rhs):  # pragma: no cover - compiled
    """The Q4_0 NEON kernels where the host has no native aarch64 tiles: the VNNI tiles, or the portable jit."""
    if _Q4_0_NEON_VNNI:
        return q40_neon._compute_neon(_Q4_0_ISA, m, n, k, mr, nr, kr, kr // sr, lhs, rhs)
    return q40_jit.matmul_qsi8d32p_qsi4c32pscalef16(m, n, k, mr, nr, kr, sr, lhs, rhs)


@numba.njit(cache=True, nogil=True)
def _q4_0_sme2_numba(m, n, k, mr, nr, lhs, rhs, first_block_fmul):  # pragma: no cover - compiled
    """The Q4_0 SME2 kernels where the host has no SME2 tiles: the VNNI tiles, or their portable IR."""
    return q40_vnni._compute(_Q4_0_ISA, m, n, k, mr, nr, lhs, rhs, first_block_fmul)


#: the Q4_0 SME2 kernels' tiles (as ``ukernels.SME2_COMPUTE``): the native SME2 ones on a host with SME2 (which run
#: the kernels bound to its SVL, the others on the VNNI/portable tiles)
_Q4_0_SME2_TILES = q40_sme2._compute if q40_sme2.AVAILABLE else _q4_0_sme2_numba
_Q4_0_SME_TILES = q40_ukernels.SME_COMPUTE
#: the Q4_0 NEON kernels' tiles (as ``ukernels.NEON_COMPUTE``): the native aarch64 ones where the host has them (only
#: then is their code referenced: its symbols exist on such hosts only)
_Q4_0_NEON_TILES = q40_native.compute if q40_native.AVAILABLE else _q4_0_neon_numba
#: the VNNI routines where the host has them; elsewhere stand-ins, so that the dispatcher compiles on any host
_Q4_1_VNNI = (
    q41_vnni._matmul if q41_vnni.HAVE_VNNI else q41_native.matmul if q41_native.AVAILABLE else _q4_1_vnni_portable
)
_Q4_1_VNNI = q41_sme2.matmul if q41_sme2.AVAILABLE else _Q4_1_VNNI  # (SME2 layouts on its tiles, the rest as above)
_Q8_0_TILES = q8_native.matmul if q8_native.AVAILABLE else q8_vnni._matmul if q8_vnni.HAVE_VNNI else _q8_0_vnni_portable
_Q8_0_TILES = q8_sme2.matmul if q8_sme2.AVAILABLE else _Q8_0_TILES  # (SME2 layouts on its tiles, the rest as above)
_Q8_0_TILES = q8_sme.matmul if q8_sme.AVAILABLE else _Q8_0_TILES  # (an SME1-only host: the SME layouts likewise)


@dataclass(frozen=True, eq=False)
class NodeKernel:
    """The compiled routine of one prepared matmul: ``code`` and ``params`` (module docstring), for ``name``."""

    name: str
    code: int
    params: np.ndarray

    def lhs_bytes(self, m: int) -> int:
        """Bytes of the packed LHS of m rows (what :func:`pack_lhs` writes and :func:`matmul` reads)."""
        p = self.params
        if self.code == F32:
            return m * int(p[P_K]) * 4
        return -(-m // int(p[P_MR])) * int(p[P_LHS_STRIDE])


#: the params slots :func:`pack_lhs` reads
_LHS_SLOTS = (P_MR, P_KR, P_SR, P_K, P_LHS_STRIDE, P_KBL, P_LHS_LAYOUT, P_TIES_EVEN, P_K_INT, P_PAD_FIRST_ROW)


def same_lhs(a: NodeKernel, b: NodeKernel) -> bool:
    """Whether two routines pack the same rows into the same bytes (one pack can serve both)."""
    return a.code == b.code and all(a.params[i] == b.params[i] for i in _LHS_SLOTS)


def node_kernel(prepared: PreparedMatmul) -> NodeKernel:
    """The :class:`NodeKernel` of a prepared matmul (NotCompilableError for other executions than ``jit`` or a
    kernel without a compiled routine)."""
    kern, k = prepared.kernel, prepared.k
    if prepared.execution != "jit":
        raise NotCompilableError(
            f"{kern.name}: the compiled plan runs the jit execution only, this matmul is prepared for "
            f"{prepared.execution!r}"
        )
    g = kern._geo()
    p = np.zeros(N_PARAMS, np.int64)
    p[P_MR], p[P_NR], p[P_KR], p[P_SR], p[P_N_STEP], p[P_K] = g.mr, g.nr, g.kr, g.sr, g.n_step, k
    p[P_LHS_STRIDE] = kern.lhs_packed_size(g.mr, k)
    p[P_RHS_STRIDE] = kern.rhs_packed_size(g.nr, k)
    p[P_FIRST_BLOCK_FMUL] = bool(kern.flags.get("first_block_fmul", False))
    lhs_packer, rhs_packer = kern.lhs_packer, kern.rhs_packer
    if isinstance(kern, q40_ukernels.Qsi8d32pQsi4c32pKernel):
        code = Q4_0_NEON if not kern.is_sme else Q4_0_SME2 if kern.tier == "sme2" else Q4_0_SME
        p[P_KBL] = lhs_packer.chunk(g.kr, g.sr)
        p[P_LHS_LAYOUT], p[P_TIES_EVEN] = lhs_packer.layout, lhs_packer.ties_even
    elif isinstance(kern, q41_ukernels.Qsi8d32pQai4c32pKernel):
        code = Q4_1_VNNI if q41_vnni.HAVE_VNNI or q41_native.AVAILABLE or q41_sme2.AVAILABLE else Q4_1
        p[P_KBL] = g.kr // g.sr
        p[P_CHUNK], p[P_NEON] = rhs_packer.chunk(g.kr, g.sr), rhs_packer.neon
    elif isinstance(kern, q8_ukernels.Qai8dxpMatmulKernel) and rhs_packer is q8_ukernels.RHS_PACKER:
        lay = rhs_packer.layout(k, g.nr, g.kr, g.sr)
        k_int = q8_ukernels.k_internal(k)
        args = (g.mr, k_int, g.kr // g.sr, g.nr, lay.blen, lay.nibble_factor, lay.k_lo, lay.k_hi)
        native = q8_native.AVAILABLE and q8_native.is_native_layout(*args)
        native = native or (q8_sme2.AVAILABLE and q8_sme2.is_native_layout(*args))
        code = Q8_0_VNNI if native or (q8_vnni.HAVE_VNNI and q8_vnni._is_vnni_layout(*args)) else Q8_0
        p[P_KBL], p[P_RECIPE], p[P_K_INT] = g.kr // g.sr, int(kern.recipe), k_int
    elif isinstance(kern, bf16_ukernels.Bf16MatmulKernel):
        code = BF16
        p[P_PAD_FIRST_ROW] = lhs_packer.pad_first_row
        p[P_TWO_ACCUMULATORS] = bool(kern.flags.get("two_accumulators", False))
    elif isinstance(kern, f32_ukernels.F32MatmulKernel):
        code = F32
        p[P_LHS_STRIDE] = g.mr * k * 4
    else:
        raise NotCompilableError(f"{kern.name}: no compiled routine for this kernel in the graph executor")
    return NodeKernel(kern.name, code, p)


# --- compiled code -----------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _finite(x, r0, r1):  # pragma: no cover - compiled
    """Whether rows r0 .. r1-1 of float32 x hold no NaN/Inf: an all-ones exponent plus one carries into bit 31; the
    OR of those sums vectorises (5x faster than a max of the exponents, ~1 µs for 64 × 576 values)."""
    for r in range(r0, r1):
        bits = x[r].view(np.uint32)
        acc = np.uint32(0)
        for i in range(bits.size):
            acc |= (bits[i] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
        if acc & np.uint32(0x80000000):
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _copy(src, dst):  # pragma: no cover - compiled
    """dst[:] = src for 1-D arrays of one size (a plain loop: numba's slice assignment is ~20x slower)."""
    for i in range(src.size):
        dst[i] = src[i]


@numba.njit(cache=True, nogil=True)
def pack_lhs(code, params, x, m, out, ith, nth):  # pragma: no cover - compiled
    """Thread ith's share of the LHS quantize+pack of x[:m] into out (module docstring). False on NaN/Inf."""
    mr = params[P_MR]
    stride = params[P_LHS_STRIDE]
    g0, g1 = share((m + mr - 1) // mr, ith, nth)
    r0, r1 = g0 * mr, min(m, g1 * mr)
    if r0 >= r1:
        return True
    if not _finite(x, r0, r1):
        return False
    rows = x[r0:r1]
    dst = out[g0 * stride : g1 * stride]
    kbl = params[P_KBL]
    if code in (Q4_0_NEON, Q4_0_SME2, Q4_0_SME):
        _copy(q40_pack._lhs_pack(_Q4_0_ISA, rows, mr, kbl, 0, params[P_LHS_LAYOUT], params[P_TIES_EVEN]), dst)
    elif code in (Q4_1, Q4_1_VNNI):
        _copy(q41_jit.lhs_quant_pack(rows, mr, kbl, 0), dst)
    elif code in (Q8_0, Q8_0_VNNI):
        if r1 == m and m % mr:  # the padding rows of the last group are 0
            for i in range((g1 - g0 - 1) * stride, dst.size):
                dst[i] = 0
        q8_jit.lhs_quant_pack_qai8dxp(rows, mr, kbl, 0, params[P_K_INT], dst)
    elif code == BF16:
        _copy(bf16_jit.pack_lhs_bf16(rows, mr, params[P_KR], params[P_PAD_FIRST_ROW] != 0), dst)
    elif code == F32:
        k = x.shape[1]
        floats = out[r0 * k * 4 : r1 * k * 4].view(np.float32)
        for r in range(r1 - r0):
            _copy(rows[r], floats[r * k : (r + 1) * k])
    return True


@numba.njit(cache=True, nogil=True)
def mul_mat(ith, nth, sync, code, params, x, m, lhs, rhs, out, n, k, status, prof, node):  # pragma: no cover - compiled
    """A MUL_MAT node as each of the nth threads runs it (the compiled plan's, and ``benchmarks/kernels.py``'s):
    its share of the LHS quantize+pack of x[:m], a barrier, its share of the columns into out. A thread whose share
    holds NaN/Inf sets status[0]; then every thread returns False, nothing multiplied. With a non-empty ``prof``
    the thread stamps prof[ith, node, 1] (monotonic ns) when its pack share is done."""
    if not pack_lhs(code, params, x, m, lhs, ith, nth):
        status[0] = 1
    if prof.shape[0] > 0:
        prof[ith, node, 1] = monotonic_ns()
    barrier(sync, nth)
    if status[0]:
        return False
    matmul(code, params, m, n, k, lhs, rhs, out, ith, nth)
    return True


@numba.njit(cache=True, nogil=True)
def _store_clamped(res, out, m, n0, n1):  # pragma: no cover - compiled
    """out[:m, n0:n1] = res [m, n1-n0] clamped to ±FLT_MAX (NaN kept, as numpy's maximum/minimum)."""
    for i in range(m):
        q40_vnni.copy_clamped(res[i, : n1 - n0], out[i, n0:n1])


@numba.njit(cache=True, nogil=True)
def split(m, n, mr, n_step, ith, nth):  # pragma: no cover - compiled
    """Thread ith's block [r0, r1) x [n0, n1) of an m x n MUL_MAT (module docstring): llama.cpp's share of the
    columns, unless whole mr-row groups split more evenly (the longest share is shorter) — a prefill whose n has an
    odd count of n_step chunks (576 = 9 x 64 on two threads: 5 chunks for one, 4 for the other)."""
    per = ((n + nth - 1) // nth + n_step - 1) // n_step * n_step
    groups = (m + mr - 1) // mr
    if (groups + nth - 1) // nth * ((n + n_step - 1) // n_step) < groups * (per // n_step):
        g0, g1 = share(groups, ith, nth)
        return g0 * mr, min(m, g1 * mr), 0, n
    return 0, m, ith * per, min(n, (ith + 1) * per)


@numba.njit(cache=True, nogil=True)
def matmul(code, params, m, n, k, lhs, rhs, out, ith, nth):  # pragma: no cover - compiled
    """Thread ith's block of the MUL_MAT (:func:`split`) into out[:m] (module docstring)."""
    mr, nr, kr, sr = params[P_MR], params[P_NR], params[P_KR], params[P_SR]
    r0, r1, n0, n1 = split(m, n, mr, params[P_N_STEP], ith, nth)
    if n0 >= n1 or r0 >= r1:
        return
    cnt = n1 - n0
    rows = r1 - r0
    rstride = params[P_RHS_STRIDE]
    fmul = params[P_FIRST_BLOCK_FMUL] != 0
    lhs_stride = params[P_LHS_STRIDE]
    a = lhs[r0 // mr * lhs_stride : (r1 + mr - 1) // mr * lhs_stride]
    b = rhs[n0 // nr * rstride : (n1 + nr - 1) // nr * rstride]
    if code == Q4_0_SME2 and not q40_sme2.AVAILABLE:  # the tiles store (and clamp) into out
        ld = out.shape[1]
        q40_vnni.compute_into(_Q4_0_ISA, rows, cnt, k, mr, nr, a, b, fmul, out.reshape(-1)[r0 * ld + n0 :], ld)
        return
    out = out[r0:r1]
    if code == Q4_0_NEON:
        res = _Q4_0_NEON_TILES(rows, cnt, k, mr, nr, kr, sr, a, b)
    elif code == Q4_0_SME2:
        res = _Q4_0_SME2_TILES(rows, cnt, k, mr, nr, a, b, fmul)
    elif code == Q4_0_SME:
        res = _Q4_0_SME_TILES(rows, cnt, k, mr, nr, a, b, fmul)
    elif code == Q4_1:
        kbl = params[P_KBL]
        res = q41_jit.matmul(rows, cnt, k, mr, nr, kbl, params[P_CHUNK], a, b, params[P_NEON] != 0, fmul)
    elif code == Q4_1_VNNI:
        res = _Q4_1_VNNI(rows, cnt, k, mr, nr, params[P_KBL], a, b, params[P_NEON] != 0, fmul)
    elif code in (Q8_0, Q8_0_VNNI):
        k_int = params[P_K_INT]
        a_i8 = a.view(np.int8)
        if code == Q8_0_VNNI:
            res = np.empty((rows, cnt), np.float32)
            fma_bias = params[P_RECIPE] == q8_jit.RECIPE_FMA_BIAS
            _Q8_0_TILES(rows, cnt, k_int, mr, nr, params[P_KBL], kr, a_i8, b, fma_bias, res)
        else:  # the portable loop writes out[:, n0:n1] itself: clamped in place
            k_lo = q8_jit.int8_k_lo(k_int, nr, kr)
            dst = out[:, n0:n1]
            kbl, recipe = params[P_KBL], params[P_RECIPE]
            a_i32, a_f32 = a.view(np.int32), a.view(np.float32)
            q8_jit.matmul_qai8dxp(
                rows, cnt, k_int, a_i8, a_i32, a_f32, b, mr, kbl, nr, kr, 0, k_lo, k_lo[:0], recipe, dst
            )
            for i in range(rows):
                q40_vnni.clamp_in_place(dst[i])
            return
    elif code == BF16:
        res = bf16_native.matmul_bf16_native(rows, cnt, k, a, b, mr, nr, kr, params[P_TWO_ACCUMULATORS] != 0)
    else:  # F32
        res = bf16_jit.matmul_f32_fma(rows, cnt, k, a[: rows * k * 4].view(np.float32), b, nr)
    _store_clamped(res, out, rows, n0, n1)
