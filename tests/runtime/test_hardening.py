"""One test per failure an adversarial run found: each bad input now gives a clean typed error (or works)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from starlette.testclient import TestClient
from tiny_models import model_parts, write_model

from kleidipy.cli import main
from kleidipy.errors import BufferSizeError, InvalidArgumentError, KernelShapeError, KleidipyError, NonFiniteInputError
from kleidipy.kernels.catalogue import get_kernel
from kleidipy.runtime import chat_template, kv_cache
from kleidipy.runtime.chat_template import ChatTemplate, ChatTemplateError
from kleidipy.runtime.generate import Engine
from kleidipy.runtime.gguf_file import WEIGHT_TYPES, Tensor
from kleidipy.runtime.tensor_check import _FLOATS, NonFiniteTensorError, check_tensor
from kleidipy.runtime.tokenizer import Tokenizer, TokenizerError
from kleidipy.server import create_app
from kleidipy.server.schemas import APIError, parse_chat

Q4_0_GEMM = "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm"
F32_GEMM = "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"
USER = [{"role": "user", "content": "hi"}]
QUANTIZABLE = {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "qwen2", T.Q4_0)


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    """Run the CLI in-process: (exit status, stderr), argparse's exits included."""
    try:
        status = main(list(args))
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def one_line_error(status: int, err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("kleidipy: error:")]
    assert status != 0 and len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]


# 1. a special-token id stored as a string


def test_special_token_id_of_the_wrong_type(tmp_path: Path) -> None:
    path = write_model(tmp_path / "m.gguf", kv={"tokenizer.ggml.eos_token_id": "2"})
    with pytest.raises(TokenizerError, match="eos_token_id = '2' is not a token id"):
        Tokenizer.from_gguf(path)
    with pytest.raises(TokenizerError, match="eos_token_id"):
        ChatTemplate.from_gguf(path)
    with pytest.raises(TokenizerError):
        Engine(path, progress=False)


# 2. templates that overflow, recurse or blow up memory


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(10**9) %}x{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "{{ 'a' * 10**12 }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{{ 'x'.center(10**10) }}",
        "{{ 'x'|center(10**10) }}",
        "{{ '%1000000000d' % 3 }}",
        "{{ '{:>1000000000}'.format(1) }}",
        "{{ 2 ** 100000 }}",
        "{{ 10.0 ** 400 }}",
        "{{ 1 + 'a' }}",
        "{{ 1 / 0 }}",
    ],
)
def test_hostile_template_is_a_chat_template_error(source: str) -> None:
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(source).render(USER)
    assert "\n" not in str(info.value)


def test_ordinary_templates_still_render() -> None:
    source = "{% for m in messages %}{{ '%s: %s' % (m.role, m.content) }}{{ '{:>3}'.format(loop.index) }}{% endfor %}"
    assert ChatTemplate(source).render(USER) == "user: hi  1"


# 3. CLI numbers out of range: one line, before the model is loaded


def test_context_sizes_out_of_range(capsys: pytest.CaptureFixture, tiny: Path, monkeypatch) -> None:  # noqa: ANN001
    for ctx in ("-5", "0", "2147483648"):
        one_line_error(*cli(capsys, "run", "-m", str(tiny), "-p", "hi", "-q", "-c", ctx), "context")
    monkeypatch.setattr(kv_cache, "_physical_memory", lambda: 1 << 30)  # as if the machine had 1 GiB
    one_line_error(*cli(capsys, "run", "-m", str(tiny), "-p", "hi", "-q", "-c", "10000000"), "GiB of KV cache")


def test_seed_minus_one_is_random(capsys: pytest.CaptureFixture, tiny: Path) -> None:
    status, err = cli(capsys, "run", "-m", str(tiny), "-p", "hi", "-q", "-n", "2", "--seed", "-1", "--temp", "1")
    assert status == 0, err
    assert cli(capsys, "run", "-m", str(tiny), "-p", "hi", "-q", "-n", "2", "--seed", "-7")[0] == 0


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_serve_port_out_of_range(capsys: pytest.CaptureFixture, port: str) -> None:
    one_line_error(*cli(capsys, "serve", "-m", "/no/such/model.gguf", "--port", port), "--port")


# 4. the CLI takes the sampling values the server takes, and no others


@pytest.mark.parametrize(
    ("option", "value", "param"),
    [
        ("--top-p", "2", "top_p"),
        ("--top-p", "-1", "top_p"),
        ("--top-k", "-5", "top_k"),
        ("--temp", "-1", "temperature"),
    ],
)
def test_cli_sampling_ranges_are_the_servers(
    capsys: pytest.CaptureFixture, option: str, value: str, param: str
) -> None:
    # checked before the model is looked up: the model file does not exist
    one_line_error(*cli(capsys, "run", "-m", "/no/such.gguf", "-p", "hi", option, value), param)
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": USER, param: float(value)})
    assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize("threads", ["0", "-1", "100000"])
def test_thread_counts(capsys: pytest.CaptureFixture, threads: str) -> None:
    one_line_error(*cli(capsys, "run", "-m", "/no/such.gguf", "-p", "hi", "-t", threads), "thread count")
    one_line_error(*cli(capsys, "bench", "-m", "/no/such.gguf", "-t", f"1,{threads}"), "thread count")


# 5. NaN in weight-side kernel inputs; NaN/Inf in model weights


def test_non_finite_weight_side_inputs() -> None:
    n, k = 16, 64
    q4 = get_kernel(Q4_0_GEMM)
    blocks = gguf.quants.quantize(np.ones((n, k), np.float32), T.Q4_0)
    blocks[3, 18:20] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # d of row 3, block 1
    with pytest.raises(NonFiniteInputError, match="Q4_0 block scale"):
        q4.pack_rhs(n, k, blocks)
    f32 = get_kernel(F32_GEMM)
    rhs = np.ones((k, n), np.float32)
    with pytest.raises(NonFiniteInputError, match="bias"):
        f32.pack_rhs(n, k, rhs, bias=np.full(n, np.inf, np.float32))
    rhs[5, 5] = np.nan
    with pytest.raises(NonFiniteInputError, match="rhs"):
        f32.pack_rhs(n, k, rhs)
    q8 = get_kernel("matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm")
    scale = np.ones(n, np.float32)
    scale[2] = np.nan
    with pytest.raises(NonFiniteInputError, match="scale"):
        q8.pack_rhs(n, k, np.ones((n, k), np.int8), scale=scale)
    q41 = get_kernel("matmul_clamp_f32_qsi8d32p4x8_qai4c32p4x8_8x4_neon_i8mm")
    zero = np.zeros(n * 2, np.float32)
    zero[0] = np.nan
    with pytest.raises(NonFiniteInputError, match="zero"):
        q41.pack_rhs(n, k, np.zeros((n, k // 2), np.uint8), scale=np.ones(n * 2, np.float32), zero=zero)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # quantizing a NaN
@pytest.mark.parametrize("ggml_type", sorted(WEIGHT_TYPES))
def test_tensor_check_finds_the_row(ggml_type: T) -> None:
    values = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)

    def tensor(x: np.ndarray) -> Tensor:
        if ggml_type in QUANTIZABLE:
            raw = np.asarray(gguf.quants.quantize(x, ggml_type)).view(np.uint8).reshape(8, -1)
        else:  # gguf cannot quantize K-quants: all-zero blocks, with d NaN where x is
            raw = np.zeros((8, gguf.GGML_QUANT_SIZES[ggml_type][1]), np.uint8)
            d = _FLOATS[ggml_type][1][0]
            raw[np.isnan(x).any(axis=1), d : d + 2] = [0x00, 0x7E]
        return Tensor("w", ggml_type, (256, 8), raw, 0)

    assert check_tensor(tensor(values)) is None
    values[5, 100] = np.nan
    assert check_tensor(tensor(values)) == 5
    if ggml_type in QUANTIZABLE:
        values[5, 100] = -np.inf
        assert check_tensor(tensor(values)) == 5


def test_non_finite_model_weights(tmp_path: Path) -> None:
    meta, arrays = model_parts("llama")
    norm = arrays["output_norm.weight"].copy()
    norm[1] = np.inf
    path = write_model(tmp_path / "inf.gguf", weights=T.F16, tensors={"output_norm.weight": norm})
    with pytest.raises(NonFiniteTensorError, match="'output_norm.weight'.*row 0"):
        Engine(path, progress=False)
    Engine(path, progress=False, check_tensors=False)  # llama.cpp without --check-tensors loads it too


# 6. a plain array packed for another k


def test_plain_buffer_of_another_k() -> None:
    kern = get_kernel(Q4_0_GEMM)
    n, m = 16, 4
    rng = np.random.default_rng(0)
    rhs64 = np.asarray(kern.pack_rhs(n, 64, gguf.quants.quantize(rng.standard_normal((n, 64), np.float32), T.Q4_0)))
    lhs32 = kern.pack_lhs(rng.standard_normal((m, 32), np.float32))
    with pytest.raises(BufferSizeError, match="exactly"):
        kern.run(m, n, 32, lhs32, rhs64)
    rhs32 = kern.pack_rhs(n, 32, gguf.quants.quantize(rng.standard_normal((n, 32), np.float32), T.Q4_0))
    kern.run(m, n, 32, np.asarray(lhs32), np.asarray(rhs32))  # exact plain arrays still run


# 7. typed errors instead of numpy's


def test_typed_errors_for_bad_arguments() -> None:
    kern = get_kernel(Q4_0_GEMM)
    x = np.ones((4, 64), np.float32)
    with pytest.raises(InvalidArgumentError, match="bogus"):
        kern.pack_lhs(x, execution="bogus")
    assert isinstance(InvalidArgumentError("x"), ValueError)
    empty = kern.pack_lhs(np.zeros((0, 64), np.float32), 0, 64, execution="reference")
    assert empty.size == 0
    with pytest.raises(KernelShapeError):
        get_kernel(F32_GEMM).pack_lhs(x, -1, 64)
    with pytest.raises(InvalidArgumentError, match="thread count"):
        kern.pack_lhs(x, threads=0)


# 8. inconsistent tokenizer metadata


@pytest.mark.parametrize(
    ("kv", "drop", "message"),
    [
        ({"tokenizer.ggml.eos_token_id": -1}, (), "eos_token_id = -1"),
        ({"tokenizer.ggml.bos_token_id": 100000}, (), "bos_token_id = 100000"),
        ({}, ("tokenizer.ggml.token_type",), "token_type is missing"),
        (
            {"tokenizer.ggml.tokens": ["<unk>", "<s>", "a"] + [f"<0x{b:02X}>" for b in range(256)] + list("bcdefg")},
            ("tokenizer.ggml.eos_token_id",),
            "no end-of-generation token",
        ),  # fmt: skip
    ],
)
def test_inconsistent_tokenizer_metadata(kv: dict, drop: tuple, message: str) -> None:
    meta = {k: v for k, v in {**model_parts("llama")[0], **kv}.items() if k not in drop}
    with pytest.raises(TokenizerError, match=message):
        Tokenizer(meta)


# 9. server: null user content, lowercase bearer


def test_server_null_content_and_bearer_scheme(tiny: Path) -> None:
    app = create_app(Engine(tiny, n_ctx=256, progress=False), parallel=1, api_key="k3y")
    with TestClient(app) as client:
        body = {"model": "tiny.gguf", "max_tokens": 2, "messages": [{"role": "user", "content": None}]}
        got = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer k3y"})
        assert got.status_code == 400 and got.json()["error"]["param"] == "messages[0].content"
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert client.get("/v1/models", headers={"Authorization": f"{scheme} k3y"}).status_code == 200
        assert client.get("/v1/models", headers={"Authorization": "Basic k3y"}).status_code == 401
        turns = [*USER, {"role": "assistant", "content": None}, *USER]
        ok = client.post(
            "/v1/chat/completions", json={**body, "messages": turns}, headers={"Authorization": "bearer k3y"}
        )
        assert ok.status_code == 200, ok.text


# 10. broken pipe, and where the Chrome trace went


def test_layout_into_a_closed_pipe() -> None:
    code = "from kleidipy.cli import main; import sys; sys.exit(main(['layout', '--text']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head` does once it has what it wants; here before the first write, so it fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) != 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_chrome_trace_says_where(capsys: pytest.CaptureFixture, tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    status, err = cli(capsys, "trace", "-m", str(tiny), "-n", "1", "--chrome-trace", str(out))
    assert status == 0 and out.is_file() and f"wrote the Chrome trace to {out}" in err
    one_line_error(*cli(capsys, "trace", "-m", str(tiny), "-n", "1", "--chrome-trace", str(tmp_path / "no/t.json")))


def test_every_error_here_is_a_kleidipy_error() -> None:
    for cls in (TokenizerError, ChatTemplateError, NonFiniteTensorError, InvalidArgumentError, APIError):
        assert issubclass(cls, KleidipyError)


# 11. hostile chat templates and unusable JSON schemas (issue 50): one line, exit != 0; a 400 from the server

RECURSIVE_MACRO = "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}"
SCHEMA_CYCLE = '{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}'


def test_cli_hostile_chat_template(capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(chat_template, "MAX_SECONDS", 0.5)
    for source, words in [
        (RECURSIVE_MACRO, ("takes more than 0.5 s",)),
        ("{{ raise_exception('a\nb') }}", ("chat template: a b",)),
        ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", ("adds",)),
    ]:
        path = write_model(tmp_path / "m.gguf", kv={"tokenizer.chat_template": source})
        one_line_error(*cli(capsys, "run", "-m", str(path), "-p", "hi", "-q", "-n", "1"), *words)


def test_cli_unusable_json_schema(capsys: pytest.CaptureFixture, tiny: Path) -> None:
    for schema in ('{"$ref": "#"}', SCHEMA_CYCLE):
        status, err = cli(capsys, "run", "-m", str(tiny), "-p", "hi", "-q", "-n", "1", "-j", schema)
        one_line_error(status, err, "invalid JSON schema: no text matches it")
        assert "NoExtensionBias" not in err and "<state>" not in err


def test_server_hostile_chat_template(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(chat_template, "MAX_SECONDS", 0.5)
    path = write_model(tmp_path / "m.gguf", kv={"tokenizer.chat_template": RECURSIVE_MACRO})
    with TestClient(create_app(Engine(path, n_ctx=256, progress=False), parallel=1)) as client:
        for stream in (False, True):
            got = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "stream": stream})
            error = got.json()["error"]
            assert got.status_code == 400 and error["type"] == "invalid_request_error", got.text
            assert error["message"] == "chat template takes more than 0.5 s to render"
