"""The kleidipy command line: one clear line and a non-zero exit for every kind of bad input; --help explains."""

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import tiny_model
from model_files import SMOLLM2, model_file
from tiny_models import write_model

from kleidipy.cli import build_parser, main
from kleidipy.cli.commands import CHAT_HELP, _chat_command, _sampling
from kleidipy.errors import InvalidArgumentError
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.model_file import ModelFile
from kleidipy.runtime.pull import CATALOGUE, DEFAULT_MODEL
from kleidipy.runtime.repack_cache import write_cache
from kleidipy.target import resolve_target


def run_cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kleidipy", *args], capture_output=True, text=True, input=input, timeout=600
    )


def one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kleidipy: error:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def main_error(capsys: pytest.CaptureFixture, *args: str) -> str:
    """Run ``kleidipy ARGS`` in-process, expecting one error line and exit 2 (argparse's too); that line."""
    try:
        status = main(list(args))
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("kleidipy: error:")]
    assert len(lines) == 1 and "Traceback" not in err and not out, err
    return lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"kleidipy {importlib.metadata.version('kleidipy')}\n"
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert run_cli("--version").stdout == f"kleidipy {pyproject['project']['version']}\n"  # e.g. kleidipy 0.1.0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("kernels", "--explain", ""), "--explain needs a kernel or packer name"),
        (("kernels", "--explain", "  "), "--explain needs a kernel or packer name"),
        (("kernels", "--asm", ""), "--asm needs a kernel name"),
        (("models", "--path", ""), "no model name given"),
        (("pull", ""), "no model name given"),
    ],
)
def test_empty_names_are_one_line_errors(capsys, args, words):
    """An empty name is refused, not read as "no name": `kernels --explain ''` used to list the whole catalogue."""
    assert words in main_error(capsys, *args)


def test_every_command_has_help():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"run", "chat", "pull", "models", "rm", "kernels", "golden", "trace", "layout", "emulate"} <= set(commands)
    for name, sub in commands.items():
        assert sub.description, f"`kleidipy {name} --help` has no description"


def test_truncated_gguf(tmp_path):
    data = model_file(SMOLLM2).read_bytes()[:5_000_000]
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data)
    one_line_error(run_cli("run", "-m", str(bad), "-p", "hi", "-q"), "truncated.gguf")


def test_not_a_gguf_and_missing_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    one_line_error(run_cli("run", "-m", str(bad), "-p", "hi", "-q"), "not a GGUF")
    one_line_error(run_cli("run", "-m", str(tmp_path / "nope.gguf"), "-p", "hi", "-q"), "no such model file")


def test_unknown_model_name_suggests():
    one_line_error(run_cli("pull", "smollm"), "unknown model", "smollm2-135m-instruct")


def test_empty_prompt_and_prompt_longer_than_context():
    one_line_error(run_cli("run", "-p", "", "-q"), "empty")
    one_line_error(run_cli("run", "-p", "one two three four five six seven eight nine ten", "-c", "4", "-q"), "context")


def test_bad_target_and_shapes():
    one_line_error(run_cli("kernels", "--target", "sme2:svl=384"), "svl")
    one_line_error(run_cli("layout", "--svl", "100"), "SVL")
    one_line_error(run_cli("layout", "--shape", "16,64,48"), "multiple")
    one_line_error(run_cli("emulate", "--kernel", "kai_matmul_nope"), "unknown kernel")


def test_verbose_shows_traceback():
    """--verbose lets the error through with its traceback (without it: one line, test_unknown_model_name_suggests)."""
    proc = run_cli("--verbose", "pull", "smollm")
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("kleidipy.runtime.pull.UnknownModelError: unknown model")


def test_explain_reads_well(capsys):
    assert main(["kernels", "--explain", "kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"]) == 0
    out = capsys.readouterr().out
    for token in ("qsi8d32p1vlx4", "qsi4c32p4vlx4", "1vlx4vl", "sme2", "mopa", "16 rows", "m_step=16"):
        assert token in out


def test_kernels_lists_selection(capsys):
    assert main(["kernels", "--target", "i8mm"]) == 0
    out = capsys.readouterr().out
    assert "qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm" in out and "q4_0 GEMM" in out


def test_kernels_names_the_table_and_its_q4_0_pair(capsys):
    """sme2: llama.cpp master's table (the F16-LHS GEMM, the int8 SDOT GEMV); table=seeds: the int8 MOPA GEMM."""
    picks = {}
    for spec in ("sme2:svl=512", "sme2:svl=512,table=seeds"):
        assert main(["kernels", "--target", spec]) == 0
        lines = capsys.readouterr().out.splitlines()
        picks[spec] = lines[0], {line.split()[0] for line in lines[2:] if "q4_0 GEMM" in line}
    assert picks["sme2:svl=512"][0].endswith("llama.cpp's master kernel table")
    assert picks["sme2:svl=512"][1] == {"kai_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"}
    assert picks["sme2:svl=512,table=seeds"][0].endswith("llama.cpp's seeds kernel table")
    assert picks["sme2:svl=512,table=seeds"][1] == {
        "kai_matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"
    }


def test_run_greedy_paris_and_seed_reproducible():
    proc = run_cli("run", "-p", "The capital of France is", "--no-chat", "--temp", "0", "-n", "4", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is Paris")
    a = run_cli("run", "-p", "Once upon a time", "-n", "8", "--seed", "7", "-q")
    b = run_cli("run", "-p", "Once upon a time", "-n", "8", "--seed", "7", "-q")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_run_lookup_gives_the_plain_text_and_checks_its_flag(tmp_path):
    """--lookup N (prompt-lookup decoding): the greedy text without drafts, and the timing line counts them; a
    bad N is one line before any model is loaded."""
    args = ("run", "-p", "Repeat exactly: one two three, one two three, one two four.", "--temp", "0", "-n", "24")
    plain, looked = run_cli(*args, "-q"), run_cli(*args, "--lookup", "8")
    assert plain.returncode == 0 and looked.returncode == 0 and looked.stdout == plain.stdout, looked.stderr
    assert "drafted accepted)" in looked.stderr.splitlines()[-1]
    for n in ("-1", "65", "x"):
        proc = run_cli("run", "-m", str(tmp_path / "never-loaded.gguf"), "-p", "hi", "--lookup", n)
        assert proc.returncode != 0 and "--lookup" in proc.stderr and "Traceback" not in proc.stderr


def test_run_json_schema_and_grammar(tmp_path):
    # (no other properties: greedy text that rambles on in another string would be cut at -n before the JSON ends)
    schema = (
        '{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], '
        '"additionalProperties": false}'
    )
    proc = run_cli("run", "-p", "What is the capital of France? Answer in JSON.", "--temp", "0", "-j", schema, "-q")
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout)["city"], str)
    proc = run_cli("run", "-p", "Is Paris in France?", "--grammar", 'root ::= "yes" | "no"', "-q")
    assert proc.returncode == 0 and proc.stdout.strip() in ("yes", "no"), proc.stderr
    (tmp_path / "schema.json").write_text(schema)
    (tmp_path / "yes-no.gbnf").write_text('root ::= "yes" | "no"\n')
    proc = run_cli("run", "-p", "What is the capital of France? Answer in JSON.", "--temp", "0", "-q", "-jf",
                   str(tmp_path / "schema.json"))  # fmt: skip
    assert proc.returncode == 0 and isinstance(json.loads(proc.stdout)["city"], str), proc.stderr
    proc = run_cli("run", "-p", "Is Paris in France?", "--grammar-file", str(tmp_path / "yes-no.gbnf"), "-q")
    assert proc.returncode == 0 and proc.stdout.strip() in ("yes", "no"), proc.stderr
    one_line_error(run_cli("run", "-p", "hi", "-j", "{nope", "-q"), "--json-schema is not valid JSON")
    one_line_error(run_cli("run", "-p", "hi", "-j", '{"type": "strin"}', "-q"), "invalid JSON schema")
    one_line_error(run_cli("run", "-p", "hi", "--grammar", "root ::= (", "-q"), "invalid grammar")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("perplexity", "-f", "missing.txt"), "no such text file: missing.txt"),
        (("perplexity", "-f", "."), "cannot read text file .: Is a directory"),
        (("perplexity", "-f", "latin1.txt"), "text file latin1.txt is not valid UTF-8 (byte 3)"),
        (("run", "-f", "missing.txt"), "no such prompt file: missing.txt"),
        (("run", "-p", "hi", "-jf", "missing.json"), "no such JSON schema file: missing.json"),
        (("run", "-p", "hi", "-jf", "latin1.txt"), "JSON schema file latin1.txt is not valid UTF-8 (byte 3)"),
        (("run", "-p", "hi", "-jf", "bad.json"), "JSON schema file bad.json is not valid JSON: Expecting"),
        (("run", "-p", "hi", "-j", "bad.json"), "(to read a file, use -jf/--json-schema-file)"),
        (("run", "-p", "hi", "--grammar-file", "missing.gbnf"), "no such grammar file: missing.gbnf"),
        (("run", "-p", "hi", "--grammar-file", "bad.json"), "invalid grammar"),
        (("chat", "--grammar-file", "missing.gbnf"), "no such grammar file: missing.gbnf"),
        (("run", "-p", "hi", "-jf", "bad.json", "-j", "{}"), "not allowed with argument"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_file_arguments_are_one_line_errors(tmp_path, monkeypatch, capsys, args, line):
    """Every file named on the command line: missing, a directory, not UTF-8 or not what it should hold is one
    line naming the file and what it was for (perplexity -f called its text a "prompt file"), before any load."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    (tmp_path / "bad.json").write_text("{nope")
    assert line in main_error(capsys, *args, "-m", "/no/such.gguf")


def test_run_defaults_are_llama_cpp_sampling_and_a_cut_reply_says_so():
    args = build_parser().parse_args(["run", "-p", "hi"])
    params = _sampling(args)
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.8, 40, 0.95, 0.05)
    assert args.seed == -1 and args.chat is None  # -1: a random seed, as in llama.cpp
    proc = run_cli("run", "-p", "Write a long story about a dragon.", "-n", "3", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    assert "kleidipy: reply cut (-n 3 tokens reached)" in proc.stderr.splitlines()


def test_readme_first_command_answers_paris(monkeypatch):
    """`kleidipy run -p "What is the capital of France?"` with its defaults (the default model, its chat template,
    llama.cpp's sampling), seeds 1..40: the reply names Paris in nearly all of them (Qwen2.5-Coder-0.5B-Instruct:
    40 of 40 when measured; SmolLM2 135M, the default before, ~60 %)."""
    monkeypatch.delenv("KLEIDIPY_MODEL")
    args = build_parser().parse_args(["run", "-p", "What is the capital of France?"])
    assert args.model == DEFAULT_MODEL
    engine = Engine(args.model, progress=False)
    ids = engine.chat_prompt([{"role": "user", "content": args.prompt}])
    replies = ["".join(engine.generate(ids, 128, _sampling(args), seed=seed)) for seed in range(1, 41)]
    assert sum("Paris" in reply for reply in replies) >= 36, replies


def test_run_takes_the_prompt_as_an_argument(capsys):
    """`kleidipy run "question"` is `-p "question"`; giving the prompt twice, or not at all, is one error line."""
    proc = run_cli("run", "The capital of France is", "--no-chat", "--temp", "0", "-n", "4", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is Paris")
    assert "PROMPT and -p" in main_error(capsys, "run", "-m", "/no/such.gguf", "question", "-p", "question")
    assert "PROMPT and -f" in main_error(capsys, "run", "-m", "/no/such.gguf", "question", "-f", "prompt.txt")
    line = main_error(capsys, "run", "-m", "/no/such.gguf", "a", "-p", "b", "-f", "prompt.txt")
    assert "given 3 times" in line and "give it once, as kleidipy run PROMPT, -p TEXT or -f FILE" in line
    assert "no prompt" in main_error(capsys, "run", "-m", "/no/such.gguf")
    assert "the prompt is empty" in main_error(capsys, "run", "-m", "/no/such.gguf", "")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 (random weights, context 256, ChatML template)."""
    return write_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "qwen2", T.Q4_0)


def test_run_generates_until_the_end_of_the_turn_or_the_context_by_default(tiny, capsys, monkeypatch):
    """-n is -1 by default, as in llama-cli: no token limit (it was 128), so a reply that never ends fills the
    context; -n N still cuts it, with its one line."""
    for command in ("run", "chat"):
        assert build_parser().parse_args([command]).n_predict == -1
    limits = []
    generate = Engine.generate

    def spy(self: Engine, prompt_ids: list[int], max_tokens: int | None = None, *args: object, **kwargs: object):
        limits.append(max_tokens)
        return generate(self, prompt_ids, max_tokens, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    flags = ["-m", str(tiny), "--no-chat", "--temp", "0", "--no-graph", "-q"]
    assert main(["run", "hi", "-c", "200", *flags]) == 0  # random weights: the model never ends its turn
    assert limits == [None]
    assert "kleidipy: reply cut (the context of 200 is full)" in capsys.readouterr().err.splitlines()
    assert main(["run", "hi", "-n", "3", *flags]) == 0
    assert limits[-1] == 3 and "kleidipy: reply cut (-n 3 tokens reached)" in capsys.readouterr().err.splitlines()
    typed = iter(["hi", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
    assert main(["chat", "-m", str(tiny), "-c", "200", "--temp", "0", "--no-graph", "-q"]) == 0
    assert limits[-1] is None
    assert "kleidipy: reply cut (the context of 200 is full)" in capsys.readouterr().err.splitlines()


def test_the_default_target_is_stated_where_it_matters(tiny, capsys, monkeypatch):
    """On a host without Arm matmul features, run says nothing of the virtual target it picks (it used to on every
    command); `kleidipy kernels` states it in its target line, and --verbose prints it for any command."""
    monkeypatch.delenv("KLEIDIPY_TARGET", raising=False)
    target = resolve_target()
    flags = ["-m", str(tiny), "hi", "-n", "1", "--no-graph", "-q"]
    assert main(["run", *flags]) == 0
    assert "Arm matmul" not in capsys.readouterr().err
    assert main(["--verbose", "run", *flags]) == 0
    err = capsys.readouterr().err
    assert main(["kernels"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("target: ") and target.describe() in first
    if target.source == "default":  # not an Arm host with its features
        assert "no Arm matmul features" in first and "--target" in first
        assert err.count("no Arm matmul features") == 1


def test_invalid_utf8_prompts(tmp_path):
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    one_line_error(run_cli("run", "-f", str(bad), "-q"), "not valid UTF-8", "byte 3")
    proc = subprocess.run(
        [sys.executable, "-m", "kleidipy", "run", "-q", "-p", b"\xff\xfe".decode("utf-8", "surrogateescape")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    one_line_error(proc, "not valid UTF-8")
    one_line_error(run_cli("run", "-q"), "-p TEXT or -f FILE")


def chat(monkeypatch, typed: list, *flags: str, interrupt_turn: int | None = None) -> tuple[int, list, list]:
    """`kleidipy chat` in-process on SmolLM2 with ``typed`` as the user's input lines (an exception instance is
    raised at the prompt instead: EOFError for Ctrl-D, KeyboardInterrupt for Ctrl-C). Reply ``interrupt_turn``
    (1-based) gets a Ctrl-C after its first piece. Returns the exit status, the text of each prompt the engine
    generated from (its token ids decoded) and each reply as the engine streamed it."""
    lines = iter(typed)
    prompts: list[str] = []
    replies: list[str] = []
    generate = Engine.generate

    def fake_input(prompt: str = "") -> str:
        print(prompt, end="")
        line = next(lines)
        if isinstance(line, BaseException):
            raise line
        return line

    def spy_generate(self, prompt_ids, *args, **kwargs):  # noqa: ANN001, ANN202
        prompts.append(self.tokenizer.decode(prompt_ids))
        replies.append("")
        for piece in generate(self, prompt_ids, *args, **kwargs):
            if len(prompts) == interrupt_turn and replies[-1]:
                raise KeyboardInterrupt
            replies[-1] += piece
            yield piece

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr(Engine, "generate", spy_generate)
    code = main(["chat", "-m", str(model_file(SMOLLM2)), "--temp", "0", "-q", *flags])
    return code, prompts, replies


def test_run_uses_the_chat_template_by_default():
    """Greedy (the default seed is random): --no-chat continues the text after echoing it; by default the prompt
    goes through the chat template, so the reply is not that continuation (a reply may itself start "The capital
    of France is Paris", as a random-seed run showed)."""
    prompt = "The capital of France is"
    chat = run_cli("run", "-p", prompt, "-n", "6", "-q", "--temp", "0")
    raw = run_cli("run", "-p", prompt, "--no-chat", "-n", "6", "-q", "--temp", "0")
    assert chat.returncode == 0 and raw.returncode == 0, chat.stderr + raw.stderr
    assert raw.stdout.startswith(prompt)
    assert chat.stdout.strip() and chat.stdout != raw.stdout


def test_explain_legacy_names_with_todays_roles_and_name(capsys):
    # KleidiAI's early spelling (its overview page) -> today's name, and the roles each operand field must show
    cases = {
        "kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_i8mm": (
            "kai_matmul_clamp_f32_qai8dxp4x8_qsi4cxp4x8_4x4x32_neon_i8mm",
            {"f32": "destination", "qai8dxp4x8": "LHS operand (m x k, activations)", "qsi4cxp4x8": "RHS operand"},
        ),
        "kai_run_lhs_quant_pack_qa8dxP_f32": (
            "kai_lhs_quant_pack_qai8dxp_f32",
            {"qai8dxp": "packed LHS", "f32": "LHS source"},
        ),
        "kai_run_rhs_pack_nxk_qs4cxP_qs4cxS1S0": (
            "kai_rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
            {"qsi4cxp": "packed RHS", "qs4cxs1s0": "RHS source"},
        ),
        "matmul_clip_f32_qa8dxP_qs4cxP": (
            "matmul_clamp_f32_qai8dxp_qsi4cxp",
            {"f32": "destination", "qai8dxp": "LHS operand (m x k, activations)", "qsi4cxp": "RHS operand"},
        ),
    }
    for name, (today, roles) in cases.items():
        assert main(["kernels", "--target", "i8mm", "--explain", name]) == 0
        out = capsys.readouterr().out
        assert "unknown" not in out.lower(), out
        assert f"legacy name; today: {today}" in out
        assert "in kleidipy: " in out and "qai8dxp_qsi4cxp" in out
        lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.strip()}
        for token, role in roles.items():
            assert role in lines[token], lines[token]
    assert main(["kernels", "--explain", next(iter(cases))]) == 0
    summary = " ".join(capsys.readouterr().out.split())
    assert "LHS activations int8 (per-row asymmetric) x RHS weights int4 (per-channel symmetric)" in summary


def test_explain_made_up_token_is_one_line_error():
    one_line_error(
        run_cli("kernels", "--explain", "kai_matmul_clamp_f32_qai8dxp4x8_qsi4cxq4x8_4x4x32_neon_i8mm"), "q4x8"
    )
    one_line_error(
        run_cli("kernels", "--explain", "kai_run_matmul_clip_f32_qa8dxP4X8_qs4cxP4X8_4x4x32_neon_zzz"), "zzz"
    )


def test_chat_keeps_the_conversation(monkeypatch, capsys):
    """The second turn's prompt is the first turn's prompt, the first reply and the new message, rendered with
    the model's chat template; /exit quits with 0."""
    typed = ["What is the capital of France?", "And of Italy?", "/exit"]
    code, prompts, replies = chat(monkeypatch, typed, "-n", "4", "--system", "Answer briefly.")
    assert code == 0 and len(prompts) == 2 and replies[0].strip()
    assert "Answer briefly." in prompts[0] and prompts[0].rstrip().endswith("assistant")
    assert prompts[1].startswith(prompts[0] + replies[0])
    rest = prompts[1][len(prompts[0] + replies[0]) :]
    assert "What is the capital of France?" not in rest and "And of Italy?" in rest
    assert capsys.readouterr().out == f"> {replies[0]}\n> {replies[1]}\n> "


def test_chat_commands_are_never_sent_to_the_model(monkeypatch, capsys):
    """/help lists the commands, /clear forgets the conversation (the system message stays), /quit quits; an
    unknown /word or a command with more words is one line and the chat goes on; // sends a message that starts
    with /, and "/ 2" is a message."""
    typed = ["/help", "/nope", "/clear now", "Say hi.", "/clear", "//usr/bin is a folder?", "/ 2", "/QUIT"]
    code, prompts, replies = chat(monkeypatch, typed, "-n", "2", "--system", "Answer briefly.")
    out, err = capsys.readouterr()
    assert code == 0 and len(prompts) == 3
    assert "Say hi." in prompts[0]
    assert "Say hi." not in prompts[1] and "Answer briefly." in prompts[1]
    assert "/usr/bin is a folder?" in prompts[1] and "//usr" not in prompts[1]
    assert prompts[2].startswith(prompts[1] + replies[1]) and "/ 2" in prompts[2][len(prompts[1]) :]
    assert out.startswith(f"> {CHAT_HELP}\n> > > ")
    for notice in (
        "kleidipy: unknown command /nope (/help lists the commands; // sends a message that starts with /)",
        "kleidipy: /clear takes nothing after it (/help lists the commands)",
        "kleidipy: conversation cleared (the model stays loaded)",
    ):
        assert err.splitlines().count(notice) == 1, err


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("/help", "help"),
        (" /? ", "help"),
        ("/clear", "clear"),
        ("/exit", "exit"),
        ("/Quit", "exit"),
        ("/bye", "exit"),
        ("hello /exit", None),
        ("//exit", None),
        ("/ exit", None),
        ("/3 of 4", None),
        ("/", None),
        ("", None),
    ],
)
def test_chat_command_lines(line, command):
    assert _chat_command(line) == command


@pytest.mark.parametrize(("line", "words"), [("/nope", "unknown command /nope"), ("/exit now", "takes nothing")])
def test_chat_command_mistakes(line, words):
    with pytest.raises(InvalidArgumentError, match=words):
        _chat_command(line)


@pytest.mark.parametrize(("at_prompt", "status"), [(EOFError(), 0), (KeyboardInterrupt(), 130)])
def test_chat_ctrl_c_stops_the_reply(monkeypatch, capsys, at_prompt, status):
    """Ctrl-C during a reply ends that reply ("[stopped]") and the chat goes on, the partial reply kept in the
    conversation; Ctrl-D or a second Ctrl-C at the prompt quits without a traceback."""
    typed = ["Tell me a long story about a dragon.", "Say hello.", at_prompt]
    code, prompts, replies = chat(monkeypatch, typed, "-n", "6", interrupt_turn=1)
    out, err = capsys.readouterr()
    assert code == status
    assert len(prompts) == 2 and replies[0] and replies[1]
    assert out == f"> {replies[0]} [stopped]\n> {replies[1]}\n> " + ("\n" if status == 0 else "")
    assert prompts[1].startswith(prompts[0] + replies[0] + "<|im_end|>")
    assert "Traceback" not in err
    assert ("kleidipy: interrupted" in err) == (status == 130)


def test_chat_shifts_a_full_context_and_goes_on(monkeypatch, capsys):
    """A conversation longer than the context drops its oldest turns (one notice line) and keeps the system
    prompt; the chat never ends on a full context."""
    long = "Tell me everything you know about the history of the city of " + "Paris and Rome and Athens " * 12
    typed = [long] * 6 + ["/exit"]
    code, prompts, replies = chat(monkeypatch, typed, "-n", "8", "-c", "256", "--system", "Be brief.")
    err = capsys.readouterr().err
    assert code == 0 and len(prompts) == 6 and all(replies)
    assert "kleidipy: context full: the" in err and "Traceback" not in err
    assert all(p.count("Be brief.") == 1 for p in prompts)  # the system prompt is always kept


def test_shift_messages_drops_the_oldest_half_after_the_system_prompt():
    from kleidipy.runtime.context_shift import shift_messages

    msgs = [{"role": "system", "content": "s"}] + [{"role": "user", "content": str(i)} for i in range(8)]
    kept, dropped = shift_messages(msgs, lambda m: 10 * len(m), n_ctx=40, room=0)  # 9 messages -> 4 fit
    assert dropped == 5 and [m["content"] for m in kept] == ["s", "5", "6", "7"]  # half of 7, then half of 4
    kept, dropped = shift_messages(msgs[:2], lambda m: 1000, n_ctx=60, room=0)
    assert dropped == 0 and kept == msgs[:2]  # the newest message alone: nothing more to drop


# --------------------------------------------------------------------------------------------- models


def test_models_lists_the_catalogue_and_marks_what_is_pulled(tmp_path, monkeypatch, capsys):
    """Each catalogue model and where it is cached; a file counts as pulled only at the catalogue's size."""
    monkeypatch.setenv("KLEIDIPY_CACHE", str(tmp_path))
    spec = CATALOGUE[SMOLLM2]
    cached = tmp_path / "models" / spec.filename

    def listed() -> dict[str, str]:
        assert main(["models"]) == 0
        *lines, total = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 * len(CATALOGUE) and total == f"repack cache {tmp_path / 'repack'}: empty"
        return {name.split()[0]: state.strip() for name, state in zip(lines[0::2], lines[1::2], strict=True)}

    assert listed() == dict.fromkeys(CATALOGUE, "not pulled")
    assert main(["models", "--path", SMOLLM2]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kleidipy: error:") and "not pulled yet" in err and "\n" not in err

    cached.parent.mkdir()
    with cached.open("wb") as f:
        f.truncate(spec.size)  # sparse: the size is what `models` looks at
    assert listed() == {**dict.fromkeys(CATALOGUE, "not pulled"), SMOLLM2: str(cached)}
    assert main(["models", "--path", SMOLLM2]) == 0
    assert capsys.readouterr().out == f"{cached}\n"

    with cached.open("r+b") as f:
        f.truncate(spec.size - 1)  # an interrupted copy is not a pulled model
    assert listed() == dict.fromkeys(CATALOGUE, "not pulled")
    assert main(["models", "--path", "smollm"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_models_shows_the_repack_cache_and_rm_removes_a_model_with_it(tmp_path, monkeypatch, capsys):
    """`models` gives each model's repacked weights and the repack cache's total (files for other GGUF files and
    unreadable ones included); `rm NAME` deletes the model file and its repack files, for every target, and
    nothing else; a model not pulled, an unknown or an empty name is one error line."""
    monkeypatch.setenv("KLEIDIPY_CACHE", str(tmp_path))
    spec = CATALOGUE[SMOLLM2]
    cached = tmp_path / "models" / spec.filename
    cached.parent.mkdir()
    with cached.open("wb") as f:
        f.truncate(spec.size)
    repack = tmp_path / "repack"
    write_cache(repack / "smollm2.i8mm.kpack", {"model": f"sha256:{spec.sha256}", "target": "i8mm"}, {})
    write_cache(repack / "smollm2.sme2.kpack", {"model": f"sha256:{spec.sha256}", "target": "sme2"}, {})
    write_cache(repack / "mine.i8mm.kpack", {"model": "/home/me/mine.gguf:1000:1", "target": "i8mm"}, {})
    (repack / "broken.kpack").write_bytes(bytes(2**20))
    sizes = {path.name: path.stat().st_size for path in repack.iterdir()}
    ours = sizes["smollm2.i8mm.kpack"] + sizes["smollm2.sme2.kpack"]
    trace = tmp_path / "trace"  # kleidipy trace's Q4_0 copies: SmolLM2's and another model's
    trace.mkdir()
    (trace / "SmolLM2-135M-Instruct.Q4_1.1234abcd-5678ef90.Q4_0.gguf").write_bytes(bytes(3 * 2**20))
    (trace / "other.aaaa-bbbb.Q4_0.gguf").write_bytes(bytes(2**20))

    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"{'':<30} {cached}; repack cache {ours / 2**20:.1f} MiB in 2 files; trace's Q4_0 copy 3.0 MiB"
    other = f"{(sum(sizes.values()) - ours) / 2**20:.1f} MiB of it for GGUF files outside the catalogue"
    assert lines[-2] == f"repack cache {repack}: {sum(sizes.values()) / 2**20:.1f} MiB in 4 files ({other})"
    assert lines[-1] == f"trace's Q4_0 copies {trace}: 4.0 MiB in 2 files"

    assert main(["rm", SMOLLM2]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"removed {SMOLLM2}: its file (93.8 MiB) and 2 files of repacked weights ({ours / 2**20:.1f} MiB) and "
        "trace's Q4_0 copy (3.0 MiB)\n"
    )
    assert not cached.exists() and sorted(path.name for path in repack.iterdir()) == ["broken.kpack", "mine.i8mm.kpack"]
    assert [path.name for path in trace.iterdir()] == ["other.aaaa-bbbb.Q4_0.gguf"]
    assert "is not pulled: nothing to remove" in main_error(capsys, "rm", SMOLLM2)
    assert "did you mean 'smollm2-135m-instruct'" in main_error(capsys, "rm", "smollm")
    assert "no model name given" in main_error(capsys, "rm", "")


# --------------------------------------------------------------------------------------------- quantize


def test_quantize_tiny_model(tmp_path, capsys):
    src = tiny_model(tmp_path)
    dst = tmp_path / "tiny.q8_0.gguf"
    assert main(["quantize", str(src), str(dst), "--type", "q8_0", "--pure", "-q"]) == 0
    assert capsys.readouterr().out.startswith(f"{dst}: ")
    tensors = ModelFile(dst).tensors.values()
    assert {t.ggml_type for t in tensors if len(t.shape) == 2} == {T.Q8_0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf", "tiny.q8_0.gguf"]


def test_quantize_bad_arguments(tmp_path):
    """One line and a non-zero exit for every mistake; nothing is written."""
    src = tiny_model(tmp_path)
    out = str(tmp_path / "out.gguf")
    one_line_error(run_cli("quantize", str(tmp_path / "missing.gguf"), out, "--type", "q4_0"), "missing.gguf")
    one_line_error(run_cli("quantize", str(src), str(tmp_path / "no" / "out.gguf"), "--type", "q4_0"), "not exist")
    one_line_error(run_cli("quantize", str(src), str(src), "--type", "q4_0"), "is the input file")
    one_line_error(run_cli("quantize", str(src), str(tmp_path), "--type", "q4_0"), "is a directory")
    bad_type = run_cli("quantize", str(src), out, "--type", "q5_0")  # argparse: usage, then the error line
    assert bad_type.returncode == 2 and "Traceback" not in bad_type.stderr
    assert "error: argument --type: invalid choice: 'q5_0'" in bad_type.stderr.splitlines()[-1]
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


# --------------------------------------------------------------------------------------------- serve


def test_serve_help_lists_llama_server_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("-m MODEL, --model MODEL", "-t THREADS, --threads THREADS", "-c CTX_SIZE, --ctx-size CTX_SIZE"):
        assert flag in out
    for flag in ("--host HOST", "--port PORT", "--parallel PARALLEL", "--api-key API_KEY"):
        assert flag in out


@pytest.mark.parametrize(
    ("flags", "word"),
    [
        (("--parallel", "0"), "--parallel"),
        (("-c", "-5"), "--ctx"),
        (("-c", "32", "--parallel", "4"), "--ctx"),  # 8 tokens a slot
        (("--api-key", ""), "--api-key"),
        (("--api-key", "  "), "--api-key"),
        (("--port", "70000"), "--port"),
        (("--port", "-1"), "--port"),
        (("--lookup", "-1"), "--lookup"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_serve_rejects_bad_flags_before_loading(tmp_path, flags, word):
    """The model named does not exist: an error about the flag shows it was caught before any load."""
    one_line_error(run_cli("serve", "-m", str(tmp_path / "never-loaded.gguf"), *flags), word)


def test_serve_on_a_busy_port_is_one_line(tmp_path):
    """A port another server listens on: one line that names it and --port, exit 2, before the model is loaded (it
    does not exist), without uvicorn's message or a traceback."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = run_cli("serve", "-m", str(tmp_path / "never-loaded.gguf"), "--port", str(port))
    one_line_error(proc, f"port {port} on 127.0.0.1 is in use (choose another with --port)")
    assert proc.returncode == 2 and "uvicorn" not in proc.stderr.lower() and "Errno" not in proc.stderr


def test_exact_weights_flag_reaches_the_engine(tmp_path, monkeypatch, capsys):
    """--exact-weights on the commands that load a model (not trace); without it the engine reads
    KLEIDIPY_EXACT_WEIGHTS: a tiny Q8_0 model runs its weights through the exact-weight family."""
    for command in ("run", "chat", "serve", "perplexity", "bench"):
        required = ["-f", "text.txt"] if command == "perplexity" else []
        assert build_parser().parse_args([command, "--exact-weights", *required]).exact_weights
    with pytest.raises(SystemExit):
        build_parser().parse_args(["trace", "--exact-weights"])
    capsys.readouterr()
    seen = []
    monkeypatch.setattr(Engine, "__post_init__", lambda engine: seen.append(engine.exact_weights) or 1 / 0)
    model = str(write_model(tmp_path / "m.gguf", "qwen2", T.Q8_0))
    for flag in (["--exact-weights"], []):
        with pytest.raises(ZeroDivisionError):
            main(["run", "-m", model, "-p", "hi", "-q", *flag])
    assert seen == [True, None]  # (None: the engine reads KLEIDIPY_EXACT_WEIGHTS)
