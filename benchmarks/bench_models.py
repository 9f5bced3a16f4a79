"""The models ``model_throughput.py`` benchmarks: what differs between SD3.5, FLUX.2 (dev, klein), Wan2.2 (TI2V-5B,
T2V-A14B, I2V-A14B), HunyuanVideo-1.5, LTX-2 and Qwen-Image-Edit.

One :class:`BenchModel` per model: its tiny builder and full-size random-weight directory, the two engines'
pipelines (ours and vLLM-Omni's stock one, both on random weights at full size), the sampling of the
model's recipe, how the stock engine is asked for the same samples, and the actor's replay: the full-size
transformer with the recipe's LoRA and a batch of recorded transitions shaped as the rollout records them
(``bench_replay_batches.py``; the A14B: its two experts in one module as training holds them, replay only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PROMPT = "a red cat on a chair near a window"


def source_image(size: tuple[int, int] = (768, 512)):
    """The editing benchmark's source image: random RGB pixels, 3:2 (the engines resize it to their condition area)."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.RandomState(0).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@dataclass(frozen=True)
class BenchModel:
    """A benchmarked model. ``full`` / ``tiny``: default sampling and replay settings at full size (CUDA) and in the
    smoke mode (the tiny random model on any device)."""

    name: str
    builder: str  # tiny_models builder name
    adapter: str  # the training adapter, "module:Class"
    cfg: float  # the recipe's CFG scale (classic or true CFG, the model's way)
    full: dict
    tiny: dict
    lora: tuple[int, int] | None = None  # the recipe's LoRA (rank, alpha); None: no replay part
    rollout: bool = True  # False: no rollout part (the A14B: two 28 GB experts in the engine are not benchmarked)
    # False: the stock engine does not start on this vLLM-Omni (the reason at the model's entry); ours is timed alone
    stock_starts: bool = True
    # False: the stock pipeline makes one sample a request whatever ``num_outputs_per_prompt`` says (the reason at the
    # model's entry); it is then sent N requests in a row, timed together
    stock_batches_outputs: bool = True
    # the replay's experts (A14B): one row per expert and micro-batch, each at a recorded step that expert sampled
    experts: tuple[str, ...] = ()
    # negative prompt text sent with CFG (None: none sent, the pipelines' empty negative prompt)
    negative: str | None = None
    source_images: int = 0
    # the stock engine's sampling-parameter fields beyond size, steps and count (model-specific CFG etc.)
    stock_fields: Callable[[Any], dict] = field(default=lambda args: {})

    def load_adapter(self):
        import importlib

        module, name = self.adapter.split(":")
        return getattr(importlib.import_module(module), name)

    def pipelines(self) -> tuple[str, str]:
        """Ours and stock vLLM-Omni's pipeline on random full-size weights (``random_pipelines.py``)."""
        import random_pipelines as rp

        return {
            "sd3": (rp.SD3_LOG_PROB_PIPELINE, rp.SD3_STOCK_PIPELINE),
            "wan2_2": (rp.WAN_LOG_PROB_PIPELINE, rp.WAN_STOCK_PIPELINE),
            "wan2_2_i2v_a14b": (rp.WAN_I2V_LOG_PROB_PIPELINE, rp.WAN_I2V_STOCK_PIPELINE),
            "qwen_image_edit": (rp.EDIT_LOG_PROB_PIPELINE, rp.EDIT_STOCK_PIPELINE),
            "flux2_klein": (rp.FLUX2_KLEIN_LOG_PROB_PIPELINE, rp.FLUX2_KLEIN_STOCK_PIPELINE),
            "flux2": (rp.FLUX2_LOG_PROB_PIPELINE, rp.FLUX2_STOCK_PIPELINE),
            "hunyuan_video_1_5": (rp.HYV15_LOG_PROB_PIPELINE, rp.HYV15_STOCK_PIPELINE),
            "ltx2": (rp.LTX2_LOG_PROB_PIPELINE, rp.LTX2_STOCK_PIPELINE),
        }[self.name]

    def write_full_size_dir(self, out: Path) -> Path:
        """The full-size random directory both engines start from, written once per run (the transformer's config
        only: the engines fill its weights on the device, so even FLUX.2-dev's 32 B take no disk)."""
        import random_weights as rw

        if self.name == "sd3":
            return rw.write_full_size_sd3_dir(out)
        if self.name.startswith("wan2_2"):
            return rw.write_full_size_wan_dir(out, builder=self.builder)
        if self.name.startswith("flux2"):
            return rw.write_full_size_flux2_dir(out, builder=self.builder)
        if self.name == "hunyuan_video_1_5":
            return rw.write_full_size_hunyuan_video_1_5_dir(out)
        if self.name == "ltx2":
            return rw.write_full_size_ltx2_dir(out)
        return rw.write_full_size_model_dir(out, builder=self.builder)

    def images(self) -> list | None:
        return [source_image()] if self.source_images else None

    def ours_sampling(self, args, seed: int) -> dict:
        """Our engine's sampling: the recipe's SDE window of 2 steps with noise 0.7, CFG the model's way."""
        params = {
            "height": args.height,
            "width": args.width,
            "num_inference_steps": args.steps,
            "true_cfg_scale": self.cfg,
            "noise_level": 0.7,
            "sde_window_size": 2,
            "seed": seed,
        }
        if args.frames > 1:
            params["num_frames"] = args.frames
        if args.condition_area is not None:
            params["model_kwargs"] = {"condition_area": args.condition_area}
        return params

    def stock_prompt(self) -> dict:
        prompt = {"prompt": PROMPT, "negative_prompt": "" if self.negative is None else self.negative}
        if self.source_images:
            prompt["multi_modal_data"] = {"image": source_image()}
        return prompt

    def stock_requests(self, args) -> int:
        """Requests of the stock engine for N samples: one, or N of one sample each."""
        return 1 if self.stock_batches_outputs else args.n

    def stock_params(self, args, seed: int):
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        fields = {"num_frames": args.frames} if args.frames > 1 else {}
        return OmniDiffusionSamplingParams(
            height=args.height,
            width=args.width,
            num_inference_steps=args.steps,
            num_outputs_per_prompt=args.n // self.stock_requests(args),
            seed=seed,
            **fields,
            **self.stock_fields(args),
        )


# the Wan2.2 launchers' shape (832×480, 33 frames, group 8; 10 steps here) and its smoke-mode counterpart, shared by
# the 5B and the A14B
WAN_FULL = {"height": 480, "width": 832, "frames": 33, "steps": 10, "n": 8, "micro_batches": [1, 2]}
WAN_TINY = {"height": 32, "width": 64, "frames": 5, "steps": 2, "n": 2, "micro_batches": [1, 2]}

MODELS = {
    # Flow-GRPO's SD3.5 recipe (examples/flowgrpo_trainer/run_sd3_ocr_lora.sh): 512², 10 steps, CFG 4.5 with the empty
    # negative prompt, LoRA rank 32 / alpha 64
    "sd3": BenchModel(
        name="sd3",
        builder="sd3",
        adapter="verl_omni.pipelines.sd3.training_adapter:SD3TrainingAdapter",
        cfg=4.5,
        full={"height": 512, "width": 512, "frames": 1, "steps": 10, "n": 16, "micro_batches": [1, 4, 9]},
        tiny={"height": 32, "width": 32, "frames": 1, "steps": 2, "n": 16, "micro_batches": [1, 2]},
        lora=(32, 64),
        stock_fields=lambda args: {"guidance_scale": 4.5},
    ),
    # the Wan2.2 5B launcher (examples/flowgrpo_trainer/run_wan2_2_5b_ocr_lora.sh): 832×480, 33 frames, CFG 5 with the
    # empty negative prompt, group of 8, LoRA rank 64 / alpha 128, micro-batch 1 (10 steps here, the launcher 20);
    # stock samples with vLLM-Omni's Euler scheduler as ours (its default is UniPC)
    "wan2_2": BenchModel(
        name="wan2_2",
        builder="wan2_2",
        adapter="verl_omni.pipelines.wan2_2.training_adapter:Wan22TrainingAdapter",
        cfg=5.0,
        full=WAN_FULL,
        tiny=WAN_TINY,
        lora=(64, 128),
        stock_fields=lambda args: {
            "guidance_scale": 5.0,
            "guidance_scale_provided": True,
            "extra_args": {"sample_solver": "euler"},
        },
    ),
    # the Wan2.2 A14B launcher (examples/flowgrpo_trainer/run_wan2_2_a14b_ocr_lora.sh): the 5B's recipe at the A14B's
    # CFG 4; replay only, both experts resident as the actor holds them
    "wan2_2_a14b": BenchModel(
        name="wan2_2_a14b",
        builder="wan2_2_a14b",
        adapter="verl_omni.pipelines.wan2_2.training_adapter:Wan22A14BTrainingAdapter",
        cfg=4.0,
        full=WAN_FULL,
        tiny=WAN_TINY,
        lora=(64, 128),
        rollout=False,
        experts=("transformer", "transformer_2"),
    ),
    # the Wan2.2 I2V-A14B launcher (examples/flowgrpo_trainer/run_wan2_2_i2v_a14b_vlm_judge_lora.sh): CFG 3.5, LoRA rank
    # 64 / alpha 128; the A14B's 832×480 shape at 33 frames (the launcher's 81: --frames 81). Rollout: one 3:2 source
    # image, 2 videos a request (a 14 B expert's CFG step over 2 × 14040 tokens is about a second), both engines'
    # two experts filled on the GPU (57 GB), stock sampling with vLLM-Omni's Euler scheduler as ours. Replay: both
    # experts resident, each sample's recorded source-image condition joined to its latents
    "wan2_2_i2v_a14b": BenchModel(
        name="wan2_2_i2v_a14b",
        builder="wan2_2_i2v_a14b",
        adapter="verl_omni.pipelines.wan2_2_i2v.training_adapter:Wan22I2VA14BTrainingAdapter",
        cfg=3.5,
        full={**WAN_FULL, "n": 2},
        tiny=WAN_TINY,
        lora=(64, 128),
        experts=("transformer", "transformer_2"),
        source_images=1,
        stock_fields=lambda args: {
            "guidance_scale": 3.5,
            "guidance_scale_provided": True,
            "extra_args": {"sample_solver": "euler"},
        },
    ),
    # the FLUX.2-klein 4B launcher (examples/flowgrpo_trainer/run_flux2_klein_4b_ocr_lora.sh): the step-distilled
    # checkpoint, 512², 4 steps, no CFG, LoRA rank 64 / alpha 128. Stock vLLM-Omni 0.26 does not start a klein
    # engine: its start-up warm-up sends the edit path a blank image, whose position ids it appends twice (the
    # models guide on where vLLM-Omni 0.26 differs); ours is timed alone
    "flux2_klein": BenchModel(
        name="flux2_klein",
        builder="flux2_klein_distilled",
        adapter="verl_omni.pipelines.flux2_klein.training_adapter:Flux2KleinDistilledTrainingAdapter",
        cfg=1.0,
        full={"height": 512, "width": 512, "frames": 1, "steps": 4, "n": 16, "micro_batches": [4, 8, 16]},
        tiny={"height": 32, "width": 32, "frames": 1, "steps": 2, "n": 2, "micro_batches": [1, 2]},
        lora=(64, 128),
        stock_starts=False,
    ),
    # the FLUX.2-dev launcher (examples/flowgrpo_trainer/run_flux2_dev_ocr_lora.sh): 512², embedded guidance 4, no CFG,
    # LoRA rank 64 / alpha 128, micro-batch 3 (10 steps here, the launcher 50; 4 samples a request, the launcher 24).
    # Full depth in both parts: the rollout's directory holds the transformer's config only (no weight file), the
    # engines fill the 32 B on the GPU. The stock engine's start-up warm-up sends its edit path a blank 512² image,
    # which FLUX.2-dev (unlike klein) takes; it refuses sides under 64 px, so the smoke mode samples at 64²
    "flux2": BenchModel(
        name="flux2",
        builder="flux2",
        adapter="verl_omni.pipelines.flux2.training_adapter:Flux2TrainingAdapter",
        cfg=1.0,
        full={"height": 512, "width": 512, "frames": 1, "steps": 10, "n": 4, "micro_batches": [1, 3]},
        tiny={"height": 64, "width": 64, "frames": 1, "steps": 2, "n": 2, "micro_batches": [1, 2]},
        lora=(64, 128),
        stock_fields=lambda args: {"guidance_scale": 4.0},
    ),
    # the HunyuanVideo-1.5 480p text-to-video launcher (examples/flowgrpo_trainer/run_hunyuan_video_1_5_ocr_lora.sh):
    # 480×848, CFG 6 with the empty negative prompt, LoRA rank 64 / alpha 128, micro-batch 1; here 33 frames (the
    # launcher's 121: --frames 121, ~3.4x the video tokens), 8 steps (the launcher 50) and 2 samples a request (the
    # launcher 8), so that one run stays a few minutes on one GPU. vLLM-Omni 0.26's HunyuanVideo-1.5 pipeline makes one
    # video a request (it reads no num_outputs_per_prompt): stock is sent N one-video requests in a row
    "hunyuan_video_1_5": BenchModel(
        name="hunyuan_video_1_5",
        builder="hunyuan_video_1_5",
        adapter="verl_omni.pipelines.hunyuan_video_1_5.training_adapter:HunyuanVideo15TrainingAdapter",
        cfg=6.0,
        full={"height": 480, "width": 848, "frames": 33, "steps": 8, "n": 2, "micro_batches": [1]},
        tiny={"height": 32, "width": 32, "frames": 5, "steps": 2, "n": 2, "micro_batches": [1, 2]},
        lora=(64, 128),
        stock_fields=lambda args: {"guidance_scale": 6.0, "guidance_scale_provided": True},
        stock_batches_outputs=False,
    ),
    # the LTX-2 launcher (examples/flowgrpo_trainer/run_ltx2_ocr_lora.sh): 512×768, 49 frames with their audio, video
    # CFG 3 and audio CFG 7 (the empty negative prompt here), LoRA rank 64 / alpha 128, micro-batch 1 (10 steps here,
    # the launcher 20; 4 samples a request, the launcher 8). Stock asked for the same guidance: its one-stage recipe's
    # STG, modality guidance and rescale off, as ours runs
    "ltx2": BenchModel(
        name="ltx2",
        builder="ltx2",
        adapter="verl_omni.pipelines.ltx2.training_adapter:LTX2TrainingAdapter",
        cfg=3.0,
        full={"height": 512, "width": 768, "frames": 49, "steps": 10, "n": 4, "micro_batches": [1]},
        tiny={"height": 32, "width": 32, "frames": 9, "steps": 2, "n": 2, "micro_batches": [1, 2]},
        lora=(64, 128),
        stock_fields=lambda args: {
            "extra_args": {
                "video_cfg_scale": 3.0,
                "audio_cfg_scale": 7.0,
                **{f"{m}_stg_scale": 0.0 for m in ("video", "audio")},
                **{f"{m}_modality_scale": 1.0 for m in ("video", "audio")},
                **{f"{m}_rescale_scale": 0.0 for m in ("video", "audio")},
            }
        },
    ),
    # the Qwen-Image-Edit launcher's sampling (true CFG 4 with the " " negative prompt); one 3:2 source image,
    # conditioned by both engines at the stock 1024² area (full size) or at 96×64 (the smoke mode: at 1024² the
    # tiny model's every step attends over ~16k source-image tokens, ~11 s a step on 2 CPU cores); rollout only
    "qwen_image_edit": BenchModel(
        name="qwen_image_edit",
        builder="qwen_image_edit",
        adapter="verl_omni.pipelines.qwen_image_edit.training_adapter:QwenImageEditTrainingAdapter",
        cfg=4.0,
        full={"height": 512, "width": 512, "frames": 1, "steps": 10, "n": 4, "micro_batches": []},
        tiny={
            "height": 32,
            "width": 32,
            "frames": 1,
            "steps": 2,
            "n": 2,
            "micro_batches": [],
            "condition_area": 96 * 64,
        },
        negative=" ",
        source_images=1,
        stock_fields=lambda args: {"true_cfg_scale": 4.0},
    ),
}


# -- replay: the actor's unit of work (one recorded transition, CFG's two passes, SDE step, log-prob, backward) --


# the full-size transformer of each replayed model: (diffusers class, ``random_weights`` config)
FULL_SIZE_TRANSFORMER = {
    "sd3": ("SD3Transformer2DModel", "SD35_MEDIUM_TRANSFORMER"),
    "wan2_2": ("WanTransformer3DModel", "WAN22_TI2V_5B_TRANSFORMER"),
    "wan2_2_a14b": ("WanTransformer3DModel", "WAN22_T2V_A14B_TRANSFORMER"),
    "wan2_2_i2v_a14b": ("WanTransformer3DModel", "WAN22_I2V_A14B_TRANSFORMER"),
    "flux2_klein": ("Flux2Transformer2DModel", "FLUX2_KLEIN_4B_TRANSFORMER"),
    "flux2": ("Flux2Transformer2DModel", "FLUX2_DEV_TRANSFORMER"),
    "hunyuan_video_1_5": ("HunyuanVideo15Transformer3DModel", "HYV15_480P_T2V_TRANSFORMER"),
    "ltx2": ("LTX2VideoTransformer3DModel", "LTX2_TRANSFORMER"),
}


def full_size_transformer(model: BenchModel, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The released architecture with its released text width and :func:`random_weights.fill_random_` weights, built
    in ``dtype`` on ``device`` (made in fp32 first, a 14 B expert would need 56 GB before its cast; on ``meta``, which
    holds no values, shapes only: the FLOP count's)."""
    import diffusers
    import random_weights as rw

    cls_name, config_name = FULL_SIZE_TRANSFORMER[model.name]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            module = getattr(diffusers, cls_name)(**getattr(rw, config_name)).to(dtype)
    finally:
        torch.set_default_dtype(previous)
    if device.type != "meta":
        rw.fill_random_(module)
    return module


def build_replay_model(
    model: BenchModel,
    args,
    model_path: Path,
    device: torch.device,
    dtype: torch.dtype,
    split: Callable[[torch.nn.Module], None] | None = None,
):
    """The trained module (the A14B: both experts in ``WanExperts``, as training builds it) with the recipe's LoRA on
    the adapter's targets and gradient checkpointing (the engine's default); at full size the released
    architecture, random weights. ``split``: called on the bare module before checkpointing and LoRA, where the
    engine splits its sequence over a sequence-parallel group."""
    from peft import LoraConfig

    adapter = model.load_adapter()
    if args.full_size:
        if model.experts:
            from verl_omni.pipelines.wan2_2.experts import WanExperts

            module = WanExperts(*(full_size_transformer(model, device, dtype) for _ in model.experts))
        else:
            module = full_size_transformer(model, device, dtype)
    else:
        module = adapter.build_module(model_path, dtype=dtype).to(device)
    if split is not None:
        split(module)
    if not args.no_gradient_checkpointing:
        module.enable_gradient_checkpointing()
    module.requires_grad_(False)
    rank, alpha = model.lora
    # the engine's LoRA: the adapter's targets less its exclusions (HunyuanVideo-1.5's token refiner)
    targets = list(adapter.lora_target_modules)
    module.add_adapter(
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, exclude_modules=adapter.lora_exclude_modules)
    )
    for param in module.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    return module


# prompt tokens of a replayed sample: SD3's CLIP 77 + T5 256 (the rollout pipeline's max_sequence_length); FLUX.2's
# templated prompt padded to 512; Wan's real UMT5 tokens of a short prompt (the adapter pads them to 512 with zeros, so
# the attention cost is the 512's); HunyuanVideo-1.5's 1000 masked Qwen2.5-VL tokens; LTX-2's 1024 connector tokens
REPLAY_TEXT_LEN = {
    "sd3": 77 + 256,
    "wan2_2": 32,
    "wan2_2_a14b": 32,
    "wan2_2_i2v_a14b": 32,
    "flux2_klein": 512,
    "flux2": 512,
    "hunyuan_video_1_5": 1000,
    "ltx2": 1024,
}
# pixels per latent cell at full size (the tiny models read theirs from the VAE config; the A14B's Wan2.1 VAE: 8)
FULL_SIZE_VAE_SCALE = {
    "sd3": 8,
    "wan2_2": 16,
    "wan2_2_a14b": 8,
    "wan2_2_i2v_a14b": 8,
    "flux2_klein": 8,
    "flux2": 8,
    "hunyuan_video_1_5": 16,
    "ltx2": 32,
}
