"""One rollout-free Flow-GRPO step on Qwen-Image, in one process: the math end to end on CPU.

``python -m verl_omni.trainer.sanity_step [--model-path DIR] [--out DIR]``

What it does, each part checked and reported:
1. builds the tiny random Qwen-Image once (or loads ``--model-path``);
2. samples ``n`` images per prompt with the SDE window (diffusers transformer + the rollout's own
   :class:`~verl_omni.pipelines.recorder.RolloutRecorder`), recording the window as the engine does;
3. scores them with a stand-in reward that needs no model (mean brightness), computes
   group advantages;
4. adds a zero-initialized LoRA and replays the recorded transitions: log π_θ must equal the
   recorded log π_old (the consistency the real trainer relies on);
5. takes Flow-GRPO optimizer steps on the LoRA with the registered algorithm's loss (``algorithm=flow_grpo``,
   as the actor builds it) and checks that the log-probs of positive-advantage samples went up relative to
   negative ones;
6. writes the images and a metrics JSON under ``--out``.

The distributed trainer (``main_flowgrpo``) replaces this as the main job; this stays a quick
self-check of a checkpoint directory and of the math.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import torch

from verl_omni.algorithms import get_algorithm
from verl_omni.pipelines.qwen_image.training_adapter import PromptEmbeds, QwenImageTrainingAdapter
from verl_omni.pipelines.recorder import RolloutRecorder
from verl_omni.pipelines.rollout_request import RolloutRequest
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler, schedule_sigmas
from verl_omni.utils.image_grid import save_grid
from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.utils.replay import num_replay_steps, prepare_scheduler, replay_step

logger = logging.getLogger(__name__)

PROMPTS = ('a red apple on a table, a sign that says "OK"', "a blue boat near the beach at night")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=None, help="diffusers Qwen-Image directory (default: build the tiny one)")
    p.add_argument("--out", default="outputs/sanity_step", help="where images and metrics.json go")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (group size)")
    p.add_argument("--steps", type=int, default=6, help="denoising steps")
    p.add_argument("--size", type=int, default=64, help="image height and width")
    p.add_argument("--window", type=int, default=2, help="SDE window size W")
    p.add_argument("--noise-level", type=float, default=1.2)
    p.add_argument("--cfg", type=float, default=4.0, help="true CFG scale (1 disables)")
    p.add_argument("--updates", type=int, default=4, help="optimizer steps on the LoRA")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def resolve_model_path(model_path: str | None, out: Path) -> Path:
    if model_path is not None:
        path = Path(model_path)
        if not (path / "model_index.json").is_file():
            raise FileNotFoundError(f"--model-path {path} has no model_index.json (a diffusers pipeline directory)")
        return path
    path = out.parent / "tiny_qwen_image"
    if not (path / "model_index.json").is_file():
        from verl_omni.utils.tiny_models import build_tiny_model

        logger.info("building the tiny random Qwen-Image into %s", path)
        build_tiny_model("qwen_image", path, seed=0)
    return path


@torch.no_grad()
def encode(pipe, prompts: list[str], negative: str | None) -> tuple[PromptEmbeds, PromptEmbeds | None]:
    embeds, mask = pipe.encode_prompt(prompt=prompts, device="cpu")
    neg = None
    if negative is not None:
        n_embeds, n_mask = pipe.encode_prompt(prompt=[negative] * len(prompts), device="cpu")
        neg = PromptEmbeds(n_embeds, n_mask)
    return PromptEmbeds(embeds, mask), neg


def sampling_spec(args: argparse.Namespace) -> SamplingSpec:
    """The run's sampling settings, as the trainer's rollout would carry them."""
    return SamplingSpec(
        num_inference_steps=args.steps,
        height=args.size,
        width=args.size,
        noise_level=args.noise_level,
        true_cfg_scale=args.cfg,
        sde_window_size=args.window,
    )


@torch.no_grad()
def sample_with_logprob(pipe, scheduler, prompt, negative, args, seeds: list[int]) -> dict:
    """SDE-window sampling of one batch with the rollout's own recorder (diffusers transformer, our step)."""
    adapter = QwenImageTrainingAdapter
    # the prompt is encoded by diffusers here: the request only carries the seeds and the spec
    request = RolloutRequest.build([0], None, replace(sampling_spec(args), seeds=tuple(seeds)))
    recorder = RolloutRecorder([request], torch.device("cpu"))
    latent_channels = pipe.transformer.config.in_channels // 4
    latents = torch.cat(
        [
            pipe.prepare_latents(1, latent_channels, args.size, args.size, torch.float32, "cpu", g)
            for g in recorder.generators
        ]
    )
    lat_hw = 2 * (args.size // (pipe.vae_scale_factor * 2))
    img_shapes = adapter.img_shapes(len(seeds), lat_hw, lat_hw)
    adapter.set_timesteps(scheduler, args.steps, latents.shape[1])
    recorder.set_schedule(schedule_sigmas(scheduler), scheduler.timesteps)
    for t in recorder.loop_timesteps:
        v = adapter.predict_velocity(
            pipe.transformer, latents, t.expand(len(seeds)), prompt, img_shapes, negative, args.cfg
        )
        latents = recorder.step(v, latents)
    (recorded,) = recorder.split()
    return {
        "final_latents": latents,
        **recorded,  # all_latents [B, W+1, N, C], rollout_log_probs [B, W], all_timesteps [B, W], window_start [B]
        "vae_scale_factor": pipe.vae_scale_factor,
        **_embeds_fields(prompt, negative),
    }


def _embeds_fields(prompt: PromptEmbeds, negative: PromptEmbeds | None) -> dict:
    """The prompt embeddings as the rollout records them (a mask always, ones where diffusers gives None)."""

    def mask(p: PromptEmbeds) -> torch.Tensor:
        return p.mask if p.mask is not None else torch.ones(p.embeds.shape[:2], dtype=torch.long)

    fields = {"prompt_embeds": prompt.embeds, "prompt_embeds_mask": mask(prompt)}
    if negative is not None:
        fields |= {"negative_prompt_embeds": negative.embeds, "negative_prompt_embeds_mask": mask(negative)}
    return fields


@torch.no_grad()
def decode(pipe, latents: torch.Tensor, size: int) -> torch.Tensor:
    """Packed latents → uint8 images [B, 3, H, W]."""
    lat = pipe._unpack_latents(latents, size, size, pipe.vae_scale_factor)
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    images = pipe.vae.decode(lat * std + mean, return_dict=False)[0][:, :, 0]
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def replayed_steps(transformer, scheduler, rec, args) -> list:
    """Every recorded transition replayed (log π_θ, μ_θ and s of each sample), with grad through the transformer."""
    spec = sampling_spec(args).replay()
    adapter = QwenImageTrainingAdapter
    prepare_scheduler(adapter, scheduler, spec, rec["all_latents"].shape[2])
    steps = range(num_replay_steps(rec))
    return [replay_step(adapter, transformer, scheduler, rec, j, spec, rec["vae_scale_factor"]) for j in steps]


def replay_log_probs(transformer, scheduler, rec, args) -> torch.Tensor:
    """log π_θ of every recorded transition, ``[B, W]``, with grad through the transformer."""
    return torch.stack([step.log_prob for step in replayed_steps(transformer, scheduler, rec, args)], dim=1)


def policy_loss(loss_fn, transformer, scheduler, rec, adv, args) -> tuple[torch.Tensor, float]:
    """The algorithm's loss averaged over the recorded steps (each step's mean over the samples, as the actor
    weighs them) and its mean ``pg_loss``; log π_old is the recorded one, as with ``actor.use_rollout_log_probs``."""
    micro_batch = {loss_fn.actor_config.old_log_prob_key: rec["rollout_log_probs"], "advantages": adv}
    losses, pg_losses = [], []
    for j, replayed in enumerate(replayed_steps(transformer, scheduler, rec, args)):
        loss, metrics = loss_fn(replayed, micro_batch, j)
        losses.append(loss)
        pg_losses.append(metrics["pg_loss"])
    return torch.stack(losses).mean(), sum(pg_losses) / len(pg_losses)


def run(args: argparse.Namespace) -> dict:
    from diffusers import QwenImagePipeline
    from peft import LoraConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    pipe = QwenImagePipeline.from_pretrained(resolve_model_path(args.model_path, out))
    pipe.set_progress_bar_config(disable=True)
    scheduler = FlowMatchSDEDiscreteScheduler.from_config(pipe.scheduler.config)
    prompts = [p for p in PROMPTS for _ in range(args.n)]
    uids = [i for i in range(len(PROMPTS)) for _ in range(args.n)]
    prompt, negative = encode(pipe, prompts, " " if args.cfg > 1 else None)

    logger.info(
        "[1/4] sampling %d images (%d prompts x n=%d, %d steps)", len(prompts), len(PROMPTS), args.n, args.steps
    )
    seeds = [args.seed * 1000 + i for i in range(len(prompts))]
    rec = sample_with_logprob(pipe, scheduler, prompt, negative, args, seeds)
    images = decode(pipe, rec["final_latents"], args.size)
    scores = images.float().mean(dim=(1, 2, 3)) / 255.0  # stand-in reward: brightness
    algorithm = get_algorithm("flow_grpo")
    algorithm_config = algorithm.config_cls()
    adv = algorithm.compute_advantage(scores, uids, algorithm_config)

    logger.info("[2/4] replaying the recorded window with a zero-initialized LoRA")
    transformer = pipe.transformer
    transformer.add_adapter(
        LoraConfig(r=8, lora_alpha=8, target_modules=list(QwenImageTrainingAdapter.lora_target_modules))
    )
    with torch.no_grad():
        replayed = replay_log_probs(transformer, scheduler, rec, args)
    consistency = (replayed - rec["rollout_log_probs"]).abs().max().item()

    logger.info("[3/4] %d Flow-GRPO updates on the LoRA", args.updates)
    params = [p for p in transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    actor_config = DiffusionActorConfig(clip_ratio=0.2, use_rollout_log_probs=True)
    loss_fn = algorithm.build_loss(actor_config, algorithm_config)
    losses = []
    for _ in range(args.updates):
        opt.zero_grad()
        loss, pg_loss = policy_loss(loss_fn, transformer, scheduler, rec, adv, args)
        loss.backward()
        opt.step()
        losses.append(pg_loss)
    with torch.no_grad():
        delta = (replay_log_probs(transformer, scheduler, rec, args) - rec["rollout_log_probs"]).mean(dim=1)

    logger.info("[4/4] writing images and metrics to %s", out)
    save_grid(images, args.n, out / "samples.png")
    result = {
        "reward_mean": scores.mean().item(),
        "advantage_abs_mean": adv.abs().mean().item(),
        "logprob_consistency_max_abs": consistency,
        "pg_loss": losses,
        "logprob_delta_positive_adv": delta[adv > 0].mean().item(),
        "logprob_delta_negative_adv": delta[adv < 0].mean().item(),
        "wall_s": round(time.time() - t0, 1),
    }
    (out / "metrics.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    result = run(args)
    logger.info("result: %s", json.dumps(result))
    if result["logprob_consistency_max_abs"] > 1e-4:
        raise SystemExit(
            f"replayed log-probs differ from the recorded ones by {result['logprob_consistency_max_abs']:.2e}"
        )
    if not result["logprob_delta_positive_adv"] > result["logprob_delta_negative_adv"]:
        raise SystemExit("the Flow-GRPO update did not favour positive-advantage samples")
    logger.info(
        "sanity step passed (log-prob consistency %.1e); images in %s", result["logprob_consistency_max_abs"], args.out
    )


if __name__ == "__main__":
    main()
