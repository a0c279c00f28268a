"""The ``kleidipy`` command: parses arguments, calls the library, prints. No logic of its own."""

from __future__ import annotations

import argparse
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
    return parser


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
