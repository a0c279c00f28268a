"""The compiled node kernels (kleidipy.ops.elementwise, kleidipy.ops.attention) against plain-numpy statements of the
same fixed-order formulas, bit for bit, and every row/head split (2 and 3 pieces) against one call; ggml_v_expf also
against float64 exp."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from kleidipy.core.numerics import fma_f32
from kleidipy.kernels.bf16p_bf16p.ukernels import bf16_matmul_reference
from kleidipy.ops import attention, elementwise
from kleidipy.ops.attention import cells
from kleidipy.ops.elementwise import gelu_f16_table, libm_f32
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.kv_cache import KVCache
from kleidipy.target import parse_target

F32 = np.float32


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(_bits(a), _bits(b))


def _f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _splits(n: int) -> list[list[tuple[int, int]]]:
    """One piece, two and three pieces of range(n)."""
    return [[(0, n)], [(0, n // 2), (n // 2, n)], [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]]


# ---------------------------------------------------------------------------------------------------------------
# expf


def expf_numpy(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (NEON) per lane, straight from its statement: fused steps via core.numerics.fma_f32."""
    x = np.asarray(x, np.float32)
    r = F32(float.fromhex("0x1.8p23"))
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        z = fma_f32(x, F32(float.fromhex("0x1.715476p+0")), r)
        n = (z - r).astype(np.float32)
        b = fma_f32(-n, F32(float.fromhex("0x1.62e4p-1")), x)
        b = fma_f32(-n, F32(float.fromhex("0x1.7f7d1cp-20")), b)
        e = (z.view(np.uint32).astype(np.uint64) << 23) & 0xFFFFFFFF
        k = ((e + 0x3F800000) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
        u = b * b
        c = [F32(float.fromhex(h)) for h in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3")]
        c += [F32(float.fromhex(h)) for h in ("0x1.573e2ep-5", "0x1.0e4020p-7")]
        j = fma_f32(fma_f32(fma_f32(c[4], b, c[3]), u, fma_f32(c[2], b, c[1])), u, c[0] * b)
        d = np.where(n <= 0, 0x82000000, 0).astype(np.uint64)
        s1 = ((d + 0x7F000000) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
        s2 = ((e - d) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
        slow = fma_f32(s2, j, s2) * s1
        return np.where(np.abs(n) > 192, s1 * s1, np.where(np.abs(n) > 126, slow, fma_f32(k, j, k))).astype(np.float32)


@numba.njit(cache=False)
def _expf_all(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = elementwise.expf(x[i])
    return out


def test_expf_hand_points() -> None:
    # n = 0, b = x: the polynomial alone; n = 1 at ln 2; flushes; special values
    points = np.array([0.0, -0.0, 1.0, -1.0, np.log(2), 10.0, -10.0], np.float32)
    want = np.array([1.0, 1.0, 2.7182819843, 0.3678794503, 2.0, 22026.4648437, 4.5399931e-05], np.float32)
    got = _expf_all(points)
    np.testing.assert_allclose(got, want, rtol=2.5e-7)
    assert _same(got, expf_numpy(points))
    assert got[0] == 1.0 and got[4] == 2.0
    edge = _expf_all(np.array([-np.inf, np.inf, np.nan, -104.0, -200.0, 89.0, 200.0, 88.3762626647949], np.float32))
    assert edge[0] == 0 and edge[1] == np.inf and np.isnan(edge[2])
    assert edge[3] == 0 and edge[4] == 0 and edge[5] == np.inf and edge[6] == np.inf
    assert np.isfinite(edge[7])  # the largest input that stays finite (ggml: "above 88.38 flush to infinity")


def test_expf_matches_its_statement_and_exp() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.uniform(-110, 90, 400_000).astype(np.float32),
            rng.standard_normal(100_000).astype(np.float32) * F32(1e-3),
            np.linspace(-104, -86, 50_000, dtype=np.float32),  # subnormal results and the |n| > 126 path
            np.linspace(86, 88.7, 20_000, dtype=np.float32),  # the |n| > 126 path near overflow
            rng.integers(0, 2**32, 100_000, dtype=np.uint32).view(np.float32),  # any bits (NaN, inf, huge)
        ]
    )
    got = _expf_all(x)
    want = expf_numpy(x)
    nan = np.isnan(got)
    assert np.array_equal(nan, np.isnan(want)) and np.array_equal(nan, np.isnan(x))
    assert _same(got[~nan], want[~nan])
    finite = np.isfinite(x) & (x > -103.9) & (x < 88.37)
    exact = np.exp(x[finite].astype(np.float64))
    # error in ulps of the float32 result (subnormal results: ulp 2^-149)
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    err = np.abs(got[finite].astype(np.float64) - exact) / ulp
    assert err.max() <= 2.0, float(err.max())


def test_expf_is_monotonic() -> None:
    x = np.linspace(-110, 90, 4_000_001, dtype=np.float32)
    y = _expf_all(x)
    assert np.all(y[1:] >= y[:-1])


# ---------------------------------------------------------------------------------------------------------------
# row ops


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1)


def test_rms_norm(rng: np.random.Generator) -> None:
    x = (rng.standard_normal((7, 96)) * 3).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    eps = 1e-6
    total = np.cumsum((x * x).astype(np.float64), axis=1)[:, -1]  # sequential f64 sum of f32 squares
    scale = F32(1.0) / np.sqrt((total / x.shape[1]).astype(np.float32) + F32(eps))
    want = (x * scale[:, None]) * w
    for pieces in _splits(7):
        out = np.empty_like(x)
        for r0, r1 in pieces:
            elementwise.rms_norm(x, w, eps, out, r0, r1)
        assert _same(out, want)
    inplace = x.copy()
    elementwise.rms_norm(inplace, w, eps, inplace, 0, 7)
    assert _same(inplace, want)


def test_add_add_row_scale(rng: np.random.Generator) -> None:
    a, b = rng.standard_normal((2, 5, 33)).astype(np.float32)
    bias = rng.standard_normal(33).astype(np.float32)
    for pieces in _splits(5):
        out, row, scaled = np.empty_like(a), a.copy(), a.copy()
        for r0, r1 in pieces:
            elementwise.add(a, b, out, r0, r1)
            elementwise.add_row(row, bias, r0, r1)
            elementwise.scale(scaled, 0.3, r0, r1)
        assert _same(out, a + b) and _same(row, a + bias) and _same(scaled, a * F32(0.3))


def test_swiglu(rng: np.random.Generator) -> None:
    gate = (rng.standard_normal((6, 70)) * 8).astype(np.float32)
    gate[0, :4] = [0.0, -0.0, 120.0, -120.0]
    up = rng.standard_normal((6, 70)).astype(np.float32)
    with np.errstate(over="ignore"):
        want = (gate / (F32(1.0) + expf_numpy(F32(0.0) - gate))) * up
    for pieces in _splits(6):
        out = np.empty_like(gate)
        for r0, r1 in pieces:
            elementwise.swiglu(gate, up, out, r0, r1)
        assert _same(out, want)
    g = gate.copy()
    elementwise.swiglu(g, up, g, 0, 6)
    assert _same(g, want)


def test_geglu(rng: np.random.Generator) -> None:
    gate = (rng.standard_normal((5, 64)) * 6).astype(np.float32)
    gate[0, :6] = [-10.0, 10.0, -10.5, 10.5, 0.0, 65519.0]
    up = rng.standard_normal((5, 64)).astype(np.float32)
    table = gelu_f16_table()
    looked = table[gate.astype(np.float16).view(np.uint16)]
    want = np.where(gate <= -10, F32(0.0), np.where(gate >= 10, gate, looked)) * up
    for pieces in _splits(5):
        out = np.empty_like(gate)
        for r0, r1 in pieces:
            elementwise.geglu(gate, up, table, out, r0, r1)
        assert _same(out, want)


def test_rope_tables_are_the_c_librarys_cosf_sinf() -> None:
    """RoPE's cos/sin tables call the C library's cosf/sinf, as ggml's rope cache does (glibc's differ from float64
    rounded once by an ulp in about 1 % of the entries, and such an ulp can flip an F16 rounding downstream)."""
    import ctypes
    import ctypes.util

    from kleidipy.ops.elementwise import c_libm_f32
    from kleidipy.runtime.hparams import RopeType
    from kleidipy.runtime.layers import RoPE

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    for name in ("cosf", "sinf"):
        getattr(libm, name).restype, getattr(libm, name).argtypes = ctypes.c_float, [ctypes.c_float]
    rope = RoPE(64, RopeType.NORM, 10000.0, 1.0, 300)
    theta = np.float32(10000.0) ** (np.float32(-2.0) / np.float32(64))  # (any angles: the call is what is checked)
    angles = np.arange(300, dtype=np.float32)[:, None] * theta ** np.arange(32, dtype=np.float32)
    want = np.vectorize(lambda t: np.float32(libm.cosf(float(t))), otypes=[np.float32])(angles)
    assert _same(c_libm_f32("cosf", angles), want)
    assert (c_libm_f32("cosf", angles) != libm_f32(np.cos, angles)).any()  # (glibc's: not float64 rounded once)
    for p in (0, 17, 299):
        for i in (0, 5, 31):
            assert rope.cos[p, i] == np.float32(libm.cosf(_rope_angle(10000.0, 64, p, i)))
            assert rope.sin[p, i] == np.float32(libm.sinf(_rope_angle(10000.0, 64, p, i)))
    with pytest.raises(ValueError, match="cosf, sinf"):
        c_libm_f32("tanhf", angles)


def _rope_angle(base: float, n_rot: int, p: int, i: int) -> float:
    """ggml's angle of pair i at position p: p times theta_scale i times, each product rounded to f32
    (theta_scale = powf(base, -2/n_rot))."""
    scale, theta = libm_f32(np.power, np.float32(base), np.float32(-2.0) / np.float32(n_rot)), np.float32(p)
    for _ in range(i):
        theta = np.float32(theta * scale)
    return float(theta)


def test_gelu_table_entry_as_llama_cpp_arm_has_it() -> None:
    """llama.cpp's table on aarch64 (GCC's ``fmadd`` for ``1.0f + GELU_COEF_A*x*x``, read from the 0c1e570 build's
    disassembly and its table computed under QEMU, tests/data/llama_cpp_arm/README.md): at x = −1.9990234375 it holds
    −0.045501708984375, one F16 step from the unfused value."""
    table = gelu_f16_table()
    assert np.float16(-1.9990234375).view(np.uint16) == 0xBFFF
    assert table[0xBFFF] == F32(-0.045501708984375)
    assert table[0x3C00] == F32(np.float16(0.8411920070648193))  # (gelu(1.0), unchanged)


@pytest.mark.parametrize("neox", [False, True])
def test_rope(rng: np.random.Generator, neox: bool) -> None:
    m, n_heads, d, n_rot, start = 4, 6, 16, 12, 5
    x = rng.standard_normal((m, n_heads, d)).astype(np.float32)
    cos, sin = rng.standard_normal((2, 20, n_rot // 2)).astype(np.float32)
    want = x.copy()
    half = n_rot // 2
    a = np.arange(half) if neox else 2 * np.arange(half)
    b = a + half if neox else a + 1
    c, s = cos[start : start + m, None, :], sin[start : start + m, None, :]
    x0, x1 = x[:, :, a], x[:, :, b]
    # ggml-cpu's rotate_pairs as GCC fuses it on AArch64: one product rounded, the other fused
    first = fma_f32(x0, c, -(x1 * s)) if neox else fma_f32(-x1, s, x0 * c)
    want[:, :, a], want[:, :, b] = first, fma_f32(x0, s, x1 * c)
    assert not _same(first, x0 * c - x1 * s)  # (the fused rounding shows on random data)
    for pieces in _splits(n_heads):
        got = x.copy()
        for h0, h1 in pieces:
            elementwise.rope(got, cos, sin, start, neox, h0, h1)
        assert _same(got, want)


@pytest.mark.parametrize("f16", [True, False])
def test_store_kv(rng: np.random.Generator, f16: bool) -> None:
    m, n_head_kv, d, n_ctx, start = 3, 3, 8, 20, 14  # (positions 14..16 span two blocks of 16 cells)
    k, v = (rng.standard_normal((2, m, n_head_kv * d)) * 100).astype(np.float32)
    k[0, :8] = [1e6, -1e-9, np.float32(65520.0), np.float32(65519.996), 3e-8, -6e-8, np.inf, -0.0]
    k[1, :3] = np.array([0x7FC00001, 0xFF800123, 0x7F812345], np.uint32).view(np.float32)  # NaNs, a signalling one
    dtype = np.float16 if f16 else np.float32
    for pieces in _splits(n_head_kv):
        cache = KVCache(1, n_head_kv, d, n_ctx, dtype)
        kc, vc = cache.layer(0)
        for h0, h1 in pieces:
            attention.store_kv(k, v, kc, vc, start, m, h0, h1)
        with np.errstate(over="ignore"):
            want_k, want_v = (x.reshape(m, n_head_kv, d).transpose(1, 0, 2).astype(dtype) for x in (k, v))
        got_k, got_v = cache.read(0, n_ctx)
        for got, want in ((got_k, want_k), (got_v, want_v)):
            assert np.array_equal(got[:, start : start + m].view(np.uint8), want.view(np.uint8))
            assert not got[:, :start].any() and not got[:, start + m :].any()
        # the layout attention reads: K by blocks of 16 cells, dimension-major within; V lane-major
        p, c = start + 2, 5
        assert kc[1, p // 16, c * 16 + p % 16] == cells(want_k[1, 2:3, c])[0]
        assert vc[1, p % 16, (p // 16) * d + c] == cells(want_v[1, 2:3, c])[0]


# ---------------------------------------------------------------------------------------------------------------
# attention


def _reduce16(lanes: np.ndarray) -> np.ndarray:
    """GGML_F32x4_REDUCE + pairwise vaddvq_f32 of lanes [..., 16]."""
    v8 = lanes[..., :8] + lanes[..., 8:]
    v4 = v8[..., :4] + v8[..., 4:]
    return (v4[..., 0] + v4[..., 1]) + (v4[..., 2] + v4[..., 3])


def softcap_numpy(x: np.ndarray, cap: float) -> np.ndarray:
    """llama.cpp's soft-cap in numpy: ggml_scale by (float)(1/cap), glibc's tanhf (as libm_f32 states it), then
    ggml_scale by cap, each rounded to f32."""
    inv = F32(1.0) / F32(cap)
    return (libm_f32(np.tanh, x.astype(np.float32) * inv) * F32(cap)).astype(np.float32)


def test_softcap(rng: np.random.Generator) -> None:
    """Elements e0..e1-1 (in memory order: from inside one row to inside another) capped in place, the others
    untouched; values past the cap come out inside (-cap, cap)."""
    cap = 7.5
    x = (rng.standard_normal((6, 37)) * 20).astype(np.float32)
    assert np.abs(x).max() > cap  # (some do cap)
    out = x.copy()
    elementwise.softcap(out, cap, 40, 190)
    flat, want = out.reshape(-1), x.reshape(-1)
    assert _same(flat[40:190], softcap_numpy(want[40:190], cap))
    assert _same(flat[:40], want[:40]) and _same(flat[190:], want[190:])
    assert np.abs(flat[40:190]).max() <= cap


def _cells_read(m: int, start: int, n_kv: int, window: int) -> list[tuple[int, int, int]]:
    """(row, first cell, last cell + 1) that each query row i (at position start + i) reads."""
    rows = []
    for i in range(m):
        p = start + i
        rows.append((i, max(0, p - window + 1) if window else 0, min(p + 1, n_kv)))
    return rows


def attention_weights_numpy(q, kc, start, n_kv, scale, window, f16, cap=0.0):
    """The softmax weights of attention.attention in numpy, before any rounding to F16: q [m, n_head, d], kc
    [n_head_kv, n_ctx, d] float32 holding the cache's values (q rounded to F16 with ``f16``; scores soft-capped when
    ``cap`` > 0); returns [m, n_head, n_kv], 0 at each row's masked cells."""
    m, n_head, d = q.shape
    group = n_head // kc.shape[0]
    d16 = d - d % 16
    out = np.zeros((m, n_head, n_kv), np.float32)
    for i, jlo, jhi in _cells_read(m, start, n_kv, window):
        for h in range(n_head):
            qv = _f16(q[i, h]) if f16 else q[i, h]
            k = kc[h // group, jlo:jhi]
            lanes = np.zeros((jhi - jlo, 16), np.float32)
            for t in range(0, d16, 16):
                lanes = fma_f32(qv[None, t : t + 16], k[:, t : t + 16], lanes)
            dot = _reduce16(lanes).astype(np.float64)
            for c in range(d16, d):
                dot += (qv[c] * k[:, c]).astype(np.float64)
            s = dot.astype(np.float32)
            if cap:
                s = softcap_numpy(s, cap)
            s = s * F32(scale)
            e = expf_numpy(s - s.max())
            cells = np.zeros(-(-jhi // 4) * 4, np.float32)
            cells[jlo:jhi] = e
            quads = cells.reshape(-1, 4)
            total = np.cumsum(((quads[:, 0] + quads[:, 1]) + (quads[:, 2] + quads[:, 3])).astype(np.float64))[-1]
            out[i, h, jlo:jhi] = e * F32(1.0 / total)
    return out


def attention_numpy(q, kc, vc, start, n_kv, scale, window, f16, cap=0.0):
    """The fixed-order formula of attention.attention in numpy: q [m, n_head, d], kc/vc [n_head_kv, n_ctx, d] float32
    holding the cache's values (scores soft-capped when ``cap`` > 0); returns [m, n_head * d]."""
    m, n_head, d = q.shape
    group = n_head // kc.shape[0]
    weights = attention_weights_numpy(q, kc, start, n_kv, scale, window, f16, cap)
    out = np.zeros((m, n_head * d), np.float32)
    for i, jlo, jhi in _cells_read(m, start, n_kv, window):
        for h in range(n_head):
            w = _f16(weights[i, h]) if f16 else weights[i, h]
            acc = np.zeros((16, d), np.float32)
            for j in range(jlo, jhi):
                acc[j % 16] = fma_f32(w[j], vc[h // group, j], acc[j % 16])
            out[i, h * d : (h + 1) * d] = _reduce16(acc.T)
    return out


@pytest.mark.parametrize(
    ("m", "start", "n_head", "n_head_kv", "d", "window", "f16"),
    [
        (1, 0, 2, 1, 32, 0, True),
        (1, 37, 6, 2, 32, 0, True),
        (5, 0, 4, 4, 16, 0, False),
        (7, 13, 6, 3, 48, 0, True),
        (7, 13, 6, 3, 48, 0, False),
        (6, 20, 4, 2, 32, 5, True),
        (1, 30, 4, 1, 32, 8, False),
        (4, 3, 3, 1, 40, 0, True),  # d % 16 != 0: ggml's f64 leftovers
        (3, 140, 4, 2, 32, 0, True),  # several blocks of cells
        (5, 140, 2, 1, 32, 100, False),
        (9, 140, 4, 2, 64, 37, True),  # a batch over f32 blocks from an unaligned window start
        (33, 0, 2, 1, 64, 0, False),
        (20, 5, 3, 1, 32, 0, True),
        (2, 15, 2, 2, 16, 0, True),
    ],
)
def test_attention(
    rng: np.random.Generator, m: int, start: int, n_head: int, n_head_kv: int, d: int, window: int, f16: bool
) -> None:
    n_ctx = start + m + 3
    n_kv = start + m
    q = (rng.standard_normal((m, n_head, d)) * 2).astype(np.float32)
    dtype = np.float16 if f16 else np.float32
    kc, vc = rng.standard_normal((2, n_head_kv, n_ctx, d)).astype(dtype)
    scale = 1 / np.sqrt(d)
    want = attention_numpy(q, kc.astype(np.float32), vc.astype(np.float32), start, n_kv, scale, window, f16)
    cache = KVCache(1, n_head_kv, d, n_ctx, dtype)
    cache.store(0, 0, kc.transpose(1, 0, 2).astype(np.float32), vc.transpose(1, 0, 2).astype(np.float32))
    ops_k, ops_v = cache.layer(0)
    for pieces in _splits(n_head):
        out = np.full((m, n_head * d), np.nan, np.float32)
        for h0, h1 in pieces:
            scratch = np.full(attention.attention_scratch_size(n_ctx, d), np.nan, np.float32)
            attention.attention(q, ops_k, ops_v, start, m, n_kv, scale, window, f16, out, scratch, h0, h1, 0, 1)
        assert _same(out, want)
    for gstep in (2, 3):  # all heads, every gstep-th group of ROWS rows per call (the plan's split of a prefill)
        out = np.full((m, n_head * d), np.nan, np.float32)
        for g0 in range(gstep):
            scratch = np.full(attention.attention_scratch_size(n_ctx, d), np.nan, np.float32)
            attention.attention(q, ops_k, ops_v, start, m, n_kv, scale, window, f16, out, scratch, 0, n_head, g0, gstep)
        assert _same(out, want)


@pytest.mark.parametrize(
    ("m", "start", "d", "window", "f16"),
    [(1, 37, 32, 0, True), (9, 140, 64, 37, True), (4, 3, 40, 0, False), (6, 20, 32, 5, False)],
)
def test_attention_softcap(rng: np.random.Generator, m: int, start: int, d: int, window: int, f16: bool) -> None:
    """Scores soft-capped before the softmax (Gemma 2), on the batch tiles, the decode path and the any-head_dim
    path; the scale after the cap (Gemma 2 scales Q and gives attention 1.0); some scores exceed the cap."""
    n_head, n_head_kv, cap = 4, 2, 5.0
    n_ctx, n_kv = start + m + 3, start + m
    q = (rng.standard_normal((m, n_head, d)) * 2).astype(np.float32)
    dtype = np.float16 if f16 else np.float32
    kc, vc = rng.standard_normal((2, n_head_kv, n_ctx, d)).astype(dtype)
    scores = np.einsum("mhd,nd->mhn", q[:, ::2], kc[0].astype(np.float32))
    assert np.abs(scores).max() > 2 * cap
    want = attention_numpy(q, kc.astype(np.float32), vc.astype(np.float32), start, n_kv, 0.75, window, f16, cap)
    assert not _same(
        want, attention_numpy(q, kc.astype(np.float32), vc.astype(np.float32), start, n_kv, 0.75, window, f16)
    )
    cache = KVCache(1, n_head_kv, d, n_ctx, dtype)
    cache.store(0, 0, kc.transpose(1, 0, 2).astype(np.float32), vc.transpose(1, 0, 2).astype(np.float32))
    ops_k, ops_v = cache.layer(0)
    out = np.full((m, n_head * d), np.nan, np.float32)
    scratch = np.full(attention.attention_scratch_size(n_ctx, d), np.nan, np.float32)
    attention.attention(q, ops_k, ops_v, start, m, n_kv, 0.75, window, f16, out, scratch, 0, n_head, 0, 1, cap)
    assert _same(out, want)


def test_attention_close_to_float64(rng: np.random.Generator) -> None:
    """The fixed order is still attention: a float64 softmax-weighted sum within F16 rounding."""
    m, start, n_head, d = 3, 9, 2, 64
    q = rng.standard_normal((m, n_head, d)).astype(np.float32)
    kc, vc = rng.standard_normal((2, 1, start + m, d)).astype(np.float32)
    out = np.empty((m, n_head * d), np.float32)
    scratch = np.empty(attention.attention_scratch_size(start + m, d), np.float32)
    cache = KVCache(1, 1, d, start + m, np.float32)
    cache.store(0, 0, kc.transpose(1, 0, 2), vc.transpose(1, 0, 2))
    attention.attention(q, *cache.layer(0), start, m, start + m, 0.125, 0, False, out, scratch, 0, n_head, 0, 1)
    for i in range(m):
        s = kc[0, : start + i + 1].astype(np.float64) @ q[i].T.astype(np.float64) * 0.125
        w = np.exp(s - s.max(axis=0))
        w /= w.sum(axis=0)
        want = (w.T @ vc[0, : start + i + 1].astype(np.float64)).reshape(-1)
        np.testing.assert_allclose(out[i], want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# attention with the KV-cache GEMM (llama.cpp master on SME2: kleidiai.cpp takes the KQV of a batch)


def _bf16_rne(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 rounded to nearest even (BFCVT: the lhs_pack_bf16p2vlx2_f32_sme and
    rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme conversions), as float64 values (finite inputs)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def attention_kv_gemm_numpy(q, kc, vc, start, n_kv, scale, window, cap=0.0):
    """llama.cpp master's attention over an F16 cache for a batch, in numpy: KQ and the softmax as ggml computes them
    (q rounded to F16), the weights left in f32 (the KQV's src1 is not converted to F16: KleidiAI takes the MUL_MAT);
    then kleidiai.cpp ``compute_forward_fp16`` per head (its KV head h // (n_head / n_head_kv)): the weights over
    llama.cpp's n_kv (padded to 256 cells: 0 weights and the cleared cells' 0 values) rounded to BF16, V (F16 ->
    exact f32 K x N, ``transpose_f32kxn_f16nxk``) rounded to BF16, zero bias, then the SME2 BFMOPA kernel's sum of
    pairs (the family's reference, checked against KleidiAI's golden data)."""
    m, n_head, d = q.shape
    group = n_head // kc.shape[0]
    weights = attention_weights_numpy(q, kc, start, n_kv, scale, window, True, cap)
    padded = -(-n_kv // 256) * 256
    out = np.zeros((m, n_head * d), np.float32)
    for h in range(n_head):
        lhs = np.zeros((m, padded), np.float32)
        lhs[:, :n_kv] = weights[:, h]
        rhs = np.zeros((padded, d), np.float32)
        rhs[:n_kv] = vc[h // group, :n_kv]
        res = bf16_matmul_reference(_bf16_rne(lhs), _bf16_rne(rhs), np.zeros(d, np.float32), False)
        out[:, h * d : (h + 1) * d] = np.clip(res, -np.finfo(F32).max, np.finfo(F32).max)
    return out


@pytest.mark.parametrize(
    ("m", "start", "n_head", "n_head_kv", "d", "window", "cap", "svl"),
    [
        (2, 0, 2, 1, 32, 0, 0.0, 512),
        (5, 0, 4, 2, 32, 0, 0.0, 128),
        (7, 13, 6, 3, 48, 0, 0.0, 512),  # SmolLM2's GQA 9/3 in small
        (4, 3, 3, 1, 40, 0, 0.0, 256),  # d % 16 != 0
        (9, 140, 4, 2, 64, 37, 0.0, 512),  # a sliding window (Gemma 3's local layers)
        (6, 20, 4, 2, 32, 5, 5.0, 512),  # soft-capped scores (Gemma 2)
        (33, 0, 2, 1, 64, 0, 0.0, 512),
        (70, 0, 2, 1, 32, 0, 0.0, 512),  # blocks of KV_GEMM_ROWS rows, each over the cells its rows read
        (75, 11, 2, 1, 32, 21, 0.0, 256),  # ... from a pair before a window's start
    ],
)
def test_attention_kv_gemm(
    rng: np.random.Generator,
    m: int,
    start: int,
    n_head: int,
    n_head_kv: int,
    d: int,
    window: int,
    cap: float,
    svl: int,
) -> None:
    """The KQV through the table's GEMM, bit for bit llama.cpp's computation (the numpy oracle above), for any split
    of the heads and any SVL; the padding of n_kv to llama.cpp's 256 cells changes no bit; not the ggml path's bits
    (its weights are rounded to F16, its V is not rounded to BF16)."""
    kv_gemm = KleidiBackend(parse_target(f"sme2:svl={svl}"), notice=lambda _: None).kv_gemm
    assert kv_gemm is not None and kv_gemm.name == "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa"
    n_ctx, n_kv = start + m + 3, start + m
    q = (rng.standard_normal((m, n_head, d)) * 2).astype(np.float32)
    kc, vc = rng.standard_normal((2, n_head_kv, n_ctx, d)).astype(np.float16)
    scale = 1 / np.sqrt(d)
    want = attention_kv_gemm_numpy(q, kc.astype(np.float32), vc.astype(np.float32), start, n_kv, scale, window, cap)
    cache = KVCache(1, n_head_kv, d, n_ctx, np.float16)
    cache.store(0, 0, kc.transpose(1, 0, 2).astype(np.float32), vc.transpose(1, 0, 2).astype(np.float32))
    ops_k, ops_v = cache.layer(0)
    for pieces in _splits(n_head):
        out = np.full((m, n_head * d), np.nan, np.float32)
        for h0, h1 in pieces:
            attention.attention_kv_gemm(
                q, ops_k, ops_v, start, m, n_kv, scale, window, out, h0, h1, kv_gemm.params, cap
            )
        assert _same(out, want)
    ggml = attention_numpy(q, kc.astype(np.float32), vc.astype(np.float32), start, n_kv, scale, window, True, cap)
    assert not _same(want, ggml)
    np.testing.assert_allclose(want, ggml, rtol=0.05, atol=0.02)  # (BF16 V: 8 bits of mantissa)


def test_kv_gemm_is_the_master_tables_on_sme2_only() -> None:
    """The seeds' table, SME without SME2 and the NEON targets keep ggml's F16 matmul for the KQV."""
    for spec in ("sme2:svl=512,table=seeds", "sme:svl=512", "i8mm", "dotprod"):
        assert KleidiBackend(parse_target(spec), notice=lambda _: None).kv_gemm is None
