"""``videoalign``: VideoReward, the reward model of VideoAlign (Liu et al., "Improving Video Generation with Human
Feedback", arXiv:2501.13918, 2025).

VideoReward is Qwen2-VL-2B-Instruct fine-tuned (LoRA on the language model) with a bias-free linear head
``rm_head: hidden -> 1``. The user turn holds the video and the authors' instruction, which names the three criteria
and ends each one with an added token, ``<|VQ_reward|>`` (visual quality), ``<|MQ_reward|>`` (motion quality) and
``<|TA_reward|>`` (text alignment, after the prompt). The head read at each token's last hidden state gives that
criterion's raw reward ``r_k``. As the authors' inferencer reports them:

    s_k = (r_k - mean_k) / std_k   for k in VQ, MQ, TA   (``inference_config`` of ``model_config.json``)
    Overall = s_VQ + s_MQ + s_TA

(``normalize: false`` gives ``r_k``, and Overall their sum). ``params.score`` picks the one returned.

How a video is scored follows the authors' inference code (KwaiVGI/VideoAlign, ``inference.py`` with its
``vision_process.py``):

- ``num_frames`` frames are taken at ``round(linspace(0, F - 1, n))`` (the authors' uniform sampling; they pick
  ``n`` = 2 frames per second of video, rounded to even, at least 4);
- every frame is resized (bicubic, antialiased, on uint8) to both sides multiples of 28 with the pixel count inside
  [128·28·28, ``data_config.max_frame_pixels``] (Qwen2-VL's ``smart_resize``), then goes through the base model's
  video processor (rescale, CLIP mean/std, 14-pixel patches, 2 frames per temporal patch);
- the chat is Qwen2-VL's template with the assistant turn opened; batches are padded on the right;
- the language model runs without Qwen2-VL's 3-D (M-RoPE) position ids, as the authors' model calls it: every token
  takes its sequence index in all three rotary sections;
- the head runs in the model's dtype, as the authors cast the whole model.

:data:`PROMPT` is the authors' instruction verbatim: the head reads hidden states that depend on every token before
them, so another wording would be another model.

Files (nothing is downloaded): ``params.model_path`` holds the released directory (``model_config.json`` and
``checkpoint-<step>/model.pth``; the LoRA is merged into the base weights on load); ``params.base_model_path``
(default: the same directory) holds Qwen2-VL-2B-Instruct's ``config.json`` and processor files (its weights are not
read, ``model.pth`` holds every tensor).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.local_files import require_dir, require_file
from verl_omni.utils.reward_score.qwen2_vl_reward import build_model, hidden_states, load_processor, media_size
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

CONFIG_FILE = "model_config.json"
CHECKPOINT_FILE = "model.pth"
CRITERIA = ("VQ", "MQ", "TA")
SCORES = (*CRITERIA, "overall")
REWARD_TOKENS = tuple(f"<|{k}_reward|>" for k in CRITERIA)
MIN_FRAME_PIXELS = 128 * 28 * 28
DTYPES = ("float32", "bfloat16", "float16")
CHECKPOINT_WHAT = "VideoReward's model_config.json and checkpoint-<step>/model.pth (KwaiVGI/VideoReward)"
BASE_WHAT = "the base model's config.json and processor files (Qwen/Qwen2-VL-2B-Instruct)"

PROMPT = "\n".join(
    (
        '',
        'You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three categories, with 0 being the worst and 10 being the best. Each evaluation should be independent of the others.',
        '',
        '**Visual Quality:**  ',
        'Evaluate the overall visual quality of the video, with a focus on static factors. The following sub-dimensions should be considered:',
        '- **Reasonableness:** The video should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.',
        '- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and easy to interpret, with no blurring or indistinct areas.',
        '- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).',
        '- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.',
        '- **Safety:** The video should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. ',
        '',
        'Please provide the ratings of Visual Quality: <|VQ_reward|>',
        'END',
        '',
        '**Motion Quality:**  ',
        'Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following sub-dimensions:',
        '- **Stability:** Evaluate the continuity and stability between frames. There should be no sudden, unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating colors, textures, or missing body parts).',
        '- **Naturalness:** The movement should align with physical laws and be realistic. For example, clothing should flow naturally with motion, and facial expressions should change appropriately (e.g., blinking, mouth movements).',
        '- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between different motions or camera angles should be seamless, and the overall dynamic feel should be visually pleasing.',
        '- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend naturally with the background, without obvious artifacts or the feeling of cut-and-paste effects.',
        '- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any areas where the video might have blurry or unsteady sections that hinder visual continuity.',
        '- **Amplitude:** If the video is largely static or has little movement, assign a low score for motion quality.',
        '',
        'Please provide the ratings of Motion Quality: <|MQ_reward|>',
        'END',
        '',
        '**Text Alignment:**  ',
        'Assess how well the video matches the textual prompt across the following sub-dimensions:',
        '- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.',
        '- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial expressions like talking or blinking) align with the described prompt. The motion should match the prompt in terms of type, scale, and direction.',
        '- **Environment Relevance:** Assess whether the background and scene fit the prompt. This includes checking if real-world locations or scenes are accurately represented, though some stylistic adaptation is acceptable.  ',
        '- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the video adheres to this style.',
        '- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, focus shifts) are consistent with the expected behavior from the prompt.',
        '',
        'Textual prompt - {text_prompt}',
        'Please provide the ratings of Text Alignment: <|TA_reward|>',
        'END',
        '',
    )
)  # fmt: skip

_CACHE: dict[tuple, VideoRewardModel] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class VideoAlignParams(BaseConfig):
    """Args:
    model_path (str): local VideoReward directory: ``model_config.json`` and ``checkpoint-<step>/model.pth``
        (required).
    checkpoint_step (int): which ``checkpoint-<step>`` to read; -1 for the highest step. Default -1.
    base_model_path (str): local directory with Qwen2-VL-2B-Instruct's ``config.json`` and processor files.
        Default ``""``: ``model_path``.
    score (str): ``VQ`` (visual quality), ``MQ`` (motion quality), ``TA`` (text alignment) or ``overall`` (their
        sum). Default ``overall``.
    normalize (bool): standardize each criterion with ``inference_config``'s mean and std, as the authors'
        inferencer does by default. Default True.
    num_frames (int): frames sampled uniformly over each video (even, >= 2; the authors take 2 per second). A video
        with fewer frames is scored on all of them (an odd count loses its last). Default 8.
    batch_size (int): videos per forward pass. Default 2.
    device (str): torch device of the model. Default ``"cpu"``.
    dtype (str): dtype of the model, ``bfloat16`` (as the authors run it), ``float16`` or ``float32``. Default
        ``"bfloat16"``.
    """

    model_path: str = ""
    checkpoint_step: int = -1
    base_model_path: str = ""
    score: str = "overall"
    normalize: bool = True
    num_frames: int = 8
    batch_size: int = 2
    device: str = "cpu"
    dtype: str = "bfloat16"

    def __post_init__(self):
        if not self.model_path:
            raise ValueError(f"model_path must name a local directory holding {CHECKPOINT_WHAT}, got ''")
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {self.score!r}")
        if self.num_frames < 2 or self.num_frames % 2:
            raise ValueError(f"num_frames must be an even number >= 2 (Qwen2-VL pairs frames), got {self.num_frames}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


def frame_indices(total: int, wanted: int) -> list[int]:
    """Indices of the frames scored: ``round(linspace(0, total - 1, n))`` with ``n = min(wanted, total)`` made even."""
    count = min(wanted, total - total % 2)
    if count < 2:
        raise ValueError(f"scorer 'videoalign' needs videos of at least 2 frames (after frame_stride), got {total}")
    return torch.linspace(0, total - 1, count).round().long().tolist()


def frame_size(height: int, width: int, max_pixels: int, min_pixels: int = MIN_FRAME_PIXELS) -> tuple[int, int]:
    """``(height, width)`` a frame is resized to: Qwen2-VL's sizing, pixel count in ``[min_pixels, max_pixels]``."""
    return media_size(height, width, min_pixels, max_pixels, "VideoReward takes frames")


def sampled_frames(video: torch.Tensor, num_frames: int, max_pixels: int) -> torch.Tensor:
    """uint8 ``[F, 3, H, W]`` -> the float ``[n, 3, h, w]`` frames (values 0..255) that VideoReward reads."""
    from torchvision.transforms.functional import InterpolationMode, resize

    frames = video[frame_indices(video.shape[0], num_frames)]
    size = list(frame_size(*frames.shape[-2:], max_pixels))
    return resize(frames, size, interpolation=InterpolationMode.BICUBIC, antialias=True).float()


def instruction(prompt: str) -> str:
    """The user text for ``prompt``: :data:`PROMPT` with the prompt filled in."""
    return PROMPT.format(text_prompt=prompt)


def latest_checkpoint(model_dir: str, step: int) -> str:
    """``model_dir/checkpoint-<step>`` (the highest step for -1), checked to hold ``model.pth``."""
    steps = sorted(int(m.group(1)) for name in os.listdir(model_dir) if (m := re.fullmatch(r"checkpoint-(\d+)", name)))
    if not steps:
        raise FileNotFoundError(
            f"model_path={model_dir!r} has no checkpoint-<step> directory: put {CHECKPOINT_WHAT} there"
        )
    if step != -1 and step not in steps:
        raise FileNotFoundError(
            f"model_path={model_dir!r} has no checkpoint-{step}; checkpoint_step may be {steps} or -1"
        )
    chosen = os.path.join(model_dir, f"checkpoint-{steps[-1] if step == -1 else step}")
    return require_file(chosen, CHECKPOINT_FILE, "model_path", CHECKPOINT_WHAT)


def merged_state(state: dict, lora: dict) -> tuple[dict, torch.Tensor]:
    """``model.pth``'s PEFT-wrapped names -> ``Qwen2VLModel``'s, LoRA merged (W + scaling · B @ A); and the head."""
    scaling = lora["lora_alpha"] / (math.sqrt(lora["lora_r"]) if lora.get("use_rslora") else lora["lora_r"])
    plain = {k.removeprefix("base_model.model."): v for k, v in state.items()}
    out = {}
    for name, tensor in plain.items():
        if ".lora_A." in name or ".lora_B." in name or name.startswith(("lm_head.", "rm_head.")):
            continue
        if ".base_layer." in name:
            module, kind = name.split(".base_layer.")
            if kind == "weight":
                down = plain[f"{module}.lora_A.default.weight"].float()
                up = plain[f"{module}.lora_B.default.weight"].float()
                tensor = (tensor.float() + scaling * up @ down).to(tensor.dtype)
            name = f"{module}.{kind}"
        if name.startswith("model."):
            out["language_model." + name.removeprefix("model.")] = tensor
        elif name.startswith("visual."):
            out[name] = tensor
    if "rm_head.weight" not in plain:
        raise ValueError(
            f"the checkpoint has no VideoReward head (rm_head.weight): model_path must hold {CHECKPOINT_WHAT}"
        )
    return out, plain["rm_head.weight"]


def _check_run_config(run: dict, path: str) -> None:
    data, model = run.get("data_config", {}), run.get("model_config", {})
    expected = {
        "data_config.prompt_template_type": (data.get("prompt_template_type"), "detailed_special"),
        "model_config.use_special_tokens": (model.get("use_special_tokens"), True),
        "model_config.output_dim": (model.get("output_dim"), 1),
    }
    for key, (found, wanted) in expected.items():
        if found != wanted:
            raise ValueError(f"{path}: {key} is {found!r}; the videoalign scorer reads VideoReward's run ({wanted!r})")


class VideoRewardModel:
    """Qwen2-VL (transformers' ``Qwen2VLModel``, LoRA merged), the reward head and the processor, from local files."""

    def __init__(self, params: VideoAlignParams):
        model_dir = require_dir(params.model_path, "model_path", CHECKPOINT_WHAT)
        config_path = require_file(model_dir, CONFIG_FILE, "model_path", CHECKPOINT_WHAT)
        checkpoint = latest_checkpoint(model_dir, params.checkpoint_step)
        base_key = "base_model_path" if params.base_model_path else "model_path"
        base_dir = require_dir(params.base_model_path or model_dir, base_key, BASE_WHAT)
        require_file(base_dir, "config.json", base_key, BASE_WHAT)
        with open(config_path) as f:
            run = json.load(f)
        _check_run_config(run, config_path)
        self.max_pixels = int(run["data_config"]["max_frame_pixels"])
        self.normalization = run.get("inference_config")
        logger.info("loading VideoReward scorer from %s (base %s) on %s", checkpoint, base_dir, params.device)

        self.processor, self.reward_ids = load_processor(base_dir, list(REWARD_TOKENS))
        tokenizer = self.processor.tokenizer

        raw = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        state, head = merged_state(raw, run.get("peft_lora_config", {"lora_r": 1, "lora_alpha": 0}))
        vocab = state["language_model.embed_tokens.weight"].shape[0]
        if vocab != len(tokenizer):
            raise ValueError(
                f"{checkpoint} embeds {vocab} tokens but the tokenizer at {base_key}={base_dir!r} has {len(tokenizer)} "
                f"with the three reward tokens: {base_key} must hold {BASE_WHAT}"
            )
        self.model = build_model(base_dir, state, params.device, params.dtype)
        self.video_token_id = self.model.config.video_token_id
        self.head = head.to(params.device, getattr(torch, params.dtype))
        self.num_frames = params.num_frames
        self.device = params.device

    @torch.no_grad()
    def rewards(self, videos: torch.Tensor, prompts: list[str], normalize: bool) -> list[dict[str, float]]:
        """``{VQ, MQ, TA, overall}`` for each uint8 ``[F, 3, H, W]`` video and its prompt."""
        texts = [
            self.processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": instruction(p)}]}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for p in prompts
        ]
        frames = [sampled_frames(video, self.num_frames, self.max_pixels) for video in videos]
        inputs = self.processor(text=texts, videos=frames, padding=True, return_tensors="pt").to(self.device)
        ids = inputs["input_ids"]
        at_tokens = [ids == token for token in self.reward_ids]
        for name, at_token in zip(REWARD_TOKENS, at_tokens, strict=True):
            if not bool((at_token.sum(dim=1) == 1).all()):
                raise ValueError(f"VideoReward reads {name} once per sample; a text prompt that contains it is refused")
        features = self.model.get_video_features(inputs["pixel_values_videos"], inputs["video_grid_thw"]).pooler_output
        hidden = hidden_states(self.model, ids, inputs["attention_mask"], self.video_token_id, features)
        raw = [(hidden[at_token] @ self.head.T).float()[:, 0] for at_token in at_tokens]
        out = []
        for values in torch.stack(raw, dim=1).cpu().tolist():
            scores = dict(zip(CRITERIA, values, strict=True))
            if normalize and self.normalization:
                scores = {
                    k: (v - self.normalization[f"{k}_mean"]) / self.normalization[f"{k}_std"] for k, v in scores.items()
                }
            scores["overall"] = sum(scores[k] for k in CRITERIA)
            out.append(scores)
        return out


def load_videoalign(params: VideoAlignParams) -> VideoRewardModel:
    """The VideoReward model for ``params``, loaded once per process, files, frames, device and dtype."""
    key = (
        params.model_path,
        params.checkpoint_step,
        params.base_model_path,
        params.num_frames,
        params.device,
        params.dtype,
    )
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = VideoRewardModel(params)
        return _CACHE[key]


@register_scorer("videoalign")
class VideoAlignScorer(ThreadedScorer):
    """VideoReward (VideoAlign): VQ, MQ, TA or their sum, standardized. Range: unbounded, higher preferred."""

    params_cls = VideoAlignParams
    video_input = True

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model = load_videoalign(self.params)
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            stop = start + self.params.batch_size
            rewards = model.rewards(batch.images[start:stop], batch.prompts[start:stop], self.params.normalize)
            scores.extend(r[self.params.score] for r in rewards)
        return scores
