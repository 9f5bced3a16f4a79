"""What the engine tests check of a replica that splits each sample over two workers (vLLM-Omni's Ulysses
``ulysses_degree``, ``rollout.ulysses_sequence_parallel_size``): it samples what the unsplit replica samples, with
the base weights and after the same LoRA push. Shared by the Qwen-Image and the diffusers-family engine tests."""

import torch

# workers of the split replica (two CPU worker processes)
SPLIT_DEGREE = 2
# the split moves only the summation order inside attention: log-probs and latents stay this close
TOLERANCE = 1e-5


def assert_split_samples_the_same(unsplit: list, split: list, what: str) -> None:
    """The split replica's samples equal the unsplit one's: log-probs and every recorded latent within
    :data:`TOLERANCE`."""
    assert len(split) == len(unsplit)
    for one, other in zip(unsplit, split, strict=True):
        log_prob_diff = float((one.rollout_log_probs - other.rollout_log_probs).abs().max())
        latents = [one.extra_fields["all_latents"], other.extra_fields["all_latents"]]
        assert latents[0].shape == latents[1].shape
        latent_diff = float((latents[0] - latents[1]).abs().max())
        print(f"{what}: split vs unsplit max |log_prob diff| = {log_prob_diff:.3e}, latents {latent_diff:.3e}")
        assert log_prob_diff <= TOLERANCE
        assert latent_diff <= TOLERANCE
        assert torch.isfinite(other.rollout_log_probs).all()


def check_split_replica(loop, unsplit_engine, split_engine, generate, lora: tuple[dict, dict]) -> None:
    """``generate(engine, request_id) -> outputs`` on both engines, with the base weights, then with ``lora``
    (``(peft_config, tensors)``) pushed to both as host tensors (the CPU weight transport), which must reach every
    worker of the split replica (a worker without it would break the equality): it binds the same modules and
    changes the samples alike. Both engines' LoRAs are removed afterwards."""
    base = generate(unsplit_engine, "split-base"), generate(split_engine, "split-base")
    assert_split_samples_the_same(*base, "base weights")
    config, tensors = lora
    try:
        bound = [loop.run(engine.load_lora_tensors(config, tensors)) for engine in (unsplit_engine, split_engine)]
        assert bound[0] == bound[1]
        adapted = generate(unsplit_engine, "split-lora"), generate(split_engine, "split-lora")
    finally:
        for engine in (unsplit_engine, split_engine):
            loop.run(engine.clear_lora())
    assert not torch.equal(adapted[1][0].diffusion_output, base[1][0].diffusion_output)
    assert_split_samples_the_same(*adapted, "after the LoRA push")
