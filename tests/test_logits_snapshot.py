"""The bits every shipped model gives, recorded: the sha256 of the logits of the prompt's last row and 16 greedy
steps, per model (the catalogue's, and SmolLM2 requantized to pure Q4_0 and Q8_0), target (i8mm, dotprod, sme2, sme)
and execution (the compiled plan at 1 and 2 threads, op by op), and the pure Q4_0 copy on sme2 with the seeds' kernel
table (``table=seeds``). A change that moves any of them moves a row of
``tests/data/logits_snapshot.json``: one made on purpose re-records it in its own commit, saying why
(``python tests/test_logits_snapshot.py --record``); a refactoring never does."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from model_files import GEMMA3, QWEN25, SMOLLM2, model_file, requantized

from kleidipy.runtime.generate import Engine
from kleidipy.target import parse_target

SNAPSHOT = Path(__file__).resolve().parent / "data" / "logits_snapshot.json"
PROMPT = "The capital of France is"
STEPS = 16
TARGETS = ("i8mm", "dotprod", "sme2:svl=512", "sme:svl=512")
MODELS = (SMOLLM2, QWEN25, GEMMA3, f"{SMOLLM2}.pure-q4_0", f"{SMOLLM2}.pure-q8_0")
EXECUTIONS = ("plan-t1", "plan-t2", "op-by-op")
#: the seeds' kernel table (the int8 MOPA GEMM for Q4_0 on SME2), one flag away from sme2's default: its one model
#: with Q4_0 matrices
SEEDS_ROWS = ((f"{SMOLLM2}.pure-q4_0", "sme2:svl=512,table=seeds"),)


def _path(model: str) -> Path:
    name, _, pure = model.partition(".pure-")
    return requantized(name, pure) if pure else model_file(name)


def _digest(engine: Engine) -> str:
    """sha256 of the logits of PROMPT's last row and of STEPS greedy steps after it, from an empty KV cache."""
    engine.lm.reset()
    logits = engine.lm.forward(engine.prompt(PROMPT))
    digest = hashlib.sha256()
    for _ in range(STEPS):
        digest.update(np.ascontiguousarray(logits, np.float32).tobytes())
        logits = engine.lm.forward([int(np.argmax(logits))])
    digest.update(np.ascontiguousarray(logits, np.float32).tobytes())
    return digest.hexdigest()


def digests(model: str, target: str) -> dict[str, str]:
    """{execution: sha256} of ``model`` on ``target``."""
    quiet = {"progress": False, "notice": lambda _: None, "target": parse_target(target)}
    plan = Engine(_path(model), threads=1, **quiet)
    out = {"plan-t1": _digest(plan)}
    plan.set_threads(2)
    out["plan-t2"] = _digest(plan)
    plan.lm.compiled.close()
    out["op-by-op"] = _digest(Engine(_path(model), graph=False, **quiet))
    return out


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_logits_bits_are_the_recorded_ones(model: str, target: str) -> None:
    recorded = json.loads(SNAPSHOT.read_text())["digests"][f"{model} {target}"]
    assert digests(model, target) == dict.fromkeys(EXECUTIONS, recorded)


@pytest.mark.parametrize("model,target", SEEDS_ROWS)
def test_seeds_table_bits_are_the_recorded_ones(model: str, target: str) -> None:
    test_logits_bits_are_the_recorded_ones(model, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write tests/data/logits_snapshot.json afresh")
    if not parser.parse_args().record:
        parser.error("nothing to do: pass --record")
    table = {}
    for model, target in [(m, t) for m in MODELS for t in TARGETS] + list(SEEDS_ROWS):
        found = digests(model, target)
        assert len(set(found.values())) == 1, (model, target, found)
        table[f"{model} {target}"] = found["plan-t1"]
        print(model, target, found["plan-t1"], flush=True)
    doc = {"prompt": PROMPT, "steps": STEPS, "digests": table}
    SNAPSHOT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
