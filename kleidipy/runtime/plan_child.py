"""The child process of a background plan build (:class:`~kleidipy.runtime.plan_build.PlanBuild` starts it as
``python -m kleidipy.runtime.plan_child MODEL --target T --kv TYPE``): it loads the model, compiles its plan into
numba's cache under the build lock and marks it ready."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from kleidipy.graph.execute import compile_model
from kleidipy.runtime import plan_build
from kleidipy.runtime.generate import Engine
from kleidipy.target import parse_target


def _build(model: str, target: str, kv: str, exact_weights: bool = False) -> int:
    """The child: load ``model`` for ``target`` op by op, compile its plan for one and two threads, run a token
    through it (which compiles and saves every entry point), then mark it ready. Another build in progress: exit."""
    with plan_build.exclusive() as mine:
        if not mine:
            print("another process is building the plan", file=sys.stderr)
            return 0
        kv_dtype = np.dtype(kv).type
        engine = Engine(
            model,
            target=parse_target(target),
            progress=False,
            check_tensors=False,
            graph=False,
            kv_dtype=kv_dtype,
            exact_weights=exact_weights,
        )
        t0 = time.perf_counter()
        if not compile_model(engine.lm, 2):
            print("the model cannot run as a compiled plan", file=sys.stderr)
            return 0
        engine.lm.compiled.warm_up()
        engine.lm.compiled.close()
        plan_build.mark_ready(kv_dtype)
        print(f"plan built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=_build.__doc__)
    parser.add_argument("model")
    parser.add_argument("--target", required=True)
    parser.add_argument("--kv", default="float16")
    parser.add_argument("--exact-weights", action="store_true")
    args = parser.parse_args(argv)
    return _build(args.model, args.target, args.kv, args.exact_weights)


if __name__ == "__main__":
    os.nice(5)  # a chat or a server may go on answering meanwhile
    sys.exit(main())
