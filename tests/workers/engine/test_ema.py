"""The EMA of the weights (``actor.ema_decay``, full fine-tuning) on a one-rank engine (gloo, in this process, the tiny
Qwen-Image): the rule after each optimizer step, the swap, the EMA's buckets, the checkpoint round trip, and the
refusals. The EMA of real shards (two ranks, uneven) is in ``test_ema_two_ranks.py``."""

from __future__ import annotations

import pytest
import torch
from workers.actor.actor_helpers import batch_of, build_actor

from verl_omni.workers.engine.fsdp.policy_versions import trainable_shards

pytestmark = pytest.mark.slow

DECAY = 0.75
UPDATES = 2


def _update(actor, rec, spec) -> None:
    """One optimizer step on the recorded batch (4 samples, one mini-batch)."""
    batch = batch_of(rec, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    batch["old_log_probs"] = rec["rollout_log_probs"]
    actor.update_policy(batch, spec)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


@pytest.fixture(scope="module")
def trained(process_group, tiny_qwen_image_path, recorded_qwen_image_batch):
    """A full fine-tuning actor with the EMA after ``UPDATES`` optimizer steps, and its weights before and after each."""
    from verl_omni.pipelines.sampling import SamplingSpec

    rec = recorded_qwen_image_batch[1]
    spec = SamplingSpec(**rec["spec"])
    actor = build_actor(tiny_qwen_image_path, lora_rank=0, lr=1e-3, ppo_mini_batch_size=4, ema_decay=DECAY)
    weights = [trainable_shards(actor.engine.module)]
    for _ in range(UPDATES):
        _update(actor, rec, spec)
        weights.append(trainable_shards(actor.engine.module))
    return actor, weights, rec, spec


def test_ema_is_decay_times_ema_plus_the_rest_times_the_weights_after_every_optimizer_step(trained):
    actor, weights, _, _ = trained
    assert actor.engine.optimizer_steps == UPDATES
    expected = {name: w.float().clone() for name, w in weights[0].items()}
    for step in weights[1:]:
        for name, ema in expected.items():
            ema.mul_(DECAY).add_(step[name].float(), alpha=1.0 - DECAY)
    ema = actor.engine.ema.shards
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in ema.values())
    assert _equal(ema, expected)
    # the EMA is neither the start nor the trained weights (most tensors moved)
    for other in (weights[0], weights[-1]):
        moved = sum(not torch.equal(ema[name], t) for name, t in other.items())
        assert moved > len(ema) // 2, f"only {moved} of {len(ema)} EMA tensors differ"


def test_swapping_the_ema_in_samples_it_and_restores_the_live_weights_bit_for_bit(trained):
    actor, weights, rec, spec = trained
    engine = actor.engine
    batch = batch_of(rec, torch.zeros(4))
    live_log_probs = actor.compute_log_prob(batch, spec)
    with engine.ema.swapped_in(engine.module):
        assert _equal(trainable_shards(engine.module), engine.ema.shards)
        ema_log_probs = actor.compute_log_prob(batch, spec)
    assert _equal(trainable_shards(engine.module), weights[-1])
    assert torch.equal(actor.compute_log_prob(batch, spec), live_log_probs)
    assert (ema_log_probs - live_log_probs).abs().max() > 1e-4
    with pytest.raises(RuntimeError, match="inside the block"):
        with engine.ema.swapped_in(engine.module):
            raise RuntimeError("inside the block")
    assert _equal(trainable_shards(engine.module), weights[-1])


def test_ema_buckets_carry_the_ema_under_the_live_names_and_plan(trained):
    actor, weights, _, _ = trained
    engine = actor.engine
    plan = engine.weight_bucket_plan(1 << 20)
    assert len(plan) > 1
    live, ema = {}, {}
    for index in range(len(plan)):
        live.update(engine.weight_bucket(plan, index))
        ema.update(engine.weight_bucket(plan, index, ema=True))
    assert ema.keys() == live.keys() == set(engine.module.state_dict())
    for name, tensor in ema.items():
        assert tensor.dtype == live[name].dtype and tensor.shape == live[name].shape
        assert torch.equal(tensor, engine.ema.shards[name] if name in engine.ema.shards else live[name])
    assert _equal({n: live[n] for n in weights[-1]}, weights[-1])


def test_checkpoint_exports_the_ema_for_diffusers_and_a_resume_continues_it_exactly(
    trained, tiny_qwen_image_path, tmp_path
):
    from diffusers import QwenImageTransformer2DModel

    from verl_omni.workers.engine.fsdp.checkpoint import EMA_STATE, engine_state_name

    actor, weights, rec, spec = trained
    ema = {name: t.clone() for name, t in actor.engine.ema.shards.items()}
    actor.engine.save_checkpoint(str(tmp_path), global_step=UPDATES)
    exported = QwenImageTransformer2DModel.from_pretrained(tmp_path / "transformer_ema").state_dict()
    trained_dir = QwenImageTransformer2DModel.from_pretrained(tmp_path / "transformer").state_dict()
    assert _equal(exported, ema) and _equal(trained_dir, weights[-1])
    state_file = tmp_path / engine_state_name(0, 1)
    assert _equal(torch.load(state_file, weights_only=False)[EMA_STATE]["shards"], ema)

    resumed = build_actor(tiny_qwen_image_path, lora_rank=0, lr=1e-3, ppo_mini_batch_size=4, ema_decay=DECAY)
    assert not _equal(resumed.engine.ema.shards, ema)
    resumed.engine.load_checkpoint(str(tmp_path))
    assert _equal(resumed.engine.ema.shards, ema) and _equal(trainable_shards(resumed.engine.module), weights[-1])
    # the next step averages into the restored EMA (not one restarted from the loaded weights)
    _update(resumed, rec, spec)
    after = trainable_shards(resumed.engine.module)
    expected = {name: t.mul(DECAY).add_(after[name], alpha=1.0 - DECAY) for name, t in ema.items()}
    assert _equal(resumed.engine.ema.shards, expected)

    # a checkpoint without the EMA (a run with ema_decay=0) is refused by a run that keeps one, naming the key
    state = torch.load(state_file, weights_only=False)
    del state[EMA_STATE]
    torch.save(state, state_file)
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.ema_decay=0"):
        resumed.engine.load_checkpoint(str(tmp_path))


def test_ema_with_lora_and_a_decay_outside_0_1_are_refused(process_group, tiny_qwen_image_path):
    from verl_omni.workers.config.actor import DiffusionActorConfig
    from verl_omni.workers.engine.fsdp.ema import WeightEMA

    with pytest.raises(ValueError, match=r"ema_decay > 0 .*model\.lora\.rank=0"):
        build_actor(tiny_qwen_image_path, lora_rank=4, ema_decay=0.5)
    for bad in (1.0, 1.5, -0.1, "0.9"):
        with pytest.raises(ValueError, match="actor.ema_decay"):
            DiffusionActorConfig(ema_decay=bad)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="actor.ema_decay"):
            WeightEMA(torch.nn.Linear(2, 2), bad)
