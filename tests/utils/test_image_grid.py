"""Validation grids: images tile row-major; a video's frames lie side by side in its cell."""

import torch

from verl_omni.utils.image_grid import make_grid, save_grid


def test_images_tile_row_major_and_videos_show_their_frames_left_to_right(tmp_path):
    images = torch.arange(3, dtype=torch.uint8).view(3, 1, 1, 1).expand(3, 3, 2, 4).contiguous()
    grid = make_grid(images, per_row=2)
    assert grid.shape == (3, 4, 8) and int(grid[0, 2, 4]) == 0 and int(grid[0, 2, 0]) == 2
    # 2 videos of 3 frames: frame f of video b holds 10·b + f
    videos = (10 * torch.arange(2).view(2, 1) + torch.arange(3).view(1, 3)).to(torch.uint8)
    videos = videos.view(2, 3, 1, 1, 1).expand(2, 3, 3, 2, 4).contiguous()
    grid = save_grid(videos, per_row=1, path=tmp_path / "grid.png")
    assert grid.shape == (3, 2 * 2, 3 * 4)
    assert [int(grid[0, 2, 4 * f]) for f in range(3)] == [10, 11, 12]
    assert (tmp_path / "grid.png").is_file()
