"""Seeded GSM8K-format arithmetic word problems whose answer needs numbers retrieved from a long, distracting prompt.

One problem (all numbers small integers, every intermediate value in ``[0, MAX_VALUE]``)::

    question: "Tom has 7 apples. The bus leaves at 9. Anna has 4 apples. Tom buys 5 more apples. Anna loses 2 apples.
               It is a sunny day. Tom gives away 3 apples. How many apples does Tom have now?"
    answer:   "Tom has 7 apples.\nTom buys 5 more apples, so 7 + 5 = 12.\nTom gives away 3 apples, so 12 - 3 = 9.\n#### 9"

The protagonist's start fact and 1-3 steps (``+ b``, ``- b``, ``* 2``) appear in order, interleaved with distractor
sentences: other people's facts and steps on the same or another item, the protagonist's facts about another item,
and number-bearing or number-free filler. Prompts run to ~60-110 tokens, past ``index_topk`` = 32, so a query of the
worked answer sees only a third of the prompt and the lightning indexer must select the sentences it copies from.
The answer follows GSM8K's convention (worked lines, then ``#### N``), so lm-eval's ``gsm8k`` filters apply unchanged:
``strict-match`` reads ``#### N``, ``flexible-extract`` the last number.

Splits are independent seeded streams (train seed 0, test seed 1 by default); :func:`write_gsm8k_dir` writes
``train.jsonl`` / ``test.jsonl`` with GSM8K's fields ``question`` and ``answer``, the directory layout
``harness.run.gsm8k_data.check_data_dir`` accepts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

MAX_VALUE = 20
TRAIN_SEED, TEST_SEED = 0, 1
"""The splits' problem streams: training (and lm-eval's few-shot pool) draws seed 0, the test split seed 1."""
NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Emma", "Jack", "Lucy", "Omar", "Nina",
         "Ravi", "Kate")
ITEMS = ("apples", "pears", "books", "coins", "cards", "shells", "pens", "stamps")
ADD_VERBS = ("buys {b} more", "finds {b} more", "gets {b} more", "picks {b} more")
SUB_VERBS = ("gives away {b}", "loses {b}", "sells {b}", "uses {b}")
FILLERS = ("It is a sunny day.", "The shop is busy.", "The sky is blue.", "Everyone is happy.", "The park is quiet.",
           "The road is long.", "It rains a little.", "The door is open.")
NUMBER_FILLERS = ("The bus leaves at {n}.", "The shop opens at {n}.", "The class has {n} desks.",
                  "It is {n} degrees outside.", "The train has {n} cars.", "The house has {n} windows.")


@dataclass(frozen=True)
class Problem:
    """One generated problem: GSM8K's ``question`` and ``answer`` text and the integer ``target``."""

    question: str
    answer: str
    target: int

    def as_gsm8k(self) -> dict[str, str]:
        return {"question": self.question, "answer": self.answer}


def _step(rng: random.Random, value: int) -> tuple[str, str, int]:
    """A random feasible step from ``value``: ``(verb phrase, op symbol, operand)`` keeping the result in range."""
    ops = []
    if value + 1 <= MAX_VALUE:
        ops.append("+")
    if value >= 1:
        ops.append("-")
    if 1 <= value <= MAX_VALUE // 2:
        ops.append("*")
    op = rng.choice(ops)
    if op == "+":
        b = rng.randint(1, min(9, MAX_VALUE - value))
        return rng.choice(ADD_VERBS).format(b=b), "+", b
    if op == "-":
        b = rng.randint(1, min(9, value))
        return rng.choice(SUB_VERBS).format(b=b), "-", b
    return "doubles the", "*", 2


def _apply(value: int, op: str, operand: int) -> int:
    return value + operand if op == "+" else value - operand if op == "-" else value * operand


def _event(name: str, phrase: str, op: str, item: str) -> str:
    return f"{name} doubles the {item}." if op == "*" else f"{name} {phrase} {item}."


def make_problem(rng: random.Random, *, min_steps: int = 1, max_steps: int = 3, min_distractors: int = 4,
                 max_distractors: int = 8) -> Problem:
    """Draw one problem from ``rng`` (see module docstring). Raises ValueError on an empty range."""
    if not 1 <= min_steps <= max_steps or not 0 <= min_distractors <= max_distractors:
        raise ValueError("make_problem: need 1 <= min_steps <= max_steps and 0 <= min_distractors <= max_distractors")
    name, *others = rng.sample(NAMES, 3)
    item, other_item = rng.sample(ITEMS, 2)
    value = rng.randint(1, 9)
    story = [f"{name} has {value} {item}."]
    answer = [story[0]]
    for _ in range(rng.randint(min_steps, max_steps)):
        phrase, op, operand = _step(rng, value)
        new = _apply(value, op, operand)
        sentence = _event(name, phrase, op, item)
        story.append(sentence)
        answer.append(f"{sentence[:-1]}, so {value} {op} {operand} = {new}.")
        value = new
    distractors = [_distractor(rng, name, others, item, other_item)
                   for _ in range(rng.randint(min_distractors, max_distractors))]
    # merge: the story keeps its order, distractors land at random places between (and around) its sentences
    slots = sorted(rng.randint(0, len(story)) for _ in distractors)
    sentences: list[str] = []
    d = 0
    for i, sentence in enumerate(story + [""]):
        while d < len(distractors) and slots[d] == i:
            sentences.append(distractors[d])
            d += 1
        if sentence:
            sentences.append(sentence)
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    return Problem(question=question, answer="\n".join(answer) + f"\n#### {value}", target=value)


def _distractor(rng: random.Random, name: str, others: list[str], item: str, other_item: str) -> str:
    kind = rng.randrange(5)
    if kind == 0:  # another person, same item
        return f"{rng.choice(others)} has {rng.randint(1, 9)} {item}."
    if kind == 1:  # another person's step, same or other item
        phrase, op, _ = _step(rng, rng.randint(2, 9))
        return _event(rng.choice(others), phrase, op, rng.choice((item, other_item)))
    if kind == 2:  # the protagonist, another item
        return f"{name} has {rng.randint(1, 9)} {other_item}."
    if kind == 3:
        return rng.choice(NUMBER_FILLERS).format(n=rng.randint(2, 20))
    return rng.choice(FILLERS)


def generate(n: int, seed: int, **kwargs) -> list[Problem]:
    """``n`` problems from the stream of ``seed`` (the same seed always gives the same list)."""
    rng = random.Random(seed)
    return [make_problem(rng, **kwargs) for _ in range(n)]


def write_gsm8k_dir(out: str | Path, *, n_train: int = 64, n_test: int = 256, train_seed: int = TRAIN_SEED,
                    test_seed: int = TEST_SEED) -> Path:
    """Write ``out/train.jsonl`` and ``out/test.jsonl`` (GSM8K records) and return ``out``.

    The train split here only serves lm-eval's few-shot sampler; training draws its own stream (``train_seed``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, train_seed), ("test", n_test, test_seed)):
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            for p in generate(n, seed):
                fh.write(json.dumps(p.as_gsm8k()) + "\n")
    return out


def prompt_text(question: str) -> str:
    """lm-eval ``gsm8k`` 0-shot prompt (``doc_to_text``: ``"Question: {{question}}\\nAnswer:"``)."""
    return f"Question: {question}\nAnswer:"


def completion_text(answer: str) -> str:
    """What the model should generate after :func:`prompt_text`: lm-eval's target delimiter (a space), the answer."""
    return " " + answer
