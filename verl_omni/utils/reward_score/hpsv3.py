"""``hpsv3``: HPSv3 (Ma, Wu, Sun, Li, "HPSv3: Towards Wide-Spectrum Human Preference Score", ICCV 2025).

HPSv3 is a Qwen2-VL-7B-Instruct fine-tuned as a reward model: the prompt holds the image, an instruction naming the
criteria with the text prompt, and an added ``<|Reward|>`` token; a head (an MLP hidden -> 1024 -> 16 -> 2 with
ReLUs) maps the last hidden state at that token to ``(mu, sigma)``, the mean and spread of the uncertainty-aware
preference score the paper trains with its uncertainty-aware ranking loss. The score is ``mu``, as the authors'
inferencer reports it: unbounded (a regression output), higher is preferred.

How the score is computed follows the authors' inference code (the ``hpsv3`` package), which a test checks on a tiny
checkpoint (``tests/utils/reward_score/reference/``):

- every image is resized (PIL bicubic) to about 256·28·28 pixels, both sides multiples of 28, keeping the aspect
  ratio (Qwen2-VL's ``smart_resize`` with its lower and upper pixel bound both at that count), then goes through the
  base model's image processor (rescale, CLIP mean/std, 14-pixel patches);
- the user turn is the image followed by :data:`INSTRUCTION` with the prompt filled in and :data:`REWARD_SUFFIX`, in
  Qwen2-VL's chat template with the assistant prompt opened; batches are padded on the right;
- the language model runs without Qwen2-VL's 3-D (M-RoPE) position ids, as the authors' model calls it: every
  token, image ones included, takes its sequence index in all three rotary sections;
- the head runs in float32 on the ``<|Reward|>`` token's hidden state.

:data:`INSTRUCTION` and :data:`REWARD_SUFFIX` are the authors' text verbatim: the head reads a hidden state that
depends on every token before it, so another wording would be another model.

Files (nothing is downloaded): ``params.model_path`` holds ``HPSv3.safetensors`` as published (MizzenAI/HPSv3 on the
Hugging Face Hub); ``params.base_model_path`` (default: the same directory) holds the base model's ``config.json``
and processor files (Qwen/Qwen2-VL-7B-Instruct; its weights are not read, the HPSv3 file holds every tensor).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.local_files import require_dir, require_file
from verl_omni.utils.reward_score.qwen2_vl_reward import build_model, hidden_states, load_processor, media_size
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "HPSv3.safetensors"
REWARD_TOKEN = "<|Reward|>"
# every image is resized to about this many pixels (the authors' lower and upper bound are both this count)
IMAGE_PIXELS = 256 * 28 * 28
HEAD_LAYERS = (0, 3, 5)  # indices of the head's linear layers in the published file (ReLU, Dropout between)
DTYPES = ("float32", "bfloat16", "float16")
CHECKPOINT_WHAT = f"HPSv3's {CHECKPOINT_FILE} (MizzenAI/HPSv3 on the Hugging Face Hub)"
BASE_WHAT = "the base model's config.json and processor files (Qwen/Qwen2-VL-7B-Instruct)"

INSTRUCTION = (
    "\n"
    "You are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the worst and 10 being the best. \n"
    "\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:\n"
    "- **Reasonableness:** The image should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.\n"
    "- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. \n"
    "\n"
    "**Text Alignment:**  \n"
    "Assess how well the image matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.\n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the image adheres to this style.\n"
    "- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the image logically fit the scenario described in the prompt. The environment should support and enhance the subject without contradictions.\n"
    "- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be acceptable, but critical attributes should be preserved.\n"
    "- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in the image. The generated content should not introduce elements that conflict with or distort the original description.\n"
    "Textual prompt - {text_prompt}\n"
    "\n"
    "\n"
)  # fmt: skip
REWARD_SUFFIX = f"\nPlease provide the overall ratings of this image: {REWARD_TOKEN}\n\nEND\n"

_CACHE: dict[tuple, HpsV3Model] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class HpsV3Params(BaseConfig):
    """Args:
    model_path (str): local directory with ``HPSv3.safetensors`` (required).
    checkpoint_file (str): checkpoint file name inside ``model_path``. Default ``HPSv3.safetensors``.
    base_model_path (str): local directory with Qwen2-VL-7B-Instruct's ``config.json`` and processor files.
        Default ``""``: ``model_path``.
    batch_size (int): images per forward pass. Default 4.
    device (str): torch device of the model. Default ``"cpu"``.
    dtype (str): dtype of the Qwen2-VL model, ``bfloat16`` (as the authors run it), ``float16`` or ``float32``; the
        head always runs in float32. Default ``"bfloat16"``.
    """

    model_path: str = ""
    checkpoint_file: str = CHECKPOINT_FILE
    base_model_path: str = ""
    batch_size: int = 4
    device: str = "cpu"
    dtype: str = "bfloat16"

    def __post_init__(self):
        if not self.model_path:
            raise ValueError(f"model_path must name a local directory holding {CHECKPOINT_WHAT}, got ''")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


def resized_size(height: int, width: int) -> tuple[int, int]:
    """``(height, width)`` that HPSv3 resizes an image to: Qwen2-VL's sizing with both pixel bounds at
    :data:`IMAGE_PIXELS` (the nearest multiples of 28 whose product is close to it)."""
    return media_size(height, width, IMAGE_PIXELS, IMAGE_PIXELS, "HPSv3 takes images")


def to_pil_resized(image: torch.Tensor):
    """uint8 ``[3, H, W]`` -> the RGB PIL image HPSv3 scores (bicubic resize to :func:`resized_size`)."""
    from PIL import Image

    pil = Image.fromarray(image.permute(1, 2, 0).contiguous().cpu().numpy())
    height, width = resized_size(*image.shape[1:])
    return pil.resize((width, height), Image.BICUBIC)


class HpsV3Model:
    """Qwen2-VL (transformers' ``Qwen2VLModel``), the reward head and the processor, loaded from local files."""

    def __init__(self, params: HpsV3Params):
        from safetensors.torch import load_file

        model_dir = require_dir(params.model_path, "model_path", CHECKPOINT_WHAT)
        checkpoint = require_file(model_dir, params.checkpoint_file, "model_path", CHECKPOINT_WHAT)
        base_key = "base_model_path" if params.base_model_path else "model_path"
        base_dir = require_dir(params.base_model_path or model_dir, base_key, BASE_WHAT)
        require_file(base_dir, "config.json", base_key, BASE_WHAT)
        logger.info("loading HPSv3 scorer from %s (base %s) on %s", checkpoint, base_dir, params.device)

        self.processor, (self.reward_id,) = load_processor(base_dir, [REWARD_TOKEN])
        tokenizer = self.processor.tokenizer

        state = load_file(checkpoint)
        head_state = {k.removeprefix("rm_head."): v for k, v in state.items() if k.startswith("rm_head.")}
        if {f"{i}.weight" for i in HEAD_LAYERS} - head_state.keys():
            raise ValueError(
                f"{checkpoint} has no HPSv3 reward head (rm_head.{{0,3,5}}.weight): model_path must hold {CHECKPOINT_WHAT}"
            )
        vocab = state["model.embed_tokens.weight"].shape[0]
        if vocab != len(tokenizer):
            raise ValueError(
                f"{checkpoint} embeds {vocab} tokens but the tokenizer at {base_key}={base_dir!r} has {len(tokenizer)} "
                f"with {REWARD_TOKEN}: {base_key} must hold {BASE_WHAT}"
            )
        self.model = build_model(base_dir, _model_state(state), params.device, params.dtype)
        self.image_token_id = self.model.config.image_token_id
        self.head = _head(head_state).to(params.device).eval()
        self.device = params.device

    @torch.no_grad()
    def score(self, images: torch.Tensor, prompts: list[str]) -> list[float]:
        """``mu`` for each uint8 ``[3, H, W]`` image and its prompt."""
        texts = [
            self.processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": _instruction(p)}]}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for p in prompts
        ]
        pil_images = [to_pil_resized(image) for image in images]
        inputs = self.processor(text=texts, images=pil_images, padding=True, return_tensors="pt").to(self.device)
        ids = inputs["input_ids"]
        pixels = inputs["pixel_values"].to(self.model.visual.dtype)
        features = self.model.get_image_features(pixels, inputs["image_grid_thw"]).pooler_output
        hidden = hidden_states(self.model, ids, inputs["attention_mask"], self.image_token_id, features)
        at_reward = ids == self.reward_id
        if not bool((at_reward.sum(dim=1) == 1).all()):
            raise ValueError(f"every HPSv3 prompt must hold one {REWARD_TOKEN} token; a prompt holds it elsewhere")
        mu_sigma = self.head(hidden[at_reward].float())
        return mu_sigma[:, 0].cpu().tolist()


def _instruction(prompt: str) -> str:
    return INSTRUCTION.format(text_prompt=prompt) + REWARD_SUFFIX


def _model_state(state: dict) -> dict:
    """The published names (transformers 4.45's ``Qwen2VLForConditionalGeneration``) -> ``Qwen2VLModel``'s."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("visual."):
            out[name] = tensor
        elif name.startswith("model."):
            out["language_model." + name.removeprefix("model.")] = tensor
    return out


def _head(head_state: dict) -> torch.nn.Sequential:
    """HPSv3's head at the widths of the file: Linear, ReLU, Dropout, Linear, ReLU, Linear (float32)."""
    first, second, last = (head_state[f"{i}.weight"].shape for i in HEAD_LAYERS)
    head = torch.nn.Sequential(
        torch.nn.Linear(first[1], first[0]),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.0),
        torch.nn.Linear(second[1], second[0]),
        torch.nn.ReLU(),
        torch.nn.Linear(last[1], last[0]),
    )
    head.load_state_dict({k: v.float() for k, v in head_state.items()}, strict=True)
    return head


def load_hpsv3(params: HpsV3Params) -> HpsV3Model:
    """The HPSv3 model for ``params``, loaded once per process, files, device and dtype."""
    key = (params.model_path, params.checkpoint_file, params.base_model_path, params.device, params.dtype)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = HpsV3Model(params)
        return _CACHE[key]


@register_scorer("hpsv3")
class HpsV3Scorer(ThreadedScorer):
    """HPSv3: mu of the Qwen2-VL reward head at the <|Reward|> token. Range: unbounded, higher preferred."""

    params_cls = HpsV3Params

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model = load_hpsv3(self.params)
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            stop = start + self.params.batch_size
            scores.extend(model.score(batch.images[start:stop], batch.prompts[start:stop]))
        return scores
