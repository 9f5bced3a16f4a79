"""Ulysses sequence parallelism in the replay (``actor.ulysses_sequence_parallel_size``): two gloo ranks, fp32.

The slow tests read one launch of ``sequence_parallel_ranks.py`` that runs a case per model (tiny Wan2.2 TI2V-5B,
T2V-A14B and I2V-A14B, tiny Qwen-Image, tiny FLUX.2-klein): the replay split over a group of 2 gives the log-probs and
LoRA gradients of two data-parallel ranks, and a checkpoint saved split resumes unsplit; and one more case, the Wan2.2
T2V-A14B with FSDP2 computing in bf16 under activation checkpointing, as on a GPU. The quick tests cover the refusals
and Qwen-Image's text padding and mask order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sequence_parallel_ranks import result_path
from two_rank_launch import run_two_ranks

HERE = Path(__file__).resolve().parent


# LoRA tensors a replayed window leaves without a non-zero gradient: Qwen-Image's last block's text-only ones
# (query and output projections of a text stream whose output the model drops); the tiny A14B's low-noise expert,
# which the window's two high-noise steps never run
UNTRAINED = {"wan2_2": 0, "qwen_image": 4, "wan2_2_a14b": 16, "flux2_klein": 0, "wan2_2_i2v_a14b": 16}


# the cases of the module's one launch: (model, FSDP2 compute precision); "default" is fp32 on the CPU
CASES = [(name, "default") for name in UNTRAINED] + [("wan2_2_a14b", "bf16")]


@pytest.fixture(scope="module")
def launched(tiny_model, tmp_path_factory):
    """The folder of the results of every case in :data:`CASES`: one two-rank launch for all of them (a launch is
    mostly its two ranks importing the stack)."""
    out = tmp_path_factory.mktemp("sequence_parallel")
    cases = [f"{name}:{compute}:{tiny_model(name)}" for name, compute in CASES]
    run_two_ranks(HERE / "sequence_parallel_ranks.py", "cpu", out, *cases)
    return out


def case_results(out, name: str, compute: str) -> dict:
    return torch.load(result_path(out, name, compute), weights_only=False)


@pytest.fixture(scope="module", params=list(UNTRAINED))
def split_and_unsplit(request, launched):
    return request.param, case_results(launched, request.param, "default")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_split_replay_gives_the_unsplit_log_probs(split_and_unsplit):
    name, results = split_and_unsplit
    for key in ("log_probs", "train_log_probs"):
        unsplit, split = results[f"{key}_1"], results[f"{key}_2"]
        assert unsplit.shape == (4, 2) and bool(torch.isfinite(unsplit).all())
        if name.startswith("wan2_2"):
            # its text is not split and every token sees the keys in the unsplit order: the same sums, bit for bit
            assert torch.equal(split, unsplit)
        else:
            # Qwen-Image's joint attention meets its keys interleaved by rank: the same terms, summed in another order
            torch.testing.assert_close(split, unsplit, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_split_replay_gives_the_unsplit_lora_gradients(split_and_unsplit):
    name, results = split_and_unsplit
    unsplit, split = results["grads_1"], results["grads_2"]
    assert unsplit.keys() == split.keys()
    assert {n for n, g in unsplit.items() if g is None} == {n for n, g in split.items() if g is None}
    reached = [n for n, g in unsplit.items() if g is not None]
    assert len([n for n in reached if unsplit[n].abs().max() > 0]) == len(unsplit) - UNTRAINED[name]
    for name in reached:
        torch.testing.assert_close(split[name], unsplit[name], rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_checkpoint_saved_split_resumes_unsplit(split_and_unsplit):
    _, results = split_and_unsplit
    moved = (results["stepped_log_probs_2"] - results["log_probs_2"]).abs().max()
    assert moved > 1e-3
    torch.testing.assert_close(results["resumed_log_probs_1"], results["stepped_log_probs_2"], rtol=0, atol=1e-5)


def assert_bf16_split_matches_unsplit(results: dict, grad_bound: float | None = 5e-2) -> None:
    """Split and unsplit replays computing in bf16 agree within its rounding: log-probs to 2e-3, each LoRA tensor's
    gradient to ``grad_bound`` of its largest entry (None: the caller bounds the gradients against an fp32 run, as
    the GPU test does), the checkpoint saved split resumes unsplit to 2e-3."""
    for key in ("log_probs", "train_log_probs"):
        assert bool(torch.isfinite(results[f"{key}_1"]).all())
        torch.testing.assert_close(results[f"{key}_2"], results[f"{key}_1"], rtol=0, atol=2e-3)
    unsplit, split = results["grads_1"], results["grads_2"]
    for param, grad in unsplit.items():
        if grad is None:
            assert split[param] is None, param
            continue
        if grad_bound is None:
            continue
        # bf16 forward and backward on the CPU: each tensor's gradient agrees to a few percent of its largest entry
        scale = grad.abs().max().clamp_min(1e-12)
        assert (split[param] - grad).abs().max() / scale < grad_bound, param
    torch.testing.assert_close(results["resumed_log_probs_1"], results["stepped_log_probs_2"], rtol=0, atol=2e-3)


@pytest.mark.slow
@pytest.mark.timeout(1800)
# the A14B meets both bf16 failures (its experts' blocks are the TI2V-5B's); the TI2V-5B's bf16 split replay, 2 min
# more of the CPU suite, runs on two GPUs in test_sequence_parallel_gpu.py
@pytest.mark.parametrize("name", ["wan2_2_a14b"])
def test_split_replay_in_bf16_on_cpu_gives_the_unsplit_log_probs_and_gradients(name, launched):
    """FSDP2 computing in bf16 with activation checkpointing on, as the GPU run does, at either degree: Wan2.2's fp32
    rotary tables, cast to bf16 for its blocks in the forward, must be cast alike in the backward's recompute; the
    A14B's low-noise expert, which no replayed step runs, must survive the backwards without gradient sync."""
    results = case_results(launched, name, "bf16")
    assert_bf16_split_matches_unsplit(results)
    trained = [g for g in results["grads_2"].values() if g is not None and g.abs().max() > 0]
    assert len(trained) == len(results["grads_2"]) - UNTRAINED[name]


# ---- refusals ---------------------------------------------------------------------------------


def test_a_model_that_cannot_split_is_refused_naming_key_model_and_degrees():
    from verl_omni.pipelines.flux.training_adapter import FluxTrainingAdapter
    from verl_omni.workers.engine.fsdp.sequence_group import check_sequence_parallel

    with pytest.raises(ValueError) as error:
        check_sequence_parallel(FluxTrainingAdapter, "/models/flux", 2, gpus_per_node=8)
    message = str(error.value)
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2" in message
    assert "FluxTrainingAdapter (/models/flux) cannot split" in message and "allowed degrees: [1]" in message


@pytest.mark.parametrize(
    ("degree", "gpus", "allowed"),
    [(4, 8, "[1, 2]"), (2, 3, "[1]")],
    ids=["more_than_the_heads", "not_dividing_the_node"],
)
def test_a_degree_must_divide_the_heads_and_the_gpus_per_node(tiny_qwen_image_path, degree, gpus, allowed):
    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter as adapter
    from verl_omni.workers.engine.fsdp.sequence_group import check_sequence_parallel

    assert adapter.attention_heads(tiny_qwen_image_path) == 2
    with pytest.raises(ValueError, match=rf"size={degree} must divide the 2 attention heads of QwenImage") as error:
        check_sequence_parallel(adapter, str(tiny_qwen_image_path), degree, gpus)
    assert f"allowed degrees: {allowed}" in str(error.value)
    # the degree the heads and the node allow passes
    check_sequence_parallel(adapter, str(tiny_qwen_image_path), 2, 2)


def test_the_actor_key_is_mirrored_into_the_engine_and_a_conflicting_engine_key_refused():
    from verl.workers.config import FSDPEngineConfig

    from verl_omni.workers.config.actor import DiffusionActorConfig

    assert DiffusionActorConfig(ulysses_sequence_parallel_size=2).engine.ulysses_sequence_parallel_size == 2
    engine = FSDPEngineConfig(strategy="fsdp2", ulysses_sequence_parallel_size=4)
    with pytest.raises(ValueError, match="set actor.ulysses_sequence_parallel_size only"):
        DiffusionActorConfig(ulysses_sequence_parallel_size=2, engine=engine)
    with pytest.raises(ValueError, match="actor.ulysses_sequence_parallel_size must be an integer >= 1"):
        DiffusionActorConfig(ulysses_sequence_parallel_size=0)


# ---- Qwen-Image's text under the split -----------------------------------------------------------


def test_joint_mask_follows_the_ranks_interleaved_text_and_image():
    from verl_omni.pipelines.qwen_image.sequence_parallel import interleave_joint_mask

    # text t0..t3 then image i0..i5, two ranks: rank 0 holds [t0 t1 | i0 i1 i2], rank 1 [t2 t3 | i3 i4 i5]
    positions = torch.arange(10)
    assert interleave_joint_mask(positions, text_local=2, degree=2).tolist() == [0, 1, 4, 5, 6, 2, 3, 7, 8, 9]


def test_text_is_padded_to_the_degree_with_masked_zeros():
    from verl_omni.pipelines.qwen_image.sequence_parallel import pad_text

    text = torch.ones(2, 5, 3)
    padded = pad_text({"encoder_hidden_states": text, "encoder_hidden_states_mask": None}, 2)
    assert padded["encoder_hidden_states"].shape == (2, 6, 3)
    assert padded["encoder_hidden_states"][:, 5].abs().sum() == 0
    assert padded["encoder_hidden_states_mask"].tolist() == [[1, 1, 1, 1, 1, 0]] * 2
    unchanged = {"encoder_hidden_states": torch.ones(2, 4, 3), "encoder_hidden_states_mask": None}
    assert pad_text(unchanged, 2) is unchanged
