"""Regenerate data/input.txt: a seeded, English-like corpus with structure a tiny char model learns fast.

The corpus ships in the repo so that nodes need no network; this script only documents how it was made
and lets anyone rebuild it byte for byte (`python make_corpus.py`). Output depends only on SEED and the
word lists below (Python's `random.Random` is stable across versions for seeded choice/randint).
"""

from __future__ import annotations

import random
from pathlib import Path

SEED = 1337
TARGET_BYTES = 200_000
OUT = Path(__file__).resolve().parent / "data" / "input.txt"

NAMES = ["Anna", "Tom", "Mara", "Elias", "Rosa", "Hugo", "Clara", "Peter", "Lena", "Oskar"]
ADJ = ["old", "young", "quiet", "tall", "small", "bright", "tired", "kind", "grey", "clever", "brave", "poor"]
NOUN = ["miller", "baker", "farmer", "sailor", "teacher", "child", "doctor", "shepherd", "weaver", "smith"]
ANIMAL = ["dog", "horse", "cat", "goose", "fox", "cow", "crow", "lamb"]
PLACE = [
    "the river",
    "the mill",
    "the market",
    "the church",
    "the forest",
    "the harbour",
    "the hill",
    "the inn",
]
THING = ["a letter", "the bread", "a lantern", "the key", "a basket", "the boat", "a coat", "the bell"]
VERB_TO = ["walked", "ran", "went", "hurried", "came back", "wandered", "rode"]
VERB_OBJ = ["found", "carried", "lost", "mended", "sold", "opened", "painted", "hid"]
ADV = ["slowly", "quickly", "early", "late", "alone", "together", "at last", "once more"]
TIME = [
    "In the morning",
    "At noon",
    "That evening",
    "Before dawn",
    "After the rain",
    "On Sunday",
    "In winter",
]
WEATHER = [
    "The wind was cold",
    "The sky was clear",
    "It was raining",
    "The snow lay deep",
    "The sun was warm",
]
FEEL = ["glad", "afraid", "tired", "hungry", "happy", "sorry", "sure"]
SAY = ["said", "asked", "cried", "answered", "whispered"]


def person(rng: random.Random) -> str:
    """A subject: a name or 'the <adjective> <noun>'."""
    if rng.random() < 0.4:
        return rng.choice(NAMES)
    return f"the {rng.choice(ADJ)} {rng.choice(NOUN)}"


def sentence(rng: random.Random) -> str:
    """One declarative sentence from a handful of templates."""
    who = person(rng)
    kind = rng.randint(0, 6)
    if kind == 0:
        s = f"{who} {rng.choice(VERB_TO)} {rng.choice(ADV)} to {rng.choice(PLACE)}"
    elif kind == 1:
        s = f"{who} {rng.choice(VERB_OBJ)} {rng.choice(THING)} near {rng.choice(PLACE)}"
    elif kind == 2:
        s = f"{rng.choice(TIME)}, {who} {rng.choice(VERB_TO)} to {rng.choice(PLACE)}"
    elif kind == 3:
        s = f"{rng.choice(WEATHER)}, and {who} was {rng.choice(FEEL)}"
    elif kind == 4:
        s = f"{who} saw a {rng.choice(ADJ)} {rng.choice(ANIMAL)} by {rng.choice(PLACE)}"
    elif kind == 5:
        s = f"{who} and {person(rng)} {rng.choice(VERB_OBJ)} {rng.choice(THING)} {rng.choice(ADV)}"
    else:
        s = f"{rng.choice(TIME)}, {who} was {rng.choice(FEEL)} and {rng.choice(VERB_TO)} home"
    return s[0].upper() + s[1:] + "."


def dialogue(rng: random.Random) -> str:
    """A quoted line: '"Where is the key?" asked Anna.' or '"I am glad today," said Tom.'"""
    what = rng.choice(
        [
            f"Where is {rng.choice(THING)}?",
            f"I am {rng.choice(FEEL)} today.",
            f"Come with me to {rng.choice(PLACE)}.",
            f"Have you seen the {rng.choice(ANIMAL)}?",
        ]
    )
    if what.endswith("."):
        what = what[:-1] + ","
    return f'"{what}" {rng.choice(SAY)} {rng.choice(NAMES)}.'


def paragraph(rng: random.Random) -> str:
    """Three to six sentences, sometimes with a line of dialogue."""
    parts = [sentence(rng) for _ in range(rng.randint(3, 6))]
    if rng.random() < 0.5:
        parts.insert(rng.randint(1, len(parts)), dialogue(rng))
    return " ".join(parts)


def corpus(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    """Chapters of paragraphs until the text reaches target_bytes."""
    rng = random.Random(seed)
    chunks: list[str] = []
    size, chapter = 0, 0
    while size < target_bytes:
        chapter += 1
        chunks.append(f"CHAPTER {chapter}\n")
        for _ in range(rng.randint(4, 9)):
            chunks.append(paragraph(rng) + "\n")
        chunks.append("\n")
        size = sum(len(c) for c in chunks)
    return "".join(chunks)


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(corpus(), encoding="utf-8")
    print(f"wrote {OUT.stat().st_size} bytes to {OUT}")
