"""``main_flowgrpo`` config: bad values fail before Ray starts, naming the key; the YAML tree stays documented and generated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CONFIG_DIR = Path(__file__).resolve().parents[2] / "verl_omni" / "trainer" / "config"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

    return ensure_tiny_prompts(tmp_path_factory.mktemp("prompts"))


@pytest.fixture
def compose(tiny_qwen_image_path, prompts, tmp_path):
    """The trainer config on the session's tiny model and prompts, plus ``overrides``."""
    from verl_omni.utils.config import compose_config

    def build(*overrides: str, model=tiny_qwen_image_path):
        train, val = prompts
        base = [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ]
        return compose_config("flowgrpo_trainer", base + list(overrides))

    return build


def test_default_config_validates(compose):
    from verl_omni.trainer.config.validation import validate_config

    configs = validate_config(compose())
    # one optimizer step over the whole batch: all 4 prompts (verl's unit), each with its rollout.n samples
    assert configs.actor.ppo_mini_batch_size == 4 and configs.actor.rollout_n == configs.rollout.n
    assert configs.actor.mini_batch_samples == 4 * configs.rollout.n
    assert configs.reward.scorers[0].type == "brightness"
    assert configs.actor.engine.strategy == "fsdp2"


BAD_CONFIGS = [
    (["actor_rollout_ref.model.path=/nonexistent/model"], "actor_rollout_ref.model"),
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
    (
        ["actor_rollout_ref.actor.ppo_mini_batch_size=3"],
        r"actor_rollout_ref.actor.ppo_mini_batch_size=3 counts prompts",
    ),
    (["actor_rollout_ref.actor.rollout_n=2"], "actor_rollout_ref.actor.rollout_n=2 must equal"),
    (["trainer.n_gpus_per_node=3"], "ppo_mini_batch_size"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], "ppo_micro_batch_size_per_gpu"),
    (["reward.diffusion.scorers=[{type: sharpness}]"], r"reward.diffusion.scorers\[0\].type"),
    (["reward.reward_manager.name=naive"], "reward.reward_manager.name"),
    (["algorithm.name=no_such_algorithm"], "algorithm.name"),
    (["+algorithm.ratio_norm=true"], "algorithm.ratio_norm"),
    (["algorithm=grpo_guard", "+algorithm.ratio_nrom=false"], "algorithm.ratio_nrom"),
    (
        ["algorithm=grpo_guard", "actor_rollout_ref.rollout.sde_type=cps", "actor_rollout_ref.rollout.noise_level=0.7"],
        "actor_rollout_ref.rollout.sde_type",
    ),
    (["algorithm=grpo_guard", "actor_rollout_ref.actor.use_rollout_log_probs=true"], "use_rollout_log_probs=false"),
    (["actor_rollout_ref.model.lora.rank=0", "actor_rollout_ref.model.lora.merge=true"], "model.lora.merge=false"),
    (["actor_rollout_ref.model.gradient_checkpointing_fraction=0"], "enable_gradient_checkpointing=false"),
    (["actor_rollout_ref.model.gradient_checkpointing_fraction=1.5"], r"gradient_checkpointing_fraction .* got 1.5"),
    (
        [
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            "actor_rollout_ref.model.gradient_checkpointing_fraction=0.5",
        ],
        "set it true, or leave the fraction 1.0",
    ),
    (["actor_rollout_ref.model.compile_dynamic=auto"], "model.compile_dynamic must be true or false"),
    (
        ["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=0"],
        "checkpoint_engine.update_weights_bucket_megabytes",
    ),
    (["data.train_files=/nonexistent/train.parquet"], "data.train_files"),
    (["trainer.logger=[console,nowhere]"], "trainer.logger"),
    (["trainer.resume_mode=resume_path"], "trainer.resume_from_path"),
    (["actor_rollout_ref.rollout.height=40"], "actor_rollout_ref.rollout.height"),
    (["actor_rollout_ref.actor.engine.strategy=fsdp"], "actor.engine.strategy"),
    (["data.train_batch_size=0"], "data.train_batch_size"),
    (["+actor_rollout_ref.rollout.model_kwargs.timestep_shift=2.0"], "actor_rollout_ref.rollout.model_kwargs"),
    (["trainer.trainer_mode=async"], "trainer.trainer_mode"),
    (["trainer.max_staleness=0"], "trainer.max_staleness"),
    (["trainer.trainer_mode=separate_async", "trainer.max_staleness=-1"], "trainer.max_staleness must be an integer"),
    (["trainer.trainer_mode=separate_async", "trainer.max_staleness=1.5"], r"trainer.max_staleness must be .* got 1.5"),
    (
        ["trainer.trainer_mode=separate_async", "algorithm=diffusion_nft"],
        "trainer.trainer_mode=separate_async needs an algorithm",
    ),
    (["trainer.trainer_mode=separate_async", "trainer.colocate_rollout=true"], "trainer.colocate_rollout=false"),
    (["trainer.trainer_mode=separate_async"], "use_rollout_log_probs=true"),
    (["actor_rollout_ref.actor.rollout_log_prob_check_freq=-1"], "actor.rollout_log_prob_check_freq"),
    # more rows of a group than the group has (rollout.n)
    (
        ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.rollout_log_prob_check_per_prompt=5"],
        "actor.rollout_log_prob_check_per_prompt must be an integer in .0, rollout.n = 4.",
    ),
    (["actor_rollout_ref.actor.rollout_correction.loss_type=reinforce"], "set actor.use_rollout_log_probs=true"),
    (
        [
            "actor_rollout_ref.actor.use_rollout_log_probs=true",
            "actor_rollout_ref.actor.rollout_correction.loss_type=tis",
        ],
        "actor.rollout_correction.loss_type must be one of",
    ),
    (
        [
            "actor_rollout_ref.actor.use_rollout_log_probs=true",
            "actor_rollout_ref.actor.rollout_correction.loss_type=reinforce",
            "actor_rollout_ref.actor.rollout_correction.rollout_is_threshold=0.5",
        ],
        "actor.rollout_correction.rollout_is_threshold must be >= 1",
    ),
    (
        [
            "algorithm=diffusion_nft",
            "actor_rollout_ref.actor.use_rollout_log_probs=true",
            "actor_rollout_ref.actor.rollout_correction.loss_type=reinforce",
        ],
        "algorithm=diffusion_nft's loss reads no log-probs",
    ),
    (["actor_rollout_ref.actor.infer_micro_batch_size_per_gpu=-4"], "actor.infer_micro_batch_size_per_gpu"),
    (["actor_rollout_ref.actor.ema_decay=0.9"], r"actor.ema_decay=0.9 .*model.lora.rank=\d+ trains a LoRA"),
    (["actor_rollout_ref.model.lora.rank=0", "actor_rollout_ref.actor.ema_decay=1.0"], "actor.ema_decay must be 0"),
    (["actor_rollout_ref.model.lora.rank=0", "actor_rollout_ref.actor.ema_decay=-0.5"], "actor.ema_decay must be 0"),
    (["actor_rollout_ref.rollout.weight_transport=nccl"], "rollout.weight_transport must be one of"),
    (
        ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "trainer.n_gpus_per_node=4"],
        r"actor.ulysses_sequence_parallel_size=4 must divide the 2 attention heads .* allowed degrees: \[1, 2\]",
    ),
    (
        ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
        r"ulysses_sequence_parallel_size=2 must divide .* the 1 GPUs per node .* allowed degrees: \[1\]",
    ),
    (["actor_rollout_ref.rollout.ulysses_sequence_parallel_size=0"], "rollout.ulysses_sequence_parallel_size must be"),
    (
        ["+actor_rollout_ref.rollout.engine_kwargs.vllm_omni.ulysses_degree=2"],
        "set actor_rollout_ref.rollout.ulysses_sequence_parallel_size instead",
    ),
    (
        ["actor_rollout_ref.rollout.weight_transport=ipc", "trainer.colocate_rollout=false"],
        "rollout.weight_transport=ipc needs the rollout colocated on CUDA",
    ),
    (
        ["actor_rollout_ref.rollout.weight_transport=collective", "trainer.colocate_rollout=true"],
        "rollout.weight_transport=collective needs the rollout on devices of its own",
    ),
]


@pytest.mark.parametrize(("overrides", "key"), BAD_CONFIGS, ids=[o[1] for o in BAD_CONFIGS])
def test_bad_config_fails_before_ray_starts_naming_the_key(compose, overrides, key):
    import ray

    from verl_omni.trainer.main_flowgrpo import run_flowgrpo

    with pytest.raises(ValueError, match=key):
        run_flowgrpo(compose(*overrides))
    assert not ray.is_initialized()


def test_bagel_takes_its_sampling_keys_and_refuses_the_bf16_rollout_log_probs_unless_truncated(
    compose, tiny_bagel_path
):
    import ray

    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.main_flowgrpo import run_flowgrpo

    bagel = (
        "+actor_rollout_ref.rollout.model_kwargs.timestep_shift=2.0",
        "+actor_rollout_ref.rollout.model_kwargs.cfg_interval=[0.5,1.0]",
    )
    configs = validate_config(compose(*bagel, model=tiny_bagel_path))
    assert configs.rollout.model_kwargs == {"timestep_shift": 2.0, "cfg_interval": [0.5, 1.0]}
    assert configs.model.tokenizer("a cat").input_ids
    bypass = "actor_rollout_ref.actor.use_rollout_log_probs=true"
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.use_rollout_log_probs"):
        run_flowgrpo(compose(bypass, model=tiny_bagel_path))
    assert not ray.is_initialized()
    # a truncated importance weight tolerates the bf16 gap that the clipped ratio cannot
    truncated = validate_config(
        compose(*bagel, bypass, "actor_rollout_ref.actor.rollout_correction.loss_type=reinforce", model=tiny_bagel_path)
    )
    assert truncated.actor.rollout_is_truncated and truncated.actor.rollout_correction.rollout_is_threshold == 2.0


ROLLOUT_SPLIT = "actor_rollout_ref.rollout.ulysses_sequence_parallel_size"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{ROLLOUT_SPLIT}=2"], r"=2 must divide .* the 1 rollout devices per node .*; allowed degrees: \[1\]"),
        (
            [f"{ROLLOUT_SPLIT}=2", "trainer.colocate_rollout=true"],
            r"=2 must divide .* the 1 devices per node of the colocated rollout .*; allowed degrees: \[1\]",
        ),
        (
            [f"{ROLLOUT_SPLIT}=4", "actor_rollout_ref.rollout.n_gpus_per_node=4"],
            r"=4 must divide the 2 attention heads of Wan22\w+ .*; allowed degrees: \[1, 2\]",
        ),
    ],
    ids=["rollout_devices", "colocated_devices", "heads"],
)
def test_the_rollout_split_is_refused_where_the_devices_or_heads_do_not_divide(compose, tiny_model, overrides, message):
    from verl_omni.trainer.config.validation import validate_config

    with pytest.raises(ValueError, match=re.escape(ROLLOUT_SPLIT) + message):
        validate_config(compose(*overrides, model=tiny_model("wan2_2")))


def test_the_rollout_splits_a_model_whose_rollout_can_and_refuses_another(compose, tiny_model):
    from verl_omni.trainer.config.validation import validate_config

    split = (f"{ROLLOUT_SPLIT}=2", "actor_rollout_ref.rollout.n_gpus_per_node=2")
    assert validate_config(compose(*split, model=tiny_model("wan2_2"))).rollout.ulysses_sequence_parallel_size == 2
    with pytest.raises(ValueError, match=re.escape(ROLLOUT_SPLIT) + r"=2: QwenImage\w+ \(.*\) cannot split .*\[1\]"):
        validate_config(compose(*split))


def test_full_fine_tuning_and_the_merged_lora_are_switches_and_bagel_refuses_both(compose, tiny_bagel_path):
    import ray

    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.main_flowgrpo import run_flowgrpo

    configs = validate_config(compose("actor_rollout_ref.model.lora.rank=0", "actor_rollout_ref.actor.kl_beta=0.04"))
    assert configs.model.lora_rank == 0 and configs.algorithm_cls.phases(configs.algorithm, configs.actor).reference
    assert validate_config(compose("actor_rollout_ref.model.lora.merge=true")).model.lora.merge
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.lora.rank=0 \(full fine-tuning\)"):
        run_flowgrpo(compose("actor_rollout_ref.model.lora.rank=0", model=tiny_bagel_path))
    # BAGEL's rollout takes no weight buckets, so it cannot take the merged LoRA either
    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.lora.merge=true needs a full-weight sync"):
        run_flowgrpo(compose("actor_rollout_ref.model.lora.merge=true", model=tiny_bagel_path))
    assert not ray.is_initialized()


def test_ema_of_the_weights_is_a_full_fine_tuning_key_from_the_command_line(compose):
    from verl_omni.trainer.config.validation import validate_config

    assert validate_config(compose()).actor.ema_decay == 0
    configs = validate_config(compose("actor_rollout_ref.model.lora.rank=0", "actor_rollout_ref.actor.ema_decay=0.99"))
    assert configs.actor.ema_decay == 0.99


def test_algorithm_the_model_does_not_support_is_refused_before_ray_naming_both(compose, monkeypatch):
    import ray

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.main_flowgrpo import run_flowgrpo

    assert validate_config(compose("algorithm=grpo_guard")).algorithm.name == "grpo_guard"
    # an adapter may restrict the algorithms it serves
    monkeypatch.setattr(QwenImageTrainingAdapter, "algorithms", ("flow_grpo",))
    with pytest.raises(ValueError, match="algorithm=grpo_guard: QwenImageTrainingAdapter"):
        run_flowgrpo(compose("algorithm=grpo_guard"))
    assert not ray.is_initialized()


@pytest.mark.parametrize("algorithm", ["flow_grpo", "grpo_guard", "diffusion_nft"])
def test_drop_zero_std_groups_from_the_command_line_reaches_the_trainer_and_the_actor(compose, algorithm, tmp_path):
    from verl_omni.trainer.config.preflight import check_config
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.diffusion.ray_trainer import RayFlowGRPOTrainer
    from verl_omni.workers.utils.sample_mask import SAMPLE_MASK_KEY

    nft = ["actor_rollout_ref.rollout.noise_level=0", "actor_rollout_ref.rollout.true_cfg_scale=1.0"]
    sampler = nft if algorithm == "diffusion_nft" else []
    for value in (False, True):
        config = compose(f"algorithm={algorithm}", f"algorithm.drop_zero_std_groups={str(value).lower()}", *sampler)
        check_config(config)  # the key is one of every algorithm's, not only the default's
        configs = validate_config(config)
        trainer = RayFlowGRPOTrainer(config, configs)
        trainer.run_dir.lock.release()  # the next construction locks the same directory
        # the trainer sends the mask to the actor's update, whose worker gets configs.algorithm (_init_actor)
        assert configs.algorithm.name == algorithm and trainer.configs.algorithm.drop_zero_std_groups is value
        assert (SAMPLE_MASK_KEY in trainer.update_keys) is value
        assert trainer.update_keys[: len(trainer.loss_keys)] == trainer.loss_keys


ASYNC = ("trainer.trainer_mode=separate_async", "actor_rollout_ref.actor.use_rollout_log_probs=true")


@pytest.mark.slow
def test_separate_async_mode_builds_its_trainer_and_refuses_a_bad_staleness_from_the_command_line(
    compose, tiny_qwen_image_path, prompt_files, tmp_path
):
    from trainer_helpers import run_entry_point

    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.diffusion.async_mode import RayFlowGRPOSeparateAsyncTrainer, trainer_class
    from verl_omni.trainer.diffusion.ray_trainer import RayFlowGRPOTrainer

    configs = validate_config(compose(*ASYNC, "trainer.max_staleness=2"))
    assert (configs.trainer.trainer_mode, configs.trainer.max_staleness) == ("separate_async", 2)
    assert trainer_class("separate_async") is RayFlowGRPOSeparateAsyncTrainer
    assert trainer_class("sync") is RayFlowGRPOTrainer
    # the real entry point, as a user types it: refused before Ray, naming the key and the fix
    proc = run_entry_point(tmp_path / "run", tiny_qwen_image_path, prompt_files, *ASYNC, "trainer.max_staleness=0")
    message = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "trainer.max_staleness must be an integer >= 1" in message and "trainer.trainer_mode=sync" in message
    assert "ray.init" not in message and "Started a local Ray instance" not in message


def test_drop_zero_std_groups_must_be_a_bool_in_every_algorithm():
    from verl_omni.algorithms import algorithm_config_from

    for name in ("flow_grpo", "dance_grpo", "mix_grpo", "grpo_guard", "diffusion_nft", "awm", "diffusion_dpo", "dgpo"):
        with pytest.raises(ValueError, match="algorithm.drop_zero_std_groups must be true or false"):
            algorithm_config_from({"name": name, "drop_zero_std_groups": "yes"})


def test_builtin_paths_resolve_to_built_files(tmp_path):
    from omegaconf import OmegaConf

    from verl_omni.trainer.main_flowgrpo import resolve_builtin_paths

    config = OmegaConf.create(
        {
            "trainer": {"builtin_dir": str(tmp_path)},
            "actor_rollout_ref": {"model": {"path": "/given/model"}},
            "data": {"train_files": "builtin://tiny_prompts/train.parquet", "val_files": "builtin://nothing"},
        }
    )
    with pytest.raises(ValueError, match="unknown built-in builtin://nothing"):
        resolve_builtin_paths(config)
    assert config.actor_rollout_ref.model.path == "/given/model"
    assert Path(config.data.train_files) == tmp_path / "tiny_prompts" / "train.parquet"
    assert Path(config.data.train_files).is_file()


def test_generated_config_is_in_sync_with_the_yaml_tree():
    from verl_omni.trainer.config.generate import GENERATED, render

    assert GENERATED.read_text() == render(), "stale: run scripts/generate_trainer_config.sh"


def _key_lines(lines: list[str]):
    """``(number, line)`` of every mapping key outside list items (list entries are documented as a whole)."""
    list_indent = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped or stripped.startswith("#"):
            continue
        if list_indent is not None and indent > list_indent:
            continue
        list_indent = indent if stripped.startswith("- ") else None
        if list_indent is None:
            yield number, line


@pytest.mark.parametrize("path", sorted(p for p in CONFIG_DIR.rglob("*.yaml") if not p.name.startswith("_")), ids=str)
def test_every_yaml_key_has_a_comment_above_and_no_inline_comment(path):
    lines = path.read_text().splitlines()
    for number, line in _key_lines(lines):
        value = line.split(":", 1)[1] if ":" in line else ""
        assert not re.search(r"\s#", value), f"{path.name}:{number}: inline comment in {line.strip()!r}"
        assert lines[number - 2].strip().startswith("#"), f"{path.name}:{number}: no comment above {line.strip()!r}"


SEED_KEYS = (
    "actor_rollout_ref.actor.seed",
    "actor_rollout_ref.actor.engine.seed",
    "actor_rollout_ref.rollout.seed",
    "data.seed",
    "algorithm.seed",
)


def test_the_run_seed_reaches_every_seeded_part_and_each_key_still_overrides_its_own(compose):
    from omegaconf import OmegaConf

    from verl_omni.trainer.config.validation import validate_config

    def seeds(*overrides):
        config = compose("algorithm=dance_grpo", *overrides)
        validate_config(config)
        return [OmegaConf.select(config, key) for key in SEED_KEYS]

    assert seeds() == [0] * len(SEED_KEYS)
    assert seeds("trainer.seed=7") == [7] * len(SEED_KEYS)
    assert seeds("trainer.seed=7", "actor_rollout_ref.rollout.seed=3") == [7, 7, 3, 7, 7]
    with pytest.raises(ValueError, match="trainer.seed"):
        seeds("trainer.seed=-1")
