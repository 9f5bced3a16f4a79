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
run starts. A run reads the files as :class:`PreferencePairs` (``data.preference_files``: offline Diffusion-DPO).
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


def _read_table(file: str | Path, prompt_key: str | None = None):
    """The parquet table of a preference file, after checking its image (and, given, prompt) columns."""
    import pyarrow.parquet as pq

    table = pq.read_table(file)
    wanted = ([prompt_key] if prompt_key else []) + [CHOSEN_KEY, REJECTED_KEY]
    missing = [key for key in wanted if key not in table.column_names]
    if missing:
        raise ValueError(f"{file} lacks the column(s) {missing}: a preference row holds prompt, chosen and rejected")
    return table


def check_preference_images(file: str | Path) -> int:
    """Open the chosen and rejected image of every row of a preference parquet; returns how many rows. Errors
    name the file, the row and the column (and the image file for a path)."""
    table = _read_table(file)
    for column in (CHOSEN_KEY, REJECTED_KEY):
        for row, ref in enumerate(table.column(column).to_pylist()):
            load_source_image(ref, f"{file} row {row} ({column})")
    return table.num_rows


def prompt_text(prompt, where: str) -> str:
    """The text of a row's prompt: a string, or chat messages (:func:`prompt_row`'s form) whose last one is read."""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], dict):
        text = prompt[-1].get("content")
    else:
        text = None
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: the prompt is a text or chat messages [{{'role', 'content'}}], got {prompt!r:.80}")
    return text


class PreferencePairs:
    """The rows of one or more preference parquets, each ``{"prompt": text, "chosen": ref, "rejected": ref}``
    (the image references as stored; :func:`load_pair` opens them). A map-style dataset: a dataloader batches it.
    """

    def __init__(self, files: str | Path | list, prompt_key: str = "prompt"):
        self.rows: list[dict] = []
        for file in [files] if isinstance(files, (str, Path)) else list(files):
            table = _read_table(file, prompt_key)
            columns = {key: table.column(key).to_pylist() for key in (prompt_key, CHOSEN_KEY, REJECTED_KEY)}
            for row in range(table.num_rows):
                where = f"{file} row {row}"
                self.rows.append(
                    {
                        "prompt": prompt_text(columns[prompt_key][row], where),
                        CHOSEN_KEY: columns[CHOSEN_KEY][row],
                        REJECTED_KEY: columns[REJECTED_KEY][row],
                        "where": where,
                    }
                )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


def load_pair(row: dict) -> tuple:
    """The (chosen, rejected) RGB PIL images of a :class:`PreferencePairs` row; errors name its file and row."""
    return tuple(load_source_image(row[key], f"{row['where']} ({key})") for key in (CHOSEN_KEY, REJECTED_KEY))
