"""Image-editing prompt sets: an instruction and its source image(s) per row, in verl's multimodal form.

A row is a text-to-image row (:func:`~verl_omni.utils.dataset.t2i_prompts.prompt_row`: ``prompt`` holds the
instruction as the user turn) plus the source images under verl's ``data.image_key`` column
(:data:`SOURCE_IMAGES_KEY`, ``images``): a list of ``{"image": "<path>"}`` (a file the trainer's machine
reads) or ``{"bytes": <encoded image>}`` (PNG/JPEG bytes inside the parquet), as verl's ``RLHFDataset``
rows carry them. verl expands ``<image>`` placeholders through a VLM processor; an editing model encodes
its source images itself, so the images travel as references to the rollout, which decodes them
(:func:`load_source_image`) and sends them once per request.

Rows come from a folder of images with their instructions (:func:`folder_rows`: ``cat.png`` and
``cat.txt``, one instruction per line, each a row) or the tiny built-in set (:func:`tiny_edit_rows`).
A missing or unreadable image is an error naming the file, the row and the image
(:func:`check_source_images`, run by the preflight before Ray starts).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verl_omni.utils.dataset.t2i_prompts import TINY_COLORS, TINY_THINGS, prompt_row

logger = logging.getLogger(__name__)

# verl's data.image_key default: the column of a row's source images
SOURCE_IMAGES_KEY = "images"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def edit_row(instruction: str, images: list[dict], index: int, split: str, data_source: str) -> dict:
    """One parquet row: the instruction as the prompt, ``images`` as verl's image references."""
    return {**prompt_row(instruction, None, index, split, data_source), SOURCE_IMAGES_KEY: images}


def image_ref(path: Path, embed: bool) -> dict:
    """verl's reference to one image: ``{"bytes": ...}`` (the file's bytes) or ``{"image": "<absolute path>"}``."""
    return {"bytes": path.read_bytes()} if embed else {"image": str(path.resolve())}


def folder_rows(folder: str | Path, split: str, embed: bool = False, data_source: str = "edit") -> list[dict]:
    """A row per instruction line of each ``<name>.txt`` beside an image ``<name>.<png|jpg|...>`` in ``folder``."""
    folder = Path(folder)
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    rows = []
    for image in images:
        text = image.with_suffix(".txt")
        if not text.is_file():
            raise FileNotFoundError(f"{image} has no instruction file {text.name} (one instruction per line)")
        for line in text.read_text().splitlines():
            if line.strip():
                rows.append(edit_row(line.strip(), [image_ref(image, embed)], len(rows), split, data_source))
    if not rows:
        raise ValueError(f"{folder} holds no image with instructions ({'/'.join(IMAGE_SUFFIXES)} + .txt)")
    return rows


def tiny_edit_rows(split: str, size: int = 32) -> list[dict]:
    """The tiny built-in editing set: a solid-colour image per thing (PNG bytes), instructions in the tiny
    tokenizer's words; ``val`` edits towards the first colour, ``train`` towards the others."""
    from PIL import Image

    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    colors = TINY_COLORS[:1] if split == "val" else TINY_COLORS[1:]
    rows = []
    for i, thing in enumerate(TINY_THINGS):
        buffer = io.BytesIO()
        Image.new("RGB", (size, size), (25 * i, 255 - 25 * i, 128)).save(buffer, format="PNG")
        for color in colors:
            rows.append(edit_row(f"a {color} {thing}", [{"bytes": buffer.getvalue()}], len(rows), split, "tiny_edit"))
    return rows


def load_source_image(ref: Any, where: str):
    """One image reference of a row (``{"bytes"}``, ``{"image": path}``, a path, bytes or a PIL image) as an RGB
    PIL image, fully read; ``where`` names the row in the error."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    if isinstance(ref, dict):
        ref = ref.get("bytes") if ref.get("bytes") is not None else ref.get("image")
    if isinstance(ref, str) and ref.startswith("file://"):
        ref = ref[len("file://") :]
    try:
        if isinstance(ref, (bytes, bytearray)):
            image = Image.open(io.BytesIO(ref))
        elif isinstance(ref, (str, Path)):
            image = Image.open(Path(ref).expanduser())
        else:
            raise ValueError(f"{where}: an image reference is {{'image': path}} or {{'bytes': ...}}, got {ref!r:.80}")
        image.load()
    except FileNotFoundError as e:
        raise ValueError(f"{where}: source image {ref} does not exist") from e
    except (UnidentifiedImageError, OSError) as e:
        name = ref if isinstance(ref, (str, Path)) else f"{len(ref)} bytes"
        raise ValueError(f"{where}: source image {name} is not a readable image ({e})") from e
    return image.convert("RGB")


def load_row_images(refs: Iterable[Any] | None, where: str) -> list:
    """Every image of a row's ``images`` field (None or empty: none)."""
    return [load_source_image(ref, f"{where}, image {i}") for i, ref in enumerate(refs if refs is not None else ())]


def check_source_images(file: str | Path, column: str = SOURCE_IMAGES_KEY, max_images: int | None = None) -> int:
    """Open every source image of a parquet file's ``column``; returns how many. Errors name the file, the row
    (``extra_info.index`` when present) and the image; a row without images or with more than ``max_images``."""
    import pyarrow.parquet as pq

    table = pq.read_table(file, columns=[column])
    count = 0
    for row, refs in enumerate(table.column(column).to_pylist()):
        where = f"{file} row {row} ({column})"
        if not refs or (max_images is not None and len(refs) > max_images):
            allowed = f"1 to {max_images}" if max_images else "at least 1"
            raise ValueError(f"{where}: has {len(refs or [])} source images, the model edits {allowed}")
        count += len(load_row_images(refs, where))
    return count
