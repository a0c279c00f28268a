"""Tokenizer: llama.cpp's exact ids and detokenizations on the reference strings (SmolLM2 always, Qwen2.5 when
pulled), a SentencePiece vocabulary written with GGUFWriter (Gemma3 reference cases it can express, llama.cpp's
dummy-prefix / byte-fallback / score rules), the splitters against the regexes they implement, streaming."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_files import QWEN25, SMOLLM2, model_file

from kleidipy.errors import KleidipyError
from kleidipy.runtime.tokenizer import (
    PRE_TOKENIZERS,
    StreamDetokenizer,
    TokenAttr,
    Tokenizer,
    TokenizerError,
    _cpt_flags,
    _split_gpt2,
    _split_llama3,
)

DETOK_VARIANTS = (("detok_r0_u1", False, True), ("detok_r0_u0", False, False), ("detok_r1_u1", True, True))


def _reference(reference_dir: Path, name: str) -> dict:
    return json.loads((reference_dir / "tokenizer" / f"tokenizer_{name}.json").read_text())


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    return Tokenizer.from_gguf(model_file(SMOLLM2))


@pytest.fixture(scope="module")
def qwen25() -> Tokenizer:
    return Tokenizer.from_gguf(model_file(QWEN25))


@pytest.fixture(params=["smollm2", "qwen25"])
def model(request: pytest.FixtureRequest) -> tuple[str, Tokenizer]:
    return request.param, request.getfixturevalue(request.param)


def _mismatches(tok: Tokenizer, ref: dict, id_map: dict[int, int] | None = None) -> Iterator[str]:
    """Every way ``tok`` differs from llama.cpp on the reference cases (ids mapped through ``id_map``)."""
    to_local = (lambda ids: [id_map[i] for i in ids]) if id_map else list
    for case in ref["cases"]:
        for parse_special in (True, False):
            block = case["parse_special_true" if parse_special else "parse_special_false"]
            if id_map is not None and not set(block["ids"]) <= id_map.keys():
                continue
            ids = to_local(block["ids"])
            got = tok.encode(case["text"], add_special=True, parse_special=parse_special)
            if got != ids:
                yield f"case {case['index']} parse_special={parse_special}: {got} != {ids}"
            for key, remove_special, unparse_special in DETOK_VARIANTS:
                text = tok.decode(ids, remove_special=remove_special, unparse_special=unparse_special)
                if text != block[key]:
                    yield f"case {case['index']} {key}: {text!r} != {block[key]!r}"


def test_reference_strings(model: tuple[str, Tokenizer], reference_dir: Path) -> None:
    name, tok = model
    ref = _reference(reference_dir, name)
    assert ref["n_cases"] == len(ref["cases"]) == 161
    assert (tok.n_vocab, tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (
        ref["vocab"]["n_tokens"],
        ref["vocab"]["bos"],
        ref["vocab"]["eos"],
        ref["vocab"]["add_bos"],
        ref["vocab"]["add_eos"],
    )
    assert list(_mismatches(tok, ref)) == []


def _logits_files(reference_dir: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((reference_dir / "logits").glob(f"{name}-*__*__*.json"))]


def test_reference_prompts_and_generations(model: tuple[str, Tokenizer], reference_dir: Path) -> None:
    """Prompt ids of every logits run, and the detokenized greedy text / first EOG of the 32 generated ids."""
    name, tok = model
    for run in _logits_files(reference_dir, name):
        label = f"{run['model']} {run['prompt_name']}"
        parse_special = run["tokenize"]["parse_special"]
        assert tok.encode(run["prompt_text"], parse_special=parse_special) == run["token_ids"], label
        greedy = run["greedy"]
        assert tok.decode(greedy["ids"]) == greedy["text_detok_r0_u1"], label
        stream = tok.detokenizer()
        assert "".join(stream.push(i) for i in greedy["ids"]) + stream.flush() == greedy["text_detok_r0_u1"], label
        eog = [k for k, i in enumerate(greedy["ids"]) if tok.is_eog(i)]
        assert (eog[0] if eog else None) == greedy["first_eog_index"], label


def test_perplexity_text_token_count(model: tuple[str, Tokenizer], reference_dir: Path) -> None:
    """The 11 kB Apache licence (one trailing newline removed, as llama-perplexity reads it), cold cache:
    llama.cpp's token count, and it decodes back to the text (speed: benchmarks/load.py)."""
    name, tok = model
    text = (reference_dir / "perplexity" / "Apache-2.0.txt").read_text().removesuffix("\n")
    expected = json.loads((reference_dir / "perplexity" / "perplexity.json").read_text())["tokenization"]
    tok._bpe_cache.clear()
    ids = tok.encode(text)
    assert len(ids) == expected[f"{name}-q4_0"]["n_tokens"]
    assert tok.decode(ids) == text


def test_special_tokens_and_eog(smollm2: Tokenizer) -> None:
    assert smollm2.encode("<|im_start|>", parse_special=True) == [1]
    assert smollm2.encode("<|im_start|>", parse_special=False) != [1]
    assert smollm2.token_attr(2) & TokenAttr.CONTROL
    # <|endoftext|>, <|im_end|> and <reponame> (llama.cpp takes it for the FIM repo-name token)
    assert {i for i in range(smollm2.n_vocab) if smollm2.is_eog(i)} == {0, 2, 4}
    assert smollm2.decode([1, 504], unparse_special=False) == "The"


def test_qwen_overrides(qwen25: Tokenizer) -> None:
    """</s> is a normal token in Qwen's vocab; llama.cpp makes it CONTROL and end-of-generation at load time."""
    eos_s = qwen25.token_id("</s>")
    assert eos_s == 128247 and qwen25.token_attr(eos_s) & TokenAttr.CONTROL and qwen25.is_eog(eos_s)
    assert qwen25.encode("</s>", parse_special=True) == [eos_s]
    assert qwen25.encode("</s>", parse_special=False) != [eos_s]
    # user-defined tokens are matched even without parse_special
    assert qwen25.encode("<tool_call>", parse_special=False) == [qwen25.token_id("<tool_call>")]
    named = ("<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "</s>")
    assert qwen25.eog_ids == {qwen25.token_id(t) for t in named}


# --- SentencePiece ------------------------------------------------------------------------------------------


def _write_spm(path: Path, vocab: dict[int, tuple[str, int, float]], **flags: object) -> dict[int, int]:
    """Write a SentencePiece (``llama``) vocabulary: {id: (text, token type, score)} with ids made dense in
    order. Returns {given id: id in the file}."""
    local = {given: k for k, given in enumerate(sorted(vocab))}
    texts, types, scores = zip(*(vocab[i] for i in sorted(vocab)), strict=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(texts))
    writer.add_token_types(list(types))
    writer.add_token_scores(list(scores))
    for key, value in flags.items():
        getattr(writer, f"add_{key}")(local[value] if key.endswith("_token_id") else value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return local


NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

# Gemma3 ids, read off the reference cases made of single characters, byte fallbacks, blank runs and specials.
GEMMA_CHARS = {
    107: "\n", 236743: "▁", 236744: "e", 236746: "a", 236748: "o", 236749: "n", 236756: "u", 236761: ".",
    236762: "y", 236763: "b", 236764: ",", 236770: "1", 236771: "0", 236772: "-", 236776: "A", 236778: "2",
    236781: "x", 236786: "/", 236787: ":", 236800: "3", 236810: "5", 236811: "F", 236812: "4", 236819: "9",
    236825: "6", 236828: "8", 236832: "7", 236840: "[", 236842: "]", 237243: "\u200d", 238178: "\ufe0f",
    242398: "😀", 255968: "\t", 518: "▁b",
}  # fmt: skip


def _gemma_like_vocab() -> dict[int, tuple[str, int, float]]:
    """Gemma3's ids for what the reference cases show. Its converter stores blank runs as USER_DEFINED tokens
    with real spaces and score -1000; normal pieces get score -id (SentencePiece pieces are ranked by score)."""
    vocab = {
        0: ("<pad>", CONTROL, 0.0),
        1: ("<eos>", CONTROL, 0.0),
        2: ("<bos>", CONTROL, 0.0),
        3: ("<unk>", UNKNOWN, 0.0),
        105: ("<start_of_turn>", CONTROL, 0.0),
        106: ("<end_of_turn>", CONTROL, 0.0),
        203: ("<s>", USER_DEFINED, -1000.0),
        212: ("</s>", USER_DEFINED, -1000.0),  # becomes CONTROL (end of generation) at load time
        255969: ("\t\t", USER_DEFINED, -1000.0),
        255970: ("\t\t\t", USER_DEFINED, -1000.0),
    }
    vocab.update({106 + n: ("\n" * n, USER_DEFINED, -1000.0) for n in range(2, 32)})
    vocab.update({136 + n: (" " * n, USER_DEFINED, -1000.0) for n in range(2, 32)})
    vocab.update({238 + b: (f"<0x{b:02X}>", BYTE, 0.0) for b in range(256)})
    vocab.update({i: (text, NORMAL, -float(i)) for i, text in GEMMA_CHARS.items()})
    return vocab


@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, dict[int, int]]:
    path = tmp_path_factory.mktemp("spm") / "gemma-like.gguf"
    local = _write_spm(
        path,
        _gemma_like_vocab(),
        bos_token_id=2,
        eos_token_id=1,
        unk_token_id=3,
        pad_token_id=0,
        add_bos_token=True,
        add_eos_token=False,
        add_space_prefix=False,
    )
    return Tokenizer.from_gguf(path), local


def test_gemma3_reference_cases(gemma_like: tuple[Tokenizer, dict[int, int]], reference_dir: Path) -> None:
    """Every Gemma3 reference case whose ids all lie in this vocabulary: BOS, byte fallback (U+00A0, \\r, CJK
    Extension B), blank runs cut longest first (33 spaces -> 31 + 2), digit strings, specials with
    parse_special (<s> user-defined, </s> overridden to control, <eos>, <unk>, <pad>), all detok variants."""
    tok, local = gemma_like
    ref = _reference(reference_dir, "gemma3")
    covered = sum(
        set(c[block]["ids"]) <= local.keys()
        for c in ref["cases"]
        for block in ("parse_special_true", "parse_special_false")
    )
    assert covered >= 68
    assert list(_mismatches(tok, ref, local)) == []
    assert tok.is_eog(local[212]) and tok.is_eog(local[1])


def _llama2_like(path: Path, ab: float = -5.0, **flags: object) -> tuple[Tokenizer, dict[str, int]]:
    vocab = {0: ("<unk>", UNKNOWN, 0.0), 1: ("<s>", CONTROL, 0.0), 2: ("</s>", CONTROL, 0.0)}
    vocab.update({3 + b: (f"<0x{b:02X}>", BYTE, 0.0) for b in range(256)})
    pieces = {"▁": -10, "h": -10, "i": -10, "a": -10, "b": -10, "c": -10, "▁h": -2, "hi": -3, "▁hi": -1}
    pieces.update({"ab": ab, "bc": -4.0})
    vocab.update({300 + k: (text, NORMAL, float(score)) for k, (text, score) in enumerate(pieces.items())})
    vocab[400] = ("<tool>", USER_DEFINED, 0.0)
    local = _write_spm(path, vocab, **flags)
    tok = Tokenizer.from_gguf(path)
    return tok, {text: local[i] for i, (text, _, _) in vocab.items()}


def test_spm_rules(tmp_path: Path) -> None:
    """llama.cpp's SentencePiece rules on a llama-2-like vocabulary (dummy prefix on by default)."""
    tok, ids = _llama2_like(tmp_path / "a.gguf")
    bos, hi = ids["<s>"], ids["▁hi"]
    assert (tok.add_bos, tok.add_space_prefix, tok.bos_id) == (True, True, 1)
    assert tok.encode("hi") == [bos, hi]  # " hi": ▁h (-2) before hi (-3), then ▁hi (-1)
    assert tok.encode("abc", add_special=False) == [ids["▁"], ids["a"], ids["bc"]]  # bc (-4) beats ab (-5)
    assert tok.encode("é", add_special=False) == [ids["▁"], ids["<0xC3>"], ids["<0xA9>"]]  # byte fallback
    # a raw fragment after a special token gets the dummy prefix again
    assert tok.encode("<s>hi", parse_special=True) == [bos, bos, hi]
    assert tok.encode("<s>hi", parse_special=False) == [
        bos, ids["▁"], ids["<0x3C>"], ids["<0x73>"], ids["<0x3E>"], ids["hi"]
    ]  # fmt: skip
    assert tok.encode("hi<tool>hi", parse_special=False) == [bos, hi, ids["<tool>"], hi]  # user-defined
    # detokenizing: the first piece loses its dummy space, unless a BOS was removed before it
    assert tok.decode([bos, hi]) == "<s> hi"
    assert tok.decode([bos, hi], unparse_special=False) == " hi"
    assert tok.decode([bos, hi], remove_special=True) == " hi"
    assert tok.decode([hi]) == "hi"
    assert tok.decode([ids["<0xC3>"], ids["<0xA9>"]]) == "é"
    tied, tied_ids = _llama2_like(tmp_path / "b.gguf", ab=-4.0)  # equal scores: leftmost pair first
    assert tied.encode("abc", add_special=False) == [tied_ids["▁"], tied_ids["ab"], tied_ids["c"]]
    plain, plain_ids = _llama2_like(tmp_path / "c.gguf", add_space_prefix=False, add_bos_token=False)
    assert plain.encode("hi") == [plain_ids["hi"]]


def test_metadata_errors() -> None:
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": []}
    base["tokenizer.ggml.eos_token_id"] = 1  # a vocabulary without an end-of-generation token is refused
    Tokenizer(base)
    for bad, message in (
        ({"tokenizer.ggml.pre": "no-such-pre"}, "unknown pre-tokenizer"),
        ({"tokenizer.ggml.model": "t5"}, "unsupported tokenizer model"),
        ({"tokenizer.ggml.tokens": ["a", "a"]}, "duplicate token"),
        ({"tokenizer.ggml.merges": None}, "merges"),
        ({"tokenizer.ggml.add_bos_token": True}, "add_bos_token is true"),  # the default BOS id 11 is out of range
    ):
        with pytest.raises(TokenizerError, match=message) as exc:
            Tokenizer({**base, **bad})
        assert isinstance(exc.value, KleidipyError)


# --- splitters against the regexes they implement -----------------------------------------------------------

_ALPHABET = "ab Z09'sStTlLrReEvVdDmM.,!?-_()\n\r\t  éßΩ中文٣²½\u00a0\u3000\u2003€+<>^|$"
_PATTERNS = {
    _split_gpt2: r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    _split_llama3: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    PRE_TOKENIZERS["qwen2"].stages[0]: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=_ALPHABET, max_size=40), which=st.sampled_from(list(_PATTERNS)))
def test_splitters_match_their_regex(text: str, which) -> None:  # noqa: ANN001
    """The hand-written GPT-2 / Llama-3 splitters and the collapsed-text Qwen2 regex agree with the Unicode
    regexes they stand for (``regex`` package, optional) on text mixing every character class."""
    regex = pytest.importorskip("regex")
    spans = which(text, [_cpt_flags(c) for c in text], [(0, len(text))])
    assert "".join(text[a:b] for a, b in spans) == text
    assert [text[a:b] for a, b in spans] == regex.findall(_PATTERNS[which], text)


def test_streaming_never_splits_a_character(smollm2: Tokenizer) -> None:
    text = "naïve café 日本語 🙂 — ok"
    ids = smollm2.encode(text)
    stream = StreamDetokenizer(smollm2)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert any(p == "" for p in pieces)  # some tokens end inside a character: held back, not split
    # an unfinished character at the end is flushed as U+FFFD
    partial = StreamDetokenizer(smollm2)
    emoji = smollm2.encode("🙂")
    assert [partial.push(i) for i in emoji[:-1]] == [""] * (len(emoji) - 1)
    assert partial.flush() == "\ufffd"
    assert list(StreamDetokenizer(smollm2).feed(emoji[:-1])) == ["\ufffd"]
    assert "".join(StreamDetokenizer(smollm2).feed(ids)) == text


# bytes SmolLM2's vocabulary has no token for: llama.cpp silently drops them (and so do we)
_SMOLLM2_MISSING_BYTES = "\x04\x06\x13\x14\x16\x1d"  # and lead bytes 0xF1/0xF2: code points >= U+40000


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(
        st.characters(max_codepoint=0x3FFFF, exclude_categories=("Cs",), exclude_characters=_SMOLLM2_MISSING_BYTES),
        max_size=60,
    )
)
def test_roundtrip_any_text(smollm2: Tokenizer, text: str) -> None:
    """Any text made of bytes the vocabulary has detokenizes back to itself, streamed or not."""
    ids = smollm2.encode(text)
    assert smollm2.decode(ids) == text
    assert "".join(smollm2.detokenizer().feed(ids)) == text


def test_bytes_without_token_are_dropped(smollm2: Tokenizer) -> None:
    assert smollm2.encode("\x04") == []
    assert smollm2.encode("a\x04b") == smollm2.encode("a") + smollm2.encode("b")
    assert smollm2.decode(smollm2.encode("\U00040000")) == "\ufffd" * 3  # F1 lead byte lost
