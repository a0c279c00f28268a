"""Malformed HTTP requests to the server (Starlette's TestClient, in-process): bad routes and methods, content
types, bodies that are not JSON or not objects, every request field with random JSON values (seeded), and API-key
headers. Every answer must be a success or a 4xx with OpenAI's error object, never a 5xx."""

from __future__ import annotations

import json
import random

import pytest
from fuzzing import Tally, outcome
from gguf import GGMLQuantizationType as T
from starlette.testclient import TestClient
from tiny_models import write_model

from kleidipy.runtime.generate import Engine
from kleidipy.server import create_app

MODEL = "tiny.gguf"
JSON = {"Content-Type": "application/json"}
USER = [{"role": "user", "content": "hi"}]
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "n", "stream", "stream_options", "logprobs", "echo", "tools", "response_format",
          "frequency_penalty", "presence_penalty", "repeat_penalty", "best_of", "suffix", "logit_bias"]  # fmt: skip
ODD = [None, True, False, 0, -1, 1, 2, 3.5, -0.0, 1e308, 10**30, -(10**30), "", "x", "\u0000", "\ud800", [], [1],
       ["a", "b"], {}, {"type": "text"}, {"role": "user"}, [{"role": "user", "content": None}],
       [{"role": "system", "content": [{"type": "image_url"}]}], [{"role": 5}], "tiny.gguf"]  # fmt: skip
RAW_BODIES = [b"", b"{", b"[", b"null", b"1", b'"s"', b"[1,2]", b"\xff\xfe", b"{" * 5000, b"[" * 100_000,
              b'{"temperature": NaN}', b'{"max_tokens": 1e999}', b'{"model": "a", "model": "b"}',
              json.dumps({"model": MODEL, "messages": USER, "max_tokens": 1}).encode()]  # fmt: skip
ROUTES = ["/health", "/v1/models", "/v1/models/tiny.gguf", "/v1/models/nope", "/v1/chat/completions",
          "/v1/completions", "/v1/embeddings", "/", "/v1/models/" + "a" * 5000,
          "/v1/chat/completions/../models"]  # fmt: skip


def is_openai_error(response: object) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)


def answer(client: TestClient, method: str, path: str, **kwargs: object) -> str:
    """``"2xx"`` / ``"4xx"`` for an acceptable answer, else a failure (see fuzzing.outcome): a 5xx or a 4xx without
    OpenAI's error object (as an AssertionError), an exception, a hang."""
    result = []

    def case() -> None:
        response = client.request(method, path, **kwargs)
        status = response.status_code
        if status >= 500 or (status >= 400 and not is_openai_error(response)):
            raise AssertionError(f"{status}: {response.text[:300]}")
        result.append(f"{status // 100}xx")

    first = outcome(case)
    return result[0] if first == "ok" else first


def requests(seed: int, n: int) -> list[tuple[str, str, dict]]:
    """(method, path, httpx keywords) of every request: the fixed ones, then ``n`` random bodies."""
    out = [(method, path, {}) for path in ROUTES for method in ("GET", "POST", "PUT", "DELETE")]
    for body in RAW_BODIES:
        for ctype in ("application/json", "text/plain", "application/json; charset=utf-8", "APPLICATION/JSON", ""):
            headers = {"Content-Type": ctype} if ctype else {}
            out += [("POST", path, {"content": body, "headers": headers}) for path in ROUTES[4:6]]
    rng = random.Random(seed)
    for _ in range(n):
        body = {"model": MODEL, "messages": USER, "prompt": "hi", "max_tokens": 2}
        for field in rng.sample(FIELDS, rng.randrange(1, 4)):
            body[field] = rng.choice(ODD)
        content = json.dumps(body).encode()  # lone surrogates as \ud800 escapes: valid JSON, invalid text
        out.append(("POST", rng.choice(ROUTES[4:6]), {"content": content, "headers": JSON}))
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = write_model(tmp_path_factory.mktemp("server") / MODEL, "qwen2", T.Q4_0)
    return Engine(path, n_ctx=128, progress=False)


def test_malformed_requests(engine: Engine) -> None:
    tally = Tally()
    with TestClient(create_app(engine, parallel=2), raise_server_exceptions=False) as client:
        for method, path, kwargs in requests(seed=0, n=1500):
            tally.add(answer(client, method, path, **kwargs), f"{method} {path} {str(kwargs)[:200]}")
        assert client.get("/health").json()["status"] == "ok"
    assert not tally.failures, tally.report("server fuzz")
    assert tally.counts["2xx"] and tally.counts["4xx"]


def test_api_key_headers(engine: Engine) -> None:
    tally = Tally()
    with TestClient(create_app(engine, parallel=1, api_key="k3y"), raise_server_exceptions=False) as client:
        for value in ["", "k3y", "Bearer", "Bearer ", "Bearer k3y", "Bearer  k3y", "bearer k3y", "Bearer k3y ",
                      "Bearer k3yy", "Basic k3y", "Bearer k3y k3y", "Bearer \u00e9", "B" * 10000]:  # fmt: skip
            headers = {"Authorization": value.encode("utf-8")} if value else {}
            tally.add(answer(client, "GET", "/v1/models", headers=headers), repr(value))
    assert not tally.failures and tally.counts["2xx"] == 4, tally.report("API keys")  # "Bearer k3y", spaced or not
