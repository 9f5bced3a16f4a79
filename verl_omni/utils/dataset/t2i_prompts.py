"""Text-to-image prompt sets as parquet rows in verl's ``RLHFDataset`` form.

A row: ``data_source`` (str), ``prompt`` (chat messages: one user turn holding the image prompt),
``reward_model`` (``{"style": "rule", "ground_truth": str | None}``: the OCR target text, or None)
and ``extra_info`` (``{"index": int, "split": str}``). ``RLHFDataset`` turns ``prompt`` into
``raw_prompt``; the reward reads ``reward_model.ground_truth``.

Two sets: an OCR set (a prompt that quotes the text to render; the quoted text is the ground
truth) and a tiny built-in set whose words the tiny models' tokenizer knows.
"""

from __future__ import annotations

import itertools
import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)

OCR_TEMPLATES = (
    'a photo of a street sign that says "{text}"',
    'a poster on a wall with the words "{text}" written in large letters',
    'a book cover with the title "{text}"',
    'a coffee cup with "{text}" printed on it',
    'a neon sign in a dark window that reads "{text}"',
)
OCR_WORDS = (
    "OPEN CLOSED EXIT STOP HELLO WELCOME SALE COFFEE BOOKS GARDEN RIVER MOON STAR CITY NIGHT "
    "BAKERY MUSEUM PARK HOTEL LIBRARY STATION MARKET CINEMA SCHOOL HARBOR"
).split()

# words of the tiny tokenizer's corpus (verl_omni/utils/tiny_models/tokenizer.py), so prompts tokenize
# to short, different lengths
TINY_COLORS = ("red", "green", "blue", "yellow", "black", "white", "orange", "purple")
TINY_THINGS = ("cat", "dog", "bird", "tree", "house", "car", "boat", "flower", "moon", "castle")
TINY_TEMPLATES = (
    "a {c} {t}",
    "a photo of a {c} {t} near a river",
    "a small {c} {t} on a beach at night under the moon",
)


def prompt_row(prompt: str, ground_truth: str | None, index: int, split: str, data_source: str) -> dict:
    """One parquet row (see the module docstring)."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split},
    }


def ocr_rows(num: int, split: str, seed: int = 0, max_words: int = 2) -> list[dict]:
    """``num`` OCR prompts: a template quoting 1..``max_words`` words; the quoted text is the ground truth."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(num):
        text = " ".join(rng.choice(OCR_WORDS) for _ in range(rng.randint(1, max_words)))
        rows.append(prompt_row(rng.choice(OCR_TEMPLATES).format(text=text), text, index, split, "ocr"))
    return rows


def tiny_rows(split: str) -> list[dict]:
    """The built-in tiny set: colour × thing × three templates of different token lengths.

    ``train`` holds every combination but those of the first colour, which form ``val``.
    """
    combos = list(itertools.product(TINY_COLORS, TINY_THINGS, TINY_TEMPLATES))
    if split == "val":
        combos = [c for c in combos if c[0] == TINY_COLORS[0]][:: len(TINY_TEMPLATES)]
    elif split == "train":
        combos = [c for c in combos if c[0] != TINY_COLORS[0]]
    else:
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return [prompt_row(tpl.format(c=c, t=t), None, i, split, "tiny_t2i") for i, (c, t, tpl) in enumerate(combos)]


def write_parquet(rows: list[dict], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` (parent directories created); returns the path."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    logger.info("wrote %d prompts to %s", len(rows), path)
    return path


def ensure_tiny_prompts(directory: str | Path) -> tuple[Path, Path]:
    """``(train.parquet, val.parquet)`` of the built-in set under ``directory``, written once."""
    directory = Path(directory)
    paths = []
    for split in ("train", "val"):
        path = directory / f"{split}.parquet"
        if not path.is_file():
            write_parquet(tiny_rows(split), path)
        paths.append(path)
    return paths[0], paths[1]
