"""Session-wide fixtures: tiny random models are built once per test session.

Importing ``verl_omni`` here would register things as a side effect; fixtures import lazily.
"""

import subprocess
import sys

import pytest
import torch


@pytest.fixture(scope="session")
def fresh_python():
    """``run(code) -> stdout``: code in a new interpreter, as a Ray or engine worker starts; fails with its stderr."""

    def run(code: str, timeout: float = 600) -> str:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    return run


@pytest.fixture(scope="session")
def tiny_qwen_image_path(tmp_path_factory):
    """Directory of a tiny random Qwen-Image (diffusers layout), built once per session with seed 0."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("qwen_image", tmp_path_factory.mktemp("tiny_qwen_image"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """``build(name, dtype="float32") -> Path``: the tiny random model ``name`` (seed 0), built once per session."""
    from verl_omni.utils.tiny_models import build_tiny_model

    built = {}

    def build(name: str, dtype: str = "float32"):
        if (name, dtype) not in built:
            built[name, dtype] = build_tiny_model(name, tmp_path_factory.mktemp(f"tiny_{name}_{dtype}"), 0, dtype)
        return built[name, dtype]

    return build


@pytest.fixture(scope="session")
def tiny_qwen_image_bf16_path(tmp_path_factory):
    """The same tiny Qwen-Image saved in bf16, like the released checkpoint (GPU engines run it in bf16)."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("qwen_image", tmp_path_factory.mktemp("tiny_qwen_image_bf16"), seed=0, dtype="bfloat16")


@pytest.fixture(scope="session")
def tiny_bagel_path(tmp_path_factory):
    """Directory of a tiny random BAGEL (checkpoint layout, fp32), built once per session with seed 0."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("bagel", tmp_path_factory.mktemp("tiny_bagel"), seed=0)


@pytest.fixture(scope="session")
def tiny_bagel_bf16_path(tmp_path_factory):
    """The same tiny BAGEL saved in bf16, as GPU engines run it."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("bagel", tmp_path_factory.mktemp("tiny_bagel_bf16"), seed=0, dtype="bfloat16")


SAMPLING_ARGS = ["--n", "2", "--steps", "4", "--size", "32", "--window", "2", "--cfg", "4.0", "--seed", "3"]


def record_batch(model_path, out_file) -> dict:
    """Sample a batch with the one-process reference (``sanity_step``) and store it with its reference numbers.

    Stores the recorded window, the sampler's log-probs, ``sanity_step``'s replayed log-probs and
    the base model's replayed means μ (no LoRA, no FSDP) for the engine to be compared against.
    """
    from diffusers import QwenImagePipeline

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler
    from verl_omni.trainer import sanity_step
    from verl_omni.workers.utils.replay import prepare_scheduler, replay_step

    args = sanity_step.parse_args(["--model-path", str(model_path), *SAMPLING_ARGS])
    pipe = QwenImagePipeline.from_pretrained(model_path)
    scheduler = FlowMatchSDEDiscreteScheduler.from_config(pipe.scheduler.config)
    prompts = [p for p in sanity_step.PROMPTS for _ in range(args.n)]
    prompt, negative = sanity_step.encode(pipe, prompts, " ")
    seeds = [args.seed * 1000 + i for i in range(len(prompts))]
    rec = sanity_step.sample_with_logprob(pipe, scheduler, prompt, negative, args, seeds)
    spec = sanity_step.sampling_spec(args).replay()
    with torch.no_grad():
        rec["sanity_log_probs"] = sanity_step.replay_log_probs(pipe.transformer, scheduler, rec, args)
        prepare_scheduler(QwenImageTrainingAdapter, scheduler, spec, rec["all_latents"].shape[2])
        means = [
            replay_step(QwenImageTrainingAdapter, pipe.transformer, scheduler, rec, j, spec, rec["vae_scale_factor"])
            for j in range(rec["all_timesteps"].shape[1])
        ]
    rec["base_prev_sample_mean"] = torch.stack([m.prev_sample_mean for m in means], dim=1)
    rec["spec"] = spec.to_dict()
    torch.save(rec, out_file)
    return rec


@pytest.fixture(scope="session")
def recorded_qwen_image_batch(tiny_qwen_image_path, tmp_path_factory):
    """``(path, dict)`` of a batch sampled from the tiny model with ``sanity_step`` (CFG 4, W=2), with reference numbers."""
    path = tmp_path_factory.mktemp("recorded") / "recorded.pt"
    return path, record_batch(tiny_qwen_image_path, path)
