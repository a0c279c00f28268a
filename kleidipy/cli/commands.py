"""The handlers of the ``kleidipy`` subcommands: each takes the parsed arguments, calls the library and prints;
returns the exit status. The parser that routes to them is in :mod:`kleidipy.cli`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kleidipy.core import buffers
from kleidipy.errors import InvalidArgumentError, KleidipyError

if TYPE_CHECKING:
    from kleidipy.runtime.generate import Engine
    from kleidipy.runtime.grammar import Grammar
    from kleidipy.runtime.sampler import SamplingParams
    from kleidipy.target import Target


def cmd_golden(args: argparse.Namespace) -> int:
    from kleidipy.tools.golden import verify

    executions = list(buffers.EXECUTIONS) if args.execution == "all" else [args.execution]

    def report(res) -> None:
        if args.quiet and res.ok:
            return
        print(res.line(), flush=True)

    results, skipped = verify(args.dir, executions, report)
    passed = sum(r.ok for r in results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def _target(args: argparse.Namespace) -> Target:
    """Resolve --target / KLEIDIPY_TARGET / host (and --sme-threads); with --verbose, say so in one line when the
    target is the virtual default (`kleidipy kernels` always states it)."""
    from kleidipy.target import resolve_target, with_sme_threads

    target = with_sme_threads(resolve_target(getattr(args, "target", None)), getattr(args, "sme_threads", None))
    if target.source == "default" and getattr(args, "verbose", False):
        print(f"kleidipy: {_default_target_note(target)}", file=sys.stderr)
    return target


def _default_target_note(target: Target) -> str:
    return (
        f"no Arm matmul features on this {platform.machine()} host: targeting a {target.describe()} "
        "(choose with --target or KLEIDIPY_TARGET)"
    )


def cmd_kernels(args: argparse.Namespace) -> int:
    from kleidipy.kernels.catalogue import all_kernels, get_kernel
    from kleidipy.target import selected_uses, standing

    if args.isa and args.asm is None:
        raise InvalidArgumentError("--isa goes with --asm NAME")
    for flag, name, what in (("--asm", args.asm, "kernel"), ("--explain", args.explain, "kernel or packer")):
        if name is not None and not name.strip():
            raise InvalidArgumentError(f"{flag} needs a {what} name (`kleidipy kernels` lists the kernels)")
    target = _target(args)
    if args.asm is not None:
        from kleidipy.tools.kernel_asm import default_isa, format_listing, listing

        kern = get_kernel(args.asm, target.svl_bits or 512)
        print(format_listing(listing(kern, args.isa or default_isa(kern))))
        return 0
    if args.explain is not None:
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
    print(f"target: {_default_target_note(target) if target.source == 'default' else target.describe()}")
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


def cmd_pull(args: argparse.Namespace) -> int:
    from kleidipy.runtime.pull import pull

    print(pull(args.name, progress=not args.quiet))
    return 0


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _files(count: int) -> str:
    return f"{count} file{'s' * (count != 1)}"


def cmd_models(args: argparse.Namespace) -> int:
    from kleidipy.runtime.pull import get_spec, list_models, model_path, trace_copies
    from kleidipy.runtime.repack_cache import cache_files, repack_dir

    if args.path is not None:
        get_spec(args.path)  # unknown name -> UnknownModelError with a suggestion
        path = model_path(args.path)
        if path is None:
            print(f"kleidipy: error: {args.path} is not pulled yet (kleidipy pull {args.path})", file=sys.stderr)
            return 1
        print(path)
        return 0
    repacked = cache_files()
    catalogue = set()
    for info in list_models():
        sha256 = get_spec(info.name).sha256
        catalogue.add(sha256)
        state = str(info.path) if info.pulled else "not pulled"
        mine = [file for file in repacked if file.model_sha256 == sha256]
        if mine:
            state += f"; repack cache {_mib(sum(file.size for file in mine))} in {_files(len(mine))}"
        copies = trace_copies(get_spec(info.name).filename)
        if copies:
            state += f"; trace's Q4_0 copy {_mib(_sizes(copies))}"
        print(f"{info.name:<30} {info.size / 2**20:7.1f} MiB  {info.description}\n{'':<30} {state}")
    others = [file for file in repacked if file.model_sha256 not in catalogue]
    total = f"{_mib(sum(file.size for file in repacked))} in {_files(len(repacked))}" if repacked else "empty"
    other = f" ({_mib(sum(file.size for file in others))} of it for GGUF files outside the catalogue)" if others else ""
    print(f"repack cache {repack_dir()}: {total}{other}")
    copies = trace_copies()
    if copies:
        print(f"trace's Q4_0 copies {copies[0].parent}: {_mib(_sizes(copies))} in {_files(len(copies))}")
    return 0


def _sizes(paths: list[Path]) -> int:
    return sum(path.stat().st_size for path in paths if path.is_file())


def cmd_rm(args: argparse.Namespace) -> int:
    from kleidipy.runtime.pull import CacheRemoveError, ModelNotPulledError, get_spec, remove_model, trace_copies
    from kleidipy.runtime.repack_cache import remove_model_caches

    spec = get_spec(args.name)  # unknown name -> UnknownModelError with a suggestion
    size = remove_model(args.name)
    caches = remove_model_caches(spec.sha256)
    copies = trace_copies(spec.filename)
    copied = _sizes(copies)
    for copy in copies:
        try:
            copy.unlink(missing_ok=True)
        except OSError as exc:
            raise CacheRemoveError(f"cannot remove {copy}: {exc.strerror or exc}") from None
    if size is None and not caches and not copies:
        raise ModelNotPulledError(f"{args.name} is not pulled: nothing to remove (`kleidipy models` lists what is)")
    removed = [] if size is None else [f"its file ({_mib(size)})"]
    if caches:
        removed.append(f"{_files(len(caches))} of repacked weights ({_mib(sum(file.size for file in caches))})")
    if copies:
        removed.append(f"trace's Q4_0 copy ({_mib(copied)})")
    print(f"removed {args.name}: {' and '.join(removed)}")
    return 0


def _engine(args: argparse.Namespace, background: bool = False) -> Engine:
    """The model of ``args``, loaded; ``background``: a first run builds the compiled plan in the background and
    answers op by op meanwhile (run, chat)."""
    from kleidipy.runtime.generate import Engine

    return Engine(
        args.model,
        target=_target(args),
        threads=args.threads,
        execution=args.execution,
        n_ctx=args.ctx_size,
        progress=not args.quiet,
        check_tensors=args.check_tensors,
        repack_cache=args.repack_cache,
        graph=args.graph,
        background_compile=background,
        exact_weights=args.exact_weights or None,
    )


def _sampling(args: argparse.Namespace) -> SamplingParams:
    """The sampling options, checked (as the server checks a request's) before the model is loaded."""
    from kleidipy.runtime.sampler import sampling_options

    return sampling_options(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
    )


def _read_text_file(path: str, what: str, error: type[KleidipyError]) -> str:
    """The text of a UTF-8 file named on the command line; ``error`` with one line naming ``what`` it is when the
    file is missing, unreadable or not UTF-8."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"no such {what}: {path}") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not valid UTF-8 (byte {exc.start})") from None


def _grammar(args: argparse.Namespace) -> Grammar | None:
    """--json-schema(-file) / --grammar(-file) as a Grammar (None without), checked before the model is loaded."""
    from kleidipy.runtime.grammar import Grammar, GrammarError

    if args.json_schema_file is not None:
        path = args.json_schema_file
        text, where = _read_text_file(path, "JSON schema file", GrammarError), f"JSON schema file {path}"
    else:
        text, where = args.json_schema, "--json-schema"
    if text is not None:
        try:
            schema = json.loads(text)
        except ValueError as exc:
            hint = " (to read a file, use -jf/--json-schema-file)" if os.path.isfile(text) else ""
            raise GrammarError(f"{where} is not valid JSON: {exc}{hint}") from None
        return Grammar.json_schema(schema)
    if args.grammar_file is not None:
        return Grammar.gbnf(_read_text_file(args.grammar_file, "grammar file", GrammarError))
    return None if args.grammar is None else Grammar.gbnf(args.grammar)


def _seed(args: argparse.Namespace) -> int | None:
    """--seed, where -1 means a random seed (llama.cpp's LLAMA_DEFAULT_SEED)."""
    return None if args.seed == -1 else args.seed


def cmd_run(args: argparse.Namespace) -> int:
    from kleidipy.runtime.generate import PromptError, check_prompt_text

    sources = {"PROMPT": args.prompt_text, "-p": args.prompt, "-f": args.file}
    given = [name for name, value in sources.items() if value is not None]
    if len(given) != 1:
        what = f"the prompt is given {len(given)} times ({' and '.join(given)})" if given else "no prompt"
        raise PromptError(f"{what}: give it once, as kleidipy run PROMPT, -p TEXT or -f FILE")
    text = args.prompt if args.prompt_text is None else args.prompt_text
    if args.file is not None:
        text = _read_text_file(args.file, "prompt file", PromptError)
    args.prompt = check_prompt_text(text)
    params, grammar, lookup = _sampling(args), _grammar(args), _lookup(args)
    engine = _engine(args, background=True)
    chat = engine.chat_template.from_model if args.chat is None else args.chat  # as llama-cli and ollama run
    ids = engine.chat_prompt([{"role": "user", "content": args.prompt}]) if chat else engine.prompt(args.prompt)
    if not chat:
        print(args.prompt, end="", flush=True)
    for piece in engine.generate(ids, _max_tokens(args), params, seed=_seed(args), grammar=grammar, lookup=lookup):
        print(piece, end="", flush=True)
    print()
    _say_if_cut(engine, args)
    if not args.quiet:
        print(engine.timings.summary(), file=sys.stderr)
    return 0


def _lookup(args: argparse.Namespace) -> int:
    """--lookup, checked (0..64 tokens a step)."""
    from kleidipy.runtime.lookup import check_lookup

    return check_lookup(args.lookup)


def _max_tokens(args: argparse.Namespace) -> int | None:
    return None if args.n_predict < 0 else args.n_predict


def _say_if_cut(engine: Engine, args: argparse.Namespace) -> None:
    """One line on stderr when the reply ended at the token limit or the full context, not where the model ended."""
    if engine.finish_reason == "length":
        limit = 0 <= args.n_predict <= engine.timings.n_generated
        why = f"-n {args.n_predict} tokens reached" if limit else f"the context of {engine.context_length} is full"
        print(f"kleidipy: reply cut ({why})", file=sys.stderr)


def cmd_perplexity(args: argparse.Namespace) -> int:
    from kleidipy.tools.perplexity import PerplexityError, check_options, perplexity

    text = _read_text_file(args.file, "text file", PerplexityError).removesuffix("\n")  # as llama-perplexity reads -f
    check_options(args.ctx_size, args.chunks, args.batch_size)
    engine = _engine(args)

    def report(result) -> None:
        print(f"[{len(result.running)}]{result.running[-1]:.4f},", end="", flush=True)

    result = perplexity(engine, text, args.ctx_size, args.chunks, args.batch_size, report, progress=not args.quiet)
    print(f"\n{result.final_line()}")
    return 0


CHAT_HELP = """\
commands (a line that starts with / and a letter; never sent to the model):
  /help, /?            this list
  /clear               forget the conversation (the --system message stays), keep the model loaded
  /exit, /quit, /bye   leave the chat (Ctrl-D too)
Ctrl-C stops a reply. Any other line is sent as typed ("/ 2" and "/3" too); to send a message that starts
with / and a letter, type // (the first / is dropped: "//usr/bin?" sends "/usr/bin?")."""

_CHAT_COMMANDS = {"/help": "help", "/?": "help", "/clear": "clear", "/exit": "exit", "/quit": "exit", "/bye": "exit"}


def _chat_command(line: str) -> str | None:
    """The command a chat line gives ("help", "clear" or "exit"), or None for a message to send. An unknown
    command, or one followed by more words, raises InvalidArgumentError (the chat prints it and goes on)."""
    text = line.strip()
    if not (text.startswith("/") and (text[1:2].isalpha() or text[1:2] == "?")):
        return None
    word, *rest = text.split()
    command = _CHAT_COMMANDS.get(word.lower())
    if command is None:
        raise InvalidArgumentError(
            f"unknown command {word} (/help lists the commands; // sends a message that starts with /)"
        )
    if rest:
        raise InvalidArgumentError(f"{word} takes nothing after it (/help lists the commands)")
    return command


def cmd_chat(args: argparse.Namespace) -> int:
    from kleidipy.runtime.context_shift import shift_messages

    params, grammar, lookup = _sampling(args), _grammar(args), _lookup(args)
    engine = _engine(args, background=True)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    print("kleidipy chat: type a message; /help lists the commands, Ctrl-D or /exit quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        try:
            command = _chat_command(line)
        except InvalidArgumentError as exc:
            print(f"kleidipy: {exc}", file=sys.stderr)
            continue
        if command == "exit":
            return 0
        if command == "help":
            print(CHAT_HELP)
            continue
        if command == "clear":
            messages = list(system)
            print("kleidipy: conversation cleared (the model stays loaded)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        if line.lstrip().startswith("//"):
            line = line.replace("/", "", 1)
        messages.append({"role": "user", "content": line})
        room = min(engine.context_length // 4, args.n_predict if args.n_predict > 0 else engine.context_length)
        messages, dropped = shift_messages(messages, lambda m: len(engine.chat_prompt(m)), engine.context_length, room)
        if dropped:
            print(f"kleidipy: context full: the {dropped} oldest messages were dropped", file=sys.stderr)
        reply = ""
        try:
            ids = engine.chat_prompt(messages)
            generate = engine.generate(
                ids, _max_tokens(args), params, _seed(args), reuse_cache=True, grammar=grammar, lookup=lookup
            )
            for piece in generate:
                reply += piece
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()
        _say_if_cut(engine, args)  # finish_reason stays None when stopped
        messages.append({"role": "assistant", "content": reply})


def cmd_trace(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kleidipy.target import with_sme_threads
    from kleidipy.tools.trace import trace_generation, trace_target
    from kleidipy.tools.trace_report import report

    chrome_trace = Path(args.chrome_trace) if args.chrome_trace else None
    trace = trace_generation(
        args.model,
        args.prompt,
        args.n_decode,
        with_sme_threads(trace_target(args.target), args.sme_threads),  # (the seeds' SME2 CPU unless named)
        args.threads,
        args.execution,
        args.ctx_size,
        args.chat,
        args.check_tensors,
        args.graph,
        args.as_q4_0,
    )
    print(report(trace, json_out=args.json, chrome_trace_path=chrome_trace, tables=args.tables))
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


def cmd_layout(args: argparse.Namespace) -> int:
    from kleidipy.tools.layout import render_layout

    dims = dict(zip(("m", "n", "k"), _shape(args.shape), strict=True)) if args.shape else {}
    print(
        render_layout(args.kernel, svl_bits=args.svl, out=Path(args.out) if args.out else None, text=args.text, **dims)
    )
    return 0


def cmd_emulate(args: argparse.Namespace) -> int:
    from kleidipy.tools.emulate import emulate_report

    report = emulate_report(args.kernel, *_shape(args.shape), args.svl, args.trace, args.seed)
    print(report)
    return 0 if "bit-exact with the jit execution: yes" in report else 1


def cmd_quantize(args: argparse.Namespace) -> int:
    from kleidipy.tools.quantize import quantize_gguf

    report = quantize_gguf(args.input, args.output, args.type, pure=args.pure, progress=not args.quiet)
    print(report.summary())
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
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
        repack_cache=args.repack_cache,
        graph=args.graph,
        exact_weights=args.exact_weights or None,
    )
    print(format_bench_table(rows))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
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
        cors=tuple(args.cors),
        target=_target(args),
        execution=args.execution,
        progress=not args.quiet,
        check_tensors=args.check_tensors,
        repack_cache=args.repack_cache,
        graph=args.graph,
        deterministic=args.deterministic,
        lookup=_lookup(args),
        exact_weights=args.exact_weights or None,
    )
    return 0
