"""``reward.diffusion`` config: validation errors name the full dotted key."""

import pytest
from omegaconf import OmegaConf

from verl_omni.workers.config.reward import DiffusionRewardConfig, ScorerConfig

JPEG = {"type": "jpeg_compressibility"}


def build(**node):
    return DiffusionRewardConfig.from_config(OmegaConf.create(node))


def test_builds_from_yaml_node_with_defaults():
    cfg = build(
        scorers=[
            JPEG,
            {"type": "ocr", "name": "text", "required": False, "params": {"url": "http://h/v1", "model": "m"}},
        ]
    )
    assert [s.label for s in cfg.scorers] == ["jpeg_compressibility", "text"]
    assert isinstance(cfg.scorers[1], ScorerConfig) and cfg.scorers[1].required is False
    assert (cfg.num_workers, cfg.async_reward, cfg.image_key) == (1, False, "responses")


@pytest.mark.parametrize(
    "node, message",
    [
        ({"scorers": []}, r"reward\.diffusion\.scorers must list at least one scorer"),
        (
            {"scorers": [JPEG, {"type": "pickscorex"}]},
            r"reward\.diffusion\.scorers\[1\]\.type: Unknown scorer 'pickscorex'\. Available: aesthetic, ",
        ),
        (
            {"scorers": [{"type": "jpeg_compressibility", "weight": 0}]},
            r"reward\.diffusion\.scorers\[0\]\.weight must be a finite number > 0",
        ),
        ({"scorers": [JPEG, JPEG]}, r"reward\.diffusion\.scorers\[1\]\.name 'jpeg_compressibility' is used twice"),
        (
            {"scorers": [{"type": "jpeg_compressibility", "name": "mean"}]},
            r"reward\.diffusion\.scorers\[0\]\.name 'mean' is reserved",
        ),
        (
            {"scorers": [{"type": "ocr", "params": {"url": "ftp://x", "model": "m"}}]},
            r"reward\.diffusion\.scorers\[0\]\.params\.url must be an http\(s\) URL",
        ),
        (
            {"scorers": [{"type": "pickscore", "params": {}}]},
            r"reward\.diffusion\.scorers\[0\]\.params\.model_path must name",
        ),
        (
            {"scorers": [{"type": "jpeg_compressibility", "wieght": 2}]},
            r"reward\.diffusion\.scorers\[0\]: unknown key\(s\) \['wieght'\]",
        ),
        ({"scorers": [JPEG], "num_workers": 0}, r"reward\.diffusion\.num_workers must be an integer >= 1"),
        ({"scorers": [JPEG], "num_gpus_per_worker": -1}, r"reward\.diffusion\.num_gpus_per_worker must be >= 0"),
        ({"scorers": [JPEG], "async": True}, r"reward\.diffusion: unknown key\(s\) \['async'\]"),
        (
            {"scorers": [JPEG], "resource_pool": "rm"},
            r"reward\.diffusion\.resource_pool must be one of \('own', 'actor'\)",
        ),
        (
            {"scorers": [JPEG, {"type": "image_reward", "params": {"model_path": "/m", "device": "cuda"}}]},
            r"reward\.diffusion\.scorers\[1\]\.params\.device='cuda' needs a GPU in the reward workers, but "
            r"reward\.diffusion\.num_gpus_per_worker is 0",
        ),
    ],
)
def test_invalid_config_names_the_dotted_key(node, message):
    with pytest.raises(ValueError, match=message):
        build(**node)


@pytest.mark.parametrize("resource_pool, own_gpus", [("own", 1.0), ("actor", 0.0)])
def test_a_gpu_scorer_runs_with_gpus_of_its_own_or_the_actors(resource_pool, own_gpus):
    scorer = {"type": "hpsv2", "params": {"model_path": "/m", "device": "cuda:0"}}
    cfg = build(scorers=[scorer], num_workers=2, num_gpus_per_worker=0.5, resource_pool=resource_pool)
    # the trainer adds the own GPUs to the actor's and the rollout's when it checks the cluster
    assert cfg.gpus_of_own == own_gpus


def test_missing_node_is_reported():
    with pytest.raises(ValueError, match=r"reward\.diffusion is missing"):
        DiffusionRewardConfig.from_config(None)


def test_vlm_judge_yaml_mirrors_the_params_defaults_and_composes_from_the_command_line():
    """``reward@reward.diffusion=vlm_judge`` plus the server keys, as a user types them, builds the
    judge with every other parameter at the dataclass default (the YAML cannot drift from it)."""
    from dataclasses import fields

    from verl_omni.utils.config import compose_config
    from verl_omni.utils.reward_score.vlm_judge import VlmJudgeParams

    overrides = [
        "reward@reward.diffusion=vlm_judge",
        "reward.diffusion.scorers.0.params.url=http://judge-host:8000/v1",
        "reward.diffusion.scorers.0.params.model=Qwen/Qwen2.5-VL-7B-Instruct",
    ]
    cfg = DiffusionRewardConfig.from_config(compose_config("flowgrpo_trainer", overrides).reward.diffusion)
    (judge,) = cfg.scorers
    assert (judge.type, judge.frame_stride, cfg.num_workers) == ("vlm_judge", 1, 1)
    expected = VlmJudgeParams(url="http://judge-host:8000/v1", model="Qwen/Qwen2.5-VL-7B-Instruct")
    names = {f.name for f in fields(VlmJudgeParams)} - {"_target_"}
    assert set(judge.params) == names
    assert {k: judge.params[k] for k in names} == {k: getattr(expected, k) for k in names}


def test_vlm_judge_yaml_without_a_model_is_refused_naming_the_key():
    from verl_omni.utils.config import compose_config

    node = compose_config("flowgrpo_trainer", ["reward@reward.diffusion=vlm_judge"]).reward.diffusion
    with pytest.raises(ValueError, match=r"^reward.diffusion.scorers\[0\].params.model must name the served VLM"):
        DiffusionRewardConfig.from_config(node)
