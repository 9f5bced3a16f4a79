"""Write an image-editing prompt set (instruction + source image per row) as parquet.

From a folder of images, each with a ``<name>.txt`` of instructions (one per line, each a row):
    python examples/data_process/edit_prompts.py --images ~/edits --out ~/data/edit [--val 8] [--embed]
The tiny built-in set (solid-colour images, words the tiny models' tokenizer knows):
    python examples/data_process/edit_prompts.py --tiny --out ~/data/tiny_edit

Rows keep the images as paths (``{"image": "/abs/path.png"}``) or, with ``--embed``, as the files' bytes
(``{"bytes": ...}``), in verl's ``images`` column; the last ``--val`` rows form val.parquet.
"""

import argparse
from pathlib import Path

from verl_omni.utils.dataset.edit_prompts import check_source_images, folder_rows, tiny_edit_rows
from verl_omni.utils.dataset.t2i_prompts import write_parquet

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", help="folder of images, each with a <name>.txt of instructions")
    source.add_argument("--tiny", action="store_true", help="the tiny built-in set")
    parser.add_argument("--out", required=True, help="directory for train.parquet and val.parquet")
    parser.add_argument("--val", type=int, default=4, help="rows held out for validation (--images)")
    parser.add_argument("--embed", action="store_true", help="store the image bytes instead of their paths")
    args = parser.parse_args()
    out = Path(args.out).expanduser()
    if args.tiny:
        train, val = tiny_edit_rows("train"), tiny_edit_rows("val")
    else:
        rows = folder_rows(Path(args.images).expanduser(), "train", embed=args.embed)
        if not 0 < args.val < len(rows):
            parser.error(f"--val must be in [1, {len(rows) - 1}] for {len(rows)} rows")
        train, val = rows[: -args.val], rows[-args.val :]
        for row in val:
            row["extra_info"]["split"] = "val"
    for name, rows in (("train", train), ("val", val)):
        path = write_parquet(rows, out / f"{name}.parquet")
        print(f"{name}: {len(rows)} rows, {check_source_images(path)} source images -> {path}")
