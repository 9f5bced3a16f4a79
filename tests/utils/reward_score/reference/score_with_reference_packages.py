"""Scores of the tiny HPSv2 / ImageReward checkpoints by the authors' own packages (``hpsv2``, ``image-reward``).

Neither package can be installed beside verl_omni: ``hpsv2`` pins ``protobuf<4`` and
``pytest==7.2.0``; ``image-reward`` pins ``timm==0.6.13`` (OpenCLIP needs ``timm>=1.0.17``) and its
BLIP code imports helpers that transformers 5 removed. So this script runs once in a scratch venv
and writes ``reference_scores.json``, which ``test_preference_scorers.py`` compares our scorers
with (same checkpoint files, same images and prompts). To regenerate::

    python -m verl_omni.utils.tiny_models hps --out /tmp/ref/hps
    python -m verl_omni.utils.tiny_models image_reward --out /tmp/ref/image_reward
    python3.11 -m venv /tmp/refvenv
    # the project's torch/torchvision/pillow, shadowed by the reference packages' own pins:
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/refvenv/lib/python3.11/site-packages/zz_project.pth
    /tmp/refvenv/bin/pip install --no-deps hpsv2==1.2.0 image-reward==1.5 transformers==4.46.3 \\
        tokenizers==0.20.3 huggingface_hub==0.26.5 timm==0.6.13 fairscale==0.4.13 ftfy wcwidth clint args
    # hpsv2 1.2.0's wheel lacks OpenCLIP's BPE file: copy open_clip's bpe_simple_vocab_16e6.txt.gz
    # into hpsv2/src/open_clip/ of that venv
    /tmp/refvenv/bin/python tests/utils/reward_score/reference/score_with_reference_packages.py \\
        /tmp/ref/hps /tmp/ref/image_reward

What is adapted, and why (the scoring code itself is the packages'):

- ``hpsv2.img_score.score`` builds ``ViT-H-14`` with downloaded OpenCLIP weights; its model cache
  (``model_dict``) is filled first with the same call at the tiny config, then ``score(image,
  prompt, cp=<checkpoint>)`` loads the checkpoint and scores as it does for the real one.
- ``ImageReward`` hard-codes ViT-L (``create_vit('large')``) and the Hub's ``bert-base-uncased``;
  its own ``VisionTransformer`` is built at the checkpoint's ``vision_config.json`` sizes and its
  tokenizer set-up runs on the checkpoint's ``tokenizer/``. Its package ``__init__`` imports the
  training code (ReFL, OpenAI ``clip``), so only the scoring modules are loaded.
"""

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch
from PIL import Image

OUT = Path(__file__).with_name("reference_scores.json")
SEED, SHAPE = 0, (3, 3, 40, 48)
PROMPTS = ["a cat", "a dog on a red chair", "x"]


def inputs():
    generator = torch.Generator().manual_seed(SEED)
    images = torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=generator)
    return [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in images]


def hps_scores(directory: str) -> list[float]:
    import hpsv2.img_score as img_score
    from hpsv2.src.open_clip import create_model_and_transforms, factory

    factory._MODEL_CONFIGS["tiny-hps"] = json.loads(Path(directory, "open_clip_config.json").read_text())["model_cfg"]
    model, _, preprocess_val = create_model_and_transforms(
        "tiny-hps", None, precision="amp", device="cpu", jit=False, force_quick_gelu=False,
        force_custom_text=False, force_patch_dropout=False, force_image_size=None, pretrained_image=False,
        image_mean=None, image_std=None, light_augmentation=True, aug_cfg={}, output_dict=True,
        with_score_predictor=False, with_region_predictor=False,
    )  # fmt: skip
    img_score.model_dict.update(model=model, preprocess_val=preprocess_val)
    img_score.device = "cpu"
    checkpoint = str(Path(directory, "HPS_v2.1_compressed.pt"))
    return [float(img_score.score(im, p, cp=checkpoint)[0]) for im, p in zip(inputs(), PROMPTS, strict=True)]


def image_reward_scores(directory: str) -> list[float]:
    location = importlib.util.find_spec("ImageReward").submodule_search_locations[0]
    for name, path in (("ImageReward", location), ("ImageReward.models", location + "/models")):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    import ImageReward.models.BLIP.blip_pretrain as blip_pretrain
    from ImageReward.models.BLIP.vit import VisionTransformer
    from transformers import BertTokenizer

    vision = json.loads(Path(directory, "vision_config.json").read_text())

    def create_vit(vit, image_size, *args, **kwargs):
        width = vision["hidden_size"]
        return VisionTransformer(
            img_size=image_size, patch_size=vision["patch_size"], embed_dim=width,
            depth=vision["num_hidden_layers"], num_heads=vision["num_attention_heads"],
            mlp_ratio=vision["intermediate_size"] / width,
        ), width  # fmt: skip

    def init_tokenizer():
        tokenizer = BertTokenizer.from_pretrained(str(Path(directory, "tokenizer")))
        tokenizer.add_special_tokens({"bos_token": "[DEC]"})
        tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        tokenizer.enc_token_id = tokenizer.additional_special_tokens_ids[0]
        return tokenizer

    blip_pretrain.create_vit, blip_pretrain.init_tokenizer = create_vit, init_tokenizer
    from ImageReward.ImageReward import ImageReward

    model = ImageReward(med_config=str(Path(directory, "med_config.json")), device="cpu")
    loaded = model.load_state_dict(torch.load(Path(directory, "ImageReward.pt"), map_location="cpu"), strict=False)
    used = ("blip.visual_encoder", "blip.text_encoder", "mlp")
    assert not [k for k in loaded.missing_keys if k.startswith(used)] and not loaded.unexpected_keys, loaded
    model.eval()
    with torch.no_grad():
        return [float(model.score(p, im)) for im, p in zip(inputs(), PROMPTS, strict=True)]


if __name__ == "__main__":
    hps_dir, image_reward_dir = sys.argv[1:3]
    result = {
        "seed": SEED,
        "shape": list(SHAPE),
        "prompts": PROMPTS,
        "hpsv2": hps_scores(hps_dir),
        "image_reward": image_reward_scores(image_reward_dir),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
