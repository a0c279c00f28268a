"""Does a model answer everyday questions? 20 questions a first-time user asks (facts, arithmetic, translation,
a haiku and a poem, a few others), each asked with seeds 1..5 with llama.cpp's default sampling (temperature 0.8,
top-k 40, top-p 0.95, min-p 0.05: kleidipy's defaults) in the model's chat template (only the user's question: a
system prompt only where the publisher's template adds its default one), generated until the end of the turn or
256 tokens, and scored by keywords (case-insensitive, common variants accepted; the haiku by its three lines).

Prints a markdown table per model (hits out of the seeds per question, the total %) and, with ``--out``, writes
every answer to JSON. ``load s`` is the load of this process (repack cache and compiled plan as they are) and
``1st answer s`` the first question's first reply: together, what a first ``kleidipy run`` waits once pulled.

    python benchmarks/first_answers.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct|FILE.gguf]
        [--seeds 1,2,3,4,5] [--threads 1] [--target SPEC] [--max-tokens 256] [--out results.json] [-v]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: the catalogue's instruct models (gemma3-270m is a base model: no chat template)
DEFAULT_MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
DEFAULT_SEEDS = (1, 2, 3, 4, 5)


def _number(*values: str) -> str:
    """A regex for any of ``values`` standing alone as a number ("84", not "184", "8.4" or "1,084")."""
    alternatives = "|".join(re.escape(v) for v in values)
    return rf"(?<![\d.,])(?:{alternatives})(?![\d]|[.,]\d)"


def _words(*values: str) -> str:
    """A regex for any of ``values`` as whole words (spaces inside match any run of spaces or hyphens)."""
    alternatives = "|".join(re.escape(v).replace(r"\ ", r"[\s-]+") for v in values)
    return rf"(?<!\w)(?:{alternatives})(?!\w)"


def _stanza_lines(text: str) -> list[list[str]]:
    """The text's stanzas (blocks between blank lines) as their lines, without introductions ("Here is a haiku:"),
    markdown headings and bold or quoted titles."""
    stanzas = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = []
        for line in block.splitlines():
            line = line.strip().strip(">").strip()
            title = re.fullmatch(r"(#+ .*|\*\*[^*]+\*\*|\"[^\"]+\"|title:.*)", line, re.IGNORECASE)
            if line and not line.endswith(":") and not title:
                lines.append(line)
        if lines:
            stanzas.append(lines)
    return stanzas


def is_haiku(text: str) -> bool:
    """A stanza of three lines (the haiku's form; its syllables are not counted)."""
    return any(len(lines) == 3 for lines in _stanza_lines(text))


def is_poem_about(keyword: str) -> Callable[[str], bool]:
    """A poem: at least two lines of verse in a stanza, and ``keyword`` (a regex) in the text."""

    def check(text: str) -> bool:
        verse = any(len(lines) >= 2 for lines in _stanza_lines(text))
        return verse and re.search(keyword, text, re.IGNORECASE) is not None

    return check


@dataclass(frozen=True)
class Question:
    """One everyday question: ``keywords`` are regexes, any of which found in the answer (case-insensitive) is a
    hit; ``check`` (if given) scores the answer instead."""

    id: str
    kind: str
    text: str
    keywords: tuple[str, ...] = ()
    check: Callable[[str], bool] | None = None

    def score(self, answer: str) -> bool:
        if self.check is not None:
            return self.check(answer)
        return any(re.search(k, answer, re.IGNORECASE) for k in self.keywords)


QUESTIONS: tuple[Question, ...] = (
    Question("capital-france", "fact", "What is the capital of France?", (_words("Paris"),)),
    Question("capital-japan", "fact", "What is the capital of Japan?", (_words("Tokyo", "Tōkyō"),)),
    Question("capital-italy", "fact", "What is the capital of Italy?", (_words("Rome", "Roma"),)),
    Question("hamlet", "fact", "Who wrote Hamlet?", (_words("Shakespeare"),)),
    Question(
        "boiling-point",
        "fact",
        "What is the boiling point of water in degrees Celsius?",
        (_number("100"), _words("one hundred", "a hundred")),
    ),
    Question("planets", "fact", "How many planets are in our solar system?", (_number("8"), _words("eight"))),
    Question("mona-lisa", "fact", "Who painted the Mona Lisa?", (_words("Leonardo", "da Vinci"),)),
    Question("12x7", "arithmetic", "What is 12 times 7?", (_number("84"), _words("eighty four"))),
    Question("15+27", "arithmetic", "What is 15 plus 27?", (_number("42"), _words("forty two"))),
    Question("100/4", "arithmetic", "What is 100 divided by 4?", (_number("25", "25.0"), _words("twenty five"))),
    Question(
        "good-morning-es",
        "translation",
        "How do you say 'good morning' in Spanish?",
        (_words("buenos días", "buenos dias", "buen día", "buen dia"),),
    ),
    Question("thank-you-fr", "translation", "How do you say 'thank you' in French?", (_words("merci"),)),
    Question(
        "hello-de",
        "translation",
        "How do you say 'hello' in German?",
        (_words("hallo", "guten Tag", "servus", "moin"),),
    ),
    Question("haiku-sea", "poem", "Write a haiku about the sea.", check=is_haiku),
    Question(
        "poem-cat",
        "poem",
        "Write a short poem about a cat.",
        check=is_poem_about(_words("cat", "cats", "kitten", "kitty", "feline", "whiskers", "purr", "purrs", "meow")),
    ),
    Question("week-days", "other", "How many days are there in a week?", (_number("7"), _words("seven"))),
    Question("blue-yellow", "other", "What color do you get when you mix blue and yellow?", (_words("green"),)),
    Question("gold-symbol", "other", "What is the chemical symbol for gold?", (_words("Au"),)),
    Question("largest-ocean", "other", "What is the largest ocean on Earth?", (_words("Pacific"),)),
    Question("opposite-hot", "other", "What is the opposite of 'hot'?", (_words("cold"),)),
)


@dataclass
class Answer:
    seed: int
    text: str
    hit: bool
    finish_reason: str | None
    tokens: int
    seconds: float


@dataclass
class QuestionResult:
    id: str
    kind: str
    question: str
    answers: list[Answer] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return sum(a.hit for a in self.answers)


@dataclass
class ModelResult:
    model: str
    path: str
    chat_template: bool
    load_s: float
    first_answer_s: float = 0.0
    questions: list[QuestionResult] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return sum(q.hits for q in self.questions)

    @property
    def total(self) -> int:
        return sum(len(q.answers) for q in self.questions)

    @property
    def percent(self) -> float:
        return 100.0 * self.hits / self.total if self.total else 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(hits=self.hits, total=self.total, percent=round(self.percent, 1))
        for q, qdata in zip(self.questions, data["questions"], strict=True):
            qdata["hits"] = q.hits
        return data


def run_model(
    model: str,
    seeds: Sequence[int],
    threads: int = 1,
    target: str | None = None,
    max_tokens: int = 256,
    questions: Sequence[Question] = QUESTIONS,
    verbose: bool = False,
) -> ModelResult:
    """Ask every question with every seed (each reply from an empty KV cache, as a fresh ``kleidipy run``)."""
    from kleidipy.api import LLM
    from kleidipy.runtime.generate import Engine
    from kleidipy.target import resolve_target

    t0 = time.perf_counter()
    # the API's LLM on an Engine that compiles its plan here (kleidipy.load builds it in a background process)
    engine = Engine(model, target=resolve_target(target), threads=threads, progress=False)
    llm = LLM(engine)
    chat = engine.chat_template.from_model  # as `kleidipy run`: a model without a template continues the text
    result = ModelResult(model, str(engine.path), chat, time.perf_counter() - t0)
    for question in questions:
        qr = QuestionResult(question.id, question.kind, question.text)
        for seed in seeds:
            llm.reset()
            t1 = time.perf_counter()
            if chat:
                reply = llm.chat([{"role": "user", "content": question.text}], max_tokens=max_tokens, seed=seed)
            else:
                reply = llm.complete(question.text, max_tokens=max_tokens, seed=seed)
            seconds = time.perf_counter() - t1
            if not result.first_answer_s:
                result.first_answer_s = seconds
            answer = Answer(
                seed,
                reply.text,
                question.score(reply.text),
                reply.finish_reason,
                reply.usage.completion_tokens,
                round(seconds, 2),
            )
            qr.answers.append(answer)
            if verbose:
                mark = "HIT " if answer.hit else "MISS"
                print(f"[{mark}] {question.id} seed {seed}: {reply.text.strip()!r}", file=sys.stderr, flush=True)
        result.questions.append(qr)
        print(f"{model}: {question.id} {qr.hits}/{len(seeds)}", file=sys.stderr, flush=True)
    return result


def rescore(data: Sequence[dict]) -> list[ModelResult]:
    """The results of an ``--out`` file, every answer scored again with the current :data:`QUESTIONS`."""
    by_id = {q.id: q for q in QUESTIONS}
    results = []
    for m in data:
        result = ModelResult(m["model"], m["path"], m["chat_template"], m["load_s"], m["first_answer_s"])
        for q in m["questions"]:
            answers = [Answer(**{**a, "hit": by_id[q["id"]].score(a["text"])}) for a in q["answers"]]
            result.questions.append(QuestionResult(q["id"], q["kind"], q["question"], answers))
        results.append(result)
    return results


def format_table(result: ModelResult) -> str:
    """The markdown table of one model: hits per question, then the total and the timings."""
    n = len(result.questions[0].answers) if result.questions else 0
    tokens = sum(a.tokens for q in result.questions for a in q.answers)
    seconds = sum(a.seconds for q in result.questions for a in q.answers)
    lines = [
        f"### {result.model}" + ("" if result.chat_template else " (no chat template: plain completion)"),
        "",
        "| question | kind | hits |",
        "| --- | --- | ---: |",
    ]
    lines += [f"| {q.question} | {q.kind} | {q.hits}/{n} |" for q in result.questions]
    lines += [
        f"| **total** | | **{result.hits}/{result.total} = {result.percent:.0f} %** |",
        "",
        f"load {result.load_s:.1f} s, 1st answer {result.first_answer_s:.1f} s; "
        f"{tokens} tokens in {seconds:.0f} s ({tokens / seconds if seconds else 0:.1f} tokens/s with prefill)",
    ]
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated catalogue names or GGUF paths (default: %(default)s)",
    )
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="default: %(default)s")
    parser.add_argument("--threads", type=int, default=1, help="kernel threads (default 1)")
    parser.add_argument("--target", default=None, help="target spec (default: $KLEIDIPY_TARGET, else the host)")
    parser.add_argument("--max-tokens", type=int, default=256, help="cap on each reply (default 256)")
    parser.add_argument("--questions", default=None, help="comma-separated question ids (default: all 20)")
    parser.add_argument("--out", type=Path, default=None, help="write every answer to this JSON file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every answer to stderr")
    parser.add_argument(
        "--rescore", type=Path, nargs="+", default=None, help="score the answers of --out files again (no model runs)"
    )
    args = parser.parse_args(argv)
    if args.rescore:
        results = [r for path in args.rescore for r in rescore(json.loads(path.read_text()))]
        for result in results:
            print(format_table(result) + "\n")
        _print_summary(results)
        return 0

    seeds = _int_list(args.seeds)
    questions = QUESTIONS
    if args.questions:
        wanted = args.questions.split(",")
        unknown = sorted(set(wanted) - {q.id for q in QUESTIONS})
        if unknown:
            parser.error(f"unknown question ids {unknown}; known: {[q.id for q in QUESTIONS]}")
        questions = tuple(q for q in QUESTIONS if q.id in wanted)
    results = []
    for model in (m.strip() for m in args.models.split(",") if m.strip()):
        result = run_model(model, seeds, args.threads, args.target, args.max_tokens, questions, args.verbose)
        results.append(result)
        print(format_table(result) + "\n", flush=True)
        if args.out:  # after each model: a long run keeps what it has
            args.out.write_text(json.dumps([r.to_json() for r in results], indent=1, ensure_ascii=False) + "\n")
    _print_summary(results)
    return 0


def _print_summary(results: Sequence[ModelResult]) -> None:
    if len(results) > 1:
        print("| model | hits | % |\n| --- | ---: | ---: |")
        for r in results:
            print(f"| {r.model} | {r.hits}/{r.total} | {r.percent:.0f} % |")


if __name__ == "__main__":
    sys.exit(main())
