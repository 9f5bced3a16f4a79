"""An own-environment scorer: its script runs under its pinned numpy 1.x (the trainer has numpy 2), batches cross
as raw bytes, and a child that dies is an error naming the scorer and its environment, not restarted."""

import numpy
import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, ScorerError
from verl_omni.utils.reward_score.brightness_numpy1 import BrightnessNumpy1Scorer
from verl_omni.utils.reward_score.environment import CACHE_ENV_VAR

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scorer(scorer_env_dir):
    """One scorer (one child process) for the module; its environment in the suite's cache (built once)."""
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV_VAR, str(scorer_env_dir))
    scorer = BrightnessNumpy1Scorer()
    yield scorer
    scorer.close()
    patch.undo()


def _batch(*values: int, frames: int | None = None) -> ScoreBatch:
    shape = (3, 4, 5) if frames is None else (frames, 3, 4, 5)
    images = torch.stack([torch.full(shape, v, dtype=torch.uint8) for v in values])
    return ScoreBatch(images, [f"p{i}" for i in range(len(values))])


def test_scores_images_and_videos_in_its_own_numpy(scorer):
    assert numpy.__version__ != "1.26.4"  # else the pin would not conflict
    assert scorer.score_sync(_batch(0, 255, 51)) == pytest.approx([0.0, 1.0, 0.2])
    process = scorer._process
    assert scorer.score_sync(_batch(102, frames=2)) == pytest.approx([0.4])
    assert scorer._process is process  # one persistent child


def test_a_dead_child_is_an_error_naming_the_scorer_and_environment_and_stays_one(scorer):
    scorer.score_sync(_batch(1))
    scorer._process.kill()
    scorer._process.wait()
    for _ in range(2):  # no silent restart
        with pytest.raises(ScorerError, match=rf"BrightnessNumpy1Scorer.*{scorer.environment().key()}"):
            scorer.score_sync(_batch(1))


def test_an_environment_that_cannot_be_built_fails_before_ray_naming_scorer_and_package(scorer_env_dir, monkeypatch):
    from verl_omni.trainer.config.validation import build_scorer_environments
    from verl_omni.utils.reward_score.environment import ScorerEnvironmentError
    from verl_omni.workers.config.reward import DiffusionRewardConfig, ScorerConfig

    bad = "verl-omni-no-such-package-for-tests==0.0.1"
    monkeypatch.setenv(CACHE_ENV_VAR, str(scorer_env_dir))
    monkeypatch.setattr(BrightnessNumpy1Scorer, "requirements", (bad,))
    reward = DiffusionRewardConfig(scorers=[ScorerConfig(type="brightness"), ScorerConfig(type="brightness_numpy1")])
    with pytest.raises(ScorerEnvironmentError, match=rf"scorers\[1\] \('brightness_numpy1'\).*failed on {bad}"):
        build_scorer_environments(reward)


def test_what_a_script_writes_to_stdout_while_serving_goes_to_stderr_not_the_protocol(tmp_path):
    """A package's print, and a write to file descriptor 1 as a C++ library's printf makes, land on stderr."""
    import json
    import subprocess
    import sys

    from verl_omni.utils.reward_score.own_env import SCRIPTS_DIR

    script = tmp_path / "noisy.py"
    script.write_text(
        "import os\nfrom scorer_child import serve\n\n"
        "def score(data, shape, prompts, targets, extra):\n"
        "    os.write(1, b'from C\\n')\n"
        "    print('from print')\n"
        "    return [len(data)] * shape[0]\n\n"
        "serve(score)\n"
    )
    request = json.dumps({"shape": [2, 1, 1, 1], "prompts": ["a", "b"], "targets": None}).encode() + b"\n\x00\x00"
    out = subprocess.run(
        [sys.executable, str(script)],
        input=request * 2,
        capture_output=True,
        env={"PYTHONPATH": str(SCRIPTS_DIR)},
        check=True,
    )
    assert out.stdout.splitlines() == [b'{"result": [2, 2]}'] * 2
    assert out.stderr.splitlines() == [b"from C", b"from print"] * 2
