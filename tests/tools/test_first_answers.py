"""benchmarks/first_answers.py: the scoring of the everyday answers (keywords, numbers standing alone, the haiku's
three lines) and the table, without a model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "first_answers.py"
_spec = importlib.util.spec_from_file_location("first_answers", _PATH)
fa = importlib.util.module_from_spec(_spec)
sys.modules["first_answers"] = fa  # dataclasses look their module up while the class is made
_spec.loader.exec_module(fa)

QUESTIONS = {q.id: q for q in fa.QUESTIONS}

#: (question id, an answer that hits, an answer that misses)
CASES = [
    ("capital-france", "The capital of France is **Paris**.", "La Dame, le Capital de France."),
    ("capital-japan", "Tokyo is the capital of Japan.", "Kyoto was the capital."),
    ("capital-italy", "It's Rome (Roma).", "Milan is the largest city."),
    ("hamlet", "William Shakespeare wrote Hamlet.", "It was written by Claudius."),
    ("boiling-point", "Water boils at 100 °C at sea level.", "Water boils at 1000 degrees."),
    ("planets", "There are eight planets.", "There are 9 planets, or 18."),
    ("mona-lisa", "Leonardo da Vinci painted it.", "Michelangelo painted it."),
    ("12x7", "12 × 7 = 84", "12 times 7 is 1,084 or 8.4 or 184"),
    ("15+27", "15 + 27 = 42.", "15 plus 27 is 32"),
    ("100/4", "100 divided by 4 is 25.0", "It is 250."),
    ("good-morning-es", "You say «Buenos días»!", "Buenas noches"),
    ("good-morning-es", "In Spanish: buenos dias", "bueno"),
    ("thank-you-fr", "'Merci' (or merci beaucoup).", "Gracias"),
    ("hello-de", "Hallo, or Guten Tag.", "Bonjour"),
    ("week-days", "A week has 7 days.", "A week has 17 days."),
    ("blue-yellow", "You get green.", "You get purple."),
    ("gold-symbol", "Gold's symbol is Au.", "Gold's symbol is Ag, or gold."),
    ("largest-ocean", "The Pacific Ocean.", "The Atlantic Ocean."),
    ("opposite-hot", "Cold.", "Warm."),
]


@pytest.mark.parametrize(("qid", "hit", "miss"), CASES)
def test_keywords(qid: str, hit: str, miss: str) -> None:
    question = QUESTIONS[qid]
    assert question.score(hit)
    assert question.score(hit.upper())  # case-insensitive
    assert not question.score(miss)


def test_twenty_questions_all_scored() -> None:
    assert len(fa.QUESTIONS) == 20 and len(QUESTIONS) == 20
    assert {q.kind for q in fa.QUESTIONS} == {"fact", "arithmetic", "translation", "poem", "other"}
    assert all(q.keywords or q.check for q in fa.QUESTIONS)


def test_haiku_three_lines() -> None:
    haiku = QUESTIONS["haiku-sea"]
    assert haiku.score("Waves fold into foam\nsalt wind carries gull voices\nthe tide keeps its time")
    intro = "Here is a haiku about the sea:\n\n**Tide**\n\nWaves fold into foam\nsalt wind\nthe tide\n\nEnjoy!"
    assert haiku.score(intro)  # the introduction and the bold title are not lines of the poem
    assert haiku.score("Sure! Here's one:\nWaves fold into foam\nsalt wind\nthe tide")
    assert not haiku.score("In twilight's caress,\nA moon's love,\nThe sea's a lover's delight,\nA simple way.")
    assert not haiku.score("The sea is calm and blue, a haiku in one line.")


def test_poem_about_a_cat() -> None:
    poem = QUESTIONS["poem-cat"]
    assert poem.score("A cat on the sill\nwatches the rain")
    assert not poem.score("A cat on the sill watches the rain.")  # one line: not a poem
    assert poem.score("Whiskers, soft and warm,\nOn a sunny day I roam.")  # a cat's words count
    assert not poem.score("The dog on the sill\nwatches the rain")
    assert not poem.score("Concatenate the lines\nof the category")  # "cat" as a word only


def test_table() -> None:
    answers = [fa.Answer(seed, "Paris", seed != 2, "stop", 3, 0.5) for seed in (1, 2, 3)]
    result = fa.ModelResult(
        "m", "/m.gguf", True, 1.5, 0.5, [fa.QuestionResult("capital-france", "fact", "Q?", answers)]
    )
    assert (result.hits, result.total, round(result.percent)) == (2, 3, 67)
    table = fa.format_table(result)
    assert "| Q? | fact | 2/3 |" in table and "**2/3 = 67 %**" in table
    data = result.to_json()
    assert data["questions"][0]["hits"] == 2 and data["percent"] == 66.7


def test_rescore() -> None:
    """An --out file's answers scored again with the current questions (its hits are not trusted)."""
    answers = [{"seed": 1, "text": "Paris.", "hit": False, "finish_reason": "stop", "tokens": 2, "seconds": 0.1}]
    answers.append({**answers[0], "seed": 2, "text": "Lyon.", "hit": True})
    questions = [{"id": "capital-france", "kind": "fact", "question": "Q?", "answers": answers, "hits": 1}]
    data = [{"model": "m", "path": "/m.gguf", "chat_template": True, "load_s": 1.0, "first_answer_s": 0.1}]
    data[0]["questions"] = questions
    (result,) = fa.rescore(data)
    assert [a.hit for a in result.questions[0].answers] == [True, False]
    assert result.to_json()["questions"][0]["answers"][0]["text"] == "Paris."
