"""Offline preference sets: the data_process converter writes rows whose chosen and rejected images load back;
a bad pair folder or a missing / unreadable image is named with its file, row and column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from verl_omni.utils.dataset.edit_prompts import load_source_image
from verl_omni.utils.dataset.preference_data import check_preference_images, pair_folder_rows
from verl_omni.utils.dataset.t2i_prompts import write_parquet

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "data_process" / "preference_pairs.py"
# chosen bright, rejected dark: what a tiny preference set teaches
CHOSEN_COLOR, REJECTED_COLOR = (230, 230, 230), (20, 20, 20)


@pytest.fixture(scope="module")
def pair_folder(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("pairs")
    for i, suffix in enumerate([".png", ".jpg", ".png"]):
        pair = folder / f"{i:04d}"
        pair.mkdir()
        (pair / "prompt.txt").write_text(f"a red cat {i}\n")
        Image.new("RGB", (16, 16), CHOSEN_COLOR).save(pair / f"chosen{suffix}")
        Image.new("RGB", (16, 16), REJECTED_COLOR).save(pair / "rejected.png")
    return folder


@pytest.mark.slow  # the converter in a fresh interpreter, as a user runs it
@pytest.mark.parametrize("embed", [False, True], ids=["paths", "bytes"])
def test_converter_writes_pairs_whose_images_load_back(pair_folder, tmp_path, embed):
    out = tmp_path / "prefs"
    command = [sys.executable, str(SCRIPT), "--pairs", str(pair_folder), "--out", str(out), "--val", "1"]
    subprocess.run(command + (["--embed"] if embed else []), check=True, cwd=REPO, capture_output=True)
    train, val = pd.read_parquet(out / "train.parquet"), pd.read_parquet(out / "val.parquet")
    assert len(train) == 2 and len(val) == 1
    assert [p[0]["content"] for p in train["prompt"]] == ["a red cat 0", "a red cat 1"]
    assert val["extra_info"][0]["split"] == "val"
    assert check_preference_images(out / "train.parquet") == 2
    row = train.iloc[1]
    assert (row["chosen"].get("bytes") is not None) == embed
    # the jpg is lossy: near, not equal, to its colour
    chosen = load_source_image(row["chosen"], "test").getpixel((8, 8))
    rejected = load_source_image(row["rejected"], "test").getpixel((8, 8))
    assert all(abs(a - b) <= 4 for a, b in zip(chosen, CHOSEN_COLOR, strict=True))
    assert rejected == REJECTED_COLOR


def test_a_missing_image_file_is_named_with_its_row_and_column(pair_folder, tmp_path):
    rows = pair_folder_rows(pair_folder, "train")
    gone = tmp_path / "gone.png"
    rows[2]["rejected"] = {"image": str(gone)}
    path = write_parquet(rows, tmp_path / "train.parquet")
    with pytest.raises(ValueError, match=rf"row 2 \(rejected\): source image {gone} does not exist"):
        check_preference_images(path)


def test_unreadable_bytes_are_named_with_their_row_and_column(pair_folder, tmp_path):
    rows = pair_folder_rows(pair_folder, "train", embed=True)
    rows[1]["chosen"] = {"bytes": b"not an image"}
    path = write_parquet(rows, tmp_path / "train.parquet")
    with pytest.raises(ValueError, match=r"row 1 \(chosen\): source image 12 bytes is not a readable image"):
        check_preference_images(path)


def test_a_parquet_without_the_image_columns_is_refused(tmp_path):
    path = write_parquet([{"prompt": "a cat"}], tmp_path / "prompts.parquet")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['chosen', 'rejected'\]"):
        check_preference_images(path)


def test_a_pair_folder_without_its_rejected_image_or_prompt_is_named(tmp_path):
    from PIL import Image

    pair = tmp_path / "pairs" / "p0"
    pair.mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(pair / "chosen.png")
    with pytest.raises(ValueError, match=rf"{pair} has no prompt.txt"):
        pair_folder_rows(pair.parent, "train")
    (pair / "prompt.txt").write_text("a cat")
    with pytest.raises(ValueError, match=rf"{pair} has no rejected image"):
        pair_folder_rows(pair.parent, "train")
