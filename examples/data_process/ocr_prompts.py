"""Write an OCR prompt set (prompt quoting the text to render; the text is the ground truth) as parquet.

python examples/data_process/ocr_prompts.py --out ~/data/ocr --train 2000 --val 64
"""

import argparse
from pathlib import Path

from verl_omni.utils.dataset.t2i_prompts import ocr_rows, write_parquet

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="~/data/ocr", help="directory for train.parquet and val.parquet")
    parser.add_argument("--train", type=int, default=2000, help="number of training prompts")
    parser.add_argument("--val", type=int, default=64, help="number of held-out prompts")
    parser.add_argument("--max-words", type=int, default=2, help="words per quoted text, 1..max")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out).expanduser()
    write_parquet(ocr_rows(args.train, "train", args.seed, args.max_words), out / "train.parquet")
    write_parquet(ocr_rows(args.val, "val", args.seed, args.max_words), out / "val.parquet")
    print(f"OCR prompts in {out}")
