"""The ``videoalign`` scorer on a tiny random VideoReward checkpoint (``tiny_models videoalign``), released layout.

The expected rewards are recomputed here the way the authors' model computes them, from transformers' Qwen2-VL and
peft directly: the PEFT-wrapped ``Qwen2VLForConditionalGeneration`` with a bias-free ``rm_head`` loads ``model.pth``
strictly (LoRA unmerged, as the authors run it; the scorer merges it), the vision tower's output is scattered into
the video tokens, the head reads every position and the three reward tokens are picked by mask in sequence order.
Frame indices and sizes are the hand-computed values of the authors' sampling and ``smart_resize`` for these videos.
(The authors' repository pins transformers 4.45 and trl 0.8 and is no package, so it is not run here.)
"""

import asyncio
import json
from pathlib import Path

import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, build_params, get_scorer_cls
from verl_omni.utils.reward_score.videoalign import (
    REWARD_TOKENS,
    VideoAlignParams,
    frame_indices,
    frame_size,
    instruction,
    load_videoalign,
)

PROMPTS = ["a red car driving at night", "a cat"]
# 6 frames of 32x48: round(linspace(0, 5, 4)) = [0, 2, 3, 5]; 32x48 is below 128*28*28 pixels, so it grows to 280x392
INDICES = [0, 2, 3, 5]
SIZE = (280, 392)


def make(model_path, **params):
    cls = get_scorer_cls("videoalign")
    values = {"model_path": str(model_path), "dtype": "float32", "num_frames": 4, **params}
    return cls(build_params(cls.params_cls, values, "test"))


@pytest.fixture(scope="module")
def tiny_dir(tiny_model):
    return tiny_model("videoalign")


@pytest.fixture(scope="module")
def videos():
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (2, 6, 3, 32, 48), dtype=torch.uint8, generator=generator)


def authors_rewards(model_dir: Path, videos: torch.Tensor, prompts: list[str]) -> list[dict[str, float]]:
    """VQ, MQ, TA (normalized) and Overall as the authors' reward model computes them, from peft + transformers."""
    from peft import LoraConfig, get_peft_model
    from torchvision.transforms.functional import InterpolationMode, resize
    from transformers import AutoProcessor, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    run = json.loads((model_dir / "model_config.json").read_text())
    lora = run["peft_lora_config"]
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "right"
    processor.tokenizer.add_special_tokens({"additional_special_tokens": list(REWARD_TOKENS)})
    special = processor.tokenizer.convert_tokens_to_ids(list(REWARD_TOKENS))

    config = Qwen2VLConfig.from_pretrained(model_dir)
    model = Qwen2VLForConditionalGeneration(config)
    model.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
    model.rm_head = torch.nn.Linear(config.text_config.hidden_size, 1, bias=False)
    targets = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding)
        and not any(part in name for part in lora["lora_namespan_exclude"])
    ]
    lora_config = LoraConfig(
        target_modules=targets, r=lora["lora_r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0, bias="none"
    )
    model = get_peft_model(model, lora_config).eval()
    state = torch.load(model_dir / "checkpoint-11352" / "model.pth", weights_only=True)
    # transformers 4.45's names -> 5's: the vision tower and the language model moved under ``model.``
    renamed = {}
    for name, tensor in state.items():
        if name.startswith("base_model.model.visual."):
            name = name.replace("base_model.model.", "base_model.model.model.", 1)
        elif name.startswith("base_model.model.model."):
            name = name.replace("base_model.model.model.", "base_model.model.model.language_model.", 1)
        renamed[name] = tensor
    model.load_state_dict(renamed, strict=True)

    frames = [resize(v[INDICES], list(SIZE), InterpolationMode.BICUBIC, antialias=True).float() for v in videos]
    chats = [
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": instruction(p)}]}] for p in prompts
    ]
    texts = [processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats]
    batch = processor(text=texts, videos=frames, padding=True, return_tensors="pt")
    ids = batch["input_ids"]
    inner = model.base_model.model
    with torch.no_grad():
        embeds = inner.model.language_model.embed_tokens(ids)
        video_embeds = inner.model.visual(batch["pixel_values_videos"], grid_thw=batch["video_grid_thw"]).pooler_output
        mask = (ids == config.video_token_id).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, video_embeds)
        hidden = inner.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"])[0]
        logits = inner.rm_head(hidden)
    at_special = torch.isin(ids, torch.tensor(special))
    pooled = logits[at_special].view(len(prompts), 3)
    norm = run["inference_config"]
    out = []
    for row in pooled.tolist():
        scores = {k: (v - norm[f"{k}_mean"]) / norm[f"{k}_std"] for k, v in zip(("VQ", "MQ", "TA"), row, strict=True)}
        scores["overall"] = sum(scores.values())
        out.append(scores)
    return out


@pytest.fixture(scope="module")
def expected(tiny_dir, videos):
    return authors_rewards(Path(tiny_dir), videos, PROMPTS)


def test_frames_are_sampled_and_sized_as_the_authors_do():
    assert frame_indices(6, 4) == INDICES
    assert frame_indices(81, 8) == [0, 11, 23, 34, 46, 57, 69, 80]
    assert frame_indices(5, 8) == [0, 1, 3, 4]  # fewer frames than asked: all of them, made even
    assert frame_size(32, 48, 200704) == SIZE
    assert frame_size(480, 832, 200704) == (336, 588)  # above the bound: shrunk, multiples of 28
    assert frame_size(392, 504, 200704) == (392, 504)
    with pytest.raises(ValueError, match="at least 2 frames"):
        frame_indices(1, 8)


def test_all_four_rewards_equal_the_authors_computation(tiny_dir, videos, expected):
    """Two videos in one right-padded batch (prompts of different lengths); LoRA merged vs. peft's unmerged."""
    model = load_videoalign(VideoAlignParams(model_path=str(tiny_dir), dtype="float32", num_frames=4))
    got = model.rewards(videos, PROMPTS, normalize=True)
    for ours, theirs in zip(got, expected, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-5)
    assert got[0]["TA"] != pytest.approx(got[1]["TA"], abs=1e-3)
    raw = model.rewards(videos, PROMPTS, normalize=False)
    assert raw[0]["VQ"] == pytest.approx(got[0]["VQ"] * 2.2476 + 3.6757, abs=1e-5)


@pytest.mark.parametrize("score", ["MQ", "overall"])
def test_the_scorer_returns_the_chosen_score_one_video_at_a_time(tiny_dir, videos, expected, score):
    scores = asyncio.run(make(tiny_dir, score=score, batch_size=1).score(ScoreBatch(videos, PROMPTS)))
    assert scores == pytest.approx([e[score] for e in expected], abs=1e-5)


def test_the_checkpoint_has_the_released_layout(tiny_dir):
    run = json.loads(Path(tiny_dir, "model_config.json").read_text())
    assert set(run) == {"data_config", "model_config", "peft_lora_config", "inference_config"}
    state = torch.load(Path(tiny_dir, "checkpoint-11352", "model.pth"), weights_only=True)
    assert {k.split(".")[2] for k in state} == {"model", "visual", "lm_head", "rm_head"}
    assert state["base_model.model.rm_head.weight"].shape == (1, 32)
    q_proj = "base_model.model.model.layers.0.self_attn.q_proj"
    assert {f"{q_proj}.{p}" for p in ("base_layer.weight", "base_layer.bias", "lora_A.default.weight")} <= set(state)
    assert not any("lora_" in k for k in state if ".visual." in k)


def test_missing_weights_name_the_directory(tmp_path, videos):
    batch = ScoreBatch(videos, PROMPTS)
    missing = tmp_path / "VideoReward"
    with pytest.raises(
        FileNotFoundError, match=rf"model_path='{missing}' is not a directory; it must hold VideoReward"
    ):
        make(missing).score_sync(batch)
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}' has no model_config.json: put VideoReward"):
        make(tmp_path).score_sync(batch)
    (tmp_path / "model_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}' has no checkpoint-<step> directory"):
        make(tmp_path).score_sync(batch)
    (tmp_path / "checkpoint-7").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}/checkpoint-7' has no model.pth"):
        make(tmp_path).score_sync(batch)
    with pytest.raises(FileNotFoundError, match=r"has no checkpoint-9; checkpoint_step may be \[7\] or -1"):
        make(tmp_path, checkpoint_step=9).score_sync(batch)


def test_a_base_directory_without_the_config_names_its_key(tiny_dir, tmp_path, videos):
    with pytest.raises(FileNotFoundError, match=rf"base_model_path='{tmp_path}' has no config.json: put the base"):
        make(tiny_dir, base_model_path=str(tmp_path)).score_sync(ScoreBatch(videos, PROMPTS))


@pytest.mark.parametrize(
    "params, message",
    [
        ({}, r"^k\.model_path must name a local directory holding VideoReward's"),
        ({"model_path": "/m", "score": "vq"}, r"k\.score must be one of VQ, MQ, TA, overall, got 'vq'"),
        ({"model_path": "/m", "num_frames": 3}, r"k\.num_frames must be an even number >= 2"),
        ({"model_path": "/m", "dtype": "float64"}, r"k\.dtype must be one of float32, bfloat16, float16"),
        ({"model_path": "/m", "batch_size": 0}, r"k\.batch_size must be >= 1"),
    ],
)
def test_bad_params_are_refused_by_key(params, message):
    cls = get_scorer_cls("videoalign")
    with pytest.raises(ValueError, match=message):
        build_params(cls.params_cls, params, "k")
