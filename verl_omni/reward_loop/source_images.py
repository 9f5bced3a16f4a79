"""Source images of a sample (the images an edit starts from), for scorers that compare with them.

Where they are found, per sample:

* by default, the image parts of the prompt's last user turn, as verl's multimodal dataset writes
  them into ``raw_prompt``: ``{"type": "image", "image": <PIL image | path>}`` (``bytes`` dicts too);
* with ``reward.diffusion.source_images_key`` set, ``non_tensor_batch[<key>]``: a list of images, or
  verl's ``multi_modal_data`` dict holding them under ``image`` / ``images``.

An image may be a PIL image, encoded bytes, a file path, a ``{"bytes" | "path" | "image": ...}``
dict, a uint8 tensor ``[3, H, W]`` or a uint8 array ``[H, W, 3]``; each becomes uint8 ``[3, H, W]``.
Anything else, or a file that cannot be read, is an error naming the row and the file.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

logger = logging.getLogger(__name__)


def image_tensor(value: Any, where: str) -> torch.Tensor:
    """uint8 ``[3, H, W]`` from one image value (forms in the module docstring); ``where`` names it in errors."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.uint8 or value.ndim != 3 or value.shape[0] != 3:
            raise ValueError(f"{where}: a tensor image must be uint8 [3, H, W], got {value.dtype} {tuple(value.shape)}")
        return value.cpu()
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim != 3 or value.shape[2] != 3:
            raise ValueError(f"{where}: an array image must be uint8 [H, W, 3], got {value.dtype} {value.shape}")
        return torch.from_numpy(np.ascontiguousarray(value)).permute(2, 0, 1).contiguous()
    if isinstance(value, Image.Image):
        return torch.from_numpy(np.array(value.convert("RGB"))).permute(2, 0, 1).contiguous()
    if isinstance(value, Mapping):
        for field in ("image", "bytes", "path"):
            if value.get(field) is not None:
                return image_tensor(value[field], where)
        raise ValueError(f"{where}: an image dict needs 'image', 'bytes' or 'path', got keys {sorted(value)}")
    if isinstance(value, bytes | str | os.PathLike):
        return image_tensor(_open(value, where), where)
    raise ValueError(f"{where}: not an image (PIL image, bytes, path, dict or uint8 tensor/array): {value!r:.100}")


def _open(value: bytes | str | os.PathLike, where: str) -> Image.Image:
    source = io.BytesIO(value) if isinstance(value, bytes) else os.fspath(value)
    name = "<bytes>" if isinstance(value, bytes) else source
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except (OSError, UnidentifiedImageError) as e:
        raise ValueError(f"{where}: cannot read the image {name}: {e}") from e


def prompt_images(prompt: Any, where: str) -> list[torch.Tensor]:
    """The image parts of the last user turn of chat messages (none for a plain-text prompt)."""
    if isinstance(prompt, str):
        return []
    for message in reversed(list(prompt)):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return []
            parts = [p for p in content if isinstance(p, Mapping) and p.get("type") == "image"]
            return [image_tensor(p, f"{where} image part {j}") for j, p in enumerate(parts)]
    return []


def listed_images(value: Any, where: str) -> list[torch.Tensor]:
    """The images of a ``source_images_key`` entry: a list, or a dict with ``image`` / ``images``, or None."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        value = value.get("images", value.get("image")) or []
    if not isinstance(value, list | tuple | np.ndarray):
        value = [value]
    return [image_tensor(v, f"{where}[{j}]") for j, v in enumerate(value)]
