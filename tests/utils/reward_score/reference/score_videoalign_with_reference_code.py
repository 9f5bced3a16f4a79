"""Rewards of the tiny VideoReward checkpoint by the authors' own inference code (KwaiVGI/VideoAlign ``inference.py``,
``VideoVLMRewardInference``).

VideoAlign is no package: its scripts import each other from the repository root, pin ``transformers==4.45.2`` and
use trl's reward trainer (verl_omni runs transformers 5). This script runs once in a scratch venv that reuses the
project's torch and writes ``videoalign_reference_scores.json``, which ``test_videoalign_scorer.py`` compares the
``videoalign`` scorer with (same checkpoint, videos and prompts). To regenerate::

    python -m verl_omni.utils.tiny_models videoalign --out /tmp/ref/videoalign
    git clone https://github.com/KwaiVGI/VideoAlign /tmp/VideoAlign    # commit 219ab9d
    uv venv -p .venv/bin/python /tmp/varef
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/varef/lib/python3.11/site-packages/zz_project.pth
    uv pip install -p /tmp/varef/bin/python --no-deps transformers==4.45.2 tokenizers==0.20.3 \\
        huggingface_hub==0.26.5 datasets==3.1.0 trl==0.11.4 peft==0.13.2
    /tmp/varef/bin/python tests/utils/reward_score/reference/score_videoalign_with_reference_code.py \\
        /tmp/VideoAlign /tmp/ref/videoalign

What is adapted, and why (the scoring code itself is the authors'):

- ``model_config.json`` names the base model by its Hub id; a copy points it at the tiny directory, and the model runs
  in float32 (the authors run bfloat16), so the comparison holds to 1e-5.
- ``from_pretrained`` loads base weights before ``model.pth`` replaces every tensor (strict); the released base
  (Qwen2-VL-2B-Instruct) has them, the tiny directory has only ``model.pth``, so its base tensors stand in for them.
- The authors' loader asks for flash-attention 2 (a CUDA kernel); here the model is built with PyTorch's SDPA.
- The authors' reader decodes a video file (``torchvision.io.read_video``); here it is handed the frames themselves,
  so no codec alters them. Frame sampling, resizing and everything after are the authors' code.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).with_name("videoalign_reference_scores.json")
SEED, SHAPE, FPS, NUM_FRAMES = 0, (2, 6, 3, 32, 48), 16.0, 4
PROMPTS = ["a red car driving at night", "a cat"]


def inputs() -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=generator)


def base_weights(directory: Path) -> dict:
    """``model.pth``'s base tensors under the plain ``Qwen2VLForConditionalGeneration`` names, the vocabulary trimmed
    to the base model's (the three reward tokens are added by the authors' code)."""
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    state = torch.load(next(directory.glob("checkpoint-*/model.pth")), weights_only=True)
    out = {}
    for name, tensor in state.items():
        name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if ".lora_" in name or name.startswith("rm_head."):
            continue
        out[name] = tensor[:vocab].clone() if name in ("model.embed_tokens.weight", "lm_head.weight") else tensor
    return out


def videoalign_rewards(repository: str, directory: str) -> dict:
    sys.path.insert(0, repository)
    import inference
    import train_reward
    import vision_process

    work = Path(tempfile.mkdtemp())
    shutil.copytree(directory, work / "model")
    model_dir = work / "model"
    save_file(base_weights(model_dir), str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    run = json.loads((model_dir / "model_config.json").read_text())
    run["model_config"].update(model_name_or_path=str(model_dir), torch_dtype="float32")
    (model_dir / "model_config.json").write_text(json.dumps(run))

    model_cls = train_reward.Qwen2VLRewardModelBT
    from_pretrained = model_cls.from_pretrained

    def with_sdpa(*args, **kwargs):
        kwargs["attn_implementation"] = "sdpa"
        return from_pretrained(*args, **kwargs)

    model_cls.from_pretrained = with_sdpa

    videos = inputs()
    paths = [f"/videos/{i}.mp4" for i in range(len(videos))]
    frames = {f"file://{p}": v for p, v in zip(paths, videos, strict=True)}

    def read_video(path, start_pts=0.0, end_pts=None, pts_unit="sec", output_format="TCHW"):
        return frames[path], None, {"video_fps": FPS}

    vision_process.io.read_video = read_video
    inferencer = inference.VideoVLMRewardInference(str(model_dir), device="cpu", dtype=torch.float32)
    with torch.no_grad():
        together = inferencer.reward(paths, PROMPTS, num_frames=NUM_FRAMES, use_norm=True)
        raw = inferencer.reward(paths, PROMPTS, num_frames=NUM_FRAMES, use_norm=False)
        alone = [inferencer.reward([p], [q], num_frames=NUM_FRAMES)[0] for p, q in zip(paths, PROMPTS, strict=True)]
    return {"normalized": together, "raw": raw, "one_at_a_time": alone}


if __name__ == "__main__":
    result = {
        "seed": SEED,
        "shape": list(SHAPE),
        "num_frames": NUM_FRAMES,
        "prompts": PROMPTS,
        "videoalign": videoalign_rewards(sys.argv[1], sys.argv[2]),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
