"""Online Diffusion-DPO (Wallace et al., 2023, arXiv:2311.12908) on flow-matching models: ``algorithm=diffusion_dpo``.

The rollout samples clean images with the ODE (the ``ode_samples`` record). Each prompt group's rollouts become
preference pairs by their rewards (its best against its worst, or every pair above a reward margin:
:func:`~verl_omni.algorithms.diffusion_dpo_math.preference_pairs`), and the update trains the pair loss of
:mod:`~verl_omni.algorithms.diffusion_dpo_math` against the frozen reference (the model with its LoRA disabled, or
under full fine-tuning the engine's frozen copy of the base transformer):

    −log sigmoid(−β/2 · [(e_θ(x⁺) − e_ref(x⁺)) − (e_θ(x⁻) − e_ref(x⁻))]),   e(x) = mean‖v(x_σ, σ) − (ε − x)‖².

What the loss needs of the engine, and how it gets it:

* both samples of a pair in one micro-batch: :meth:`DiffusionDPO.arrange_update` lays the update rows out as
  (chosen, rejected) row pairs, spread evenly over the batch so every mini-batch gets its share, and the config
  check refuses an odd micro-batch and shuffled mini-batches; the batch keeps its size, the rows not in a pair are
  left out of the loss by the ``sample_mask`` (a group's samples between its best and its worst train nothing);
* the same σ and ε for a pair's two samples: σ is the replayed schedule step's, one per forward; ε is drawn once
  per pair (the replay's ``noise_group`` key, :func:`~verl_omni.workers.utils.replay.forward_noise`);
* the reference's errors at that same noise, without gradient: the replay runs the reference policy before the
  trained forward (``Phases.reference_in_update``).

The paper draws one timestep per pair; here a mini-batch's pairs share each replayed step, ``num_train_steps`` of
them drawn from strata of the schedule as AWM draws them (:func:`~verl_omni.algorithms.awm.stratified_steps`).

Offline, the pairs come from a preference file instead of a rollout (``data.preference_files``): each pair is a
group of two samples scored 1 and 0, and the same pairing, layout and loss apply
(``verl_omni/trainer/diffusion/offline_preferences.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_omni.algorithms.awm import stratified_steps
from verl_omni.algorithms.base import (
    NOISE_GROUP_KEY,
    Algorithm,
    AlgorithmConfig,
    AlgorithmLoss,
    UpdateRows,
    register_algorithm,
)
from verl_omni.algorithms.diffusion_dpo_math import check_pairing, diffusion_dpo_pair_loss, preference_pairs
from verl_omni.pipelines.model_base import ODE_SAMPLES

# per update row, float [B]: +1 the chosen sample of its pair, −1 the rejected one, 0 a row in no pair
PREFERENCE_KEY = "preference"


@dataclass
class DiffusionDPOConfig(AlgorithmConfig):
    """Online Diffusion-DPO (``algorithm=diffusion_dpo``).

    Args:
        name (str): ``diffusion_dpo``.
        beta (float): β, > 0: the larger, the less the policy may move from the reference for a preference (the
            loss saturates once the error gaps reach about 1/β).
        pairing (str): ``best_worst`` (each prompt group's best sample against its worst: at most one pair per
            group) or ``margin`` (every pair of a group whose reward gap exceeds ``reward_margin``).
        reward_margin (float): the reward gap a pair must exceed, >= 0 (0: any strict preference).
        timestep_fraction (float): the trained schedule steps are drawn from the first ``timestep_fraction`` of
            the T steps (the noisiest end), in (0, 1].
        num_train_steps (int): schedule steps trained on per mini-batch, one from each of that many equal strata
            of the allowed steps (at most their number), >= 1.
    """

    name: str = "diffusion_dpo"
    beta: float = 1000.0
    pairing: str = "best_worst"
    reward_margin: float = 0.0
    timestep_fraction: float = 0.9
    num_train_steps: int = 4

    def __post_init__(self):
        super().__post_init__()
        self.require_positive("beta")
        check_pairing(self.pairing, self.reward_margin)
        self.require_fraction("timestep_fraction")
        if not (isinstance(self.num_train_steps, int) and self.num_train_steps >= 1):
            raise ValueError(f"algorithm.num_train_steps must be an integer >= 1, got {self.num_train_steps!r}")


def pair_slots(num_pairs: int, num_slots: int) -> torch.Tensor:
    """The slots (row pairs) of ``num_pairs`` pairs spread evenly over ``num_slots`` >= ``num_pairs``: contiguous
    mini-batches of the update then each get about the same number of pairs."""
    return torch.div(torch.arange(num_pairs) * num_slots, max(num_pairs, 1), rounding_mode="floor")


def arrange_pairs(pairs: torch.Tensor, scores: torch.Tensor, size: int) -> UpdateRows:
    """The update rows of ``pairs`` ``[P, 2]`` (chosen, rejected sample indices) in a batch of ``size`` rows.

    Pair k takes rows (2s, 2s + 1) of its slot s; the other rows repeat the batch's samples in order and are not
    trained. When there are more pairs than the size/2 slots, those with the largest reward gap are kept.
    """
    if size % 2:
        raise ValueError(f"a preference update needs an even batch to lay pairs out in, got {size} samples")
    slots = size // 2
    gaps = scores[pairs[:, 0]] - scores[pairs[:, 1]]
    dropped = max(0, len(pairs) - slots)
    if dropped:
        kept = torch.argsort(gaps, descending=True, stable=True)[:slots]
        pairs, gaps = pairs[kept], gaps[kept]
    order = torch.arange(size)
    keep = torch.zeros(size, dtype=torch.bool)
    preference = torch.zeros(size)
    # rows outside a pair each get their own noise group (their noise is drawn but never trained on)
    noise_group = torch.arange(size, dtype=torch.long) + size
    rows = 2 * pair_slots(len(pairs), slots)
    for k, (chosen, rejected) in enumerate(pairs.tolist()):
        row = int(rows[k])
        order[row], order[row + 1] = chosen, rejected
        preference[row], preference[row + 1] = 1.0, -1.0
        noise_group[row] = noise_group[row + 1] = k
    keep[rows] = keep[rows + 1] = True
    metrics = {
        "dpo/pairs": float(len(pairs)),
        "dpo/pairs_dropped": float(dropped),
        "dpo/paired_sample_frac": float(len(set(pairs.flatten().tolist()))) / max(len(scores), 1),
        "dpo/reward_gap_mean": float(gaps.mean()) if len(gaps) else 0.0,
    }
    return UpdateRows(order, keep, {NOISE_GROUP_KEY: noise_group, PREFERENCE_KEY: preference}, metrics)


def split_pairs(micro_batch, rows: int) -> torch.Tensor:
    """The (chosen, rejected) row indices ``[P, 2]`` of a micro-batch's trained rows, which must come as adjacent
    (chosen, rejected) rows of one noise group; raises naming the settings that keep a pair together otherwise."""
    preference = micro_batch[PREFERENCE_KEY].reshape(-1)
    groups = micro_batch[NOISE_GROUP_KEY].reshape(-1)
    if rows % 2 == 0:
        pairs = torch.arange(rows).reshape(-1, 2)
        roles_ok = bool((preference[pairs[:, 0]] > 0).all() and (preference[pairs[:, 1]] < 0).all())
        if roles_ok and bool((groups[pairs[:, 0]] == groups[pairs[:, 1]]).all()):
            return pairs
    raise ValueError(
        f"a micro-batch's trained rows are not whole (chosen, rejected) pairs (preference {preference.tolist()}): "
        "algorithm=diffusion_dpo needs an even actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu and "
        "actor_rollout_ref.actor.shuffle=false, and its update batch as the trainer lays it out (arrange_update)"
    )


class DiffusionDPOLoss(AlgorithmLoss):
    """:func:`~verl_omni.algorithms.diffusion_dpo_math.diffusion_dpo_pair_loss` of one forward-noised step
    (``ODESamplesReplay`` with the reference velocity); reads the pair layout's ``noise_group`` and ``preference``."""

    metric_reductions = {
        "dpo_loss": "mean",
        "dpo_accuracy": "mean",
        "dpo_margin": "mean",
        "chosen_improvement": "mean",
        "rejected_improvement": "mean",
    }

    @property
    def required_keys(self) -> tuple[str, ...]:
        return (NOISE_GROUP_KEY, PREFERENCE_KEY)

    def replay_steps(self, num_steps: int) -> Sequence[int]:
        config = self.algorithm_config
        return stratified_steps(num_steps, config.timestep_fraction, config.num_train_steps)

    def __call__(self, replayed, micro_batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.check_batch(micro_batch)
        if replayed.reference_velocity is None:
            raise RuntimeError(
                "Diffusion-DPO's loss needs the reference velocity at the trained noise: the engine's "
                "reference_in_update must be set (Phases.reference_in_update, before the first update)"
            )
        pairs = split_pairs(micro_batch, replayed.velocity.shape[0]).to(replayed.velocity.device)
        sigma = replayed.sigma.view(-1, *([1] * (replayed.clean.ndim - 1)))
        # u = ε − x_0, recovered from x_σ = (1 − σ)·x_0 + σ·ε (σ > 0 at every trained schedule step)
        target = (replayed.noisy - replayed.clean) / sigma
        return diffusion_dpo_pair_loss(
            replayed.velocity, replayed.reference_velocity, target, pairs, self.algorithm_config.beta
        )


@register_algorithm("diffusion_dpo")
class DiffusionDPO(Algorithm):
    """Online Diffusion-DPO: ODE rollouts, preference pairs of each prompt group, the pair loss against the frozen
    reference (``algorithm=diffusion_dpo``)."""

    title = "Diffusion-DPO"
    config_cls = DiffusionDPOConfig
    loss_cls = DiffusionDPOLoss
    rollout_record = ODE_SAMPLES
    uses_log_probs = False
    old_outputs = ()
    reference_in_update = True

    @classmethod
    def compute_advantage(cls, scores: torch.Tensor, index: Sequence, config: DiffusionDPOConfig) -> torch.Tensor:
        """+1 for a sample chosen in some pair, −1 for one rejected in some pair (the sum when in several), 0 for
        a sample in none: DPO weighs no sample by its reward, only its side of a pair (logged as the advantage)."""
        pairs = preference_pairs(scores, index, config.pairing, config.reward_margin)
        side = torch.zeros(len(scores))
        side.index_add_(0, pairs[:, 0], torch.ones(len(pairs)))
        side.index_add_(0, pairs[:, 1], -torch.ones(len(pairs)))
        return side.clamp(-1, 1)

    @classmethod
    def arrange_update(cls, scores: torch.Tensor, index: Sequence, config: DiffusionDPOConfig) -> UpdateRows:
        """Each pair's (chosen, rejected) rows adjacent, spread over the batch; the rows in no pair not trained."""
        pairs = preference_pairs(scores, index, config.pairing, config.reward_margin)
        return arrange_pairs(pairs, scores.detach().flatten().cpu().double(), len(scores))

    @classmethod
    def check(cls, configs) -> None:
        """ODE rollouts, no KL term, pairs kept in one micro-batch."""
        name = configs.algorithm.name
        if configs.rollout.noise_level != 0:
            raise ValueError(
                f"algorithm={name} trains on ODE samples: set actor_rollout_ref.rollout.noise_level=0 "
                f"(got {configs.rollout.noise_level})"
            )
        if configs.actor.kl_beta != 0:
            raise ValueError(
                f"algorithm={name}: actor_rollout_ref.actor.kl_beta must be 0 (the DPO loss already holds the "
                "policy to the reference through algorithm.beta)"
            )
        micro = configs.actor.ppo_micro_batch_size_per_gpu
        if micro % 2:
            raise ValueError(
                f"algorithm={name} trains a preference pair's two samples in one forward: "
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must be even, got {micro}"
            )
        if configs.actor.shuffle:
            raise ValueError(
                f"algorithm={name} lays each pair out in adjacent rows: set actor_rollout_ref.actor.shuffle=false "
                "(shuffled mini-batches would split the pairs)"
            )
