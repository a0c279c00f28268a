"""The Python API: kleidipy.load, chat/complete streamed or not, finish reasons, usage, KV cache reuse."""

import json

import pytest
from model_files import SMOLLM2

import kleidipy
from kleidipy.api import LLM, Chunk, Completion
from kleidipy.errors import KleidipyError
from kleidipy.runtime.grammar import GrammarError
from kleidipy.runtime.sampler import SamplingError

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return kleidipy.load(SMOLLM2, target="sme2:svl=512", threads=1, n_ctx=1024)


def test_load_options(llm: LLM) -> None:
    assert llm.engine.context_length == 1024
    assert (llm.engine.target.name, llm.engine.target.svl_bits) == ("sme2", 512)


def test_chat_reply_finish_reason_and_usage(llm: LLM) -> None:
    llm.reset()
    # llama.cpp's default sampling: which seeds name Paris moves with any last-ulp change to the forward pass (the
    # model's rate is ~60 %: test_cli's test_readme_first_command_answers_paris), so the text itself is not asserted
    reply = llm.chat(QUESTION, max_tokens=128, seed=2)
    assert isinstance(reply, Completion)
    assert reply.text.strip() and reply.finish_reason == "stop"
    prompt = llm.engine.chat_prompt(QUESTION)
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.cached_tokens == 0
    assert 0 < reply.usage.completion_tokens < 128
    assert reply.usage.total_tokens == len(prompt) + reply.usage.completion_tokens


def test_stream_gives_the_same_text_and_ends_with_a_usage_chunk(llm: LLM) -> None:
    llm.reset()
    whole = llm.chat(QUESTION, max_tokens=12, seed=3)
    llm.reset()
    chunks = list(llm.chat(QUESTION, max_tokens=12, seed=3, stream=True))
    assert all(isinstance(c, Chunk) for c in chunks) and len(chunks) > 2
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == whole.text
    assert (chunks[-1].finish_reason, chunks[-1].usage) == (whole.finish_reason, whole.usage)


def test_max_tokens_gives_length(llm: LLM) -> None:
    reply = llm.complete("Once upon a time", max_tokens=3, seed=1)
    assert reply.finish_reason == "length" and reply.usage.completion_tokens == 3


def test_complete_continues_the_text(llm: LLM) -> None:
    reply = llm.complete("The capital of France is", temperature=0, max_tokens=2)
    assert reply.text.startswith(" Paris")


def test_second_turn_prefills_only_the_new_tokens(llm: LLM) -> None:
    llm.reset()
    first = llm.chat(QUESTION, temperature=0, max_tokens=32)
    turn1 = llm.engine.chat_prompt(QUESTION)
    history = [*QUESTION, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And Italy?"}]
    turn2 = llm.engine.chat_prompt(history)
    second = llm.chat(history, temperature=0, max_tokens=32)
    # the first prompt and the reply are in the cache: only the end of turn 1 and the new message are prefilled
    assert second.usage.prompt_tokens == len(turn2)
    assert second.usage.cached_tokens >= len(turn1) + first.usage.completion_tokens - 1
    assert second.usage.prefilled_tokens == len(turn2) - second.usage.cached_tokens
    assert llm.engine.timings.n_prompt == second.usage.prefilled_tokens < len(turn2) - len(turn1)
    assert second.text


def test_response_format_constrains_the_reply(llm: LLM) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    # both from a full prefill: on master's SME2 a batch's KQV is KleidiAI's BF16 GEMM and a lone re-prefilled token
    # ggml's order, as in llama.cpp, so a prompt cached by an earlier call may move a near tie
    llm.reset()
    reply = llm.chat(QUESTION, temperature=0, max_tokens=40, response_format=fmt)
    assert reply.finish_reason == "stop" and isinstance(json.loads(reply.text)["capital"], str)
    llm.reset()
    streamed = llm.chat(QUESTION, temperature=0, max_tokens=40, response_format=fmt, stream=True)
    assert "".join(c.text for c in streamed) == reply.text
    obj = llm.complete("A JSON object:", seed=4, max_tokens=40, response_format={"type": "json_object"})
    assert obj.text.startswith("{")
    with pytest.raises(GrammarError, match="Unimplemented keys"):
        llm.chat(QUESTION, response_format={"type": "json_schema", "json_schema": {"schema": {"if": {}}}})


def test_bad_input_raises_typed_errors(llm: LLM) -> None:
    with pytest.raises(KleidipyError, match="max_tokens"):
        llm.complete("Hello", max_tokens=-1)
    with pytest.raises(SamplingError):
        llm.complete("Hello", temperature=float("nan"))
    with pytest.raises(KleidipyError, match="empty"):
        llm.complete("")
    with pytest.raises(KleidipyError):
        kleidipy.load("no-such-model")
