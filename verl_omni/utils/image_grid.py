"""Image grids: many uint8 ``[3, H, W]`` images (or ``[F, 3, H, W]`` videos, frames side by side) in one picture,
for logs and checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def make_grid(images: torch.Tensor, per_row: int) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` → uint8 ``[3, rows·H, per_row·W]``, row-major, black where the last row is short.
    Videos ``[B, F, 3, H, W]`` are laid out as ``[B, 3, H, F·W]`` strips (their frames left to right) first."""
    if images.ndim == 5:
        images = images.permute(0, 2, 3, 1, 4).flatten(3)
    if images.ndim != 4 or images.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 [B, 3, H, W], got {images.dtype} {tuple(images.shape)}")
    b, c, h, w = images.shape
    per_row = max(1, min(per_row, b))
    rows = (b + per_row - 1) // per_row
    grid = torch.zeros(c, rows * h, per_row * w, dtype=torch.uint8)
    for i, img in enumerate(images):
        r, col = divmod(i, per_row)
        grid[:, r * h : (r + 1) * h, col * w : (col + 1) * w] = img
    return grid


def save_grid(images: torch.Tensor, per_row: int, path: str | Path) -> torch.Tensor:
    """Write the grid of ``images`` as a PNG at ``path`` (parents created); returns the grid."""
    from PIL import Image

    grid = make_grid(images, per_row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid.permute(1, 2, 0).numpy()).save(path)
    return grid
