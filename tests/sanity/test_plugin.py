"""verl loads our plugin through its entry point, and every registration in it happened.

verl logs plugin import failures at DEBUG only, so a broken plugin would otherwise go unnoticed.
"""

import importlib.metadata

import pytest


def test_verl_plugin_entry_point_is_installed():
    eps = importlib.metadata.entry_points(group="verl.plugins")
    assert "verl_omni.plugin" in {ep.value for ep in eps}


@pytest.mark.slow
def test_importing_verl_registers_what_verl_looks_up_and_the_reward_loop_registers_its_manager(fresh_python):
    # a fresh interpreter that imports only verl, as a Ray worker would
    code = (
        "import verl, sys\n"
        "assert 'verl_omni.plugin' in sys.modules, 'plugin not loaded by verl'\n"
        # the workers that never score (rollout, actor, agent loop, router) do not pay for the reward loop
        "print('reward_loop imported', 'verl_omni.reward_loop' in sys.modules)\n"
        "from verl_omni.algorithms import ALGORITHMS\n"
        "from verl_omni.utils.reward_score.registry import SCORERS\n"
        "print('algos', ALGORITHMS.names())\n"
        "print('scorers', SCORERS.names())\n"
        # what a reward worker's class import does (DiffusionRewardLoopWorker lives there)
        "import verl_omni.reward_loop\n"
        "from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls\n"
        "print('reward_manager', get_reward_manager_cls('diffusion').__name__)\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "replica = RolloutReplicaRegistry.get('vllm_omni')\n"
        "print('rollout', replica.__module__, replica.__name__)\n"
    )
    stdout = fresh_python(code)
    assert "reward_loop imported False" in stdout, stdout
    (algos,) = [line for line in stdout.splitlines() if line.startswith("algos ")]
    for algorithm in ("flow_grpo", "grpo_guard", "dance_grpo", "mix_grpo", "diffusion_nft"):
        assert f"'{algorithm}'" in algos, stdout
    for scorer in (
        "brightness",
        "jpeg_compressibility",
        "jpeg_incompressibility",
        "ocr",
        "pickscore",
        "clip_score",
        "aesthetic",
        "http",
        "http_video",
        "temporal_consistency",
        "vlm_judge",
    ):
        assert f"'{scorer}'" in stdout, stdout
    assert "reward_manager DiffusionRewardManager" in stdout
    assert "rollout verl_omni.workers.rollout.vllm_omni.server vLLMOmniReplica" in stdout


def test_test_module_basenames_are_unique():
    # pytest's default import mode keys test modules by basename: a duplicate stops collection
    from collections import Counter
    from pathlib import Path

    names = Counter(p.name for p in Path(__file__).parents[1].rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
