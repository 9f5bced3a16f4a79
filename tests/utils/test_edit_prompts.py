"""Editing prompt sets: the data_process script writes rows verl's dataset (our ``RLHFDataset`` subclass) returns
with their source images; a bad image is named with its file and row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("edits")
    for i, size in enumerate([(40, 24), (16, 16), (24, 40)]):
        Image.new("RGB", size, (60 * i, 0, 0)).save(folder / f"im{i}.png")
        (folder / f"im{i}.txt").write_text("a red cat\n\nmake it blue\n")
    return folder


@pytest.mark.slow  # the script in a fresh interpreter, as a user runs it
@pytest.mark.parametrize("embed", [False, True], ids=["paths", "bytes"])
def test_script_writes_rows_the_dataset_returns_with_their_images(image_folder, tmp_path, embed):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import collate_fn

    from verl_omni.utils.dataset.edit_prompts import load_row_images
    from verl_omni.utils.dataset.prompt_dataset import DiffusionPromptDataset
    from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

    script = [sys.executable, str(REPO / "examples/data_process/edit_prompts.py"), "--images", str(image_folder)]
    script += ["--out", str(tmp_path), "--val", "2"] + (["--embed"] if embed else [])
    out = subprocess.run(script, capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "train: 4 rows, 4 source images" in out.stdout and "val: 2 rows, 2 source images" in out.stdout

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": False})
    dataset = DiffusionPromptDataset(str(tmp_path / "train.parquet"), build_qwen2_tokenizer(), config, None)
    rows = [dataset[i] for i in range(len(dataset))]
    assert [r["raw_prompt"][0]["content"] for r in rows] == ["a red cat", "make it blue"] * 2
    ref = rows[2]["images"][0]
    assert ("bytes" in ref and ref["bytes"]) if embed else ref["image"] == str(image_folder / "im1.png")
    batch = collate_fn(rows)
    images = load_row_images(batch["images"][2], "row 2")
    assert [im.size for im in images] == [(16, 16)]


def test_a_missing_or_corrupt_image_is_named_with_file_and_row(tmp_path):
    from verl_omni.utils.dataset.edit_prompts import check_source_images, edit_row
    from verl_omni.utils.dataset.t2i_prompts import write_parquet

    good = tmp_path / "good.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(good)
    rows = [edit_row("a red cat", [{"image": str(good)}], 0, "train", "t")]
    missing = write_parquet(
        rows + [edit_row("x", [{"image": str(tmp_path / "gone.png")}], 1, "train", "t")], tmp_path / "m.parquet"
    )
    with pytest.raises(
        ValueError, match=r"m.parquet row 1 \(images\), image 0: source image .*gone.png does not exist"
    ):
        check_source_images(missing)
    corrupt = write_parquet(rows + [edit_row("x", [{"bytes": b"not a png"}], 1, "train", "t")], tmp_path / "c.parquet")
    with pytest.raises(
        ValueError, match=r"c.parquet row 1 \(images\), image 0: source image 9 bytes is not a readable"
    ):
        check_source_images(corrupt)
    empty = write_parquet(rows + [edit_row("x", [], 1, "train", "t")], tmp_path / "e.parquet")
    with pytest.raises(ValueError, match=r"e.parquet row 1 \(images\): has 0 source images"):
        check_source_images(empty)
    assert check_source_images(write_parquet(rows, tmp_path / "ok.parquet")) == 1
