"""Helpers the kernel family tests share: a family's golden runs through the verifier's own functions, exact
rational models of float rounding (independent of numpy) for the scalar kernel models, and a bit comparison."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np

from kleidipy.core.matmul import MatmulKernel
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.observer import KernelCall, Observer
from kleidipy.tools import asm
from kleidipy.tools.golden import GoldenSet, iter_runs, verify_run


def family_runs(golden_dir: Path, family: str) -> tuple[GoldenSet, list[tuple[dict, dict]]]:
    """The golden set and the (case, run) pairs of one family's ``ok`` runs."""
    golden = GoldenSet(golden_dir)
    runs = [(c, r) for c, r in iter_runs(golden) if r.get("family") == family and r.get("status") == "ok"]
    return golden, runs


def verify_family(golden_dir: Path, family: str, execution: str) -> tuple[int, list[str]]:
    """verify_run over every ``ok`` run of one family (packed buffers shared between the runs of one case only):
    the number of runs and the lines of those that failed."""
    golden, runs = family_runs(golden_dir, family)
    caches: dict[int, dict] = {}
    failures = [
        res.line()
        for case, run in runs
        if not (res := verify_run(golden, case, run, execution, caches.setdefault(id(case), {}))).ok
    ]
    return len(runs), failures


def round_binary(x: Fraction, precision: int, emin: int) -> Fraction:
    """x rounded to nearest even in a binary format (precision bits, min normal exponent emin); no overflow."""
    if x == 0:
        return Fraction(0)
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, emin) - precision + 1)
    units = a / ulp
    whole = math.floor(units)
    rest = units - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    return (whole * ulp) * (1 if x > 0 else -1)


def exact_round(q: Fraction, to_odd: bool = False) -> float:
    """float32 value of the rational q: round to nearest even with gradual underflow (IEEE float32), or round to
    odd with flush to zero below 2^-126 (BF16 EBF = 0 steps). Overflow gives ±inf; an exact 0 gives +0."""
    if not to_odd:
        value = float(round_binary(q, 24, -126))
        return math.copysign(math.inf, value) if abs(value) >= 2.0**128 else value
    if q == 0:
        return 0.0
    sign, a = (-1.0 if q < 0 else 1.0), abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    if e < -126:
        return sign * 0.0
    scaled = a / Fraction(2) ** (e - 23)
    i = math.floor(scaled)
    i += 1 if scaled - i and i % 2 == 0 else 0
    value = math.ldexp(i, e - 23)
    return sign * (math.inf if value >= 2.0**128 else value)


def exact_fma(a: float, b: float, c: float) -> np.float32:
    """IEEE binary32 fma of float32 values on exact rationals: a·b + c with one rounding (nearest even), and the
    signed-zero rules (an exact zero is −0 only when the product is a −0 and c is −0)."""
    a, b, c = float(a), float(b), float(c)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return np.float32(exact_round(exact))
    product_negative = math.copysign(1.0, a) * math.copysign(1.0, b) < 0
    negative_zero = (a == 0 or b == 0) and c == 0 and product_negative and math.copysign(1.0, c) < 0
    return np.float32(-0.0 if negative_zero else 0.0)


def assert_threads_keep_bits(
    kernel: MatmulKernel, m: int, n: int, k: int, lhs_packed: np.ndarray, rhs_packed: np.ndarray, executions: tuple
) -> None:
    """``kernel.run`` on 2 threads (columns split in multiples of n_step) gives the bits of 1 thread."""
    for execution in executions:
        one = kernel.run(m, n, k, lhs_packed, rhs_packed, execution=execution)
        two = kernel.run(m, n, k, lhs_packed, rhs_packed, execution=execution, threads=2, min_split_macs=0)
        assert bits_equal(one, two)


def assert_sme_geometry(mopa_name: str, dot_name: str, svls: tuple[int, ...], kr: int, sr: int) -> None:
    """The SME 1VL × 4VL kernels at every SVL: the MOPA GEMM steps and packs VL rows × 4VL columns, the GEMV one
    row × 4VL columns, both with the given kr, sr."""
    for svl in svls:
        vl = svl // 32
        mopa, dot = get_kernel(mopa_name, svl), get_kernel(dot_name, svl)
        assert (mopa.m_step, mopa.n_step, mopa.mr, mopa.nr, mopa.kr, mopa.sr) == (vl, 4 * vl, vl, 4 * vl, kr, sr)
        assert (dot.m_step, dot.n_step, dot.mr, dot.nr, dot.kr, dot.sr) == (1, 4 * vl, 1, 4 * vl, kr, sr)


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Both float32, same shape and the same bit patterns: what "exact" means for a kernel's output (−0.0 is not
    +0.0, NaN payloads count), where value equality would let signed zeros and NaNs through."""
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
    )


class MatmulRecorder(Observer):
    """An observer that keeps every MUL_MAT event (:class:`~kleidipy.observer.KernelCall`)."""

    wants_matmuls = True

    def __init__(self) -> None:
        self.calls: list[KernelCall] = []

    def on_matmul(self, call: KernelCall) -> None:
        self.calls.append(call)


def make_problem(seed: int, m: int, n: int, k: int, scale_exp: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    lhs = (rng.standard_normal((m, k)) * 2.0**scale_exp).astype(np.float32)
    rhs = (rng.standard_normal((k, n)) * 0.5).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return lhs, rhs, bias


def mixed_f32(
    rng: np.random.Generator, shape: int | tuple[int, ...], lo: float, hi: float, subnormals: bool = True
) -> np.ndarray:
    """Mixed-sign float32 of magnitudes in [lo, hi] (log-uniform), with some ±0 and (``subnormals``) some 1e-40."""
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), size=shape)) * rng.choice([-1.0, 1.0], size=shape)
    v = mag.astype(np.float32)
    v[rng.random(shape) < 0.05] = 0.0
    v[rng.random(shape) < 0.05] = -0.0
    if subnormals:
        v[rng.random(shape) < 0.03] = np.float32(1e-40)
    return v


def mnemonics(text: str) -> Counter:
    """Instructions per mnemonic in LLVM's assembly text."""
    return Counter(line.mnemonic for line in asm.parse(text) if line.mnemonic)


def portable_int8_lines(text: str) -> list[str]:
    """The lines of aarch64 assembly that LLVM makes of portable int8 dot products (widening multiplies and adds,
    sign extensions, vector multiplies): none in a native tile."""
    widening = ("smull", "smull2", "smlal", "smlal2", "sxtl", "sxtl2", "saddw", "saddw2")
    return [
        line.text
        for line in asm.parse(text)
        if line.mnemonic in widening or (line.mnemonic in ("mul", "mla") and line.operands[:1] == "v")
    ]
