"""One Diffusion-DPO update on the real ``DiffusersFSDPEngine`` (one gloo rank, FSDP2, tiny Qwen-Image), with a peft
LoRA and with full fine-tuning: the loss the engine back-propagates is the pair formula evaluated on the engine's own
forwards, a pair's samples share their noise, the reference forward is the base model (the LoRA disabled, or the
frozen copy) without gradient, and the trained weights move.

The loss is watched, not replaced: a recorder keeps what the engine hands the algorithm's own loss and what it
returns. The LoRA starts random (not zero), so the trained policy and the reference differ from the first forward.
"""

from __future__ import annotations

import math

import pytest
import torch
from actor_helpers import build_actor
from tensordict import TensorDict

from verl_omni.algorithms.diffusion_dpo import DiffusionDPO, DiffusionDPOConfig

pytestmark = pytest.mark.slow

SIZE = 32
REWARDS = torch.tensor([0.9, 0.1, 0.2, 0.6])
GROUPS = [0, 0, 1, 1]
BETA = 200.0


class RecordingLoss:
    """The algorithm's loss, called as the engine calls it; keeps each call's inputs and result."""

    def __init__(self, loss):
        self.loss, self.calls = loss, []
        self.metric_reductions = loss.metric_reductions
        self.first_epoch_metrics = loss.first_epoch_metrics
        self.required_keys = loss.required_keys

    def replay_steps(self, num_steps):
        return self.loss.replay_steps(num_steps)

    def __call__(self, replayed, micro_batch, step):
        loss, metrics = self.loss(replayed, micro_batch, step)
        self.calls.append((replayed, micro_batch, step, loss.detach().clone()))
        return loss, metrics


@pytest.fixture(scope="module", params=[4, 0], ids=["lora", "full"])
def update(request, process_group, tiny_qwen_image_path):
    """The actor (LoRA rank ``param``, 0: full fine-tuning) after one update on two preference pairs, what the loss
    saw, the spec and the trained weights before."""
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.workers.engine.fsdp.policy_versions import trainable_shards
    from verl_omni.workers.utils.sample_mask import SAMPLE_MASK_KEY

    config = DiffusionDPOConfig(beta=BETA, num_train_steps=1)
    actor = build_actor(
        tiny_qwen_image_path,
        lora_init=False,
        lora_rank=request.param,
        lr=1e-3 if request.param == 0 else 1e-2,
        algorithm_config=config,
        ppo_mini_batch_size=2,
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=4,
    )
    engine = actor.engine
    model, cell = engine.module.config, 2 * engine.vae_scale_factor
    g = torch.Generator().manual_seed(0)
    samples = TensorDict(
        {
            "clean_latents": torch.randn(4, (SIZE // cell) ** 2, model.in_channels, generator=g),
            "prompt_embeds": torch.randn(4, 5, model.joint_attention_dim, generator=g),
            "prompt_embeds_mask": torch.ones(4, 5, dtype=torch.long),
        },
        batch_size=[4],
    )
    # the trainer's layout (RayFlowGRPOTrainer._arranged_input)
    rows = DiffusionDPO.arrange_update(REWARDS, GROUPS, config)
    batch = samples[rows.order]
    batch.update(rows.keys | {SAMPLE_MASK_KEY: rows.keep})
    spec = SamplingSpec(num_inference_steps=4, height=SIZE, width=SIZE, noise_level=0.0, true_cfg_scale=1.0)
    before = trainable_shards(engine.module)
    recorder = RecordingLoss(actor.loss_fn)
    actor.loss_fn = recorder
    metrics = actor.update_policy(batch, spec)
    return actor, recorder.calls, metrics, spec, rows, before


def test_the_pairs_arrive_whole_in_one_micro_batch_chosen_first(update):
    _, calls, _, _, rows, _ = update
    ((replayed, micro_batch, _, _),) = calls  # one micro-batch, one replayed step
    assert rows.order.tolist() == [0, 1, 3, 2]
    assert micro_batch["preference"].tolist() == [1.0, -1.0, 1.0, -1.0]
    assert replayed.velocity.shape[0] == 4


def test_a_pairs_two_samples_share_their_noise_and_sigma(update):
    _, calls, _, _, _, _ = update
    replayed = calls[0][0]
    # one σ per replayed step (the schedule's first is 1: pure noise)
    assert len(set(replayed.sigma.tolist())) == 1 and 0 < replayed.sigma[0] <= 1
    # σ·ε = x_σ − (1 − σ)·x_0 of each row: equal within a pair, different across pairs
    sigma = replayed.sigma.view(-1, 1, 1)
    scaled_noise = replayed.noisy - (1 - sigma) * replayed.clean
    torch.testing.assert_close(scaled_noise[0], scaled_noise[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(scaled_noise[2], scaled_noise[3], rtol=0, atol=1e-5)
    assert (scaled_noise[0] - scaled_noise[2]).abs().max() > 0.1 * replayed.sigma[0]


def test_the_reference_is_the_base_model_without_gradient_and_the_policy_differs(update, tiny_qwen_image_path):
    actor, calls, _, spec, _, _ = update
    replayed, micro_batch, step, _ = calls[0]
    assert replayed.velocity.requires_grad and not replayed.reference_velocity.requires_grad
    engine = actor.engine
    base = engine.adapter.build_module(tiny_qwen_image_path, dtype=torch.float32).eval()
    view = {k: micro_batch[k] for k in ("prompt_embeds", "prompt_embeds_mask")}
    view["all_latents"] = replayed.noisy[:, None]
    view["all_timesteps"] = engine.scheduler.timesteps[step].float().expand(4)[:, None]
    with torch.no_grad():
        expected = engine.adapter.step_velocity(base, view, 0, spec, engine.vae_scale_factor).float()
    torch.testing.assert_close(replayed.reference_velocity, expected, rtol=0, atol=1e-4)
    if actor.engine._is_lora:
        # a random LoRA: the trained policy is not the base model
        assert (replayed.velocity.detach() - expected).abs().max() > 1e-3
    else:
        # full fine-tuning starts from the base weights, which the frozen copy keeps
        torch.testing.assert_close(replayed.velocity.detach(), expected, rtol=0, atol=1e-4)


def test_the_loss_is_the_pair_formula_on_the_engines_forwards(update):
    _, calls, metrics, _, _, _ = update
    replayed, _, _, loss = calls[0]
    sigma = replayed.sigma.view(-1, 1, 1)
    eps = (replayed.noisy - (1 - sigma) * replayed.clean) / sigma
    target = (eps - replayed.clean).double()

    def error(velocity, row):
        return ((velocity[row].detach().double() - target[row]) ** 2).mean().item()

    expected = 0.0
    for chosen, rejected in ((0, 1), (2, 3)):
        policy_gap = error(replayed.velocity, chosen) - error(replayed.velocity, rejected)
        reference_gap = error(replayed.reference_velocity, chosen) - error(replayed.reference_velocity, rejected)
        expected += math.log1p(math.exp(BETA / 2 * (policy_gap - reference_gap))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-4)
    assert metrics["actor/dpo_loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["actor/skipped_mini_batches"] == 0


def test_one_update_moves_the_trained_weights_and_not_the_reference(update, tiny_qwen_image_path):
    from verl_omni.workers.engine.fsdp.policy_versions import trainable_shards

    actor, _, metrics, _, _, before = update
    assert 0 < metrics["actor/grad_norm"] < float("inf")
    after = trainable_shards(actor.engine.module)
    assert before and after.keys() == before.keys()
    assert max((after[k] - v).abs().max().item() for k, v in before.items()) > 0
    if actor.engine._is_lora:
        assert all("lora_" in name for name in after)
    else:
        # the frozen copy still holds the base weights
        base = actor.engine.adapter.build_module(tiny_qwen_image_path, dtype=torch.float32).state_dict()
        frozen = {
            n: getattr(p, "full_tensor", lambda p=p: p)() for n, p in actor.engine.reference_module.state_dict().items()
        }
        assert all(torch.equal(frozen[n], base[n]) for n in base)
