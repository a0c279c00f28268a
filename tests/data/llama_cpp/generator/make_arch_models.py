#!/usr/bin/env python3
"""Small random-weight GGUFs of the qwen3, smollm3, phi3 and gemma2 architectures in llama.cpp's own tensor names and
metadata keys, and llama.cpp's reference data for them (``../arch/``; README "Random-weight architectures").

``write_model(key, tokenizer_source, path)`` writes one file: deterministic (seed per key), gguf + numpy only, so
the tests write the same bytes at test time (the files are not committed: the Qwen tokenizer alone makes the qwen3
file 40 MB) and check them against the sha256 recorded with the reference. The tokenizer (tokens, types, merges,
special ids, chat template) is copied from a shipped model of the family: Qwen2.5's for qwen3 (Qwen3 keeps Qwen2's
vocabulary, pre-tokenizer ``qwen2``); SmolLM2's vocabulary for smollm3 with SmolLM3's pre-tokenizer type
``llama-bpe`` (SmolLM3 ships Llama 3's tokenizer; no catalogue model has it, llama-bpe's rules are what is tested);
Gemma 3's SPM vocabulary (``llama`` model, the SPM one in the catalogue) for phi3, whose file has fused attn_qkv and
ffn_up, LongRoPE factors and an original context of 512 (the long prompt runs past it: llama.cpp's context of 2048
takes the long factors), and a sliding window of 262 that llama.cpp reads and disables; the same vocabulary (its
pre type ``default``, as Gemma 2's converter writes it) for gemma2, whose file has a sliding window of 64 on its even
layers, soft-caps of 1 (attention) and 30 (logits), and no output.weight (llama.cpp's gemma2 always takes
token_embd).

The output logits are peaked, so that greedy top-1/top-2 margins are wide: the blocks' output projections are scaled
by BLOCK_GAIN, so the residual stream stays near the input token's embedding, and the LM head's row of each token's
successor (a fixed random permutation; with a tied LM head the token itself) is that token's embedding: the top
logit stands ~10 standard deviations of the others above them, while every block still shifts every logit.

``reference`` (run in a separate process with llama-cpp-python's package on PYTHONPATH and LLAMA_CPP_LIB_PATH at
the vendored build's bin/) runs llama.cpp on each file: token ids of the prompts, last-row logits, greedy steps
with their margins, for the variants default, norepack (use_extra_bufts=false) and flashattn; the spread is the
largest last-row max |Δ| of a variant against default.

``rstrip-reference`` records llama.cpp's token ids for a phi3 file named as a Phi-3 (llama.cpp then gives its special
tokens the RSTRIP attribute: the whitespace after them is dropped) with a vocabulary shaped as Phi-3's
(``write-phi3-named``): ``../arch/phi3_rstrip.json``.

Usage:
  make_arch_models.py write KEY TOKENIZER_SOURCE_GGUF OUT.gguf
  make_arch_models.py reference KEY MODEL.gguf OUT_DIR
  make_arch_models.py write-phi3-named OUT.gguf
  make_arch_models.py rstrip-reference MODEL.gguf OUT.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests/: the random tensors of the tests' tiny models
from gguf_writer import tiny_tensors, write_tensors  # noqa: E402

#: not "phi3" nor "phi-3": llama.cpp gives a model so named its tokenizer's special tokens RSTRIP and "</s>" (which
#: Gemma's vocabulary lacks: the load fails), a rule of the name that kleidipy's tokenizer does not follow
PHI3_NAME = "kleidipy random fused-QKV LongRoPE model"
#: gemma2's sliding window (layers 0 and 2; the long prompt runs past it) and its attention and final soft-caps,
#: small enough that they cap (the test checks: scores and logits past them)
GEMMA2_WINDOW, GEMMA2_CAPS = 64, (1.0, 30.0)
#: per model key: architecture, shape and weight types (blocks, token_embd, output; output None = tied)
MODELS = {
    "qwen3": dict(
        arch="qwen3", seed=3, pre=None, n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=128, n_ff=768,
        rope_base=1000000.0, eps=1e-6, n_ctx=40960, blocks=T.Q4_0, embd=T.Q4_0, output=None,
    ),
    "smollm3": dict(
        arch="smollm3", seed=33, pre="llama-bpe", n_layer=8, n_embd=256, n_head=4, n_head_kv=1, head_dim=64,
        n_ff=768, rope_base=5000000.0, eps=1e-6, n_ctx=65536, blocks=T.Q8_0, embd=T.Q4_0, output=T.Q4_0,
    ),
    "phi3": dict(
        arch="phi3", seed=43, pre=None, n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
        rope_base=10000.0, eps=1e-5, n_ctx=4096, blocks=T.Q4_0, embd=T.Q4_0, output=T.Q4_0,
        name=PHI3_NAME, kv={"rope.scaling.original_context_length": 512, "attention.sliding_window": 262,
                            "rope.scaling.attn_factor": float(np.sqrt(4 / 3))},
    ),
    "gemma2": dict(
        arch="gemma2", seed=52, pre=None, n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
        rope_base=10000.0, eps=1e-6, n_ctx=8192, blocks=T.Q4_0, embd=T.Q4_0, output=None,
        kv={"attention.sliding_window": GEMMA2_WINDOW, "attn_logit_softcapping": GEMMA2_CAPS[0],
            "final_logit_softcapping": GEMMA2_CAPS[1]},
    ),
}  # fmt: skip
#: the catalogue model each key copies its tokenizer from
TOKENIZER_SOURCE = {
    "qwen3": "qwen2.5-coder-0.5b-instruct",
    "smollm3": "smollm2-135m-instruct",
    "phi3": "gemma3-270m",
    "gemma2": "gemma3-270m",
}
#: the scale of the blocks' output projections (attn_output, ffn_down): their sum stays well below the embedding
BLOCK_GAIN = 0.1

LONG = " ".join(
    f"Chapter {i}: the river kept its course past the mill, the orchard and the old stone bridge, where "
    f"{n} travellers had stopped that year to look at the water and talk about the weather."
    for i, n in enumerate(range(17, 17 * 23, 17))
)
#: name -> (text, parse_special); long_prose is longer than one ubatch (512 tokens)
PROMPTS = {
    "short_fact": ("The capital of France is", False),
    "mixed_unicode": ("Grüße aus Zürich! 東京は晴れ。 x² + y² = z², emoji 🙂 and\ttabs  and  spaces 12345.", False),
    "chat_special": ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", True),
    "long_prose": (LONG, False),
}
N_GREEDY = 16
VARIANTS = ("default", "norepack", "flashattn")


def tokenizer_kv(source: Path, pre: str | None) -> list[tuple[str, object, gguf.GGUFValueType, object]]:
    """The ``tokenizer.*`` keys of a shipped GGUF with their GGUF types (``pre`` replaces tokenizer.ggml.pre)."""
    out = []
    for key, field in gguf.GGUFReader(source).fields.items():
        if key.startswith("tokenizer."):
            value = pre if key == "tokenizer.ggml.pre" and pre else field.contents()
            sub = field.types[1] if len(field.types) > 1 else None
            out.append((key, value, field.types[0], sub))
    return out


def tensors(m: dict, n_vocab: int) -> dict[str, np.ndarray]:
    """Random float32 tensors in numpy order (ggml shape reversed), llama.cpp's names (tests/gguf_writer.py), made
    peaked (module docstring)."""
    shape = {k: m[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "head_dim", "seed")}
    t = tiny_tensors(m["arch"], n_vocab=n_vocab, tied=m["output"] is None, **shape)
    for name in t:
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            t[name] *= np.float32(BLOCK_GAIN)
    if "output.weight" in t:  # the successor of token i is successor[i]
        successor = np.random.default_rng(m["seed"]).permutation(n_vocab)
        t["output.weight"][successor] = t["token_embd.weight"]
    return t


def write_model(key: str, tokenizer_source: Path | None, path: Path, name: str | None = None) -> Path:
    """Write model ``key``'s GGUF to ``path`` (the same bytes on every run); with no ``tokenizer_source``, the
    Phi-3-like vocabulary of :func:`phi3_vocab_kv`; ``name`` replaces the model's general.name."""
    m, a = MODELS[key], MODELS[key]["arch"]
    tok = tokenizer_kv(tokenizer_source, m["pre"]) if tokenizer_source else phi3_vocab_kv()
    n_vocab = len(next(v for k, v, *_ in tok if k == "tokenizer.ggml.tokens"))
    w = gguf.GGUFWriter(path, a)
    w.add_string("general.name", name or m.get("name", f"kleidipy random {a}"))
    w.add_uint32(f"{a}.block_count", m["n_layer"])
    w.add_uint32(f"{a}.context_length", m["n_ctx"])
    w.add_uint32(f"{a}.embedding_length", m["n_embd"])
    w.add_uint32(f"{a}.feed_forward_length", m["n_ff"])
    w.add_uint32(f"{a}.attention.head_count", m["n_head"])
    w.add_uint32(f"{a}.attention.head_count_kv", m["n_head_kv"])
    w.add_uint32(f"{a}.attention.key_length", m["head_dim"])
    w.add_uint32(f"{a}.attention.value_length", m["head_dim"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", m["eps"])
    w.add_float32(f"{a}.rope.freq_base", m["rope_base"])
    w.add_uint32(f"{a}.rope.dimension_count", m["head_dim"])
    w.add_uint32(
        "general.file_type",
        int(gguf.LlamaFileType.MOSTLY_Q4_0 if m["blocks"] == T.Q4_0 else gguf.LlamaFileType.MOSTLY_Q8_0),
    )
    for k, v in m.get("kv", {}).items():  # (phi3's LongRoPE keys and sliding window, gemma2's window and caps)
        (w.add_uint32 if isinstance(v, int) else w.add_float32)(f"{a}.{k}", v)
    for k, v, vtype, sub in tok:
        w.add_key_value(k, v, vtype, sub)
    write_tensors(
        w, tensors(m, n_vocab), {"token_embd.weight": m["embd"], "output.weight": m["output"], "*": m["blocks"]}
    )
    return path


#: a Phi-3 model's name: llama.cpp strips the whitespace after its special tokens (RSTRIP) but <unk>, <s>,
#: <|endoftext|>
PHI3_REAL_NAME = "Phi-3-mini-4k-instruct"
#: texts for the RSTRIP rule, each tokenized with parse_special true and false
RSTRIP_TEXTS = (
    "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
    "<|system|>  \t be brief<|end|>\r\n\n<|user|> hi </s>  next <s>  kept <unk>  kept <|endoftext|>  kept",
    "a<|end|>   <|end|>\n\n",
)


def phi3_vocab_kv() -> list[tuple[str, object, gguf.GGUFValueType, object]]:
    """A SentencePiece vocabulary shaped as Phi-3's: <unk> <s> </s>, the 256 byte tokens, a few pieces, then
    <|endoftext|> (control) and Phi-3's chat tokens (<|end|> control, the others user-defined, as its file has
    them)."""
    V = gguf.GGUFValueType
    pieces = ["\u2581", *("\u2581" + w for w in ("What", "is", "hi", "be", "brief", "next", "kept")), "a"]
    specials = {"<|endoftext|>": 3, "<|assistant|>": 4, "<|end|>": 3, "<|system|>": 4, "<|user|>": 4}
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces, *specials]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces), *specials.values()]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0] * len(specials)
    kv = [
        ("tokenizer.ggml.model", "llama", V.STRING, None),
        ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
        ("tokenizer.ggml.scores", scores, V.ARRAY, V.FLOAT32),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
    ]
    ids = {"bos_token_id": 1, "eos_token_id": tokens.index("<|endoftext|>"), "unknown_token_id": 0}
    return kv + [(f"tokenizer.ggml.{k}", v, V.UINT32, None) for k, v in ids.items()]


def rstrip_reference(model: Path, out: Path) -> None:
    """Write llama.cpp's token ids of :data:`RSTRIP_TEXTS` (BOS added; parse_special true and false) to ``out``."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    cases = [
        {"text": text, "parse_special": special, "token_ids": llm.tokenize(text.encode(), True, special)}
        for text in RSTRIP_TEXTS
        for special in (True, False)
    ]
    rec = {"model_sha256": sha256_file(model), "llama_cpp_python": llama_cpp.__version__, "cases": cases}
    out.write_text(json.dumps(rec, ensure_ascii=False, indent=1) + "\n")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run_variant(model: Path, variant: str) -> dict:
    """llama.cpp on every prompt in one variant: token ids, last-row logits, greedy steps with margins."""
    import llama_cpp
    import llama_cpp.llama_cpp as C

    orig = C.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = variant != "norepack"
        return p

    C.llama_model_default_params = params
    kw = dict(n_ctx=2048, n_threads=1, n_threads_batch=1, logits_all=True, seed=0, verbose=False)
    llm = llama_cpp.Llama(model_path=str(model), flash_attn=variant == "flashattn", **kw)
    C.llama_model_default_params = orig
    out = {}
    for name, (text, special) in PROMPTS.items():
        ids = llm.tokenize(text.encode(), add_bos=True, special=special)
        llm.reset()
        llm.eval(ids)
        row = llm.scores[len(ids) - 1].copy()
        last, steps = row.copy(), []
        for _ in range(N_GREEDY):
            order = np.argsort(-row, kind="stable")[:2]
            steps.append([int(order[0]), float(row[order[0]]) - float(row[order[1]])])
            llm.eval([int(order[0])])
            row = llm.scores[llm.n_tokens - 1].copy()
        out[name] = {"ids": [int(i) for i in ids], "last": last, "greedy": steps}
    return out


def reference(key: str, model: Path, out_dir: Path) -> None:
    """Write ``<key>.json`` (file sha256, per prompt: token ids, greedy tokens and margins, spread) and
    ``<key>__<prompt>.last_logits.npy`` (llama.cpp default) into ``out_dir``."""
    import llama_cpp

    runs = {v: _run_variant(model, v) for v in VARIANTS}
    base = runs["default"]
    prompts = {}
    for name, (text, special) in PROMPTS.items():
        for v in VARIANTS[1:]:
            assert runs[v][name]["ids"] == base[name]["ids"], (v, name)
        spread = {
            f"default_vs_{v}": float(np.max(np.abs(runs[v][name]["last"] - base[name]["last"]))) for v in VARIANTS[1:]
        }
        np.save(out_dir / f"{key}__{name}.last_logits.npy", base[name]["last"].astype(np.float32))
        prompts[name] = {
            "text": text,
            "parse_special": special,
            "token_ids": base[name]["ids"],
            "greedy": [s[0] for s in base[name]["greedy"]],
            "greedy_margin": [round(s[1], 4) for s in base[name]["greedy"]],
            "spread": spread,
        }
    rec = {
        "model": key,
        "model_sha256": sha256_file(model),
        "llama_cpp_python": llama_cpp.__version__,
        "procedure": "Llama(n_ctx=2048, n_threads=1, logits_all=True); tokenize(add_bos=True, special=parse_special);"
        f" eval; {N_GREEDY} greedy steps (argmax, ties to the lowest id); variants {', '.join(VARIANTS)}",
        "prompts": prompts,
    }
    (out_dir / f"{key}.json").write_text(json.dumps(rec, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "write":
        key, a, b = sys.argv[2:5]
        write_model(key, Path(a), Path(b))
    elif cmd == "write-phi3-named":
        write_model("phi3", None, Path(sys.argv[2]), name=PHI3_REAL_NAME)
    elif cmd == "rstrip-reference":
        rstrip_reference(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        key, a, b = sys.argv[2:5]
        reference(key, Path(a), Path(b))
