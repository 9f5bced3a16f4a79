"""Kept weight versions (``trainer_mode=separate_async``): a kept version computes as the weights did when kept,
and the current weights come back after the replay, also when it fails. The FSDP2 (DTensor) path runs in
``tests/trainer/test_flowgrpo_async_e2e.py``."""

from __future__ import annotations

import pytest
import torch


def lora_like(seed: int = 0) -> torch.nn.Module:
    """A frozen base and a trainable low-rank pair, as a LoRA-wrapped layer trains."""
    torch.manual_seed(seed)
    module = torch.nn.ModuleDict(
        {
            "base": torch.nn.Linear(8, 8),
            "down": torch.nn.Linear(8, 2, bias=False),
            "up": torch.nn.Linear(2, 8, bias=False),
        }
    )
    module["base"].requires_grad_(False)
    return module


def forward(module, x):
    return module["base"](x) + module["up"](module["down"](x))


def train_step(module, x) -> None:
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.5)
    forward(module, x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_kept_version_replays_its_outputs_and_the_trained_weights_come_back():
    from verl_omni.workers.engine.fsdp.policy_versions import trainable_shards, weights_of

    module, x = lora_like(), torch.randn(4, 8)
    with torch.no_grad():
        before = forward(module, x)
    kept = trainable_shards(module)
    assert set(kept) == {"down.weight", "up.weight"}, "only the trained tensors are kept"
    train_step(module, x)
    with torch.no_grad():
        trained = forward(module, x)
    assert not torch.allclose(trained, before), "the update moved the outputs"
    with weights_of(module, kept), torch.no_grad():
        assert torch.equal(forward(module, x), before)
    with torch.no_grad():
        assert torch.equal(forward(module, x), trained)
    with pytest.raises(RuntimeError, match="replay failed"), weights_of(module, kept):
        raise RuntimeError("replay failed")
    with torch.no_grad():
        assert torch.equal(forward(module, x), trained), "a failed replay leaves the trained weights"


def test_kept_weights_of_other_tensors_are_refused_naming_them():
    from verl_omni.workers.engine.fsdp.policy_versions import trainable_shards, weights_of

    module = lora_like()
    kept = trainable_shards(module)
    kept["extra.weight"] = kept.pop("up.weight")
    with pytest.raises(ValueError, match=r"missing \['up.weight'\], unexpected \['extra.weight'\]"):
        with weights_of(module, kept):
            pass
