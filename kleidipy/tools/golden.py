"""Golden verifier: re-run every packer and kernel a KleidiAI golden manifest lists and compare bit for bit.

The manifest schema is the one of ``shared/golden/manifest.json``: ``cases[]`` with ``inputs`` and
``runs[]``; every file is opened through the manifest (never by building names). Packed bytes must be
identical; dst must be identical bit for bit (clamped and unclamped runs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kleidipy.core import buffers
from kleidipy.core.numerics import FLT_MAX
from kleidipy.errors import GoldenDataError, KleidipyError
from kleidipy.kernels.catalogue import get_kernel, get_packer


@dataclass
class RunResult:
    """Outcome of one manifest run under one execution."""

    where: str  # "<dir>/<variant>"
    execution: str
    clamped: bool
    ok: bool
    detail: str = ""

    def line(self) -> str:
        tag = "PASS" if self.ok else "FAIL"
        clamp = " clamped" if self.clamped else ""
        extra = f": {self.detail}" if self.detail else ""
        return f"{tag} [{self.execution}{clamp}] {self.where}{extra}"


class GoldenSet:
    """A golden folder: its manifest and lazily loaded, sha256-checked files."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        path = self.root / "manifest.json" if self.root.is_dir() else self.root
        if self.root.is_file():
            self.root = self.root.parent
        try:
            self.manifest = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise GoldenDataError(f"no manifest.json in {self.root}") from exc
        except json.JSONDecodeError as exc:
            raise GoldenDataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        if not isinstance(self.manifest.get("cases"), list):
            raise GoldenDataError(f"{path}: no 'cases' list")
        self._cache: dict[str, bytes] = {}

    def read(self, entry: dict) -> bytes:
        rel = entry["file"]
        if rel not in self._cache:
            p = self.root / rel
            try:
                data = p.read_bytes()
            except OSError as exc:
                raise GoldenDataError(f"cannot read {p}: {exc.strerror}") from exc
            if "sha256" in entry and hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise GoldenDataError(f"{p}: sha256 does not match the manifest")
            self._cache[rel] = data
        return self._cache[rel]

    def array(self, entry: dict) -> np.ndarray:
        arr = np.frombuffer(self.read(entry), dtype=np.dtype(entry.get("dtype", "uint8")))
        return arr.reshape(entry["shape"]) if "shape" in entry else arr


def _clamp_values(params: dict) -> tuple[float, float]:
    bits = params.get("clamp_bits")
    if bits:
        lo, hi = (np.array([int(b, 16)], dtype=np.uint32).view(np.float32)[0] for b in bits)
        return float(lo), float(hi)
    named = {"-FLT_MAX": -FLT_MAX, "FLT_MAX": FLT_MAX}
    lo, hi = params["clamp"]
    return float(named.get(lo, lo)), float(named.get(hi, hi))


def _rhs_inputs(rhs_input: str, inputs: dict, golden: GoldenSet, n: int) -> dict[str, np.ndarray]:
    """Map a run's ``rhs_input`` description (e.g. "rhs_q4_1_qau4c32_s0s1 + rhs_q4_1_zero_f32 + ...") to
    the RHS packer's keyword inputs: ``*_scale_f32`` -> scale, ``*_zero_f32`` -> zero, ``bias_f32`` -> bias,
    "(+ N zero f32 biases)" -> bias = zeros[N], anything else -> rhs."""
    args: dict[str, np.ndarray] = {}
    text = rhs_input
    if "zero f32 biases" in text:
        args["bias"] = np.zeros(n, dtype=np.float32)
        text = text.split("(")[0]
    for name in (t.strip() for t in text.split("+")):
        if not name:
            continue
        if name not in inputs:
            raise GoldenDataError(f"rhs_input names '{name}', which is not among the case inputs")
        arr = golden.array(inputs[name])
        suffixes = {"scale_f32": "scale", "zero_f32": "zero", "bias_f32": "bias"}
        key = next((key for suffix, key in suffixes.items() if name.endswith(suffix)), "rhs")
        args[key] = arr
    return args


def verify_run(
    golden: GoldenSet, case: dict, run: dict, execution: str, packed_cache: dict[tuple, np.ndarray]
) -> RunResult:
    """Re-run one manifest run: RHS pack, LHS pack, matmul; compare with the golden files."""
    where = f"{run['dir']}/{run['variant']}"
    clamped = bool(run.get("clamped"))

    def fail(msg: str) -> RunResult:
        return RunResult(where, execution, clamped, False, msg)

    m, n, k = case["m"], case["n"], case["k"]
    p = run["params"]
    svl = run["svl_bytes"] * 8 if run.get("svl_bytes") else None
    try:
        kern = get_kernel(run["kernels"]["matmul"], svl)
    except KleidipyError as exc:
        return fail(f"cannot run: {exc}")
    got = {"mr": kern.mr if kern.lhs_packer else None, "nr": kern.nr, "kr": kern.kr, "sr": kern.sr}
    want = {key: p.get(key) for key in got}
    if got != want:
        return fail(f"kernel parameters {got} differ from the manifest's {want}")
    bl = p.get("bl")
    try:
        rhs_packer = get_packer(run["kernels"]["rhs_pack"])
        key = ("rhs", run["kernels"]["rhs_pack"], run.get("rhs_input"), kern.nr, kern.kr, kern.sr, execution)
        if key not in packed_cache:
            rhs_args = _rhs_inputs(run["rhs_input"], case["inputs"], golden, n)
            rhs = rhs_args.pop("rhs")
            packed_cache[key] = rhs_packer.run(
                n, k, kern.nr, kern.kr, kern.sr, rhs, bl=bl, execution=execution, **rhs_args
            )
        rhs_ours = packed_cache[key]
        rhs_gold = golden.array(run["files"]["rhs_packed"])
        if rhs_ours.size != rhs_gold.size or not np.array_equal(np.asarray(rhs_ours), rhs_gold):
            return fail(_first_diff("RHS packed", np.asarray(rhs_ours), rhs_gold))

        lhs_f32 = golden.array(case["inputs"]["lhs_f32"]).reshape(m, k)
        if run["kernels"].get("lhs_pack"):
            lhs_packer = get_packer(run["kernels"]["lhs_pack"])
            key = ("lhs", run["kernels"]["lhs_pack"], kern.mr, kern.kr, kern.sr, execution)
            if key not in packed_cache:
                packed_cache[key] = lhs_packer.run(m, k, kern.mr, kern.kr, kern.sr, lhs_f32, bl=bl, execution=execution)
            lhs_ours = packed_cache[key]
            lhs_gold = golden.array(run["files"]["lhs_packed"])
            if lhs_ours.size != lhs_gold.size or not np.array_equal(np.asarray(lhs_ours), lhs_gold):
                return fail(_first_diff("LHS packed", np.asarray(lhs_ours), lhs_gold))
            lhs_in = lhs_gold
        else:
            lhs_in = lhs_f32
        lo, hi = _clamp_values(p)
        dst_gold = golden.array(run["files"]["dst"]).reshape(m, n)
        dst = kern.run(m, n, k, lhs_in, rhs_gold, None, n * 4, lo, hi, execution=execution)
    except KleidipyError as exc:
        return fail(f"{type(exc).__name__}: {exc}")
    except NotImplementedError:
        return fail(f"cannot run: no {execution} execution")
    if not np.array_equal(dst.view(np.uint32), dst_gold.view(np.uint32)):
        return fail(_first_diff("dst", dst.reshape(-1), dst_gold.reshape(-1)))
    return RunResult(where, execution, clamped, True)


def _first_diff(what: str, ours: np.ndarray, gold: np.ndarray) -> str:
    if ours.size != gold.size:
        return f"{what} is {ours.size} elements, golden {gold.size}"
    a = ours.view(np.uint32) if ours.dtype == np.float32 else ours
    b = gold.view(np.uint32) if gold.dtype == np.float32 else gold
    idx = np.flatnonzero(a != b)
    return (
        f"{what} differs at {idx.size} of {a.size} elements, first at {idx[0]}: {ours[idx[0]]} vs golden {gold[idx[0]]}"
    )


def iter_runs(golden: GoldenSet) -> Iterator[tuple[dict, dict]]:
    for case in golden.manifest["cases"]:
        for run in case.get("runs", []):
            yield case, run


def verify(
    root: str | Path, executions: list[str], report: Callable[[RunResult], None] | None = None
) -> tuple[list[RunResult], int]:
    """Verify every ``ok`` run of a manifest under each execution. Returns (results, number skipped)."""
    golden = GoldenSet(root)
    results: list[RunResult] = []
    skipped = 0
    for execution in executions:
        buffers.check_execution(execution)
        cache: dict[tuple, np.ndarray] = {}
        last_case = None
        for case, run in iter_runs(golden):
            if case is not last_case:
                cache.clear()
                last_case = case
            if run.get("status") != "ok":
                skipped += 1
                continue
            res = verify_run(golden, case, run, execution, cache)
            results.append(res)
            if report:
                report(res)
    return results, skipped
