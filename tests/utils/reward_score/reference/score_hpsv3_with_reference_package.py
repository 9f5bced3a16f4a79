"""Scores of the tiny HPSv3 checkpoint by the authors' own package (``hpsv3`` 1.0.0, ``HPSv3RewardInferencer``).

``hpsv3`` pins ``transformers==4.45.2`` (verl_omni runs transformers 5) and pulls the training stack (deepspeed,
trl), so it cannot be installed beside verl_omni. This script runs once in a scratch venv that reuses the project's
torch and writes ``hpsv3_reference_scores.json``, which ``test_hpsv3_scorer.py`` compares the ``hpsv3`` scorer
with (same checkpoint file, images and prompts). To regenerate::

    python -m verl_omni.utils.tiny_models hpsv3 --out /tmp/ref/hpsv3
    uv venv -p .venv/bin/python /tmp/hpsv3ref
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/hpsv3ref/lib/python3.11/site-packages/zz_project.pth
    uv pip install -p /tmp/hpsv3ref/bin/python --no-deps hpsv3==1.0.0 transformers==4.45.2 tokenizers==0.20.3 \\
        huggingface_hub==0.26.5 datasets==3.1.0 trl==0.11.4 peft==0.13.2 fire termcolor matplotlib contourpy \\
        cycler fonttools kiwisolver pyparsing
    /tmp/hpsv3ref/bin/python tests/utils/reward_score/reference/score_hpsv3_with_reference_package.py /tmp/ref/hpsv3

What is adapted, and why (the scoring code itself is the package's):

- The inferencer reads its settings from the package's ``HPSv3_7B.yaml``; a copy points ``model_name_or_path`` at the
  tiny directory and runs in float32 (the released settings cast the model to bfloat16), so the comparison holds
  to 1e-5.
- ``from_pretrained`` loads the base model's weights before the HPSv3 file replaces every tensor (``strict=True``);
  the released base (Qwen2-VL-7B-Instruct) has them, the tiny directory has only ``HPSv3.safetensors``, so a copy of
  that file without the head and without the ``<|Reward|>`` row stands in for them.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from PIL import Image
from safetensors.torch import load_file, save_file

OUT = Path(__file__).with_name("hpsv3_reference_scores.json")
SEED, SHAPE = 0, (3, 3, 40, 48)
PROMPTS = ["a cat", "a dog on a red chair", "x"]


def inputs():
    generator = torch.Generator().manual_seed(SEED)
    images = torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=generator)
    return [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in images]


def hpsv3_scores(directory: str) -> dict:
    import hpsv3
    from hpsv3.inference import HPSv3RewardInferencer

    work = Path(tempfile.mkdtemp())
    base = work / "base"
    shutil.copytree(directory, base)
    checkpoint = base / "HPSv3.safetensors"
    vocab = json.loads((base / "config.json").read_text())["vocab_size"]
    state = load_file(str(checkpoint))
    rows = ("model.embed_tokens.weight", "lm_head.weight")
    base_state = {k: (v[:vocab] if k in rows else v) for k, v in state.items() if not k.startswith("rm_head.")}
    save_file(base_state, str(base / "model.safetensors"), metadata={"format": "pt"})

    settings = yaml.safe_load((Path(hpsv3.__file__).parent / "config" / "HPSv3_7B.yaml").read_text())
    settings.update(model_name_or_path=str(base), bf16=False, torch_dtype="float32", deepspeed=None)
    settings.update(output_dir=str(work / "out"), report_to="none", dataloader_num_workers=0)
    config = work / "HPSv3_tiny.yaml"
    config.write_text(yaml.safe_dump(settings))

    inferencer = HPSv3RewardInferencer(config_path=str(config), checkpoint_path=str(checkpoint), device="cpu")
    with torch.no_grad():
        together = inferencer.reward(inputs(), PROMPTS).float()
        alone = [inferencer.reward([im], [p]).float()[0] for im, p in zip(inputs(), PROMPTS, strict=True)]
    return {
        "mu": together[:, 0].tolist(),
        "sigma": together[:, 1].tolist(),
        "mu_one_at_a_time": [float(r[0]) for r in alone],
    }


if __name__ == "__main__":
    result = {"seed": SEED, "shape": list(SHAPE), "prompts": PROMPTS, "hpsv3": hpsv3_scores(sys.argv[1])}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
