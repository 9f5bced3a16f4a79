"""Every registered algorithm, end to end on the tiny Qwen-Image without the engine: its own rollout record,
its advantage, the phases it declares and one actor update, on the CPU (fp32) and on CUDA (bf16, ``gpu``).

The algorithms come from the registry, so a new one is covered when it registers; its sampling settings are
Hydra overrides (``ALGORITHM_OVERRIDES``, the authors' recipe scaled to the tiny model) checked by the trainer's
own config validation, so an algorithm whose sampler this table does not set fails with its check's message.
The rollout is recorded the way the rollout pipeline records it (the shared ``RolloutRecorder`` over the
diffusers transformer, as ``sanity_step`` does), on the test's device.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from actor_helpers import build_actor
from tensordict import TensorDict

from verl_omni.algorithms import ALGORITHMS

pytestmark = pytest.mark.slow

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"
# the tiny run every algorithm shares: 2 prompts x 2 samples, 4 steps at 32 px, a 2-step window, a KL term
# (an algorithm refusing one of these overrides it below)
TINY_RUN = {
    "data.train_batch_size": 2,
    f"{ROLLOUT}.n": 2,
    f"{ACTOR}.ppo_mini_batch_size": 2,
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": 2,
    f"{ROLLOUT}.num_inference_steps": 4,
    f"{ROLLOUT}.height": 32,
    f"{ROLLOUT}.width": 32,
    f"{ROLLOUT}.sde_window_size": 2,
    f"{ACTOR}.kl_beta": 0.04,
}
# each algorithm's sampler (docs/guide/algorithms.md and its YAML), scaled to TINY_RUN
ALGORITHM_OVERRIDES = {
    "dance_grpo": {
        f"{ROLLOUT}.sde_type": "dance",
        f"{ROLLOUT}.same_initial_noise": "true",
        f"{ROLLOUT}.sde_window_size": 4,
        f"{ROLLOUT}.noise_level": 0.3,
    },
    "mix_grpo": {
        f"{ROLLOUT}.sde_window_schedule": "progressive",
        f"{ROLLOUT}.ode_solver": "dpmsolver++",
        f"{ROLLOUT}.ode_post_window_ratio": 0.5,
    },
    "diffusion_nft": {f"{ROLLOUT}.noise_level": 0, f"{ROLLOUT}.true_cfg_scale": 1.0, f"{ACTOR}.kl_beta": 0.0},
    "awm": {f"{ROLLOUT}.noise_level": 0, f"{ROLLOUT}.true_cfg_scale": 1.0, f"{ACTOR}.kl_beta": 0.0},
    "diffusion_dpo": {f"{ROLLOUT}.noise_level": 0, f"{ROLLOUT}.true_cfg_scale": 1.0, f"{ACTOR}.kl_beta": 0.0},
    "dgpo": {f"{ROLLOUT}.noise_level": 0, f"{ROLLOUT}.true_cfg_scale": 1.0, f"{ACTOR}.kl_beta": 0.0},
}
GROUP_SIZE = 2
# made-up rewards: within each prompt group one sample better than the other
REWARDS = (0.9, 0.1, 0.2, 0.6)
# with algorithm.drop_zero_std_groups=true: the second group's rewards are equal, so it leaves the update (its
# micro-batch keeps no row and back-propagates a zero through the algorithm's replay)
REWARDS_ONE_EQUAL_GROUP = (0.9, 0.1, 0.5, 0.5)
# metrics that are 0 when the update's first replay runs the policy the old outputs came from (one mini-batch:
# no optimizer step before it), with the tolerance of each device's compute dtype
ON_POLICY_METRICS = ("ratio_max_abs_dev", "ratio_mean_bias", "logprob_diff_max", "old_deviate_max")
ON_POLICY_ATOL = {"cpu": 1e-5, "cuda": 1e-2}


def registered_algorithms() -> list[str]:
    """Every registered algorithm except the test doubles other modules register (``test_*``)."""
    return [name for name in ALGORITHMS.names() if not name.startswith("test_")]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

    return ensure_tiny_prompts(tmp_path_factory.mktemp("prompts"))


def validated_configs(name: str, model_path, prompts, run_dir, drop_zero_std_groups: bool = False):
    """The run's validated configs for ``algorithm=<name>`` composed by Hydra, as the command line would."""
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import compose_config

    train, val = prompts
    values = {
        "actor_rollout_ref.model.path": model_path,
        "data.train_files": train,
        "data.val_files": val,
        "trainer.default_local_dir": run_dir,
        **TINY_RUN,
        **ALGORITHM_OVERRIDES.get(name, {}),
        "algorithm.drop_zero_std_groups": str(drop_zero_std_groups).lower(),
    }
    return validate_config(
        compose_config("flowgrpo_trainer", [f"algorithm={name}"] + [f"{k}={v}" for k, v in values.items()])
    )


@pytest.fixture(scope="module")
def tiny_pipeline(tiny_qwen_image_path):
    """The tiny diffusers pipeline on the CPU and the 4 prompts' embeddings (with the negative prompt's)."""
    from diffusers import QwenImagePipeline

    from verl_omni.trainer import sanity_step

    pipe = QwenImagePipeline.from_pretrained(tiny_qwen_image_path)
    prompts = [p for p in sanity_step.PROMPTS for _ in range(GROUP_SIZE)]
    prompt, negative = sanity_step.encode(pipe, prompts, " ")
    return pipe, prompt, negative


@pytest.fixture(scope="module")
def sampler(device_process_group, tiny_pipeline):
    """``(transformer, dtype)`` on the test's device in the actor's compute dtype there (CUDA: bf16)."""
    pipe = tiny_pipeline[0]
    dtype = torch.bfloat16 if device_process_group.type == "cuda" else torch.float32
    return copy.deepcopy(pipe.transformer).to(device_process_group, dtype), dtype


@torch.no_grad()
def record_rollout(pipe, transformer, dtype, prompt, negative, spec, device) -> dict[str, torch.Tensor]:
    """One rollout of the 4 samples with ``spec`` through the rollout's recorder; its record and conditioning."""
    from verl_omni.pipelines.qwen_image.training_adapter import PromptEmbeds, QwenImageTrainingAdapter
    from verl_omni.pipelines.recorder import RolloutRecorder
    from verl_omni.pipelines.rollout_request import RolloutRequest
    from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler, schedule_sigmas

    adapter = QwenImageTrainingAdapter
    size = len(REWARDS)
    seeds = tuple(7000 + i for i in range(size))
    # a group sharing its initial noise starts from its first sample's seed (as the agent loop sends it)
    noise_seeds = tuple(seeds[i - i % GROUP_SIZE] for i in range(size)) if spec.same_initial_noise else ()
    request = RolloutRequest.build([0], None, replace(spec, seeds=seeds, initial_noise_seeds=noise_seeds))
    recorder = RolloutRecorder([request], device)
    channels = transformer.config.in_channels // 4
    latents = torch.cat(
        [pipe.prepare_latents(1, channels, spec.height, spec.width, dtype, device, g) for g in recorder.generators]
    )
    lat_hw = 2 * (spec.height // (pipe.vae_scale_factor * 2))
    scheduler = FlowMatchSDEDiscreteScheduler.from_config(pipe.scheduler.config)
    adapter.set_timesteps(scheduler, spec.num_inference_steps, latents.shape[1])
    recorder.set_schedule(schedule_sigmas(scheduler, device), scheduler.timesteps)

    def on_device(p: PromptEmbeds | None) -> PromptEmbeds | None:
        if p is None:
            return None
        return PromptEmbeds(p.embeds.to(device), None if p.mask is None else p.mask.to(device))

    cond, uncond = on_device(prompt), on_device(negative if spec.uses_cfg else None)
    for t in recorder.loop_timesteps:
        velocity = adapter.predict_velocity(
            transformer,
            latents,
            t.to(device).expand(size),
            cond,
            adapter.img_shapes(size, lat_hw, lat_hw),
            uncond,
            spec.true_cfg_scale,
        )
        latents = recorder.step(velocity, latents)
    (recorded,) = recorder.split()
    return recorded | conditioning(prompt, "prompt") | (conditioning(negative, "negative_prompt") if uncond else {})


def conditioning(embeds, prefix: str) -> dict[str, torch.Tensor]:
    """The prompt's embeddings as the rollout records them (a mask always, ones where diffusers gives None)."""
    mask = embeds.mask if embeds.mask is not None else torch.ones(embeds.embeds.shape[:2], dtype=torch.long)
    return {f"{prefix}_embeds": embeds.embeds, f"{prefix}_embeds_mask": mask}


def check_sampler_invariants(recorded: dict[str, torch.Tensor], spec) -> None:
    """What the spec promises of the record: a progressive window is one window for the whole batch; a group
    sharing its initial noise starts from one latent (seen when the window opens at step 0)."""
    starts = recorded["window_start"]
    if spec.sde_window_schedule == "progressive":
        assert len(set(starts.tolist())) == 1, f"a progressive window differs between samples: {starts.tolist()}"
    if spec.same_initial_noise and spec.noise_level > 0 and bool((starts == 0).all()):
        first = recorded["all_latents"][:, 0]
        for g in range(0, len(REWARDS), GROUP_SIZE):
            assert torch.equal(first[g], first[g + 1]), "a prompt group did not share its initial noise"
        assert not torch.equal(first[0], first[GROUP_SIZE]), "two prompt groups started from the same noise"


@pytest.mark.parametrize("drop_zero_std_groups", [False, True], ids=["all_groups", "drop_zero_std_groups"])
@pytest.mark.parametrize("name", registered_algorithms())
def test_one_update_of_each_algorithm_on_its_own_rollout(
    name, drop_zero_std_groups, device_process_group, sampler, tiny_pipeline, tiny_qwen_image_path, prompts, tmp_path
):
    from verl_omni.algorithms.flow_grpo_math import zero_std_groups
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.workers.utils.replay import get_replay
    from verl_omni.workers.utils.sample_mask import SAMPLE_MASK_KEY

    device = device_process_group
    configs = validated_configs(name, tiny_qwen_image_path, prompts, tmp_path / "run", drop_zero_std_groups)
    algorithm = configs.algorithm_cls
    spec = configs.rollout.sampling_spec(adapter=QwenImageTrainingAdapter)
    pipe, prompt, negative = tiny_pipeline
    transformer, dtype = sampler
    recorded = record_rollout(pipe, transformer, dtype, prompt, negative, spec, device)
    check_sampler_invariants(recorded, spec)

    # the advantage: the algorithm's estimator on made-up rewards, prompt groups of GROUP_SIZE
    uids = [i // GROUP_SIZE for i in range(len(REWARDS))]
    rewards = torch.tensor(REWARDS_ONE_EQUAL_GROUP if drop_zero_std_groups else REWARDS)
    advantages = algorithm.compute_advantage(rewards, uids, configs.algorithm)
    assert advantages.shape == (len(REWARDS),) and bool(torch.isfinite(advantages).all())
    assert bool((advantages != 0).any()), f"{name}: made-up rewards with spread gave all-zero advantages"

    # what the trainer sends the actor: the record's trajectory, the model's conditioning, the loss's keys
    replay_keys = get_replay(algorithm.rollout_record).trajectory_keys
    replay_keys += QwenImageTrainingAdapter.required_keys(spec.uses_cfg)
    missing = [k for k in replay_keys if k not in recorded]
    assert not missing, f"{name}: the rollout recorded no {missing} (spec {spec})"
    batch = TensorDict({k: recorded[k] for k in replay_keys} | {"advantages": advantages}, batch_size=[len(REWARDS)])
    # the trainer's adv phase: the mask of the samples outside equal-reward groups
    update_keys = ()
    if configs.algorithm.drop_zero_std_groups:
        batch[SAMPLE_MASK_KEY] = ~zero_std_groups(rewards, uids)[0]
        assert batch[SAMPLE_MASK_KEY].tolist() == [True, True, False, False]
        update_keys = (SAMPLE_MASK_KEY,)
    # the trainer's layout of the update rows, for an algorithm whose loss couples samples (its mask replaces one)
    rows = algorithm.arrange_update(rewards, uids, configs.algorithm)
    if rows is not None:
        batch = batch[rows.order]
        batch.update(rows.keys | {SAMPLE_MASK_KEY: rows.keep})
        update_keys = (*rows.keys, SAMPLE_MASK_KEY)
    if algorithm.uses_log_probs:
        batch["rollout_log_probs"] = recorded["rollout_log_probs"]

    actor = build_actor(
        tiny_qwen_image_path,
        ppo_mini_batch_size=TINY_RUN[f"{ACTOR}.ppo_mini_batch_size"],
        rollout_n=TINY_RUN[f"{ROLLOUT}.n"],
        ppo_micro_batch_size_per_gpu=TINY_RUN[f"{ACTOR}.ppo_micro_batch_size_per_gpu"],
        algorithm_config=configs.algorithm,
        kl_beta=configs.actor.kl_beta,
        use_rollout_log_probs=configs.actor.use_rollout_log_probs,
    )
    phases = algorithm.phases(configs.algorithm, actor.config)
    actor_spec = spec.replay()  # what the trainer sends (meta_info["sampling_spec"])
    if phases.old_log_prob:
        old = actor.infer(batch, actor_spec)
        for output in phases.old_outputs:
            batch[f"old_{output}"] = old[output]
    if phases.reference:
        batch["ref_prev_sample_mean"] = actor.compute_ref_prev_sample_mean(batch, actor_spec)
    loss_keys = actor.loss_fn.required_keys
    assert set(loss_keys) <= set(batch.keys()), f"{name}: the declared phases left {set(loss_keys) - set(batch.keys())}"
    batch = batch.select(*dict.fromkeys(replay_keys + tuple(loss_keys) + update_keys))

    lora_before = {k: v.clone() for k, v in actor.engine.lora_state_dict().items()}
    metrics = actor.update_policy(batch, actor_spec)
    print(f"{name} on {device.type}: " + ", ".join(f"{k}={v:.3g}" for k, v in sorted(metrics.items())))

    declared = {f"actor/{k}" for k in actor.loss_fn.metric_reductions}
    assert declared <= set(metrics), f"{name}: declared metrics not reported: {declared - set(metrics)}"
    bad = {k: metrics[k] for k in declared if not math.isfinite(metrics[k])}
    assert not bad, f"{name}: non-finite metrics {bad}"
    assert 0 < metrics["actor/grad_norm"] < float("inf")
    for key in ON_POLICY_METRICS:
        if f"actor/{key}" in metrics:
            assert abs(metrics[f"actor/{key}"]) < ON_POLICY_ATOL[device.type], f"{name}: {key} off-policy"
    if drop_zero_std_groups or rows is not None:
        assert metrics["actor/skipped_mini_batches"] == 0  # one mini-batch of 4, two rows kept
    if phases.old_policy_adapter:
        # one update = one optimizer step here; the old adapter's EMA took the algorithm's decay after it
        assert metrics["actor/old_policy_decay"] == algorithm.old_policy_decay(configs.algorithm, 1)
    lora_after = actor.engine.lora_state_dict()
    moved = max((lora_after[k].float() - v.float()).abs().max().item() for k, v in lora_before.items())
    assert moved > 0, f"{name}: one update left every LoRA tensor unchanged"
