"""``python -m verl_omni.utils.tiny_models NAME --out DIR [--seed S]``."""

import argparse
import logging

from verl_omni.utils.tiny_models import available_builders, build_tiny_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a tiny random model directory.")
    parser.add_argument("name", choices=available_builders())
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="dtype the weights are saved in"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = build_tiny_model(args.name, args.out, args.seed, args.dtype)
    logging.getLogger(__name__).info("wrote %s model to %s", args.name, path)


if __name__ == "__main__":
    main()
