"""Actor ↔ rollout on the real parts: the engine replays what vLLM-Omni sampled, and its LoRA syncs back.

One vLLM-Omni engine (CPU platform, tiny model, fp32) and one FSDP2 actor engine on a one-rank
gloo group, in this process. The rollout samples a prompt group; the actor recomputes the
recorded transitions' log-probs (the consistency the trainer relies on), takes a Flow-GRPO update,
exports its LoRA as tensors and pushes them to the rollout in memory; the rollout then samples
with the adapter, and the actor must reproduce those log-probs too.
"""

import pytest
import torch
from tensordict import TensorDict

pytestmark = pytest.mark.slow

H = W = 32
STEPS = 4
WINDOW = 2
CFG = 4.0
NOISE = 0.7
N = 4
SAMPLING = {
    "height": H,
    "width": W,
    "num_inference_steps": STEPS,
    "true_cfg_scale": CFG,
    "noise_level": NOISE,
    "sde_window_size": WINDOW,
    "seed": 11,
}
# fp32 on both sides; the two transformer implementations (vLLM-Omni's, diffusers') differ in op
# order only: measured 6.0e-8 before and 1.2e-7 after the sync on the development machine
LOGPROB_BOUND = 1e-5


@pytest.fixture(scope="module")
def actor(process_group, tiny_qwen_image_path):
    from actor.actor_helpers import build_actor

    return build_actor(tiny_qwen_image_path, ppo_mini_batch_size=N)


@pytest.fixture(scope="module")
def spec():
    from verl_omni.pipelines.sampling import SamplingSpec

    return SamplingSpec(
        num_inference_steps=STEPS, height=H, width=W, noise_level=NOISE, sde_type="sde", true_cfg_scale=CFG
    )


def sample_group(loop, engine, prompts, request_id):
    return loop.run(
        engine.engine_call(
            prompts["cat"],
            SAMPLING,
            request_id,
            num_outputs_per_prompt=N,
            negative_prompt_token_ids=prompts["negative"],
        )
    )


def actor_batch(outputs, advantages) -> TensorDict:
    """The rollout's per-sample outputs stacked into the batch the actor replays."""
    keys = ("all_latents", "all_timesteps", "prompt_embeds", "prompt_embeds_mask")
    keys += ("negative_prompt_embeds", "negative_prompt_embeds_mask")
    fields = {k: torch.stack([o.extra_fields[k] for o in outputs]) for k in keys}
    return TensorDict({**fields, "advantages": advantages}, batch_size=[len(outputs)])


def test_actor_replays_rollout_then_synced_rollout_reproduces_actor(loop, engine, prompts, actor, spec):
    # 1. the rollout samples a group; the actor (zero-initialized LoRA = base model) replays it
    before = sample_group(loop, engine, prompts, "sync-before")
    rollout_lp = torch.stack([o.rollout_log_probs for o in before])
    batch = actor_batch(before, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    actor_lp = actor.compute_log_prob(batch, spec)
    diff_before = (actor_lp - rollout_lp).abs().max().item()
    print(f"max |log π_actor − log π_rollout| before the update: {diff_before:.2e}")
    assert diff_before <= LOGPROB_BOUND

    # 2. one Flow-GRPO update moves the policy in the advantages' direction
    batch["old_log_probs"] = actor_lp
    metrics = actor.update_policy(batch, spec)
    assert metrics["actor/logprob_diff_max"] <= LOGPROB_BOUND
    moved = actor.compute_log_prob(batch, spec) - actor_lp
    assert bool((moved[batch["advantages"] > 0] > 0).all()) and bool((moved[batch["advantages"] < 0] < 0).all())

    # 3. LoRA tensors travel to the rollout in memory; the probe reports the modules they bind
    params, peft_config = actor.engine.get_per_tensor_param()
    bound = loop.run(engine.load_lora_tensors(peft_config, dict(params)))
    assert len(bound) > 0

    # 4. same seeds, new images; the actor reproduces the synced rollout's log-probs
    after = sample_group(loop, engine, prompts, "sync-after")
    assert any(not torch.equal(a.diffusion_output, b.diffusion_output) for a, b in zip(before, after, strict=True))
    synced_lp = torch.stack([o.rollout_log_probs for o in after])
    replayed = actor.compute_log_prob(actor_batch(after, torch.zeros(N)), spec)
    diff_after = (replayed - synced_lp).abs().max().item()
    print(f"max |log π_actor − log π_rollout| after the LoRA sync: {diff_after:.2e}")
    assert diff_after <= LOGPROB_BOUND


def test_lora_broadcast_over_gloo_samples_as_the_host_sync_and_a_corrupted_one_is_refused(loop, engine, prompts, actor):
    """Separate pools' transport (``collective_share``) on the CPU: this process as actor rank 0's end of the weight
    group, the engine's workers receiving. After the update above, the actor's LoRA broadcast samples bit for bit
    what the same LoRA as host tensors does; a buffer changed after its checksum is refused, the adapter kept."""
    from verl_omni.workers.rollout.collective_share import CollectiveSender

    params, peft_config = actor.engine.get_per_tensor_param()
    params = dict(params)
    loop.run(engine.load_lora_tensors(peft_config, params))
    host = sample_group(loop, engine, prompts, "lora-host")
    sender = CollectiveSender(1 + loop.run(engine.worker_count()), torch.device("cpu"), "127.0.0.1")
    joining = loop.submit(engine.join_weight_group(sender.group, 1))
    sender.connect()
    joining.result(600)

    def broadcast(corrupt: bool = False) -> list[str]:
        sent = sender.stage(params)
        if corrupt:
            sender.staged[-1][:64] += 1
        loading = loop.submit(engine.load_lora_tensors(peft_config, broadcast=sent))
        sender.send()
        return loading.result(600)

    active = engine.active_lora
    with pytest.raises(RuntimeError, match="broadcast weight buffer received is not the one sent"):
        broadcast(corrupt=True)
    assert engine.active_lora == active
    assert len(broadcast()) > 0 and engine.active_lora != active
    after = sample_group(loop, engine, prompts, "lora-broadcast")
    assert all(torch.equal(a.diffusion_output, h.diffusion_output) for a, h in zip(after, host, strict=True))
    assert all(torch.equal(a.rollout_log_probs, h.rollout_log_probs) for a, h in zip(after, host, strict=True))


def test_sync_whose_names_bind_no_module_fails_and_keeps_the_previous_adapter(loop, engine, prompts, actor):
    params, peft_config = actor.engine.get_per_tensor_param()
    renamed = {k.replace("transformer_blocks", "blocks_that_do_not_exist"): v for k, v in params}
    active = engine.active_lora
    with pytest.raises(ValueError):
        loop.run(engine.load_lora_tensors(peft_config, renamed))
    assert engine.active_lora == active
