#!/usr/bin/env python3
"""Generate llama.cpp reference logits in the schema of ../shared/reference/logits.

One process = one (model, variant). For every prompt it writes
  <model>__<prompt>__<variant>.json
  <model>__<prompt>__<variant>.last_logits.npy
and once per process
  <model>__<variant>.run.json

Procedure (as documented in ../shared/reference/README.md, section "logits/"):
  Llama(model_path, n_ctx=2048, n_threads=1, n_threads_batch=1, logits_all=True, seed=0)
  (verbose=True, the library default, so that the load log can be inspected), library defaults
  otherwise: n_batch = n_ubatch = 512, flash attention off, F16 KV cache, no GPU.
  variant "norepack": the model parameter use_extra_bufts=false (no CPU_REPACK buffer).
  Each prompt: llama_tokenize(add_special=true, parse_special=<per prompt>), evaluated in one
  llama_decode (Llama.eval, all prompts are < n_batch tokens), logits for all positions; then
  32 greedy tokens (argmax, ties -> lowest id), one token per llama_decode, reusing the KV cache.
  Decoding does not stop at EOG.

Prompts (prompt_name, prompt_kind, messages, prompt_text, parse_special) are copied from an
existing reference set's files so that they are byte-identical.

Usage:
  make_reference.py --model-key KEY --model-path PATH --model-file NAME --variant default|norepack \
      --prompts-from ../shared/reference/logits --prompts-model qwen25-q4_0 --out DIR [--prompt NAME ...] \
      [--threads N] [--python-path DIR ...]

--threads sets n_threads and n_threads_batch (default 1); --python-path puts a folder first on sys.path (where
llama_cpp is found under an emulator whose PYTHONPATH is set for it: ../../llama_cpp_arm/make_arm_reference.py).
run.json also keeps the load log's KleidiAI lines and buffer-type moves, and the GGML_* environment of the run.
"""

import argparse
import collections
import ctypes
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

PROMPT_ORDER = ["short_fact", "single_word", "code_python", "mixed_unicode", "long_prose", "chat_capital"]
N_GREEDY = 32
LLAMA_CPP_COMMIT = "0c1e57098"  # llama-cpp-python 0.3.36 CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098"
CHAT_TEMPLATE_SOURCE = (
    "GGUF tokenizer.chat_template rendered by llama_cpp.llama_chat_format.Jinja2ChatFormatter "
    "(jinja2, trim_blocks, lstrip_blocks), add_generation_prompt=True"
)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def topk(row, k):
    """[[id, logit], ...] sorted by logit descending, ties -> lower id (stable sort of -row)."""
    idx = np.argsort(-row, kind="stable")[:k]
    return [[int(i), float(row[i])] for i in idx]


def logsumexp64(row):
    r = row.astype(np.float64)
    m = r.max()
    return float(m + np.log(np.exp(r - m).sum()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-key", required=True)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--model-file", required=True, help="file name recorded in model_file")
    ap.add_argument("--variant", required=True, choices=["default", "norepack"])
    ap.add_argument("--prompts-from", required=True, help="directory with existing reference jsons")
    ap.add_argument("--prompts-model", required=True, help="model key whose jsons give the prompts")
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir", default=None, help="where to keep the raw stderr load/run log")
    ap.add_argument("--prompt", action="append", default=None, help="subset of prompts (default: all six)")
    ap.add_argument("--threads", type=int, default=1, help="n_threads and n_threads_batch")
    ap.add_argument("--python-path", action="append", default=[], help="folder put first on sys.path")
    args = ap.parse_args()
    sys.path[:0] = args.python_path

    os.makedirs(args.out, exist_ok=True)
    prompts = args.prompt or PROMPT_ORDER

    # ---- capture everything written to fd 2 (llama.cpp log callback prints to sys.stderr) ----
    log_dir = args.log_dir or args.out
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"{args.model_key}__{args.variant}.stderr.log")
    sys.stderr.flush()
    saved_fd2 = os.dup(2)
    log_f = open(log_path, "wb")  # noqa: SIM115 - fd 2 points at it for the whole run
    os.dup2(log_f.fileno(), 2)

    def log_text():
        sys.stderr.flush()
        with open(log_path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")

    import llama_cpp
    import llama_cpp.llama_cpp as C
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    use_extra_bufts = args.variant != "norepack"
    if not use_extra_bufts:
        # Llama() has no argument for it: patch the default model params it starts from.
        _orig = C.llama_model_default_params

        def _patched():
            p = _orig()
            p.use_extra_bufts = False
            return p

        C.llama_model_default_params = _patched

    llama_kwargs = dict(
        n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, logits_all=True, verbose=True, seed=0
    )
    t_load = time.time()
    llm = llama_cpp.Llama(model_path=args.model_path, **llama_kwargs)
    t_load = time.time() - t_load
    assert bool(llm.model_params.use_extra_bufts) == use_extra_bufts

    load_log = log_text()
    load_lines = [l.strip() for l in load_log.splitlines()]

    vocab = C.llama_model_get_vocab(llm._model.model)
    n_vocab = C.llama_vocab_n_tokens(vocab)
    vocab_add_bos = bool(C.llama_vocab_get_add_bos(vocab))
    bos = C.llama_vocab_bos(vocab)
    eos = C.llama_vocab_eos(vocab)
    bos_text = C.llama_vocab_get_text(vocab, bos).decode("utf-8") if bos != -1 else None
    eos_text = C.llama_vocab_get_text(vocab, eos).decode("utf-8") if eos != -1 else None
    system_info = C.llama_print_system_info().decode("utf-8")

    def tokenize(text, parse_special):
        return llm.tokenize(text.encode("utf-8"), add_bos=True, special=parse_special)

    def detok_r0_u1(ids):
        arr = (C.llama_token * len(ids))(*ids)
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = C.llama_detokenize(vocab, arr, len(ids), buf, size, False, True)
            if n < 0:
                size = -n + 16
                continue
            return buf.raw[:n]

    # chat template (for checking the copied chat prompt)
    chat_template = llm.metadata.get("tokenizer.chat_template")

    # ---- prompts ----
    run_prompts = []
    for pname in prompts:
        src_path = Path(args.prompts_from) / f"{args.prompts_model}__{pname}__default.json"
        src = json.loads(src_path.read_text(encoding="utf-8"))
        prompt_kind = src["prompt_kind"]
        messages = src["messages"]
        prompt_text = src["prompt_text"]
        parse_special = bool(src["tokenize"]["parse_special"])
        if prompt_kind == "chat":
            fmt = Jinja2ChatFormatter(
                template=chat_template, eos_token=eos_text, bos_token=bos_text, stop_token_ids=[eos]
            )
            rendered = fmt(messages=messages).prompt
            assert rendered == prompt_text, (rendered, prompt_text)

        t0 = time.time()
        ids = tokenize(prompt_text, parse_special)
        n = len(ids)
        assert n <= llm.n_batch  # -> one llama_decode
        llm.reset()
        llm.eval(ids)
        scores = llm.scores[:n, :].copy()  # float32, exactly llama_get_logits

        positions = []
        for i in range(n):
            row = scores[i]
            lse = logsumexp64(row)
            e = {"pos": i, "token": int(ids[i]), "top10": topk(row, 10), "logsumexp": lse}
            if i + 1 < n:
                nt = int(ids[i + 1])
                e["next_token"] = nt
                e["next_token_logit"] = float(row[nt])
                e["next_token_logprob"] = float(np.float64(row[nt]) - lse)
            positions.append(e)
        last = scores[n - 1].copy()

        # greedy
        gen = []
        steps = []
        row = last
        for s in range(N_GREEDY):
            tok = int(np.argmax(row))  # first maximum = lowest id
            t5 = topk(row, 5)
            assert t5[0][0] == tok
            steps.append({"step": s, "token": tok, "top5": t5, "top1_minus_top2": float(t5[0][1] - t5[1][1])})
            gen.append(tok)
            if s + 1 < N_GREEDY:
                llm.eval([tok])
                row = llm.scores[llm.n_tokens - 1, :].copy()
        seconds = round(time.time() - t0, 2)

        raw = detok_r0_u1(gen)
        try:
            text = raw.decode("utf-8")
            text_hex = None
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            text_hex = raw.hex()
        first_eog = next((i for i, t in enumerate(gen) if C.llama_vocab_is_eog(vocab, t)), None)
        until = gen[: first_eog + 1] if first_eog is not None else list(gen)

        base = f"{args.model_key}__{pname}__{args.variant}"
        np.save(os.path.join(args.out, base + ".last_logits.npy"), last.astype(np.float32))
        rec = {
            "model": args.model_key,
            "model_file": args.model_file,
            "variant": args.variant,
            "prompt_name": pname,
            "prompt_kind": prompt_kind,
            "messages": messages,
            "prompt_text": prompt_text,
            "tokenize": {
                "add_special(add_bos default)": True,
                "vocab_add_bos": vocab_add_bos,
                "parse_special": parse_special,
            },
            "n_tokens": n,
            "token_ids": [int(t) for t in ids],
            "n_vocab": int(n_vocab),
            "positions": positions,
            "last_logits_npy": base + ".last_logits.npy",
            "last_logits_argmax": int(np.argmax(last)),
            "greedy": {
                "n_generated": len(gen),
                "ids": gen,
                "text_detok_r0_u1": text,
                "text_hex": text_hex,
                "first_eog_index": first_eog,
                "ids_until_first_eog_inclusive": until,
                "steps": steps,
                "min_top1_minus_top2": min(st["top1_minus_top2"] for st in steps),
            },
            "seconds": seconds,
        }
        with open(os.path.join(args.out, base + ".json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
        run_prompts.append(
            {
                "prompt_name": pname,
                "json": base + ".json",
                "npy": base + ".last_logits.npy",
                "n_tokens": n,
                "greedy_text": text,
                "first_eog_index": first_eog,
                "min_greedy_margin": rec["greedy"]["min_top1_minus_top2"],
                "min_prompt_top1_margin": min(p["top10"][0][1] - p["top10"][1][1] for p in positions),
            }
        )
        print(f"{base}: n_tokens={n} seconds={seconds} greedy={text!r}", file=sys.__stdout__, flush=True)

    # ---- run.json ----
    repack_lines = [l for l in load_lines if "REPACK" in l]
    buffer_lines = [l for l in load_lines if "buffer size" in l]
    names, formats = [], collections.Counter()
    for l in load_lines:
        m = re.search(r"repack tensor (\S+) with (\S+)$", l)
        if m:
            names.append(m.group(1))
            formats[m.group(2)] += 1
    cp = llm.context_params
    fa_names = {-1: "auto", 0: "disabled", 1: "enabled"}
    run = {
        "model": args.model_key,
        "model_file": args.model_file,
        "model_sha256": sha256_file(args.model_path),
        "variant": args.variant,
        "llama_cpp_python": llama_cpp.__version__,
        "llama.cpp_commit": LLAMA_CPP_COMMIT,
        "system_info": system_info,
        "Llama_kwargs": llama_kwargs,
        "context_params": {
            "n_ctx": int(C.llama_n_ctx(llm._ctx.ctx)),
            "n_batch": int(C.llama_n_batch(llm._ctx.ctx)),
            "n_ubatch": int(C.llama_n_ubatch(llm._ctx.ctx)),
            "n_threads": int(cp.n_threads),
            "n_threads_batch": int(cp.n_threads_batch),
            "flash_attn_type": int(cp.flash_attn_type),
            "flash_attn_type_name": fa_names.get(int(cp.flash_attn_type), str(cp.flash_attn_type)),
            "type_k": int(cp.type_k),
            "type_v": int(cp.type_v),
            "offload_kqv": bool(cp.offload_kqv),
            "use_extra_bufts(model param)": bool(llm.model_params.use_extra_bufts),
        },
        "cpu_repack_used": any("CPU_REPACK model buffer size" in l for l in load_lines),
        "load_log_repack_lines": repack_lines,
        "repacked_tensors": {"count": len(names), "formats": dict(formats), "names": names},
        "load_log_buffer_lines": buffer_lines,
        "vocab_add_bos": vocab_add_bos,
        "chat_template_source": CHAT_TEMPLATE_SOURCE,
        "bos_token_text": bos_text,
        "eos_token_text": eos_text,
        "prompts": run_prompts,
    }
    # buffer lines printed after the load (context creation) are in the full log
    full_lines = [l.strip() for l in log_text().splitlines()]
    run["load_log_buffer_lines"] = [l for l in full_lines if "buffer size" in l]
    run["load_log_kleidiai_lines"] = [l for l in full_lines if "kleidiai" in l.lower()]
    run["load_log_buffer_type_moves"] = [l for l in full_lines if "cannot be used with preferred buffer type" in l]
    run["environment"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("GGML_")}
    with open(os.path.join(args.out, f"{args.model_key}__{args.variant}.run.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(run, ensure_ascii=False, indent=1))
    print(
        f"run.json: cpu_repack_used={run['cpu_repack_used']} repacked={len(names)} {dict(formats)} load_s={t_load:.1f}",
        file=sys.__stdout__,
        flush=True,
    )

    os.dup2(saved_fd2, 2)


if __name__ == "__main__":
    main()
