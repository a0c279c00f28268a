"""Exact float32 primitives: single-rounded fma, Arm clamp semantics."""

import numpy as np

from kleidipy.core.numerics import clamp_f32, fma_f32


def test_clamp_orders_signed_zeros_as_arm_fmax_fmin():
    x = np.array([-0.0, 0.0, 1.0, -3.0, 5.0, np.inf], np.float32)
    lo0 = clamp_f32(x, 0.0, 4.0)
    assert lo0.tolist() == [0, 0, 1, 0, 4, 4] and not np.signbit(lo0).any()
    hi0 = clamp_f32(x, -2.0, -0.0)
    assert hi0.tolist() == [0, 0, 0, -2, 0, 0] and np.signbit(hi0).all()
    assert clamp_f32(x, -1e38, 1e38)[-1] == np.float32(1e38)


def test_fma_is_single_rounded():
    from fractions import Fraction

    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(2000).astype(np.float32) for _ in range(3))
    c *= np.float32(1e-3)
    got = fma_f32(a, b, c)
    for i in range(0, 2000, 7):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        cand = np.float32(float(exact))
        neighbours = [cand, np.nextafter(cand, np.float32(np.inf)), np.nextafter(cand, np.float32(-np.inf))]
        best = min(neighbours, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.float32(v).view(np.int32)) & 1))
        assert got[i] == best


def test_f16_table_is_exact_and_host_independent() -> None:
    """Every fp16 number converts exactly (as numpy does); NaNs come out quieted with their payload, as Arm's FCVT
    gives them on every host (numpy's conversion keeps a signalling NaN signalling on x86 only); no warning."""
    import warnings

    import numpy as np

    from kleidipy.core import numerics

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = numerics._f16_table()
    ref = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    numbers = ~np.isnan(ref)
    assert table[numbers].view(np.uint32).tobytes() == ref[numbers].view(np.uint32).tobytes()
    assert np.isnan(table[~numbers]).all()
    assert [hex(int(table[b].view(np.uint32))) for b in (0x7C01, 0x7E00, 0xFC01)] == [
        "0x7fc02000",
        "0x7fc00000",
        "0xffc02000",
    ]
    assert table.tobytes() == numerics.F16_BITS_TO_F32.tobytes()
