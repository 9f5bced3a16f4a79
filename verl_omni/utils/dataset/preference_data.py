"""Offline preference sets for Diffusion-DPO: a prompt with a chosen and a rejected image per row.

A row is a text-to-image row (:func:`~verl_omni.utils.dataset.t2i_prompts.prompt_row`) plus two image
references, :data:`CHOSEN_KEY` and :data:`REJECTED_KEY`, each ``{"image": "<path>"}`` (a file the trainer's
machine reads) or ``{"bytes": <encoded image>}`` (PNG/JPEG bytes inside the parquet), the form the editing
sets use for their source images.

Rows come from a folder of pairs (:func:`pair_folder_rows`), one sub-folder per pair::

    pairs/
      0001/  prompt.txt  chosen.png  rejected.png
      0002/  prompt.txt  chosen.jpg  rejected.webp

``prompt.txt`` holds the prompt (its stripped text); each image may have any suffix of
:data:`~verl_omni.utils.dataset.edit_prompts.IMAGE_SUFFIXES`. A missing or unreadable image is an error
naming the file, the row and the column (:func:`check_preference_images`), so a set can be checked before a
run starts.
"""

from __future__ import annotations

from pathlib import Path

from verl_omni.utils.dataset.edit_prompts import IMAGE_SUFFIXES, image_ref, load_source_image
from verl_omni.utils.dataset.t2i_prompts import prompt_row

# the columns of a row's two images
CHOSEN_KEY = "chosen"
REJECTED_KEY = "rejected"
PROMPT_FILE = "prompt.txt"


def preference_row(prompt: str, chosen: dict, rejected: dict, index: int, split: str, data_source: str) -> dict:
    """One parquet row: the prompt and the references of its chosen and rejected image."""
    return {**prompt_row(prompt, None, index, split, data_source), CHOSEN_KEY: chosen, REJECTED_KEY: rejected}


def _pair_image(pair: Path, stem: str) -> Path:
    found = sorted(p for p in pair.iterdir() if p.stem == stem and p.suffix.lower() in IMAGE_SUFFIXES)
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({[p.name for p in found]})"
        raise ValueError(f"{pair} has {what} {stem} image; a pair folder holds one {stem}.<{'|'.join(IMAGE_SUFFIXES)}>")
    return found[0]


def pair_folder_rows(
    folder: str | Path, split: str, embed: bool = False, data_source: str = "preference"
) -> list[dict]:
    """A row per sub-folder of ``folder`` (sorted by name) holding ``prompt.txt``, ``chosen.*`` and ``rejected.*``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of preference pairs")
    rows = []
    for pair in sorted(p for p in folder.iterdir() if p.is_dir()):
        prompt_file = pair / PROMPT_FILE
        if not prompt_file.is_file():
            raise ValueError(f"{pair} has no {PROMPT_FILE} (the pair's prompt)")
        prompt = prompt_file.read_text().strip()
        if not prompt:
            raise ValueError(f"{prompt_file} is empty")
        chosen, rejected = (image_ref(_pair_image(pair, stem), embed) for stem in (CHOSEN_KEY, REJECTED_KEY))
        rows.append(preference_row(prompt, chosen, rejected, len(rows), split, data_source))
    if not rows:
        raise ValueError(f"{folder} holds no pair folder (<pair>/{PROMPT_FILE}, chosen.*, rejected.*)")
    return rows


def check_preference_images(file: str | Path) -> int:
    """Open the chosen and rejected image of every row of a preference parquet; returns how many rows. Errors
    name the file, the row and the column (and the image file for a path)."""
    import pyarrow.parquet as pq

    table = pq.read_table(file)
    missing = [key for key in (CHOSEN_KEY, REJECTED_KEY) if key not in table.column_names]
    if missing:
        raise ValueError(f"{file} lacks the column(s) {missing}: a preference row holds prompt, chosen and rejected")
    for column in (CHOSEN_KEY, REJECTED_KEY):
        for row, ref in enumerate(table.column(column).to_pylist()):
            load_source_image(ref, f"{file} row {row} ({column})")
    return table.num_rows
