"""Write the built-in tiny prompt set (words the tiny models' tokenizer knows) as parquet.

python examples/data_process/tiny_prompts.py --out ~/data/tiny_t2i
"""

import argparse
from pathlib import Path

from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="~/data/tiny_t2i", help="directory for train.parquet and val.parquet")
    args = parser.parse_args()
    train, val = ensure_tiny_prompts(Path(args.out).expanduser())
    print(f"tiny prompts: {train}, {val}")
