"""The elementwise and reduction nodes of the forward pass (:func:`expf`, :func:`rms_norm`, :func:`swiglu`,
:func:`geglu`, :func:`rope`, the KV cache's cells) as compiled kernels, each with one fixed order of operations:
ggml-cpu's algorithms as they run on Arm (aarch64 NEON). The eager path and the compiled graph call these same
functions.

Hand-written because no maintained library states these orders: numpy's ``exp``, ``sum`` and BLAS products differ
between hosts and builds, and they are what makes a forward pass reproducible bit for bit.

The order of each op: docs/elementwise-ops.md."""

from __future__ import annotations

import platform
from collections.abc import Callable
from functools import cache

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.types import ExternalFunction
from numba.extending import intrinsic, overload

from kleidipy.core.numerics import F16_BITS_TO_F32, f32_bits, f32_to_f16_bits_scalar, fma32, fma_f32
from kleidipy.core.vnni import HAS_F16C

# ggml_v_expf's constants (NEON variant)
_SHIFT = np.float32(float.fromhex("0x1.8p23"))  # rounds z to an integer in its low mantissa bits
_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_C1 = np.float32(float.fromhex("0x1.ffffecp-1"))
_C2 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_C3 = np.float32(float.fromhex("0x1.555e66p-3"))
_C4 = np.float32(float.fromhex("0x1.573e2ep-5"))
_C5 = np.float32(float.fromhex("0x1.0e4020p-7"))


def expf_ir(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """IR of exp(x) in float32 as ggml_v_expf (NEON), for a float or a vector of floats (every lane alike):
    ``n = round(x / ln 2)``, ``b = x - n ln 2`` (two fused steps), a degree-5 polynomial ``j`` of b (fused), result
    ``k + k*j`` with ``k = 2^n``; when ``|n| > 126`` the scale is split in two factors (``(s2 + s2*j) * s1``), and
    when ``|n| > 192`` the result is ``s1*s1`` (0 or inf). Max error 1.45 + 0.5 ulp; below -103.97 it flushes to 0,
    above 88.38 to inf. Every case is computed and the result selected (no branch; ggml's vector code branches
    around the rare cases), the rare ones from scale 1 in the lanes that do not take them."""
    fty = x.type
    lanes = fty.count if isinstance(fty, ir.VectorType) else 0
    ity = ir.VectorType(ir.IntType(32), lanes) if lanes else ir.IntType(32)

    def cf(value: float) -> ir.Constant:
        return ir.Constant(fty, [ir.Constant(ir.FloatType(), value)] * lanes if lanes else value)

    def ci(value: int) -> ir.Constant:
        value -= (value >= 1 << 31) << 32  # as a signed i32
        return ir.Constant(ity, [ir.Constant(ir.IntType(32), value)] * lanes if lanes else value)

    suffix = f"v{lanes}f32" if lanes else "f32"
    fma_fn = b.module.globals.get(f"llvm.fma.{suffix}") or ir.Function(
        b.module, ir.FunctionType(fty, [fty, fty, fty]), f"llvm.fma.{suffix}"
    )
    fabs_fn = b.module.globals.get(f"llvm.fabs.{suffix}") or ir.Function(
        b.module, ir.FunctionType(fty, [fty]), f"llvm.fabs.{suffix}"
    )

    def fma(p: ir.Value, q: ir.Value, r: ir.Value) -> ir.Value:
        return b.call(fma_fn, [p, q, r])

    z = fma(x, cf(_LOG2E), cf(_SHIFT))
    n = b.fsub(z, cf(_SHIFT))
    bn = fma(b.fneg(n), cf(_LN2_LO), fma(b.fneg(n), cf(_LN2_HI), x))
    e = b.shl(b.bitcast(z, ity), ci(23))
    k = b.bitcast(b.add(e, ci(0x3F800000)), fty)
    u = b.fmul(bn, bn)
    j = fma(fma(fma(cf(_C5), bn, cf(_C4)), u, fma(cf(_C3), bn, cf(_C2))), u, b.fmul(cf(_C1), bn))
    an = b.call(fabs_fn, [n])
    negative = b.fcmp_ordered("<=", n, cf(0.0))
    d = b.select(negative, ci(0x82000000), ci(0))
    # the split scales where |n| > 126, else 1: a lane whose result is `near` must not compute the other cases from
    # its own scales (their products underflow to subnormals: a microcode assist per lane on Intel cores, ~10x the
    # whole expf; ggml's vector code branches around them)
    split_lane = b.fcmp_ordered(">", an, cf(126.0))
    s1 = b.select(split_lane, b.bitcast(b.add(d, ci(0x7F000000)), fty), cf(1.0))
    s2 = b.select(split_lane, b.bitcast(b.sub(e, d), fty), cf(1.0))
    split = b.fmul(fma(s2, j, s2), s1)
    flush = b.select(negative, cf(0.0), cf(float("inf")))  # s1·s1: 2^-250 rounds to +0, 2^254 overflows
    near = fma(k, j, k)
    return b.select(b.fcmp_ordered(">", an, cf(192.0)), flush, b.select(split_lane, split, near))


@intrinsic
def _expf_lane(typingctx, x):  # pragma: no cover - compile time
    return types.float32(types.float32), lambda context, builder, signature, args: expf_ir(builder, args[0])


@numba.njit(cache=True, nogil=True, inline="always")
def expf(x):
    """exp(x) in float32 as one lane of ggml_v_expf (:func:`expf_ir`); loops of it vectorize."""
    return _expf_lane(np.float32(x))


@numba.njit(cache=True, nogil=True)
def rms_norm(x, w, eps, out, r0, r1):
    """Rows r0..r1-1 of out [m, n] = RMSNorm of x [m, n] times w [n] (docs/elementwise-ops.md); out may alias x."""
    n = x.shape[1]
    eps32 = np.float32(eps)
    r = r0
    while r + 4 <= r1:  # four rows' sums side by side: each a chain of dependent f64 adds, four chains in flight
        t0 = t1 = t2 = t3 = 0.0
        for i in range(n):
            t0 += np.float64(x[r, i] * x[r, i])
            t1 += np.float64(x[r + 1, i] * x[r + 1, i])
            t2 += np.float64(x[r + 2, i] * x[r + 2, i])
            t3 += np.float64(x[r + 3, i] * x[r + 3, i])
        for k, total in enumerate((t0, t1, t2, t3)):
            _normalized(x, w, eps32, out, r + k, total)
        r += 4
    for t in range(r, r1):
        total = 0.0
        for i in range(n):
            total += np.float64(x[t, i] * x[t, i])
        _normalized(x, w, eps32, out, t, total)


@numba.njit(cache=True, nogil=True, inline="always")
def _normalized(x, w, eps32, out, r, total):
    """out[r] = (x[r] * scale) * w, scale = 1/sqrtf(mean + eps) from row r's sum of squares (f64)."""
    mean = np.float32(total / x.shape[1])
    scale = np.float32(1.0) / np.sqrt(mean + eps32)
    for i in range(x.shape[1]):
        out[r, i] = (x[r, i] * scale) * w[i]


@numba.njit(cache=True, nogil=True)
def add(a, b, out, r0, r1):
    """Rows r0..r1-1 of out = a + b (all [m, n]; the residual connection); out may alias a or b."""
    for r in range(r0, r1):
        for i in range(a.shape[1]):
            out[r, i] = a[r, i] + b[r, i]


@numba.njit(cache=True, nogil=True)
def add_row(x, bias, r0, r1):
    """Rows r0..r1-1 of x [m, n] += bias [n], in place."""
    for r in range(r0, r1):
        for i in range(x.shape[1]):
            x[r, i] += bias[i]


@numba.njit(cache=True, nogil=True)
def scale(x, s, r0, r1):
    """Rows r0..r1-1 of x [m, n] *= s (float32), in place."""
    s32 = np.float32(s)
    for r in range(r0, r1):
        for i in range(x.shape[1]):
            x[r, i] *= s32


@numba.njit(cache=True, nogil=True, inline="always")
def tanhf(x):
    """glibc's tanhf of an f32 as :func:`libm_f32` states it: tanh in float64, rounded once to f32."""
    return np.float32(np.tanh(np.float64(x)))


@numba.njit(cache=True, nogil=True, inline="always")
def softcap_value(x, inv, cap):
    """One soft-capped f32, in llama.cpp's op order (ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap):
    ``tanhf(x * inv) * cap`` with ``inv`` = (float)(1.0f / cap)."""
    return tanhf(x * inv) * cap


@numba.njit(cache=True, nogil=True)
def softcap(x, cap, e0, e1):
    """Elements e0..e1-1 of x [m, n] (C-contiguous, in memory order) soft-capped in place (Gemma 2's final logits,
    split by elements: a decoded token's one row of 256k shares out too): :func:`softcap_value` with the f32
    ``cap``."""
    c = np.float32(cap)
    inv = np.float32(1.0) / c
    flat = x.reshape(-1)
    for i in range(e0, e1):
        flat[i] = softcap_value(flat[i], inv, c)


@numba.njit(cache=True, nogil=True, error_model="numpy")  # no ZeroDivisionError branch: the loop vectorizes
def swiglu(gate, up, out, r0, r1):
    """Rows r0..r1-1 of out = silu(gate) * up (all [m, n]), ``silu(g) = g / (1 + expf(0 - g))`` in f32 with
    :func:`expf` for every element (ggml takes libm's expf for the n % 4 last ones); out may alias gate or up."""
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for r in range(r0, r1):
        g_row, u_row, o_row = gate[r], up[r], out[r]
        for i in range(g_row.shape[0]):
            g = g_row[i]
            o_row[i] = (g / (one + expf(zero - g))) * u_row[i]


def libm_f32(fn: Callable[..., np.ndarray], *args: np.ndarray | np.float32) -> np.ndarray:
    """glibc's float function (powf, tanhf) of f32 arguments, approximated as ``fn`` in float64 rounded once to f32:
    the same bits on every host (README's Exactness section says how close to glibc)."""
    wide = [np.asarray(a, np.float64) for a in args]
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(fn(*wide), np.float64).astype(np.float32)


#: the C library's float functions of one float that :func:`c_libm_f32` calls
C_LIBM_FUNCTIONS = ("cosf", "sinf")
#: the same functions as numba sees them: calls to the C symbols, resolved in the process at load (so the loop that
#: calls them is cached on disk like any other)
_COSF = ExternalFunction("cosf", types.float32(types.float32))
_SINF = ExternalFunction("sinf", types.float32(types.float32))


@numba.njit(cache=True, nogil=True)
def _c_libm_loop(which, x, out):  # pragma: no cover - compiled
    """out[i] = the C library's ``C_LIBM_FUNCTIONS[which]`` of x[i]."""
    for i in range(x.size):
        out[i] = _COSF(x[i]) if which == 0 else _SINF(x[i])


def c_libm_f32(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's own ``cosf``/``sinf`` (:data:`C_LIBM_FUNCTIONS`) of every f32 of x, as llama.cpp calls them
    for RoPE's cache: glibc's are not correctly rounded everywhere (about 1 % of RoPE's entries are an ulp from
    float64 rounded once), and an ulp can flip an F16 rounding of K or Q downstream. glibc gives the same bits on
    x86-64 and aarch64 (README, Exactness)."""
    if name not in C_LIBM_FUNCTIONS:
        raise ValueError(f"c_libm_f32 calls {', '.join(C_LIBM_FUNCTIONS)}, not {name!r}")
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.empty_like(flat)
    _c_libm_loop(C_LIBM_FUNCTIONS.index(name), flat, out)
    return out.reshape(np.shape(x))


@cache
def gelu_f16_table() -> np.ndarray:
    """ggml's GELU table: for every F16 bit pattern, the tanh-approximated GELU in f32 rounded to F16 (as f32), with
    ``1.0f + GELU_COEF_A*x*x`` one fma as GCC contracts it in ``ggml_gelu_f32`` (``fmadd`` in llama.cpp's aarch64
    build: the entry of x = −1.9990234375 moves by one F16 step, every other is the same)."""
    x = F16_BITS_TO_F32  # (from the bits: no float conversion, so no warning and the same NaNs on every host)
    with np.errstate(invalid="ignore", over="ignore"):
        coef_x_x = fma_f32(np.float32(0.044715) * x, x, np.float32(1.0))
        inner = np.float32(0.7978845608028654) * x * coef_x_x
        gelu = np.float32(0.5) * x * (np.float32(1.0) + libm_f32(np.tanh, inner))
        return gelu.astype(np.float16).astype(np.float32)  # (NaN entries, from NaN bit patterns, stay NaN)


@numba.njit(cache=True, nogil=True)
def geglu(gate, up, table, out, r0, r1):
    """Rows r0..r1-1 of out = gelu(gate) * up (all [m, n]) with ggml-cpu's F16-table GELU: a gate <= -10 gives 0,
    >= 10 the gate itself, otherwise ``table`` (float32 [65536], :func:`gelu_f16_table`) at the gate's F16 bit
    pattern (nearest even); times up in f32. out may alias gate or up."""
    lo = np.float32(-10.0)
    hi = np.float32(10.0)
    for r in range(r0, r1):
        for i in range(gate.shape[1]):
            g = gate[r, i]
            if g <= lo:
                y = np.float32(0.0)
            elif g >= hi:
                y = g
            else:
                y = table[f32_to_f16_bits_scalar(f32_bits(g))]
            out[r, i] = y * up[r, i]


@numba.njit(cache=True, nogil=True)
def rope(x, cos, sin, start, neox, h0, h1):
    """Rotate heads h0..h1-1 of x [m, n_heads, head_dim] in place, row t at position start + t, by the angles of
    the tables cos/sin [n_ctx, n_rot/2]: pair i is (2i, 2i+1) or, with ``neox``, (i, i + n_rot/2); dims past n_rot
    pass through. Each pair (x0, x1) -> (x0·cos − x1·sin, x0·sin + x1·cos) with one product rounded and the other
    fused, as ggml-cpu's ``rotate_pairs`` runs on AArch64 when GCC builds it (its default -ffp-contract=fast; the
    disassembly of llama.cpp's libggml-cpu.so): the normal mode's vectorized loop computes fma(−x1, sin, x0·cos)
    and fma(x0, sin, x1·cos), the NeoX mode's fma(x0, cos, −x1·sin) and fma(x0, sin, x1·cos) — llama.cpp on Arm
    bit for bit (``tests/runtime/test_arm_reference.py``)."""
    half = cos.shape[1]
    for t in range(x.shape[0]):
        p = start + t
        for h in range(h0, h1):
            for i in range(half):
                a = i if neox else 2 * i
                b = a + half if neox else a + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                c = cos[p, i]
                s = sin[p, i]
                x[t, h, a] = fma32(x0, c, -(x1 * s)) if neox else fma32(-x1, s, x0 * c)
                x[t, h, b] = fma32(x0, s, x1 * c)


def _load_cell(cell):  # pragma: no cover - replaced in compiled code by its overload
    """float32 value of one KV-cache cell: F16 bits (uint16) or float32."""
    raise NotImplementedError


@intrinsic
def _fpext_f16(typingctx, bits):  # pragma: no cover - compile time
    """float32 of F16 bits by LLVM's fpext from half (vcvtph2ps with F16C, fcvt on Arm: exact, vectorizes)."""

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


#: fpext from half is a native instruction here (elsewhere LLVM would call a helper the JIT may lack: the table)
_NATIVE_F16 = HAS_F16C or platform.machine().lower() in ("aarch64", "arm64")


@overload(_load_cell)
def _load_cell_impl(cell):  # pragma: no cover - compile time
    if isinstance(cell, types.Integer):
        if _NATIVE_F16:
            return lambda cell: _fpext_f16(cell)
        return lambda cell: F16_BITS_TO_F32[cell]
    return lambda cell: np.float32(cell)


def _store_cell(cache, value):  # pragma: no cover - replaced in compiled code by its overload
    """``value`` (float32) as a cell of ``cache``: F16 bits rounded to nearest even (uint16 cache) or itself."""
    raise NotImplementedError


@intrinsic
def _fptrunc_f16(typingctx, value):  # pragma: no cover - compile time
    """F16 bits of a float32 by LLVM's fptrunc to half (vcvtps2ph with F16C, fcvt on Arm): nearest even, the same
    bits as :func:`~kleidipy.core.numerics.f32_to_f16_bits_scalar` for every value but a signalling NaN (quieted)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@overload(_store_cell)
def _store_cell_impl(cache, value):  # pragma: no cover - compile time
    if cache.dtype == types.uint16:
        if _NATIVE_F16:  # one instruction instead of the bit arithmetic (store_kv 3x faster); NaN by numpy's rule

            def native(cache, value):
                x = np.float32(value)
                return _fptrunc_f16(x) if x == x else f32_to_f16_bits_scalar(f32_bits(x))

            return native
        return lambda cache, value: f32_to_f16_bits_scalar(f32_bits(np.float32(value)))
    return lambda cache, value: np.float32(value)
