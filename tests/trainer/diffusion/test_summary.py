"""The run summary and reward curve, built from a run directory whose ``metrics.jsonl`` verl's own file backend wrote.

That the printed diffusers lines load the LoRA is checked on a real run's checkpoint in
``tests/trainer/test_flowgrpo_e2e.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from verl_omni.trainer.diffusion.run_dir import RunDir
from verl_omni.trainer.diffusion.summary import (
    CURVE_FILE,
    DIFFUSERS_HEADER,
    SUMMARY_FILE,
    TRANSFORMER_HEADER,
    draw_reward_curve,
    read_run,
    write_summary,
)

TRAIN = {1: 0.1, 2: 0.3, 3: 0.5, 4: 0.7}
VAL = {0: 0.2, 2: 0.4, 4: 0.9}
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, monkeypatch_module):
    """A run directory as a 4-step run leaves it: metrics by verl's ``Tracking``, grids, two checkpoints."""
    from verl.utils.tracking import Tracking

    run = tmp_path_factory.mktemp("run")
    monkeypatch_module.setenv("VERL_FILE_LOGGER_PATH", str(run / "metrics.jsonl"))
    tracker = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    for step in range(5):
        data = {"timing_s/step": 1.0}
        if step in TRAIN:
            data["critic/score/mean"] = TRAIN[step]
        if step in VAL:
            data["val/score/mean"] = VAL[step]
        tracker.log(data=data, step=step)
    tracker.finish()
    for step in VAL:
        (run / "images").mkdir(exist_ok=True)
        Image.new("RGB", (8, 8)).save(run / "images" / f"val_step_{step}.png")
    # checkpoints saved the way the trainer saves them: into a .partial, then committed
    checkpoints = RunDir(root=run, world_size=1)
    lora = checkpoints.begin_checkpoint(2) / "actor" / "lora"
    lora.mkdir(parents=True)
    (lora / "pytorch_lora_weights.safetensors").write_bytes(b"")
    checkpoints.commit_checkpoint(2)
    # a later save that was cut off (its .partial left behind) is not the final LoRA
    (checkpoints.begin_checkpoint(4) / "actor" / "lora").mkdir(parents=True)
    return run


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_reads_training_and_validation_scores_by_step(run_dir):
    record = read_run(run_dir / "metrics.jsonl")
    assert record.train == TRAIN and record.val == VAL and record.steps_done == 4


def test_summary_names_steps_scores_files_and_the_diffusers_lines(run_dir):
    text = write_summary(
        run_dir, 4, 125.4, "/models/qwen", "QwenImagePipeline", algorithm="Flow-GRPO", interrupted=False
    )
    assert (run_dir / SUMMARY_FILE).read_text() == text + "\n"
    lines = text.splitlines()
    assert lines[0] == "Flow-GRPO run finished: 4 of 4 steps in 0:02:05 (wall time)"
    assert "validation score (val/score/mean): 0.2 at step 0 -> 0.9 at step 4" in text
    assert f"metrics: {run_dir / 'metrics.jsonl'}" in text
    assert f"image grids: {run_dir / 'images'} (val_step_0.png ... val_step_4.png)" in text
    lora = run_dir / "global_step_2" / "actor" / "lora"
    assert f"final LoRA: {lora}" in text
    code = [line.strip() for line in lines[lines.index(f"  {DIFFUSERS_HEADER}") + 1 :]]
    assert code == [
        "from diffusers import QwenImagePipeline",
        "pipe = QwenImagePipeline.from_pretrained('/models/qwen')",
        f"pipe.load_lora_weights({str(lora)!r})",
    ]


def test_interrupted_run_and_a_model_without_a_diffusers_pipeline(tmp_path, run_dir):
    text = write_summary(run_dir, 10, 3.0, "/models/bagel", None, algorithm="Flow-GRPO", interrupted=True)
    assert text.startswith("Flow-GRPO run interrupted after step 4: 4 of 10 steps")
    assert DIFFUSERS_HEADER not in text
    empty = write_summary(tmp_path, 10, 3.0, "/m", "QwenImagePipeline", algorithm="Flow-GRPO", interrupted=True)
    assert "0 of 10 steps" in empty and "final LoRA: none saved" in empty and DIFFUSERS_HEADER not in empty
    assert (tmp_path / CURVE_FILE).is_file()


def test_full_fine_tuning_summary_names_the_trained_transformer_and_its_diffusers_lines(tmp_path):
    """A run with ``model.lora.rank=0`` saves ``actor/transformer`` (``save_pretrained``), not a LoRA: the summary
    must say where it is and how diffusers loads it, not "no LoRA saved". The lines are run on a real checkpoint in
    ``tests/trainer/test_flowgrpo_full_ft_e2e.py``."""
    import json

    checkpoints = RunDir(root=tmp_path, world_size=1)
    transformer = checkpoints.begin_checkpoint(3) / "actor" / "transformer"
    transformer.mkdir(parents=True)
    (transformer / "config.json").write_text(json.dumps({"_class_name": "QwenImageTransformer2DModel"}))
    checkpoints.commit_checkpoint(3)
    text = write_summary(
        tmp_path, 3, 1.0, "/models/qwen", "QwenImagePipeline", algorithm="Flow-GRPO", interrupted=False
    )
    final = tmp_path / "global_step_3" / "actor" / "transformer"
    lines = text.splitlines()
    assert f"final transformer: {final}" in text and "final LoRA" not in text and DIFFUSERS_HEADER not in text
    assert [line.strip() for line in lines[lines.index(f"  {TRANSFORMER_HEADER}") + 1 :]] == [
        "from diffusers import QwenImageTransformer2DModel, QwenImagePipeline",
        f"transformer = QwenImageTransformer2DModel.from_pretrained({str(final)!r})",
        "pipe = QwenImagePipeline.from_pretrained('/models/qwen', transformer=transformer)",
    ]
    assert "EMA" not in text


def test_full_fine_tuning_summary_names_the_ema_transformer_when_the_checkpoint_has_one(tmp_path):
    """``actor.ema_decay`` > 0 adds ``actor/transformer_ema`` beside ``actor/transformer``: the summary names it."""
    import json

    checkpoints = RunDir(root=tmp_path, world_size=1)
    actor = checkpoints.begin_checkpoint(2) / "actor"
    for name in ("transformer", "transformer_ema"):
        (actor / name).mkdir(parents=True)
        (actor / name / "config.json").write_text(json.dumps({"_class_name": "QwenImageTransformer2DModel"}))
    checkpoints.commit_checkpoint(2)
    text = write_summary(
        tmp_path, 2, 1.0, "/models/qwen", "QwenImagePipeline", algorithm="Flow-GRPO", interrupted=False
    )
    final = tmp_path / "global_step_2" / "actor"
    assert f"final transformer: {final / 'transformer'}\n" in text
    assert f"final EMA transformer (actor.ema_decay, what validation sampled): {final / 'transformer_ema'}" in text


def _pixels(image: np.ndarray, color) -> np.ndarray:
    """``(y, x)`` of the pixels of ``color``."""
    return np.argwhere((image == np.array(color)).all(axis=-1))


def test_reward_curve_draws_both_series_rising(run_dir, tmp_path):
    path = draw_reward_curve(read_run(run_dir / "metrics.jsonl"), tmp_path / CURVE_FILE)
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape == (400, 640, 3)
    for color in (BLUE, ORANGE):
        pixels = _pixels(image, color)
        assert len(pixels) > 50, f"no curve drawn in {color}"
        left = pixels[pixels[:, 1] < np.percentile(pixels[:, 1], 20)]
        right = pixels[pixels[:, 1] > np.percentile(pixels[:, 1], 80)]
        # both scores rise over the steps: image rows grow downwards
        assert left[:, 0].mean() > right[:, 0].mean()
    # training starts at step 1, validation at step 0: the orange curve starts further left
    assert _pixels(image, ORANGE)[:, 1].min() < _pixels(image, BLUE)[:, 1].min()


@pytest.mark.parametrize(
    "name", ["flow_grpo", "grpo_guard", "dance_grpo", "mix_grpo", "diffusion_nft", "awm", "diffusion_dpo", "dgpo"]
)
def test_the_summary_names_the_registered_algorithm_run(run_dir, name):
    """The first line names the algorithm as it registered itself (its ``title``), not Flow-GRPO for every run."""
    from verl_omni.algorithms import get_algorithm

    algorithm = get_algorithm(name)
    text = write_summary(run_dir, 4, 1.0, "/m", None, algorithm=algorithm.display_name(), interrupted=False)
    assert text.splitlines()[0] == f"{algorithm.title} run finished: 4 of 4 steps in 0:00:01 (wall time)"
    assert algorithm.title and (algorithm.title == "Flow-GRPO") == (name == "flow_grpo")


def test_a_subclass_registered_under_another_name_does_not_inherit_the_title():
    """An algorithm derived from a built-in (GRPO-Guard from Flow-GRPO; an entry point's) states its own title."""
    from verl_omni.algorithms import Algorithm, get_algorithm

    flow_grpo = get_algorithm("flow_grpo")
    derived = type("Derived", (flow_grpo,), {"name": "my_variant"})
    assert derived.display_name() == "my_variant"
    assert get_algorithm("grpo_guard").display_name() == "GRPO-Guard" and issubclass(derived, Algorithm)
