"""Mean brightness computed in a scorer environment of its own that pins numpy 1.x: the smallest own-environment
scorer (``own_env.py``), and the check that such a scorer's reward flows into a real run.

The trainer's environment has numpy 2; this scorer's script runs under ``numpy==1.26.4`` and refuses any other
version, so a score proves the separate environment ran it.
"""

from __future__ import annotations

from verl_omni.utils.reward_score.own_env import SCRIPTS_DIR, OwnEnvironmentScorer
from verl_omni.utils.reward_score.registry import register_scorer


@register_scorer("brightness_numpy1")
class BrightnessNumpy1Scorer(OwnEnvironmentScorer):
    """Mean pixel value / 255, computed with numpy 1.26 in its own environment. Range [0, 1]. Toy reward."""

    requirements = ("numpy==1.26.4",)
    script = SCRIPTS_DIR / "brightness_numpy1.py"
