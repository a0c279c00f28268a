"""The OpenAI-compatible server, driven over loopback with the official ``openai`` client (and raw HTTP for what
the client cannot send): SmolLM2 where real text matters (streamed == non-streamed == Engine.generate, usage,
stop strings, bad input), a tiny random GGUF with a byte-level vocabulary where only speed matters (disconnects
free slots, the FIFO queue, 16 concurrent streaming clients, 600 requests with disconnects leaving memory flat,
API key), and the step machine and scheduler on their own (stop strings held back, one failing job leaves the
others alone)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import llguidance
import numpy as np
import openai
import pytest
import uvicorn
from gguf import GGMLQuantizationType as T
from gguf_writer import TINY, tiny_kv, tiny_tensors, write_gguf
from hypothesis import given, settings
from hypothesis import strategies as st
from model_files import SMOLLM2

import kleidipy.server
from kleidipy.runtime.generate import Engine, Generation
from kleidipy.runtime.grammar import Grammar
from kleidipy.runtime.sampler import SamplingParams
from kleidipy.server import create_app, schemas, serve
from kleidipy.server.app import ServerConfigError
from kleidipy.server.scheduler import Job, Scheduler
from kleidipy.server.schemas import APIError, parse_chat, parse_completion

# ---------------------------------------------------------------------------------------------------------------
# running a server in-process


class Server:
    """uvicorn serving ``app`` in a thread on a free loopback port (lifespan on: the scheduler runs)."""

    def __init__(self, app) -> None:  # noqa: ANN001
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def client(self, api_key: str = "unused", timeout: float = 120) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=timeout)

    def async_client(self, timeout: float = 120) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """Raw HTTP: (status, parsed JSON body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def raw(self, head: bytes, chunks: list[bytes] = ()):
        """Send ``head`` then ``chunks`` in chunked encoding (without the last chunk) on a socket: (status, JSON)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.sendall(head)
            for chunk in chunks:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            return resp.status, json.loads(resp.read())

    def post(self, path: str, obj: object, **headers: str):
        return self.request("POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json", **headers})

    def health(self) -> dict:
        status, body = self.request("GET", "/health")
        assert status == 200
        return body

    def wait_idle(self) -> None:
        """Wait until no slot is busy and nothing is queued (HANG_TIMEOUT only catches a hang)."""
        deadline = time.monotonic() + HANG_TIMEOUT
        while True:
            h = self.health()
            if h["slots_processing"] == 0 and h["queued"] == 0:
                return
            assert time.monotonic() < deadline, f"server still busy after {HANG_TIMEOUT} s: {h}"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@contextlib.contextmanager
def serving(engine: Engine, **options) -> Iterator[Server]:  # noqa: ANN003
    server = Server(create_app(engine, **options))
    try:
        yield server
    finally:
        server.close()


def is_openai_error(body: dict, param: str | None = None) -> bool:
    err = body.get("error")
    ok = isinstance(err, dict) and set(err) == {"message", "type", "param", "code"} and err["message"]
    return bool(ok) and (param is None or err["param"] == param)


# ---------------------------------------------------------------------------------------------------------------
# models

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
#: seconds after which a wait is a hang (never a speed requirement: speed is measured in benchmarks/server.py)
HANG_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def greedy_chat(smollm2: Engine) -> str:
    """What Engine.generate answers (temperature 0, 12 tokens): run before any scheduler takes the model."""
    return "".join(smollm2.generate(smollm2.chat_prompt(MESSAGES), 12, SamplingParams(temperature=0.0)))


@pytest.fixture(scope="module")
def smol(smollm2: Engine, greedy_chat: str) -> Iterator[Server]:
    with serving(smollm2, parallel=2) as server:  # 2 slots of 512 tokens
        yield server


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """A 2-layer random llama with a byte-level BPE vocabulary (token id b = byte b) and ChatML specials."""
    tokens = [*_byte_chars(), "Ġt", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    n_vocab = len(tokens)
    hp = {**TINY, "n_vocab": n_vocab, "n_ctx": 4096}
    kv = {
        **tiny_kv("llama", **hp),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (n_vocab - 3) + [3, 3, 3],
        "tokenizer.ggml.merges": ["Ġ t", "h e"],
        "tokenizer.ggml.bos_token_id": n_vocab - 3,
        "tokenizer.ggml.eos_token_id": n_vocab - 1,
        "tokenizer.ggml.add_bos_token": False,
    }
    tensors = tiny_tensors("llama", seed=1, tied=False, **hp)
    tensors["output.weight"] *= 10  # logits spread over ~±30 and the specials' at 0: min_p / top_k never keep
    tensors["output.weight"][-3:] = 0  # end-of-generation, so every generation runs to max_tokens
    path = write_gguf(tmp_path_factory.mktemp("tiny") / "tiny-chat.gguf", "llama", kv, tensors, {"*": T.Q4_1})
    return Engine(path, n_ctx=32768, progress=False)  # long enough that an uncancelled generation takes minutes


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2: real text


def test_health_and_models(smol: Server) -> None:
    assert smol.health() == {"status": "ok", "slots_idle": 2, "slots_processing": 0, "queued": 0}
    client = smol.client()
    assert [m.id for m in client.models.list().data] == [SMOLLM2]
    assert client.models.retrieve(SMOLLM2).id == SMOLLM2
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_any_model_name_is_served_by_the_one_model(smol: Server) -> None:
    """As llama-server does: a client that names another model (or "default") gets this one, named in the reply."""
    client = smol.client()
    for name in ("gpt-4o", "default"):
        reply = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2, temperature=0)
        assert reply.model == SMOLLM2 and reply.usage.completion_tokens <= 2


def test_a_request_without_model_is_served(smol: Server, greedy_chat: str) -> None:
    """As llama-server does: a chat or completion body without "model" (or with null) is answered by the one
    model, named in the reply (curl examples leave it out)."""
    status, reply = smol.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert status == 200 and reply["model"] == SMOLLM2
    assert reply["choices"][0]["message"]["content"] == greedy_chat
    status, reply = smol.post("/v1/completions", {"model": None, "prompt": "The capital of France is", "max_tokens": 2})
    assert status == 200 and reply["model"] == SMOLLM2 and reply["usage"]["completion_tokens"] <= 2
    status, err = smol.post("/v1/chat/completions", {"model": 5, "messages": MESSAGES})
    assert status == 400 and is_openai_error(err, "model")  # a model given must still be a name


def test_tokenize_and_detokenize(smol: Server, smollm2: Engine) -> None:
    text = "The capital of France is"
    status, body = smol.post("/tokenize", {"content": text})
    assert status == 200 and body["tokens"] == smollm2.prompt(text)
    status, pieces = smol.post("/tokenize", {"content": "<|im_start|>hi", "with_pieces": True})
    assert status == 200 and pieces["tokens"][0] == {"id": 1, "piece": "<|im_start|>"}  # special text parsed
    status, plain = smol.post("/tokenize", {"content": "<|im_start|>hi", "parse_special": False})
    assert status == 200 and plain["tokens"][0] != 1
    status, body = smol.post("/detokenize", {"tokens": smollm2.prompt(text)})
    assert status == 200 and body["content"] == text
    for path, bad, param in (
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
        ("/detokenize", {"tokens": ["a"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", [1, 2], None),
    ):
        status, body = smol.post(path, bad)
        assert status == 400 and is_openai_error(body) and body["error"]["param"] == param, (path, bad, body)


def _stream_text(stream) -> tuple[str, list[str], str | None, object]:  # noqa: ANN001
    """Concatenated text, the pieces, the finish reason and the usage of a streamed answer."""
    pieces, finish, use = [], None, None
    for chunk in stream:
        use = chunk.usage or use
        for choice in chunk.choices:
            text = choice.delta.content if hasattr(choice, "delta") else choice.text
            if text:
                pieces.append(text)
            finish = choice.finish_reason or finish
    return "".join(pieces), pieces, finish, use


def test_chat_streamed_equals_non_streamed_equals_engine(smol: Server, smollm2: Engine, greedy_chat: str) -> None:
    client = smol.client()
    # a fresh prefill each time (no prompt cache), so the bits are the engine's for the whole prompt
    args = dict(
        model=SMOLLM2, messages=MESSAGES, max_tokens=12, temperature=0, seed=7, extra_body={"cache_prompt": False}
    )
    full = client.chat.completions.create(**args)
    choice = full.choices[0]
    assert full.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content == greedy_chat  # the server computes what `kleidipy run` computes
    n_prompt, n_out = len(smollm2.chat_prompt(MESSAGES)), full.usage.completion_tokens  # (the GGUF's chat template)
    assert choice.finish_reason == ("length" if n_out == 12 else "stop") and 0 < n_out <= 12  # (an EOG can come first)
    assert (full.usage.prompt_tokens, full.usage.total_tokens) == (n_prompt, n_prompt + n_out)
    stream = client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    text, pieces, finish, use = _stream_text(stream)
    assert text == greedy_chat and len(pieces) > 1 and finish == choice.finish_reason
    assert (use.prompt_tokens, use.completion_tokens, use.total_tokens) == (n_prompt, n_out, n_prompt + n_out)


def test_lookup_drafts_give_the_same_text(smollm2: Engine) -> None:
    """Prompt-lookup decoding in the server (``--lookup``, a request's ``lookup``): two concurrent requests whose
    answers repeat their prompts, in batched rounds, each the text the engine generates without drafts."""
    prompt = [{"role": "user", "content": "Repeat exactly: red, green, blue, red, green, blue, red, green, white."}]
    want = "".join(smollm2.generate(smollm2.chat_prompt(prompt), 40, SamplingParams(temperature=0.0)))
    with serving(smollm2, parallel=2, lookup=6) as server:

        async def both() -> list[str]:
            client = server.async_client()
            asks = [
                client.chat.completions.create(model=SMOLLM2, messages=prompt, max_tokens=40, temperature=0, **kw)
                for kw in ({}, {"extra_body": {"lookup": 10}})
            ]
            return [r.choices[0].message.content for r in await asyncio.gather(*asks)]

        assert asyncio.run(both()) == [want, want]
        assert server.app.state.scheduler.stats.forward_passes < 40  # (drafts were accepted: fewer passes)


def test_prompt_cache_prefills_only_the_new_tokens(smol: Server, smollm2: Engine) -> None:
    """A second chat turn that extends the first takes the slot whose KV cache holds the conversation and
    prefills only its new tokens (usage.prompt_tokens_details.cached_tokens); cache_prompt=false starts afresh."""
    client = smol.client()
    turn = [{"role": "user", "content": "Name a colour."}]
    first = client.chat.completions.create(model=SMOLLM2, messages=turn, max_tokens=6, temperature=0)
    turn += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Why?"}]
    second = client.chat.completions.create(model=SMOLLM2, messages=turn, max_tokens=4, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    first_ids, second_ids = smollm2.chat_prompt(turn[:1]), smollm2.chat_prompt(turn)
    assert second_ids[: len(first_ids)] == first_ids
    assert len(first_ids) <= cached < second.usage.prompt_tokens  # at least the whole first prompt was reused
    fresh = client.chat.completions.create(
        model=SMOLLM2, messages=turn, max_tokens=4, temperature=0, extra_body={"cache_prompt": False}
    )
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0


def test_logprobs_chat_and_completions(smol: Server, smollm2: Engine) -> None:
    """Chat ``logprobs``/``top_logprobs`` and completions ``logprobs``: one entry per generated token, its text is
    the content, greedy picks the most likely token, the first one is the engine's log-softmax of the prompt's
    last logits, and streaming gives the same entries."""
    from kleidipy.runtime.sampler import log_softmax

    client = smol.client()
    args = dict(model=SMOLLM2, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
                extra_body={"cache_prompt": False})  # fmt: skip
    full = client.chat.completions.create(**args)
    content = full.choices[0].logprobs.content
    assert (
        len(content) == full.usage.completion_tokens
        and "".join(c.token for c in content) == full.choices[0].message.content
    )
    for c in content:
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token and c.logprob <= 0
        assert c.logprob == c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob
    smollm2.lm.reset()
    first = log_softmax(smollm2.lm.forward(smollm2.chat_prompt(MESSAGES)))
    assert content[0].logprob == float(first.max())
    streamed = [c for chunk in client.chat.completions.create(**args, stream=True) for ch in chunk.choices
                if ch.logprobs for c in ch.logprobs.content]  # fmt: skip
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    plain = client.chat.completions.create(model=SMOLLM2, messages=MESSAGES, max_tokens=2)
    assert plain.choices[0].logprobs is None
    comp = client.completions.create(model=SMOLLM2, prompt="The capital of France is", max_tokens=4, temperature=0,
                                     logprobs=2)  # fmt: skip
    lp = comp.choices[0].logprobs
    assert "".join(lp.tokens) == comp.choices[0].text and len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert all(
        len(alts) == 2 and max(alts.values()) == v for alts, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )


def test_completion_sampled_with_seed_and_stop(smol: Server) -> None:
    client = smol.client()
    args = dict(model=SMOLLM2, prompt="Once upon a time", max_tokens=10, temperature=0.9, top_p=0.95, seed=1234)
    full = client.completions.create(**args)
    text = full.choices[0].text
    assert full.object == "text_completion" and full.usage.completion_tokens == 10 and len(text) > 5
    streamed, _, finish, _ = _stream_text(client.completions.create(**args, stream=True))
    assert streamed == text and finish == full.choices[0].finish_reason == "length"
    # a stop string from the middle of that text cuts it there, streamed or not, and never leaks a prefix of it
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = text[: text.index(stop)]
    cut = client.completions.create(**args, stop=[stop, "never-seen-stop"])
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == (expected, "stop")
    streamed, _, finish, _ = _stream_text(client.completions.create(**args, stop=stop, stream=True))
    assert (streamed, finish) == (expected, "stop")  # nothing of the stop string was sent before it completed


def test_n_choices_are_the_seeded_answers_one_by_one(smol: Server) -> None:
    """``n`` answers one request with n choices: choice i is what a single request with seed + i gives, streamed
    chunks carry each choice's index and end each with a finish reason, and usage counts every choice's tokens."""
    client = smol.client()
    args = dict(model=SMOLLM2, prompt="Once upon a time", max_tokens=6, temperature=0.9, seed=99)
    singles = [client.completions.create(**{**args, "seed": 99 + i}).choices[0].text for i in range(2)]
    many = client.completions.create(**args, n=2)
    assert [c.index for c in many.choices] == [0, 1] and [c.text for c in many.choices] == singles
    assert many.usage.completion_tokens == 12
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in client.chat.completions.create(
        model=SMOLLM2, messages=MESSAGES, max_tokens=4, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True},
    ):  # fmt: skip
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        if chunk.usage:
            assert chunk.usage.completion_tokens == 8
    assert texts[0] == texts[1] != "" and finishes == {0: "length", 1: "length"}  # greedy: the same answer twice


CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0, "maximum": 10**8},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
JSON_QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in JSON with its population."}]


def _is_city(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"city", "population"} and isinstance(value["city"], str) and type(value["population"]) is int


def test_response_format_json_schema_and_json_object(smol: Server) -> None:
    """``response_format`` constrains the reply: a json_schema reply parses and matches the schema (greedy and
    seeded, streamed or not, chat and completions) and ends with "stop" when the JSON is complete; json_object
    gives a JSON object."""
    client = smol.client()
    schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    args = dict(model=SMOLLM2, messages=JSON_QUESTION, max_tokens=60, temperature=0, response_format=schema)
    full = client.chat.completions.create(**args)
    text, finish = full.choices[0].message.content, full.choices[0].finish_reason
    assert _is_city(text) and finish == "stop"
    assert _stream_text(client.chat.completions.create(**args, stream=True))[::2] == (text, "stop")
    seeded = {**args, "temperature": 0.8, "seed": 3}
    first = client.chat.completions.create(**seeded).choices[0].message.content
    assert _is_city(first) and client.chat.completions.create(**seeded).choices[0].message.content == first
    obj = client.chat.completions.create(**{**args, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(obj.choices[0].message.content), dict) and obj.choices[0].finish_reason == "stop"
    comp = client.completions.create(
        model=SMOLLM2, prompt="The capital of France as JSON:", max_tokens=60, temperature=0,
        extra_body={"response_format": schema},
    )  # fmt: skip
    assert _is_city(comp.choices[0].text) and comp.choices[0].finish_reason == "stop"


def test_bad_requests_get_openai_errors(smol: Server) -> None:
    chat = {"model": SMOLLM2, "messages": MESSAGES}

    def schema_format(schema: dict) -> dict:
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    cases = [
        ({**chat, "model": ""}, 400, "model"),
        ({"model": SMOLLM2}, 400, "messages"),
        ({**chat, "messages": []}, 400, "messages"),
        ({**chat, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
        ({**chat, "messages": ["hi"]}, 400, "messages[0].role"),
        ({**chat, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content"),
        ({**chat, "n": 9}, 400, "n"),
        ({**chat, "lookup": -1}, 400, "lookup"),
        ({**chat, "lookup": 65}, 400, "lookup"),
        ({**chat, "lookup": "yes"}, 400, "lookup"),
        ({**chat, "n": 0}, 400, "n"),
        ({**chat, "max_tokens": 0}, 400, "max_tokens"),
        ({**chat, "max_tokens": -5}, 400, "max_tokens"),
        ({**chat, "max_tokens": 10**9}, 400, "max_tokens"),
        ({**chat, "max_tokens": "many"}, 400, "max_tokens"),
        ({**chat, "temperature": 3.5}, 400, "temperature"),
        ({**chat, "temperature": "hot"}, 400, "temperature"),
        ({**chat, "temperature": 10**400}, 400, "temperature"),
        ({**chat, "top_p": -0.1}, 400, "top_p"),
        ({**chat, "seed": 1.5}, 400, "seed"),
        ({**chat, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({**chat, "stop": 5}, 400, "stop"),
        ({**chat, "stream": "yes"}, 400, "stream"),
        ({**chat, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        ({**chat, "top_logprobs": 2}, 400, "top_logprobs"),
        ({**chat, "tools": [{"type": "function"}]}, 400, "tools"),
        ({**chat, "response_format": {"type": "yaml"}}, 400, "response_format"),
        ({**chat, "response_format": schema_format({"type": "strin"})}, 400, "response_format"),
        ({**chat, "response_format": schema_format({"if": {"type": "string"}})}, 400, "response_format"),
        ({**chat, "messages": [{"role": "user", "content": "\ud83d"}]}, 400, "messages[0].content"),
        ({**chat, "messages": [{"role": "user", "content": "hello " * 600}]}, 400, "messages"),  # > 512 per slot
    ]
    for body, status, param in cases:
        got, err = smol.post("/v1/chat/completions", body)
        assert (got, is_openai_error(err, param)) == (status, True), (body, got, err)
    completion = {"model": SMOLLM2, "prompt": "hi"}
    for body, param in [
        ({**completion, "prompt": "hello " * 600}, "prompt"),
        ({**completion, "prompt": [1, 2, 10**9]}, "prompt"),
        ({**completion, "prompt": [1] * 513}, "prompt"),
        ({**completion, "prompt": "a \ud800 b"}, "prompt"),
        ({**completion, "stop": "\udfff"}, "stop"),
        ({**completion, "prompt": ""}, "prompt"),
        ({**completion, "prompt": ["a", "b"]}, "prompt"),
        ({**completion, "echo": True}, "echo"),
        ({**completion, "best_of": 3}, "best_of"),
        ([1, 2, 3], None),
    ]:
        got, err = smol.post("/v1/completions", body)
        assert (got, is_openai_error(err, param)) == (400, True), (body, got, err)
    json_headers = {"Content-Type": "application/json"}
    raw = [
        ("POST", "/v1/chat/completions", b'{"model": ', json_headers, 400),
        ("POST", "/v1/chat/completions", b"[" * 100_000, json_headers, 400),
        ("POST", "/v1/chat/completions", b"\xff\xfe{", json_headers, 400),
        ("POST", "/v1/chat/completions", json.dumps(chat).encode(), {"Content-Type": "text/plain"}, 415),
        ("POST", "/v1/chat/completions", json.dumps(chat).encode(), {}, 415),
        ("GET", "/v1/chat/completions", None, {}, 405),
        ("GET", "/v1/engines", None, {}, 404),
    ]
    for method, path, body, headers, status in raw:
        got, err = smol.request(method, path, body, headers)
        assert (got, is_openai_error(err)) == (status, True), (path, body and body[:20], got, err)
    # bodies over the limit: announced by Content-Length (refused before it is sent), or chunked (cut off)
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, err = smol.raw(f"{head}Content-Length: {2 << 20}\r\n\r\n".encode() + b"[1,")
    assert status == 413 and is_openai_error(err)
    chunk = b"1," * (256 << 10)
    status, err = smol.raw(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode(), [b"[", chunk, chunk, chunk])
    assert status == 413 and is_openai_error(err)
    # through the official client: typed exceptions
    client = smol.client()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SMOLLM2, messages=MESSAGES, max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")  # only the served model has a card
    # ... and the server still serves
    assert smol.health()["status"] == "ok"
    ok = client.completions.create(model=SMOLLM2, prompt="The capital of France is", max_tokens=2, temperature=0)
    assert ok.choices[0].text and ok.usage.completion_tokens <= 2


# ---------------------------------------------------------------------------------------------------------------
# tiny model: slots, queue, disconnects, load


def test_disconnect_mid_stream_frees_the_slot(tiny: Engine) -> None:
    with serving(tiny, parallel=1) as server:
        client = server.client()
        long = dict(model="tiny-chat.gguf", messages=MESSAGES, max_tokens=30000, temperature=1.0, seed=3)
        stream = client.chat.completions.create(**long, stream=True)
        it = iter(stream)
        for _ in range(4):
            next(it)
        scheduler = server.app.state.scheduler
        job = scheduler.slots[0].job
        assert job is not None and server.health()["slots_processing"] == 1
        stream.close()
        server.wait_idle()
        assert job.cancelled and not job.generation.done and job.generation.n_generated < 30000
        assert scheduler.slots[0].job is None  # the slot is free: the next request takes it at once
        quick = client.chat.completions.create(model="tiny-chat.gguf", messages=MESSAGES, max_tokens=4)
        assert quick.usage.completion_tokens <= 4 and not job.generation.done
        # a non-streamed request whose client goes away is stopped as well
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps(long).encode(), {"Content-Type": "application/json"})
        deadline = time.monotonic() + HANG_TIMEOUT
        while (job := scheduler.slots[0].job) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        conn.close()
        server.wait_idle()
        assert job.cancelled and not job.generation.done


def test_queue_is_fifo_and_a_queued_disconnect_leaves_it(tiny: Engine) -> None:
    with serving(tiny, parallel=1) as server:
        client = server.client()
        scheduler = server.app.state.scheduler
        admitted: list[str] = []  # the order in which queued jobs take the slot, named by their prompts

        class RecordingQueue(collections.deque):
            def popleft(self) -> Job:
                job = super().popleft()
                admitted.append(next(n for n in NAMES if n in tiny.tokenizer.decode(job.generation.prompt)))
                return job

        NAMES = ("first", "second", "third", "fourth")
        scheduler._queue = RecordingQueue(scheduler._queue)

        def start(name: str, max_tokens: int):  # noqa: ANN202
            stream = client.chat.completions.create(
                model="tiny-chat.gguf", messages=[{"role": "user", "content": name}], max_tokens=max_tokens,
                temperature=0.0, stream=True,
            )  # fmt: skip
            next(iter(stream))  # the role chunk is sent at once, slot or not
            return stream

        def wait_queued(n: int) -> None:
            deadline = time.monotonic() + HANG_TIMEOUT
            while server.health()["queued"] != n:
                assert time.monotonic() < deadline, server.health()
                time.sleep(0.02)

        first = start("first", 30000)
        second, third, fourth = start("second", 20), start("third", 20), start("fourth", 20)
        wait_queued(3)
        third.close()  # leaves the queue without ever taking a slot
        wait_queued(2)
        done = []
        readers = [threading.Thread(target=lambda s=s, n=n: (_stream_text(s), done.append(n)))
                   for s, n in ((fourth, "fourth"), (second, "second"))]  # fmt: skip
        for t in readers:
            t.start()
        first.close()
        for t in readers:
            t.join(HANG_TIMEOUT)
        assert sorted(done) == ["fourth", "second"]  # both answered (in whichever order the readers finish)
        server.wait_idle()
        assert admitted == ["first", "second", "fourth"]


def test_sixteen_concurrent_streaming_clients(tiny: Engine) -> None:
    n_clients, rounds, max_tokens = 16, 4, 64
    with serving(tiny, parallel=4) as server:
        server.client().chat.completions.create(model="tiny-chat.gguf", messages=MESSAGES, max_tokens=max_tokens)
        busy_health: list[dict] = []
        stop_polling = threading.Event()

        def poll_health() -> None:  # the event loop answers while the compute thread is busy
            while not stop_polling.is_set():
                h = server.health()
                if h["slots_processing"] == 4 and h["queued"] > 0:
                    busy_health.append(h)
                time.sleep(0.05)

        async def one_client(client: openai.AsyncOpenAI, i: int) -> list[tuple[str, str, int]]:
            answers = []
            for _ in range(rounds):
                stream = await client.chat.completions.create(
                    model="tiny-chat.gguf", messages=[{"role": "user", "content": f"client {i}"}], stream=True,
                    max_tokens=max_tokens, temperature=1.0, seed=i, stream_options={"include_usage": True},
                )  # fmt: skip
                pieces, finish, use = [], None, None
                async for chunk in stream:
                    use = chunk.usage or use
                    for choice in chunk.choices:
                        pieces.append(choice.delta.content or "")
                        finish = choice.finish_reason or finish
                answers.append(("".join(pieces), finish, use.completion_tokens))
            return answers

        async def run() -> list[list[tuple[str, str, int]]]:
            client = server.async_client()
            bad = client.chat.completions.create(model="tiny-chat.gguf", messages=[], stream=True)
            results = await asyncio.gather(*(one_client(client, i) for i in range(n_clients)), bad,
                                           return_exceptions=True)  # fmt: skip
            await client.close()
            assert isinstance(results[-1], openai.BadRequestError)  # one bad request among them: only it fails
            return results[:-1]

        poller = threading.Thread(target=poll_health)
        poller.start()
        results = asyncio.run(asyncio.wait_for(run(), HANG_TIMEOUT * 2))
        stop_polling.set()
        poller.join()
        server.wait_idle()
    assert busy_health, "/health was never answered while all slots were busy and requests queued"
    for answers in results:
        assert not isinstance(answers, BaseException), answers
        for _, finish, n in answers:
            assert finish in ("stop", "length") and (n == max_tokens) == (finish == "length") and n <= max_tokens
        assert answers[0] == answers[1]  # same seed, same text, whatever else the other slots were doing


# the openai client's own SSE generators, left suspended when a client stops reading mid-stream, are finalized
# later by the garbage collector and can complain there ("async generator already executing"): client side only
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_300_requests_with_disconnects_leave_memory_flat(tiny: Engine) -> None:
    """Two loads of 304 streamed requests from 16 concurrent clients, every third client going away after two
    chunks (in a slot or still queued): once the server is idle again, the second load has left (almost) nothing
    allocated that the first had not (Python and numpy allocations, traced after a warm-up round; bounded caches
    fill during the first), and every slot is free."""
    n_clients, per_client, max_tokens = 16, 19, 8  # 16 x 19 = 304 requests a load

    async def one_client(client: openai.AsyncOpenAI, i: int, rounds: int) -> int:
        finished = 0
        for r in range(rounds):
            stream = await client.chat.completions.create(
                model="tiny-chat.gguf", messages=[{"role": "user", "content": f"client {i} round {r}"}],
                max_tokens=max_tokens, temperature=1.0, seed=i, stream=True,
            )  # fmt: skip
            chunks = 0
            async for _ in stream:
                chunks += 1
                if (i + r) % 3 == 0 and chunks == 2:
                    break  # the client goes away mid-stream
            await stream.close()
            finished += (i + r) % 3 != 0
        return finished

    def load(rounds: int) -> tuple[int, int]:
        async def clients() -> int:
            client = server.async_client()
            done = await asyncio.gather(*(one_client(client, i, rounds) for i in range(n_clients)))
            await client.close()
            return sum(done)

        finished = asyncio.run(asyncio.wait_for(clients(), HANG_TIMEOUT * 2))
        server.wait_idle()
        gc.collect()
        return finished, tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0

    with serving(tiny, parallel=4) as server:
        load(2)  # warm-up: first-use caches, compiled code
        tracemalloc.start()
        try:
            finished_a, after_a = load(per_client)
            finished_b, after_b = load(per_client)
        finally:
            tracemalloc.stop()
        health = server.health()
    want = sum((i + r) % 3 != 0 for i in range(n_clients) for r in range(per_client))
    assert finished_a == finished_b == want
    assert health["slots_processing"] == 0 and health["queued"] == 0
    assert after_b - after_a < 256 * 1024, f"the second 304 requests left {after_b - after_a} more bytes allocated"


def test_embeddings_are_the_mean_pooled_normalized_final_hidden_state(smol: Server, smollm2: Engine) -> None:
    """/v1/embeddings through the openai client: one vector per input (text or token ids), unit length, the
    model's own ``embed`` of the tokens; usage counts the tokens; bad inputs are 400s."""
    client = smol.client()
    texts = ["The capital of France is Paris.", "Bonjour"]
    out = client.embeddings.create(model="any", input=texts)
    assert out.model == SMOLLM2 and [d.index for d in out.data] == [0, 1]
    ids = [smollm2.tokenizer.encode(t, add_special=True) for t in texts]
    assert out.usage.prompt_tokens == sum(map(len, ids))
    for d, tokens in zip(out.data, ids, strict=True):
        vec = np.asarray(d.embedding, np.float32)
        assert vec.shape == (smollm2.lm.hparams.n_embd,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
        assert vec.tobytes() == smollm2.lm.embed(tokens).tobytes()
    by_ids = client.embeddings.create(model="any", input=ids[1])
    assert by_ids.data[0].embedding == out.data[1].embedding
    status, raw = smol.post("/v1/embeddings", {"model": "m", "input": texts[1], "encoding_format": "float"})
    assert status == 200 and raw["data"][0]["embedding"] == out.data[1].embedding  # JSON numbers, same values
    for bad, param in (({"model": "m"}, "input"), ({"model": "m", "input": []}, "input"),
                       ({"model": "m", "input": [10**9]}, "input"), ({"input": "x"}, "model")):  # fmt: skip
        status, err = smol.post("/v1/embeddings", bad)
        assert status == 400 and is_openai_error(err, param), (bad, err)


def test_metrics_in_prometheus_format(tiny: Engine) -> None:
    """/metrics counts prompt and generated tokens, requests and forward time, and shows busy slots, the queue
    and KV cache usage, parsed back with prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape(server: Server) -> dict[str, float]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            text = resp.read().decode()
            assert resp.status == 200 and resp.getheader("content-type").startswith("text/plain")
        finally:
            conn.close()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    with serving(tiny, parallel=2) as server:
        before = scrape(server)
        assert before["kleidipy_requests_total"] == 0 and before["kleidipy_kv_cache_usage_ratio"] == 0
        reply = server.client().chat.completions.create(model="x", messages=MESSAGES, max_tokens=3, temperature=0)
        server.wait_idle()
        after = scrape(server)
    assert after["kleidipy_requests_total"] == 1
    assert after["kleidipy_prompt_tokens_total"] == reply.usage.prompt_tokens
    assert after["kleidipy_tokens_predicted_total"] == reply.usage.completion_tokens
    assert after["kleidipy_forward_seconds_total"] > 0
    assert after["kleidipy_requests_processing"] == after["kleidipy_requests_deferred"] == 0


def test_pages_from_other_sites_cannot_drive_the_api(tiny: Engine) -> None:
    """A browser sends Origin: a page from another site gets 403 unless --cors allows it; pages from this machine
    and clients without an Origin (curl, SDKs) are served; an allowed origin gets CORS headers and preflights."""
    body = {"model": "tiny-chat.gguf", "messages": MESSAGES, "max_tokens": 2}
    with serving(tiny, parallel=1, cors=("https://allowed.example",)) as server:
        status, err = server.post("/v1/chat/completions", body, Origin="https://evil.example")
        assert status == 403 and is_openai_error(err) and err["error"]["code"] == "origin_not_allowed"
        assert server.health()["slots_processing"] == 0  # refused before anything ran
        for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "https://allowed.example"):
            status, _ = server.post("/v1/chat/completions", body, Origin=origin)
            assert status == 200, origin
        assert server.post("/v1/chat/completions", body)[0] == 200  # no Origin: not a browser page
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        try:
            headers = {"Origin": "https://allowed.example", "Access-Control-Request-Method": "POST"}
            conn.request("OPTIONS", "/v1/chat/completions", headers=headers)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200 and resp.getheader("access-control-allow-origin") == "https://allowed.example"
        finally:
            conn.close()
    with serving(tiny, parallel=1, cors=("*",)) as server:
        assert server.post("/v1/chat/completions", body, Origin="https://any.example")[0] == 200


#: llguidance's words for its parser state, which a reply must never carry
GRAMMAR_INTERNALS = ("<state>", "<grammar>", "NoExtensionBias", "Parser", "Tokens")


def test_unusable_json_schemas_are_400_before_anything_runs(tiny: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema referencing itself, or a $defs cycle, compiled and then failed at sampling (a 500 carrying
    llguidance's parser state; a 200 and an error event when streamed): now a 400 invalid_request_error about
    response_format, streamed or not, with nothing generated. A grammar that fails while generating all the same
    (let through here by hand) ends as a 500 of one short message of ours."""
    cycle = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    body = {"model": "tiny-chat.gguf", "messages": MESSAGES, "max_tokens": 4}
    with serving(tiny, parallel=1) as server:
        for schema in ({"$ref": "#"}, cycle):
            response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
            for stream in (False, True):
                request = {**body, "response_format": response_format, "stream": stream}
                status, err = server.post("/v1/chat/completions", request)
                assert status == 400 and is_openai_error(err, "response_format"), err
                message = err["error"]["message"]
                assert err["error"]["type"] == "invalid_request_error" and "no text matches it" in message
                assert not any(word in message for word in GRAMMAR_INTERNALS), message
        assert server.app.state.scheduler.stats.requests == 0  # nothing ran
        unchecked = Grammar(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(cycle)))
        monkeypatch.setattr(schemas, "response_format_grammar", lambda value: unchecked)
        status, err = server.post("/v1/chat/completions", {**body, "response_format": {"type": "json_object"}})
        assert status == 500 and err["error"]["type"] == "server_error", err
        assert "grammar allows no token" in err["error"]["message"]
        assert not any(word in err["error"]["message"] for word in GRAMMAR_INTERNALS), err


def test_api_key(tiny: Engine) -> None:
    with serving(tiny, parallel=1, api_key="s3cret") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, body = server.request("GET", "/v1/models", headers=headers)
            assert status == 401 and is_openai_error(body) and body["error"]["code"] == "invalid_api_key"
        status, body = server.post("/v1/chat/completions", {"model": "tiny-chat.gguf", "messages": MESSAGES})
        assert status == 401
        with pytest.raises(openai.AuthenticationError):
            server.client("nope").models.list()
        client = server.client("s3cret")
        assert client.models.list().data[0].id == "tiny-chat.gguf"
        out = client.chat.completions.create(model="tiny-chat.gguf", messages=MESSAGES, max_tokens=3)
        assert out.usage.completion_tokens <= 3
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=60) as page:  # no key needed
            assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
            assert "connect-src 'self'" in page.headers["Content-Security-Policy"]
            assert b"<title>kleidipy chat</title>" in page.read()
        assert server.request("POST", "/", b"{}", {"Content-Type": "application/json"})[0] == 401
        # the page's scripts (marked, DOMPurify) come from this server, keyless too; the page runs no other script
        vendor = Path(kleidipy.server.__file__).parent / "static" / "vendor"
        for name in ("marked.umd.js", "purify.min.js"):
            url = f"http://127.0.0.1:{server.port}/static/vendor/{name}"
            with urllib.request.urlopen(url, timeout=60) as script:
                assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
                assert script.headers["X-Content-Type-Options"] == "nosniff"
                assert script.read() == (vendor / name).read_bytes()
                etag = script.headers["ETag"]
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            conn.request("GET", f"/static/vendor/{name}", headers={"If-None-Match": etag})
            assert conn.getresponse().status == 304  # revalidated, not sent again
            conn.close()
        status, body = server.request("GET", "/static/vendor/README.md")
        assert status == 404 and is_openai_error(body)
        csp = page.headers["Content-Security-Policy"]
        assert "script-src 'self' 'sha256-" in csp and "unsafe" not in csp


# ---------------------------------------------------------------------------------------------------------------
# the step machine and the scheduler on their own

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "n", "stream", "stream_options", "logprobs", "echo", "tools", "response_format",
          "frequency_penalty", "presence_penalty", "repeat_penalty", "best_of", "suffix", "logit_bias"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([parse_chat, parse_completion]), st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6))
def test_any_json_body_is_a_request_or_a_4xx(parse, fields: dict) -> None:  # noqa: ANN001
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", **fields}
    try:
        req = parse(body)
    except APIError as exc:
        assert 400 <= exc.status < 500 and is_openai_error(exc.body())
        return
    assert req.max_tokens is None or req.max_tokens >= 1
    assert req.params.temperature >= 0 and len(req.stop) <= 4


def _scripted(tokens: list[int], n_vocab: int):  # noqa: ANN202
    """A forward pass whose greedy choice is tokens[0], tokens[1], ... on successive calls."""
    calls = iter(tokens)

    def forward(ids) -> np.ndarray:  # noqa: ANN001
        logits = np.zeros(n_vocab, np.float32)
        logits[next(calls)] = 1.0
        return logits

    return forward


def _run(gen: Generation, forward) -> list[str]:  # noqa: ANN001
    pieces = []
    while not gen.done:
        pieces.append(gen.step(forward))
    return pieces


def test_generation_holds_back_stop_prefixes(tiny: Engine) -> None:
    tok = tiny.tokenizer
    script = [*b"hello XYZ world"]
    gen = Generation(tok, [1, 2, 3], n_ctx=64, stop=["XYZ", "lo!"])
    pieces = _run(gen, _scripted(script, tok.n_vocab))
    # "l" and "lo" might start "lo!": held back until " " rules it out; "X", "XY" held back, "XYZ" stops
    assert pieces == ["h", "e", "", "l", "", "lo ", "", "", ""] and gen.finish_reason == "stop"
    assert gen.n_generated == 9
    gen = Generation(tok, [1], n_ctx=64, max_tokens=3, stop=["XY"])
    assert "".join(_run(gen, _scripted([*b"abX"], tok.n_vocab))) == "abX" and gen.finish_reason == "length"
    gen = Generation(tok, [1], n_ctx=64, stop=["zz"])
    assert _run(gen, _scripted([*b"ab", tok.eos_id], tok.n_vocab)) == ["a", "b", ""] and gen.finish_reason == "stop"
    # the context ends: the last token that fits is still sampled, then "length"
    gen = Generation(tok, [1, 2, 3], n_ctx=5)
    assert "".join(_run(gen, _scripted([*b"abcdef"], tok.n_vocab))) == "abc" and gen.finish_reason == "length"
    # a multi-byte character split over tokens comes out whole
    gen = Generation(tok, [1], n_ctx=64, max_tokens=3)
    assert _run(gen, _scripted([*"é!".encode()], tok.n_vocab)) == ["", "é", "!"]


class _Broken(Generation):
    def advance(self, n: int, logits: np.ndarray) -> str:
        if self.n_past:
            raise RuntimeError("boom")
        return super().advance(n, logits)


def test_one_failing_job_leaves_the_others_alone(tiny: Engine) -> None:
    async def run() -> tuple[list, list]:
        loop = asyncio.get_running_loop()
        scheduler = Scheduler(tiny.lm, parallel=2, n_ctx=128)
        scheduler.start()
        ids = tiny.chat_prompt(MESSAGES)
        bad = Job(_Broken(tiny.tokenizer, ids, 128, max_tokens=8), loop)
        good = Job(Generation(tiny.tokenizer, ids, 128, max_tokens=8), loop)
        queued = Job(Generation(tiny.tokenizer, ids, 128, max_tokens=8), loop)
        for job in (bad, good, queued):
            scheduler.submit(job)
        got = []
        for job in (bad, good, queued):
            events = []
            while not events or events[-1][0] not in ("done", "error"):
                events.append(await asyncio.wait_for(job.events.get(), 60))
            got.append(events)
        scheduler.stop()
        with pytest.raises(APIError):
            scheduler.submit(Job(Generation(tiny.tokenizer, ids, 128), loop))
        return got

    bad, good, queued = asyncio.run(run())
    assert bad[-1][0] == "error" and bad[-1][1].status == 500 and "boom" in bad[-1][1].message
    assert good[-1][0] == queued[-1][0] == "done"
    assert "".join(p for k, p in good if k == "text") == "".join(p for k, p in queued if k == "text")


@pytest.mark.parametrize("deterministic", [False, True])
def test_busy_slots_share_forward_passes(tiny: Engine, deterministic: bool) -> None:
    """Three requests admitted together: one forward pass per round for all three (a prefill, then 7 decode
    steps), or with ``deterministic`` one per slot and step."""

    async def run() -> tuple[Scheduler, list[str]]:
        loop = asyncio.get_running_loop()
        scheduler = Scheduler(tiny.lm, parallel=3, n_ctx=128, deterministic=deterministic)
        scheduler.start()
        ids = tiny.chat_prompt(MESSAGES)
        jobs = [Job(Generation(tiny.tokenizer, ids, 128, max_tokens=8), loop) for _ in range(3)]
        with scheduler._cond:  # the worker admits all three in one round
            for job in jobs:
                scheduler.submit(job)
        texts = []
        for job in jobs:
            events = []
            while not events or events[-1][0] not in ("done", "error"):
                events.append(await asyncio.wait_for(job.events.get(), 60))
            assert events[-1][0] == "done"
            texts.append("".join(p for k, p in events if k == "text"))
        scheduler.stop()
        return scheduler, texts

    scheduler, texts = asyncio.run(run())
    assert scheduler.stats.forward_sequences == 3 * 8 and scheduler.stats.predicted_tokens == 3 * 8
    assert scheduler.stats.forward_passes == (3 * 8 if deterministic else 8)
    assert texts[0] == texts[1] == texts[2]  # the same rows in one pass: the same logits


class _NoBatches:
    """A model whose forward passes of several sequences fail."""

    def __init__(self, lm) -> None:  # noqa: ANN001
        self.lm = lm

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.lm, name)

    def forward_batch(self, parts: list) -> list[np.ndarray]:
        if len(parts) > 1:
            raise RuntimeError("no batches")
        return self.lm.forward_batch(parts)


def test_a_failing_batch_runs_again_slot_by_slot(tiny: Engine) -> None:
    async def run() -> list[list]:
        loop = asyncio.get_running_loop()
        scheduler = Scheduler(_NoBatches(tiny.lm), parallel=2, n_ctx=128)
        scheduler.start()
        ids = tiny.chat_prompt(MESSAGES)
        jobs = [Job(Generation(tiny.tokenizer, ids, 128, max_tokens=4), loop) for _ in range(2)]
        with scheduler._cond:
            for job in jobs:
                scheduler.submit(job)
        got = []
        for job in jobs:
            events = []
            while not events or events[-1][0] not in ("done", "error"):
                events.append(await asyncio.wait_for(job.events.get(), 60))
            got.append(events)
        scheduler.stop()
        return got

    solo = "".join(tiny.generate(tiny.chat_prompt(MESSAGES), max_tokens=4))
    for events in asyncio.run(run()):  # each slot alone: what Engine.generate computes
        assert events[-1][0] == "done" and "".join(p for k, p in events if k == "text") == solo


def test_model_id_and_slot_options(tiny: Engine) -> None:
    assert Path(tiny.model).name == "tiny-chat.gguf"
    for parallel in (0, -1, 32768 // 8):
        with pytest.raises(ServerConfigError):
            create_app(tiny, parallel=parallel)
    with serving(tiny, parallel=2) as server:
        assert server.client().models.list().data[0].id == "tiny-chat.gguf"
        assert server.health()["slots_idle"] == 2


def test_serve_runs_uvicorn_on_loopback(tiny: Engine) -> None:
    with pytest.raises(ServerConfigError):
        serve(tiny.path, ctx=32, parallel=4)  # refused before the model is loaded
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"from kleidipy.server import serve; serve({str(tiny.path)!r}, port={port}, parallel=2, progress=False)"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "serve() did not come up"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert json.loads(r.read())["slots_idle"] == 2
                    break
            except OSError:
                time.sleep(0.2)
        # another server on this port: refused in one line, before its model (which does not exist) is loaded
        message = f"port {port} on 127.0.0.1 is in use (choose another with --port)"
        with pytest.raises(ServerConfigError, match=re.escape(message)):
            serve(tiny.path.with_name("never-loaded.gguf"), port=port)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        stderr = proc.stderr.read()
        assert f"serving tiny-chat.gguf on http://127.0.0.1:{port}/v1 (2 slot(s) x 2048 tokens" in stderr
        url = f"http://127.0.0.1:{port}"
        assert f"kleidipy: chat page at {url}/ - OpenAI API at {url}/v1\n" in stderr  # once it is served
    finally:
        proc.kill()
        proc.wait()
