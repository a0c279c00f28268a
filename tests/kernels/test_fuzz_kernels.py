"""The kernel misuse matrix: every catalogue kernel x every execution x every kind of bad shape, buffer, dtype,
non-finite value and option, through pack_lhs / pack_rhs / run / prepare / GET_ROWS. Each case must work or raise
a KleidipyError; the matrix is exhaustive, not sampled."""

from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np
import pytest
from fuzzing import Tally, outcome
from gguf import GGMLQuantizationType as T

from kleidipy.core.buffers import EXECUTIONS, PackedBuffer
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.packers import RhsPacker
from kleidipy.kernels.catalogue import all_kernels

K = 64
Case = Callable[[MatmulKernel, str], object]


def rhs_inputs(packer: RhsPacker, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Valid inputs of any RHS packer: (rhs, keywords)."""
    rng = np.random.default_rng(seed)
    if (
        "zero" in packer.inputs and getattr(packer, "rhs_dtype", None) == np.int8
    ):  # int8 codes with scale and offset per 16 values
        nb = n * k // 16
        codes = rng.integers(-128, 128, (n, k), dtype=np.int8)
        return codes, {"scale": np.full(nb, 0.01, np.float32), "zero": np.zeros(nb, np.float32)}
    if "zero" in packer.inputs:  # 4-bit codes with per-block scale and zero point
        nb = n * k // 32
        codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        return codes, {"scale": np.full(nb, 0.01, np.float32), "zero": np.zeros(nb, np.float32)}
    if "scale" in packer.inputs:  # per-channel int8 values or 4-bit pairs
        row = k if packer.rhs_dtype == np.int8 else k // 2
        rhs = rng.integers(-8, 8, (n, row)).astype(packer.rhs_dtype)
        return rhs, {"scale": np.full(n, 0.01, np.float32)}
    if packer.rhs_order == "kxn":  # float32 K x N (+ bias)
        extra = {"bias": np.zeros(n, np.float32)} if "bias" in packer.inputs else {}
        return rng.standard_normal((k, n)).astype(np.float32), extra
    if not packer.blocked:  # float32 N x K + bias (the SME2 F32 packer)
        return rng.standard_normal((n, k)).astype(np.float32), {"bias": np.zeros(n, np.float32)}
    return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T.Q4_0), {}  # Q4_0 blocks


def kernels() -> list[MatmulKernel]:
    return [kern.bind(512) for kern in sorted(all_kernels(), key=lambda kern: kern.name)]


def shape(kern: MatmulKernel) -> tuple[int, int]:
    return (1 if kern.kind == "gemv" else min(kern.m_step, 4)), kern.n_step


def packed(kern: MatmulKernel, m: int, n: int, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    rhs, kw = rhs_inputs(kern.rhs_packer, n, k)
    return kern.pack_lhs(rng.standard_normal((m, k)).astype(np.float32)), kern.pack_rhs(n, k, rhs, **kw)


def with_nan(arr: np.ndarray, value: float = np.nan) -> np.ndarray:
    """``arr`` with one NaN (or ``value``): a float, or the scale d of a Q4_0 block (integers stay as they are)."""
    out = np.array(arr, copy=True)
    if out.dtype == np.uint8 and out.ndim == 3:
        out[0, 0, :2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    elif out.dtype.kind == "f":
        out.flat[out.size // 2] = value
    return out


def run_cases() -> dict[str, Case]:
    """Every misuse: name -> case(kernel, execution)."""
    cases: dict[str, Case] = {}

    def run(**change: object) -> Case:
        def case(kern: MatmulKernel, execution: str) -> object:
            m, n = shape(kern)
            lhs, rhs = packed(kern, m, n)
            args = {"m": m, "n": n, "k": K, "lhs_packed": lhs, "rhs_packed": rhs, "execution": execution}
            args.update({key: value(kern, args) if callable(value) else value for key, value in change.items()})
            return kern.run(**args)

        return case

    for name in ("m", "n", "k"):
        for value in (0, -1, -64, 2**40):
            cases[f"run {name}={value}"] = run(**{name: value})
    cases["run k=48"] = run(k=48)
    cases["run m=2 (GEMV: too many rows)"] = run(m=2)
    cases["run m past the LHS"] = run(m=lambda kern, a: a["m"] + kern.m_step)
    cases["run n past the RHS"] = run(n=lambda kern, a: a["n"] * 2)
    cases["run LHS cut short"] = run(lhs_packed=lambda kern, a: np.asarray(a["lhs_packed"]).reshape(-1)[:-4])
    cases["run RHS cut short"] = run(rhs_packed=lambda kern, a: np.asarray(a["rhs_packed"]).reshape(-1)[:-4])
    cases["run RHS plain, packed for 2k"] = run(
        rhs_packed=lambda kern, a: np.asarray(packed(kern, a["m"], a["n"], 2 * K)[1]), k=K
    )
    cases["run RHS packed for 2k"] = run(rhs_packed=lambda kern, a: packed(kern, a["m"], a["n"], 2 * K)[1])
    cases["run LHS packed for 2k"] = run(lhs_packed=lambda kern, a: packed(kern, a["m"], a["n"], 2 * K)[0])
    cases["run RHS from another kernel"] = run(rhs_packed=lambda kern, a: other_rhs(kern, a["n"]))
    cases["run RHS at another SVL"] = run(rhs_packed=lambda kern, a: packed(kern.bind(256), a["m"], a["n"])[1])
    cases["run RHS float32"] = run(rhs_packed=lambda kern, a: np.zeros(np.asarray(a["rhs_packed"]).size, np.float32))
    cases["run RHS int8"] = run(rhs_packed=lambda kern, a: np.asarray(a["rhs_packed"]).view(np.int8))
    cases["run LHS float64"] = run(lhs_packed=lambda kern, a: np.asarray(a["lhs_packed"]).astype(np.float64))
    cases["run LHS int8"] = run(lhs_packed=lambda kern, a: np.asarray(a["lhs_packed"]).view(np.int8))
    cases["run LHS 0-d"] = run(lhs_packed=np.float32(1))
    cases["run dst float64"] = run(dst=lambda kern, a: np.zeros((a["m"], a["n"]), np.float64))
    cases["run dst too small"] = run(dst=lambda kern, a: np.zeros(a["n"] - 1, np.float32))
    cases["run dst stride 3"] = run(dst=lambda kern, a: np.zeros((a["m"], a["n"]), np.float32), dst_stride_row=3)
    cases["run dst stride < 4n"] = run(dst_stride_row=4)
    cases["run dst not contiguous"] = run(dst=lambda kern, a: np.zeros((a["m"], 2 * a["n"]), np.float32)[:, ::2])
    cases["run clamp NaN"] = run(clamp_min=float("nan"))
    cases["run clamp min > max"] = run(clamp_min=1.0, clamp_max=-1.0)
    cases["run bl=16"] = run(bl=16)
    cases["run execution bogus"] = run(execution="bogus")
    cases["run execution 3"] = run(execution=3)
    for threads in (0, -1, 10**6, 2.5, True):
        cases[f"run threads={threads}"] = run(threads=threads)

    def pack_lhs(make: Callable[[int, int], np.ndarray], **kw: object) -> Case:
        def case(kern: MatmulKernel, execution: str) -> object:
            m, _ = shape(kern)
            return kern.pack_lhs(make(m, K), execution=execution, **kw)

        return case

    cases["pack_lhs float64"] = pack_lhs(lambda m, k: np.ones((m, k)))
    cases["pack_lhs int32"] = pack_lhs(lambda m, k: np.ones((m, k), np.int32))
    cases["pack_lhs float16"] = pack_lhs(lambda m, k: np.ones((m, k), np.float16))
    cases["pack_lhs NaN"] = pack_lhs(lambda m, k: with_nan(np.ones((m, k), np.float32)))
    cases["pack_lhs Inf"] = pack_lhs(lambda m, k: with_nan(np.ones((m, k), np.float32), np.inf))
    cases["pack_lhs no columns"] = pack_lhs(lambda m, k: np.ones((m, 0), np.float32))
    cases["pack_lhs 0-d"] = pack_lhs(lambda m, k: np.float32(1))
    cases["pack_lhs k=48"] = pack_lhs(lambda m, k: np.ones((m, 48), np.float32))
    cases["pack_lhs m=0"] = lambda kern, ex: kern.pack_lhs(np.ones((0, K), np.float32), 0, K, execution=ex)
    cases["pack_lhs m=-1"] = lambda kern, ex: kern.pack_lhs(np.ones((1, K), np.float32), -1, K, execution=ex)
    cases["pack_lhs m too large"] = lambda kern, ex: kern.pack_lhs(np.ones((1, K), np.float32), 9, K, execution=ex)
    cases["pack_lhs bad stride"] = pack_lhs(lambda m, k: np.ones((m, k), np.float32), lhs_stride=6)
    cases["pack_lhs threads=0"] = pack_lhs(lambda m, k: np.ones((m, k), np.float32), threads=0)

    def pack_rhs(name: str, value: Callable[[np.ndarray], object], n: Callable[[int], int] = lambda n: n) -> Case:
        def case(kern: MatmulKernel, execution: str) -> object:
            _, n0 = shape(kern)
            rhs, kw = rhs_inputs(kern.rhs_packer, n0, K)
            given = {"rhs": rhs, **kw}
            if name not in given:
                given[name] = np.zeros(n0, np.float32)  # an input this packer does not take
            given[name] = value(given[name])
            return kern.pack_rhs(n(n0), K, given.pop("rhs"), execution=execution, **given)

        return case

    for name in ("rhs", "scale", "zero", "bias"):
        cases[f"pack_rhs {name} NaN"] = pack_rhs(name, with_nan)
        cases[f"pack_rhs {name} Inf"] = pack_rhs(name, lambda a: with_nan(a, -np.inf))
        cases[f"pack_rhs {name} float64"] = pack_rhs(name, lambda a: np.asarray(a, np.float64))
        cases[f"pack_rhs {name} cut short"] = pack_rhs(name, lambda a: np.asarray(a).reshape(-1)[:3])
        cases[f"pack_rhs {name} list"] = pack_rhs(name, lambda a: np.asarray(a).tolist())
        cases[f"pack_rhs {name} missing"] = pack_rhs(name, lambda a: None)
    cases["pack_rhs n=0"] = pack_rhs("rhs", lambda a: a, n=lambda n: 0)
    cases["pack_rhs n past rhs"] = pack_rhs("rhs", lambda a: a, n=lambda n: n * 3)
    cases["pack_rhs execution bogus"] = lambda kern, ex: kern.pack_rhs(*shape(kern)[1:], K, None, execution="bogus")

    def prepared(x: Callable[[int], object], n: Callable[[int], int] = lambda n: n, threads: int = 1) -> Case:
        def case(kern: MatmulKernel, execution: str) -> object:
            m, n0 = shape(kern)
            _, rhs = packed(kern, m, n0)
            return kern.prepare(n(n0), K, rhs, execution=execution)(x(m), threads=threads)

        return case

    cases["prepare n past the RHS"] = prepared(lambda m: np.ones((m, K), np.float32), n=lambda n: 2 * n)
    cases["prepared threads=0"] = prepared(lambda m: np.ones((m, K), np.float32), threads=0)
    cases["prepared x NaN"] = prepared(lambda m: with_nan(np.ones((m, K), np.float32)))
    cases["prepared x float64"] = prepared(lambda m: np.ones((m, K)))
    cases["prepared x wrong k"] = prepared(lambda m: np.ones((m, K + 32), np.float32))
    cases["prepared x list"] = prepared(lambda m: [[1.0] * K])
    cases["prepared x 3 rows"] = prepared(lambda m: np.ones((3, K), np.float32))

    def get_rows(rows: object, cut: int = 0) -> Case:
        def case(kern: MatmulKernel, execution: str) -> object:
            _, n = shape(kern)
            buf = np.asarray(packed(kern, 1 if kern.kind == "gemv" else kern.mr, n)[1])
            buf = buf[: buf.size - cut]
            return kern.rhs_packer.get_rows_operands(buf, rows, n, K, kern.nr, kern.kr, kern.sr)

        return case

    cases["get_rows ids negative"] = get_rows(np.array([-1]))
    cases["get_rows ids past n"] = get_rows(np.array([10**6]))
    cases["get_rows ids float"] = get_rows(np.array([0.5]))
    cases["get_rows buffer short"] = get_rows(np.array([0]), cut=8)
    return cases


def other_rhs(kern: MatmulKernel, n: int) -> np.ndarray:
    """A packed RHS made by another kernel's packer."""
    other = next(k for k in kernels() if k.rhs_packer.name != kern.rhs_packer.name)
    rhs, kw = rhs_inputs(other.rhs_packer, n, K)
    return other.pack_rhs(n, K, rhs, **kw)


CASES = run_cases()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("execution", EXECUTIONS)
def test_misuse_matrix(execution: str) -> None:
    tally = Tally()
    runs = [kern for kern in kernels() if execution != "isa" or kern.isa is not None]  # (not emulated: no isa)
    for kern in runs:
        m, n = shape(kern)
        if execution != "isa":  # the emulator is slow: its valid runs are the golden tests'
            valid = kern.run(m, n, K, *packed(kern, m, n), execution=execution)
            assert valid.shape == (m, n)
        for name, case in CASES.items():
            tally.add(outcome(lambda kern=kern, case=case: case(kern, execution)), f"{kern.name} [{execution}] {name}")
    assert not tally.failures, tally.report(f"kernel misuse [{execution}]")
    assert sum(tally.counts.values()) == len(runs) * len(CASES)


def test_valid_plain_buffers_still_run() -> None:
    """The exact packed size as plain arrays (as golden files are) is accepted by every kernel."""
    for kern in kernels():
        m, n = shape(kern)
        lhs, rhs = packed(kern, m, n)
        ref = kern.run(m, n, K, lhs, rhs)
        plain = kern.run(m, n, K, np.asarray(lhs).view(np.ndarray), np.asarray(rhs).view(np.ndarray))
        assert np.array_equal(ref.view(np.uint32), plain.view(np.uint32)), kern.name
        assert isinstance(rhs, PackedBuffer)
