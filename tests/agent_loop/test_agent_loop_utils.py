"""The agent loop's pure rules: per-row seeds, when the batched path runs, padding."""

import numpy as np
import pytest
import torch

from verl_omni.agent_loop.utils import (
    chunk_bounds,
    one_row_array,
    pad_conditioning_to,
    plan_batches,
    right_pad,
    sample_seed,
    sequence_keys,
)

KEYS = ("raw_prompt", "negative_prompt")


def rows(prompts, n, **extra):
    out = []
    for p in prompts:
        for _ in range(n):
            out.append({"agent_name": "diffusion_single_turn", "raw_prompt": [{"role": "user", "content": p}], **extra})
    return out


def plan(batch_rows, n=2, enabled=True, name="vllm_omni"):
    return plan_batches(batch_rows, n, enabled=enabled, rollout_name=name, prompt_keys=KEYS)


def test_sample_seed_depends_on_seed_step_and_row_only():
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3)
    seeds = {sample_seed(s, t, r) for s in (0, 1) for t in (0, 1) for r in (0, 1)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)


def test_batched_path_runs_when_every_group_shares_agent_and_prompt():
    result = plan(rows(["a", "b"], 2))
    assert result.batched and result.group_size == 2 and result.reason == ""


@pytest.mark.parametrize(
    ("batch_rows", "kwargs", "reason"),
    [
        (rows(["a", "b"], 2), {"enabled": False}, "enable_batched_diffusion is False"),
        (rows(["a", "b"], 2), {"n": 1}, "rollout.n=1"),
        (rows(["a", "b"], 2), {"name": "vllm"}, "rollout.name='vllm'"),
        (rows(["a"], 3), {}, "does not divide into groups of rollout.n=2"),
        (rows(["a"], 1) + rows(["b"], 1), {}, "differ in 'raw_prompt'"),
    ],
)
def test_per_sample_path_and_its_reason(batch_rows, kwargs, reason):
    result = plan(batch_rows, **kwargs)
    assert not result.batched and reason in result.reason


def test_groups_differing_in_negative_prompt_or_agent_are_not_batched():
    mixed_negative = rows(["a"], 2)
    mixed_negative[1]["negative_prompt"] = "blurry"
    assert "negative_prompt" in plan(mixed_negative).reason
    mixed_agent = rows(["a"], 2)
    mixed_agent[1]["agent_name"] = "other"
    assert "agent_name" in plan(mixed_agent).reason


def test_prompts_compare_by_content_whatever_the_container():
    as_array = rows(["a"], 2)
    as_array[1]["raw_prompt"] = np.array(as_array[1]["raw_prompt"], dtype=object)
    assert plan(as_array).batched


def test_right_pad_and_pad_conditioning_to_zero_fill_the_tail():
    stacked = right_pad([torch.ones(2, 3), torch.ones(4, 3)])
    assert stacked.shape == (2, 4, 3) and float(stacked[0, 2:].abs().sum()) == 0.0
    batch = {"prompt_embeds": stacked, "prompt_embeds_mask": right_pad([torch.ones(2), torch.ones(4)])}
    pad_conditioning_to(batch, ("prompt_embeds", "prompt_embeds_mask", "negative_prompt_embeds"), 6)
    assert batch["prompt_embeds"].shape == (2, 6, 3) and batch["prompt_embeds_mask"].sum().item() == 6


def test_pad_conditioning_to_leaves_pooled_vectors_and_pads_token_ids_with_their_mask():
    """SD3.5 / FLUX.1 record a pooled embedding [B, D] beside the token embeddings: its D is no length."""
    ids = right_pad([torch.ones(2, dtype=torch.long), torch.ones(3, dtype=torch.long)])
    batch = {
        "prompt_embeds": torch.ones(2, 5, 3),
        "pooled_prompt_embeds": torch.ones(2, 4),
        "prompt_token_ids": ids,
        "prompt_token_ids_mask": ids.clone(),
    }
    keys = tuple(batch)
    assert sequence_keys(batch, keys) == ["prompt_embeds", "prompt_token_ids", "prompt_token_ids_mask"]
    pad_conditioning_to(batch, keys, 7)
    assert batch["pooled_prompt_embeds"].shape == (2, 4)
    assert batch["prompt_embeds"].shape == (2, 7, 3) and batch["prompt_token_ids"].shape == (2, 7)
    assert batch["prompt_token_ids_mask"].shape == (2, 7)


def test_workers_batches_pad_each_sequence_to_its_own_longest():
    """Two workers' outputs of an editing model: prompt embeddings and image tokens each padded to their own
    longest over the workers (a prompt is not padded to the image's token count, nor the image's grid rows)."""
    from tensordict import TensorDict

    from verl_omni.agent_loop.utils import pad_conditioning_alike

    def worker(length: int, tokens: int, images: int) -> TensorDict:
        return TensorDict(
            {
                "prompt_embeds": torch.ones(2, length, 3),
                "prompt_embeds_mask": torch.ones(2, length, dtype=torch.long),
                "image_latents": torch.ones(2, tokens, 16),
                "image_latents_grid": torch.ones(2, images, 2, dtype=torch.long),
                "pooled_prompt_embeds": torch.ones(2, 4),
            },
            batch_size=2,
        )

    batches = [worker(5, 40, 1), worker(7, 24, 2)]
    pad_conditioning_alike(batches, tuple(batches[0].keys()))
    for batch in batches:
        assert batch["prompt_embeds"].shape == (2, 7, 3) and batch["prompt_embeds_mask"].shape == (2, 7)
        assert batch["image_latents"].shape == (2, 40, 16) and batch["image_latents_grid"].shape == (2, 2, 2)
        assert batch["pooled_prompt_embeds"].shape == (2, 4)
    assert int(batches[0]["prompt_embeds_mask"].sum()) == 10 and int(batches[0]["image_latents_grid"][:, 1].sum()) == 0
    assert torch.cat([b["image_latents"] for b in batches]).shape == (4, 40, 16)


def test_one_row_array_keeps_a_message_list_as_one_element():
    value = [{"role": "user", "content": "a"}]
    array = one_row_array(value)
    assert array.shape == (1,) and array[0] is value


@pytest.mark.parametrize(
    ("rows_", "group", "workers", "expected"),
    [
        (16, 4, 2, [(0, 8), (8, 16)]),
        (12, 4, 2, [(0, 4), (4, 12)]),
        (8, 4, 8, [(0, 4), (4, 8)]),
        (6, 4, 2, [(0, 3), (3, 6)]),
        (1, 1, 4, [(0, 1)]),
    ],
)
def test_chunks_never_cut_a_group_and_cover_every_row(rows_, group, workers, expected):
    assert chunk_bounds(rows_, group, workers) == expected
