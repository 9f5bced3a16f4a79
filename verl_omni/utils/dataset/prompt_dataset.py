"""verl's ``RLHFDataset`` for diffusion prompts: a row's source images pass through to the rollout as references.

verl expands a row's ``<image>`` placeholders with the images of ``data.image_key`` through a VLM
processor and drops the column; a diffusion model has no such processor (``processor=None``), and an
editing model encodes its source images itself. So the column is kept as it is in the row (under
the same name, read by the agent loop, :func:`row_image_key`) and the prompt messages stay text. A
text-to-image row, without the column, is what ``RLHFDataset`` gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from verl.utils.dataset.rl_dataset import RLHFDataset, get_dataset_class

# verl's default of data.image_key
DEFAULT_IMAGE_KEY = "images"


def row_image_key(config) -> str:
    """The row field holding the source images: the trainer ``config``'s ``data.image_key`` (verl's default
    ``images``; also when the config has no ``data`` node, as the standalone rollout's)."""
    data = config.get("data", None) if config is not None else None
    key = data.get("image_key", None) if data else None
    return str(key or DEFAULT_IMAGE_KEY)


def prompt_text(value: Any, key: str) -> str:
    """The prompt string from a ``non_tensor_batch`` entry: a string or chat messages (last user turn)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | np.ndarray):
        for message in reversed(list(value)):
            if isinstance(message, Mapping) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list | tuple | np.ndarray):
                    return " ".join(p["text"] for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    raise ValueError(f"non_tensor_batch[{key!r}] must hold a prompt string or chat messages, got {value!r:.200}")


class DiffusionPromptDataset(RLHFDataset):
    """``RLHFDataset`` whose rows keep their source images (``data.image_key``) when there is no processor."""

    def _build_messages(self, example: dict, key: str):
        if self.processor is None:
            # no VLM processor: the rollout model encodes the images itself, the messages stay text
            return example[key]
        return super()._build_messages(example, key)

    def __getitem__(self, item):
        images = self.dataframe[item].get(self.image_key)
        row = super().__getitem__(item)
        if images is not None and self.processor is None:
            row[self.image_key] = images
        return row


def create_prompt_dataset(data_paths, data_config, tokenizer, is_train: bool = True):
    """The dataset of ``data_paths``: ``data.custom_cls`` when set (verl's rule), else :class:`DiffusionPromptDataset`."""
    cls = get_dataset_class(data_config)
    if cls is RLHFDataset:
        cls = DiffusionPromptDataset
    return cls(data_files=data_paths, tokenizer=tokenizer, processor=None, config=data_config)
