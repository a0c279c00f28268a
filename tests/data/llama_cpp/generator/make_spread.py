#!/usr/bin/env python3
"""variant_spread.json in the schema of ../shared/reference/logits/variant_spread.json.

For a model key and pairs of variants, compare the files <model>__<prompt>__<variant>.json/.npy:
  last_logits_max_abs_diff / _mean_abs_diff : |a - b| over the last-position logit vectors (float64)
  last_logprob_max_abs_diff                 : same on log-softmax (float64)
  last_KL(a||b)                             : sum p_a (log p_a - log p_b) (float64)
  prompt_positions_top1_agree               : "k/n", top-1 id equal at each prompt position
  prompt_next_token_logprob_max_abs_diff    : max over positions of |Δ next_token_logprob| (null for 1 token)
  greedy_identical_prefix_len               : length of the common prefix of the 32 greedy ids

Usage: make_spread.py --dir DIR --model KEY [--pair a:b[:name]] ... [--out FILE] [--check REFERENCE_SPREAD]
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np

PROMPTS = ["chat_capital", "code_python", "long_prose", "mixed_unicode", "short_fact", "single_word"]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def pair_stats(d, model, prompt, va, vb):
    a = np.load(os.path.join(d, f"{model}__{prompt}__{va}.last_logits.npy")).astype(np.float64)
    b = np.load(os.path.join(d, f"{model}__{prompt}__{vb}.last_logits.npy")).astype(np.float64)
    ja = json.loads(Path(os.path.join(d, f"{model}__{prompt}__{va}.json")).read_text(encoding="utf-8"))
    jb = json.loads(Path(os.path.join(d, f"{model}__{prompt}__{vb}.json")).read_text(encoding="utf-8"))
    assert ja["token_ids"] == jb["token_ids"]
    la, lb = log_softmax(a), log_softmax(b)
    pa, pb = ja["positions"], jb["positions"]
    agree = sum(x["top10"][0][0] == y["top10"][0][0] for x, y in zip(pa, pb, strict=False))
    nt = [
        abs(x["next_token_logprob"] - y["next_token_logprob"])
        for x, y in zip(pa, pb, strict=False)
        if "next_token_logprob" in x
    ]
    ga, gb = ja["greedy"]["ids"], jb["greedy"]["ids"]
    k = 0
    while k < min(len(ga), len(gb)) and ga[k] == gb[k]:
        k += 1
    return {
        "last_logits_max_abs_diff": float(np.abs(a - b).max()),
        "last_logits_mean_abs_diff": float(np.abs(a - b).mean()),
        "last_logprob_max_abs_diff": float(np.abs(la - lb).max()),
        "last_KL(a||b)": float((np.exp(la) * (la - lb)).sum()),
        "prompt_positions_top1_agree": f"{agree}/{len(pa)}",
        "prompt_next_token_logprob_max_abs_diff": max(nt) if nt else None,
        "greedy_identical_prefix_len": k,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--pair", action="append", default=None, help="va:vb[:name], default default:norepack")
    ap.add_argument("--out", default=None)
    ap.add_argument("--check", default=None, help="compare against an existing variant_spread.json")
    args = ap.parse_args()
    pairs = []
    for p in args.pair or ["default:norepack"]:
        parts = p.split(":")
        pairs.append((parts[0], parts[1], parts[2] if len(parts) > 2 else f"{parts[0]}_vs_{parts[1]}"))
    out = {}
    for model in args.model:
        for prompt in PROMPTS:
            out[f"{model}/{prompt}"] = {name: pair_stats(args.dir, model, prompt, va, vb) for va, vb, name in pairs}
    if args.check:
        ref = json.loads(Path(args.check).read_text(encoding="utf-8"))
        bad = 0
        for k, v in out.items():
            for name, st in v.items():
                r = ref[k][name]
                if r != st:
                    bad += 1
                    print("DIFF", k, name, {f: (r[f], st[f]) for f in st if r[f] != st[f]})
        print(f"check: {sum(len(v) for v in out.values())} entries compared, {bad} differ")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps(out, ensure_ascii=False, indent=1))
    else:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
