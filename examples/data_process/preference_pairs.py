"""Write an offline preference set (prompt, chosen image, rejected image per row) as parquet, for Diffusion-DPO.

From a folder with one sub-folder per pair, each holding prompt.txt, chosen.<png|jpg|...> and rejected.<...>:
    python examples/data_process/preference_pairs.py --pairs ~/pairs --out ~/data/prefs [--val 8] [--embed]

Rows keep the images as paths (``{"image": "/abs/path.png"}``) or, with ``--embed``, as the files' bytes
(``{"bytes": ...}``), in the ``chosen`` and ``rejected`` columns; the last ``--val`` pairs form val.parquet.
Every image is opened once written, so a missing or unreadable one is named (file, row, column) here.
"""

import argparse
from pathlib import Path

from verl_omni.utils.dataset.preference_data import check_preference_images, pair_folder_rows
from verl_omni.utils.dataset.t2i_prompts import write_parquet

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", required=True, help="folder of pair folders (prompt.txt, chosen.*, rejected.*)")
    parser.add_argument("--out", required=True, help="directory for train.parquet and val.parquet")
    parser.add_argument("--val", type=int, default=1, help="pairs held out for validation")
    parser.add_argument("--embed", action="store_true", help="store the image bytes instead of their paths")
    args = parser.parse_args()
    rows = pair_folder_rows(Path(args.pairs).expanduser(), "train", embed=args.embed)
    if not 0 < args.val < len(rows):
        parser.error(f"--val must be in [1, {len(rows) - 1}] for {len(rows)} pairs")
    train, val = rows[: -args.val], rows[-args.val :]
    for row in val:
        row["extra_info"]["split"] = "val"
    out = Path(args.out).expanduser()
    for name, split_rows in (("train", train), ("val", val)):
        path = write_parquet(split_rows, out / f"{name}.parquet")
        print(f"{name}: {check_preference_images(path)} pairs -> {path}")
