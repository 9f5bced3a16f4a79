"""Full fine-tuning on the real parts: the whole transformer trains, syncs to the rollout in checked buckets,
and checkpoints as a diffusers transformer.

The module's own vLLM-Omni engine (CPU platform, tiny Qwen-Image, fp32), not the package's: once any module has
pushed a LoRA into an engine, vLLM-Omni keeps those layers wrapped, and a full-weight sync is refused there (the
last test shows it). A full fine-tuning FSDP2 actor (``model.lora.rank=0``, KL reference on) on a one-rank gloo
group, in this process. The buckets go the way the trainer sends them minus Ray (the actor builds each, the
engine's workers check and load it); the trainer run over Ray is ``tests/trainer/test_flowgrpo_full_ft_e2e.py``.
The collective transport of separate pools (``collective_share``) runs here over gloo: this process as actor rank
0's end of the weight group, the engine's workers as the other members, every bucket broadcast (its 2-GPU NCCL run:
``tests/workers/rollout/vllm_omni/test_collective_sync_gpu.py``).
"""

import pytest
import torch
from test_lora_sync import LOGPROB_BOUND, N, actor_batch, sample_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# a few buckets of the tiny transformer (1.3 MB, largest tensor 96 KB)
BUCKET_BYTES = 256 << 10
ADVANTAGES = torch.tensor([1.0, -1.0, 1.0, -1.0])


@pytest.fixture(scope="module")
def engine(own_engine):
    """An engine that never served a LoRA (the package's ``engine`` may have, in an earlier module)."""
    return own_engine


@pytest.fixture(scope="module")
def actor(process_group, tiny_qwen_image_path):
    from actor.actor_helpers import build_actor

    return build_actor(tiny_qwen_image_path, lora_rank=0, lr=1e-4, ppo_mini_batch_size=N, kl_beta=0.04)


@pytest.fixture(scope="module")
def spec():
    from verl_omni.pipelines.sampling import SamplingSpec

    return SamplingSpec(num_inference_steps=4, height=32, width=32, noise_level=0.7, sde_type="sde", true_cfg_scale=4.0)


def bucket(actor, plan, version, index):
    from verl_omni.workers.rollout.weight_buckets import WeightBucket

    return WeightBucket.build(version, index, len(plan), actor.engine.weight_bucket(plan, index))


def sync(loop, engine, actor, version) -> dict:
    """The trainer's sync without Ray: plan, every bucket built by the actor and loaded by the rollout, close."""
    plan = actor.engine.weight_bucket_plan(BUCKET_BYTES)
    loop.run(engine.begin_weight_sync(version, len(plan)))
    for index in range(len(plan)):
        assert loop.run(engine.load_weight_bucket(bucket(actor, plan, version, index))) > 0
    return loop.run(engine.finish_weight_sync(version))


@pytest.fixture(scope="module")
def trained(loop, engine, prompts, actor, spec):
    """One update of the full transformer on a sampled group, synced to the rollout: (group before, report)."""
    before = sample_group(loop, engine, prompts, "full-before")
    batch = actor_batch(before, ADVANTAGES)
    batch["old_log_probs"] = actor.compute_log_prob(batch, spec)
    batch["ref_prev_sample_mean"] = actor.compute_ref_prev_sample_mean(batch, spec)
    metrics = actor.update_policy(batch, spec)
    assert metrics["actor/logprob_diff_max"] <= LOGPROB_BOUND
    return before, batch, sync(loop, engine, actor, version=1)


def test_every_transformer_parameter_trains_and_the_reference_stays_the_base(actor, trained, spec):
    module = actor.engine.module
    assert all(p.requires_grad for p in module.parameters())
    optimizer = actor.engine.optimizer
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(list(module.parameters()))
    # AdamW state exists for every parameter the replay reached (a few of the tiny model's get no gradient)
    assert len(optimizer.state) > len(list(module.parameters())) // 2
    _, batch, _ = trained
    ref = actor.compute_ref_prev_sample_mean(batch, spec)
    assert torch.equal(ref, batch["ref_prev_sample_mean"]), "the frozen reference did not move"
    assert not torch.allclose(actor.infer(batch, spec)["prev_sample_mean"], ref), "the policy moved"


def test_synced_rollout_samples_with_the_trained_weights(loop, engine, prompts, actor, trained, spec):
    before, _, report = trained
    plan = actor.engine.weight_bucket_plan(BUCKET_BYTES)
    assert report["buckets"] == len(plan) > 2
    assert report["bytes"] == sum(p.numel() * p.element_size() for p in actor.engine.module.parameters())
    after = sample_group(loop, engine, prompts, "full-after")
    assert all(not torch.equal(a.diffusion_output, b.diffusion_output) for a, b in zip(before, after, strict=True))
    synced = torch.stack([o.rollout_log_probs for o in after])
    replayed = actor.compute_log_prob(actor_batch(after, torch.zeros(N)), spec)
    diff = (replayed - synced).abs().max().item()
    print(f"max |log π_actor − log π_rollout| after the full-weight sync: {diff:.2e}")
    assert diff <= LOGPROB_BOUND


def test_dropped_or_corrupted_bucket_fails_the_sync_naming_it(loop, engine, prompts, actor, trained):
    from verl_omni.workers.rollout.weight_buckets import WeightSyncError

    plan = actor.engine.weight_bucket_plan(BUCKET_BYTES)
    # bucket 1 never arrives (what a lost transfer leaves)
    loop.run(engine.begin_weight_sync(2, len(plan)))
    for index in [i for i in range(len(plan)) if i != 1]:
        loop.run(engine.load_weight_bucket(bucket(actor, plan, 2, index)))
    with pytest.raises(WeightSyncError, match=r"lost buckets \[1\]"):
        loop.run(engine.finish_weight_sync(2))
    # bucket 0 changes after the sender's checksum (what a corrupted transfer leaves): refused unloaded
    loop.run(engine.begin_weight_sync(3, len(plan)))
    corrupted = bucket(actor, plan, 3, 0)
    name = next(iter(corrupted.tensors))
    corrupted.tensors[name] = corrupted.tensors[name] + 1e-3
    with pytest.raises(WeightSyncError, match="bucket 0 of weight sync 3 is corrupted"):
        loop.run(engine.load_weight_bucket(corrupted))
    # a complete sync afterwards succeeds: the rollout is consistent with the actor again
    assert sync(loop, engine, actor, version=4)["buckets"] == len(plan)


@pytest.fixture(scope="module")
def weight_group(loop, engine):
    """The collective transport over gloo, as separate pools use it over NCCL: this process (actor rank 0's end,
    ``CollectiveSender``) and the engine's workers (through their RPC) join one group, at the same time."""
    from verl_omni.workers.rollout.collective_share import CollectiveSender

    workers = loop.run(engine.worker_count())
    sender = CollectiveSender(1 + workers, torch.device("cpu"), "127.0.0.1")
    joining = loop.submit(engine.join_weight_group(sender.group, 1))
    sender.connect()
    joining.result(600)
    return sender


def broadcast_bucket(loop, engine, sender, bucket, corrupt: bool = False) -> int:
    """One bucket's layout to the engine while ``sender`` broadcasts its buffer (the two calls in flight together);
    ``corrupt``: the staged buffer changes after its checksum was taken (what a corrupted transfer leaves)."""
    from verl_omni.workers.rollout.weight_buckets import WeightBucket

    sent = sender.stage(bucket.tensors)
    if corrupt:
        sender.staged[-1][:64] += 1
    loading = loop.submit(
        engine.load_weight_bucket(WeightBucket.broadcast_build(bucket.version, bucket.index, bucket.count, sent))
    )
    sender.send()
    return loading.result(600)


def test_broadcast_sync_over_gloo_delivers_the_actors_weights_and_refuses_a_corrupted_bucket(
    loop, engine, prompts, actor, trained, weight_group, tiny_qwen_image_path
):
    """The collective transport's path on the CPU (gloo): the rollout synced by broadcast samples exactly what it
    sampled after the host sync of the same weights, from the base weights in between; a bucket whose bytes changed
    after the sender's checksum is refused, naming it. Runs right after the host syncs left the actor's weights."""
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.workers.rollout.weight_buckets import WeightSyncError

    expected = sample_group(loop, engine, prompts, "broadcast-expected")
    plan = actor.engine.weight_bucket_plan(BUCKET_BYTES)
    loop.run(engine.begin_weight_sync(10, len(plan)))
    with pytest.raises(
        WeightSyncError, match="bucket 0 of weight sync 10: the broadcast weight buffer received is not"
    ):
        broadcast_bucket(loop, engine, weight_group, bucket(actor, plan, 10, 0), corrupt=True)
    with pytest.raises(WeightSyncError, match="failed earlier"):
        loop.run(engine.finish_weight_sync(10))

    loop.run(engine.load_weights(QwenImageTrainingAdapter.load_transformer(tiny_qwen_image_path).state_dict()))
    loop.run(engine.begin_weight_sync(11, len(plan)))
    for index in range(len(plan)):
        assert broadcast_bucket(loop, engine, weight_group, bucket(actor, plan, 11, index)) > 0
    report = loop.run(engine.finish_weight_sync(11))
    assert report["buckets"] == len(plan) and report["bytes"] >= sum(
        p.numel() * p.element_size() for p in actor.engine.module.parameters()
    )
    after = sample_group(loop, engine, prompts, "broadcast-after")
    assert all(torch.equal(a.diffusion_output, e.diffusion_output) for a, e in zip(after, expected, strict=True))
    assert all(torch.equal(a.rollout_log_probs, e.rollout_log_probs) for a, e in zip(after, expected, strict=True))


def test_checkpoint_is_a_diffusers_transformer_with_the_actors_velocity_and_resumes(
    actor, trained, spec, tiny_qwen_image_path, tmp_path
):
    from actor.actor_helpers import build_actor
    from diffusers import QwenImageTransformer2DModel

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    _, batch, _ = trained
    actor.engine.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    assert not (tmp_path / "actor" / "lora").exists()
    saved = QwenImageTransformer2DModel.from_pretrained(tmp_path / "actor" / "transformer").eval()
    vae_scale = actor.engine.vae_scale_factor
    with torch.no_grad(), actor.engine.eval_mode():
        expected = QwenImageTrainingAdapter.step_velocity(actor.engine.module, batch, 0, spec, vae_scale)
        loaded = QwenImageTrainingAdapter.step_velocity(saved, batch, 0, spec, vae_scale)
    print(f"max |v_saved − v_actor|: {(loaded - expected).abs().max().item():.2e}")
    assert torch.allclose(loaded, expected, atol=1e-6, rtol=0)

    resumed = build_actor(tiny_qwen_image_path, lora_rank=0, lr=1e-4, ppo_mini_batch_size=N, kl_beta=0.04)
    resumed.engine.load_checkpoint(str(tmp_path / "actor"))
    assert torch.equal(resumed.compute_log_prob(batch, spec), actor.compute_log_prob(batch, spec))
    # the optimizer state came back too: one more identical update keeps the two identical
    for one in (actor, resumed):
        one.update_policy(batch, spec)
    assert torch.equal(resumed.compute_log_prob(batch, spec), actor.compute_log_prob(batch, spec))


def test_loaded_weights_change_the_samples_and_the_original_weights_restore_them(
    loop, engine, prompts, trained, tiny_qwen_image_path
):
    """``engine.load_weights`` (the checked sync from a state dict): scaled attention weights change every sample,
    the base weights bring the base samples back bit for bit. Runs after ``trained`` has synced its update."""
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

    original = QwenImageTrainingAdapter.load_transformer(tiny_qwen_image_path).state_dict()
    assert loop.run(engine.load_weights(original))["params"] > 0
    base = sample_group(loop, engine, prompts, "weights-base")
    changed = {name: t * 1.5 if ".attn.to_" in name else t for name, t in original.items()}
    assert loop.run(engine.load_weights(changed))["params"] > 0
    after = sample_group(loop, engine, prompts, "weights-changed")
    assert all(not torch.equal(a.diffusion_output, b.diffusion_output) for a, b in zip(base, after, strict=True))
    loop.run(engine.load_weights(original))
    restored = sample_group(loop, engine, prompts, "weights-restored")
    assert all(torch.equal(r.diffusion_output, b.diffusion_output) for r, b in zip(restored, base, strict=True))


def test_merged_lora_sync_samples_what_the_lora_actor_computes_and_refuses_an_unknown_name(
    loop, engine, prompts, spec, process_group, tiny_qwen_image_path
):
    """``model.lora.merge``: a LoRA actor (random A and B, so the adapter moves the policy) sends its adapted linears'
    merged weights as a partial sync; the rollout, serving no adapter, then samples with the log-probs the LoRA
    actor replays (fp32, the bound of the adapter sync). A partial sync checks each name it sends instead of the
    whole transformer: a name the rollout does not know fails it. Before the last test (which serves a LoRA)."""
    from actor.actor_helpers import build_actor

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.workers.rollout.weight_buckets import WeightBucket, WeightSyncError

    original = QwenImageTrainingAdapter.load_transformer(tiny_qwen_image_path).state_dict()
    loop.run(engine.load_weights(original))
    base = sample_group(loop, engine, prompts, "merged-base")
    lora_actor = build_actor(tiny_qwen_image_path, lora_init=False, ppo_mini_batch_size=N)
    plan = lora_actor.engine.weight_bucket_plan(BUCKET_BYTES)
    names = [name for names in plan for name in names]
    # the tiny model's default LoRA targets: the eight attention linears of each of its 2 blocks
    assert len(names) == 16 and all(name.endswith(".weight") and ".attn." in name for name in names)
    loop.run(engine.begin_weight_sync(20, len(plan), complete=False))
    for index in range(len(plan)):
        loaded = loop.run(engine.load_weight_bucket(bucket(lora_actor, plan, 20, index)))
        assert loaded >= len(plan[index])
    report = loop.run(engine.finish_weight_sync(20))
    weights = dict(lora_actor.engine.module.named_parameters())
    frozen = [weights[name.replace(".weight", ".base_layer.weight")] for name in names]
    assert report["bytes"] == sum(w.numel() * w.element_size() for w in frozen)

    merged = sample_group(loop, engine, prompts, "merged-after")
    assert all(not torch.equal(m.diffusion_output, b.diffusion_output) for m, b in zip(merged, base, strict=True))
    replayed = lora_actor.compute_log_prob(actor_batch(merged, torch.zeros(N)), spec)
    diff = (replayed - torch.stack([o.rollout_log_probs for o in merged])).abs().max().item()
    print(f"max |log π_actor(LoRA) − log π_rollout(merged)|: {diff:.2e}")
    assert diff <= LOGPROB_BOUND

    unknown = {"transformer_blocks.0.attn.to_nowhere.weight": torch.zeros(2, 2)}
    loop.run(engine.begin_weight_sync(21, 1, complete=False))
    with pytest.raises(WeightSyncError, match=r"to_nowhere.weight set no rollout parameter"):
        loop.run(engine.load_weight_bucket(WeightBucket.build(21, 0, 1, unknown)))
    loop.run(engine.load_weights(original))


def test_a_rollout_that_served_a_lora_refuses_the_full_weight_sync_naming_why(loop, engine, actor, trained):
    """Last in the module: it leaves the engine with LoRA-wrapped layers. Without the refusal the sync would skip
    the wrapped layers' base weights and fail only at its end (``wrote 49 of the rollout's 61 parameters``)."""
    from peft import LoraConfig

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.workers.rollout.weight_buckets import WeightSyncError

    weights = dict(actor.engine.module.named_parameters())
    lora = {}
    for sub in ("to_q", "to_k", "to_v"):
        out_features, in_features = weights[f"transformer_blocks.0.attn.{sub}.weight"].shape
        lora[f"transformer_blocks.0.attn.{sub}.lora_A.weight"] = torch.zeros(2, in_features)
        lora[f"transformer_blocks.0.attn.{sub}.lora_B.weight"] = torch.zeros(out_features, 2)
    peft_config = LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v"]).to_dict()
    config, tensors = QwenImageTrainingAdapter.rollout_lora(lora, peft_config)
    assert loop.run(engine.load_lora_tensors(config, tensors))
    loop.run(engine.clear_lora())
    with pytest.raises(WeightSyncError, match=r"carries LoRA layers .* this engine served a LoRA before"):
        loop.run(engine.begin_weight_sync(5, 1))
