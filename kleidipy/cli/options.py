"""The argument groups the ``kleidipy`` subcommands share (:mod:`kleidipy.cli`): the model and runtime options,
the target, one kernel at one shape, prompt lookup."""

from __future__ import annotations

import argparse

from kleidipy.core import buffers
from kleidipy.runtime.pull import MODEL_ENV, default_model


def add_lookup(p: argparse.ArgumentParser, more: str = "") -> None:
    p.add_argument(
        "--lookup",
        type=int,
        default=0,
        metavar="N",
        help="prompt-lookup decoding (llama.cpp's llama-lookup): draft up to N tokens a step from n-grams of the "
        "context and verify them in one forward pass, keeping the longest accepted prefix - the same text, sooner "
        f"when the reply repeats the prompt (code edits, quotes); default 0 = off{more}",
    )


def add_runtime_args(
    p: argparse.ArgumentParser,
    *,
    thread_list: bool = False,
    ctx: bool = True,
    quiet: str | None = "no progress bars",
    repack_cache: bool = True,
    exact_weights: bool = True,
) -> None:
    """The options every command that runs a model shares: model, threads, context, execution, load checks and
    the repack cache, exact weights, target, quiet."""
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
    if exact_weights:
        help_text = "multiply every weight as the file holds it: Q8_0 too by kleidipy's exact-weight kernels (as "
        help_text += "Q5_0/Q5_1/Q5_K/Q6_K/Q8_K/IQ4_NL always are), not requantized per channel to int8 as Arm "
        help_text += "llama.cpp's KleidiAI path does; F16/F32 as f32, not rounded to bf16 (default: "
        help_text += "$KLEIDIPY_EXACT_WEIGHTS)"
        p.add_argument("--exact-weights", action="store_true", help=help_text)
    if quiet:
        p.add_argument("-q", "--quiet", action="store_true", help=quiet)
    add_target_arg(p)
    p.add_argument(
        "--sme-threads",
        metavar="N",
        help="run the SME kernels on N threads and the NEON ones on the others, as llama.cpp does on a CPU with fewer "
        "SME units than threads (GGML_KLEIDIAI_SME=N, GGML_KLEIDIAI_CHUNK_MULTIPLIER=1): the bits then change with "
        "-t; an SME target only, the same as its option sme_threads=N (default: SME on every thread)",
    )


def add_kernel_args(p: argparse.ArgumentParser, shape: str | None, shape_help: str) -> None:
    """--kernel, --shape and --svl: one kernel at one problem shape (the seeds' example by default)."""
    p.add_argument(
        "--kernel",
        default="kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa",
        help="catalogue kernel name (default: the SME2 Q4_0 MOPA GEMM)",
    )
    p.add_argument("--shape", default=shape, metavar="M,N,K", help=shape_help)
    p.add_argument("--svl", type=int, default=512, help="SME streaming vector length in bits (default 512)")


def add_target_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        metavar="T",
        help="Arm CPU to target: sme2[:svl=128..2048], sme[:svl=N], i8mm, dotprod or host, each with an optional "
        "table=master|seeds: llama.cpp's kernel table (master, the default: the F16-LHS GEMM for Q4_0 on SME2; "
        "seeds: the int8 MOPA GEMM), e.g. sme2:svl=512,table=seeds, and for sme/sme2 sme_threads=N (--sme-threads) "
        "(default: $KLEIDIPY_TARGET, else the host; on a host without Arm matmul features a virtual CPU, which "
        "`kleidipy kernels` names)",
    )
