"""The Flow-GRPO authors' own SD3.5 trainer (``scripts/train_sd3.py`` of github.com/yifan123/flow_grpo at ``ac4c86e``),
unchanged, for a given number of epochs on one GPU: prints each epoch's wall time and images per GPU-second, to set
beside ``flowgrpo_recipe_step.py --recipe sd3`` on the same GPU and the same random checkpoint.

Their code is not part of this project: check it out into the ignored folder ``.peers/flow_grpo`` and carry it to
the GPU machine beside this repository. This file is both the launcher and the config file their ``--config`` flag
reads (``get_config``): the authors' one-GPU OCR config (``config/grpo.py`` ``general_ocr_sd3_1gpu``: 8 prompts x 8
images per epoch, 10 steps, CFG 4.5, the loss on 9 steps, KL 0.04, LoRA r32) with only what a timing run needs
changed: the local random-weights checkpoint, a local prompt folder (``train.txt``, ``test.txt``), the JPEG reward
(as on our side), no checkpoint, and their evaluation (which their loop runs at epoch 0 whatever the frequency) on
the 16 prompts of ``test.txt``.

Shimmed, because the GPU machine's stack lacks them: ``imp`` (gone in Python 3.12; their config loads ``base.py``
with it); wandb (a stub whose ``log`` notes when each epoch's reward line is written and stops the run after
``--epochs``); and DDP's ``.module`` (their update reaches the LoRA model as ``transformer.module``; accelerate wraps
no DDP around a single process).

    python3 -m accelerate.commands.launch --config_file .peers/flow_grpo/scripts/accelerate_configs/multi_gpu.yaml \\
        --num_processes=1 benchmarks/authors_train_sd3.py --model /tmp/model_sd3 --prompts DIR --epochs 3

An epoch is the time between two epochs' reward lines (the update of one epoch and the sampling of the next); the
steady state is the median after the first.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import itertools
import json
import os
import runpy
import statistics
import sys
import time
import types
from pathlib import Path

PEER = Path(__file__).resolve().parents[1] / ".peers" / "flow_grpo"
CONFIG_NAME = "general_ocr_sd3_1gpu"


def get_config(name: str = CONFIG_NAME):
    """Their config file's entry point (ml_collections' ``--config=FILE:NAME``), with the timing run's changes."""
    spec = importlib.util.spec_from_file_location("grpo", PEER / "config" / "grpo.py")
    grpo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grpo)
    config = getattr(grpo, name)()
    config.pretrained.model = os.environ["AUTHORS_MODEL"]
    config.dataset = os.environ["AUTHORS_PROMPTS"]
    config.reward_fn = {"jpeg_compressibility": 1.0}
    config.eval_freq = 10**6
    config.save_freq = 10**6
    config.logdir = config.save_dir = os.environ.get("AUTHORS_LOGDIR", "/tmp/authors_logs")
    return config


def _load_source(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class EpochClock:
    """wandb's ``log`` for their loop: the time of each epoch's reward line; ends the process after ``epochs``."""

    def __init__(self, epochs: int, images_per_epoch: int, json_out: Path | None):
        self.epochs, self.images, self.json_out = epochs, images_per_epoch, json_out
        self.start = time.perf_counter()
        self.marks: dict[int, float] = {}

    def log(self, data: dict, step=None, **_) -> None:
        # every optimizer step's line also carries "epoch": the reward line is the epoch's first
        if "epoch" not in data or "reward_avg" not in data:
            return
        self.marks[data["epoch"]] = time.perf_counter() - self.start
        print(f"[authors] epoch {data['epoch']} reward line at {self.marks[data['epoch']]:.1f} s", flush=True)
        if data["epoch"] >= self.epochs:
            self.report()
            os._exit(0)

    def report(self) -> None:
        import torch

        times = [self.marks[e] for e in sorted(self.marks)]
        epochs = [b - a for a, b in itertools.pairwise(times)]
        steady = statistics.median(epochs[1:] or epochs)
        summary = {
            "trainer": "flow_grpo scripts/train_sd3.py",
            "epoch_s": [round(s, 2) for s in epochs],
            "steady_epoch_s": round(steady, 2),
            "img_per_gpu_s": round(self.images / steady, 3),
            "start_to_first_reward_line_s": round(times[0], 1),
            "max_memory_allocated_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        }
        print("[authors] " + json.dumps(summary), flush=True)
        if self.json_out:
            self.json_out.write_text(json.dumps(summary, indent=1))


def _install_shims(clock: EpochClock) -> None:
    sys.modules["imp"] = types.SimpleNamespace(load_source=_load_source)
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.log, wandb.init, wandb.Image = clock.log, (lambda *a, **k: None), (lambda *a, **k: None)
    sys.modules["wandb"] = wandb

    import accelerate

    prepare = accelerate.Accelerator.prepare

    def prepare_with_module(self, *objects, **kwargs):
        prepared = prepare(self, *objects, **kwargs)
        for obj in prepared if isinstance(prepared, tuple) else (prepared,):
            if hasattr(obj, "disable_adapter") and "module" not in obj.__dict__:
                object.__setattr__(obj, "module", obj)
        return prepared

    accelerate.Accelerator.prepare = prepare_with_module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="the SD3.5 Medium directory (random weights)")
    p.add_argument("--prompts", type=Path, required=True, help="a folder with train.txt and test.txt")
    p.add_argument("--epochs", type=int, default=3, help="epochs timed after the first reward line")
    p.add_argument("--json", type=Path, default=None)
    args, theirs = p.parse_known_args()
    if not (PEER / "scripts" / "train_sd3.py").is_file():
        raise SystemExit(f"no {PEER}/scripts/train_sd3.py: check github.com/yifan123/flow_grpo out into {PEER}")
    os.environ.update(AUTHORS_MODEL=str(args.model), AUTHORS_PROMPTS=str(args.prompts.resolve()))
    # the one-GPU config's epoch: 8 sampling batches of 8 images
    _install_shims(EpochClock(args.epochs, 64, args.json))
    sys.path.insert(0, str(PEER))
    os.chdir(PEER)
    sys.argv = ["train_sd3.py", f"--config={Path(__file__).resolve()}:{CONFIG_NAME}", *theirs]
    runpy.run_path("scripts/train_sd3.py", run_name="__main__")


if __name__ == "__main__":
    main()
