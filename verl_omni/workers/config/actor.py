"""Config of the Flow-GRPO actor update (the ``actor_rollout_ref.actor`` node).

Engine, optimizer and checkpoint settings are verl's ``FSDPEngineConfig``, ``FSDPOptimizerConfig``
and ``CheckpointConfig``, nested under ``engine``, ``optim`` and ``checkpoint`` as in verl's actor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl.base_config import BaseConfig
from verl.trainer.config import CheckpointConfig
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig

# how the loss uses the rollout's log-probs as log π_old (verl's bypass-mode loss types, same names)
ROLLOUT_CORRECTION_LOSSES = ("ppo_clip", "reinforce")


@dataclass
class RolloutCorrectionConfig(BaseConfig):
    """How the loss treats the rollout's log-probs when they serve as log π_old (``actor.use_rollout_log_probs``):
    verl's rollout correction in bypass mode, with its key names.

    The rollout and the actor compute the same policy with different kernels; in bf16 their per-step log-probs differ
    by a few 1e-4, more than Flow-GRPO's clip range 1e-4. Divided by the rollout's log-probs, a clipped ratio then
    starts outside the clip range for many samples, and those contribute no gradient even before the first optimizer
    step. A truncated importance weight tolerates that gap: it is ≈ 1 for numerics and only caps real drift.

    Args:
        loss_type (str): ``ppo_clip`` (default): the algorithm's clipped ratio π_θ / π_rollout (the gap must stay
            under ``actor.clip_ratio``); ``reinforce``: the policy gradient −A·w·∇log π_θ with the truncated
            importance weight w = min(π_θ / π_rollout, ``rollout_is_threshold``), no clip (``docs/guide/training.md``).
        rollout_is_threshold (float): the cap C of the importance weight with ``reinforce`` (verl's default 2.0);
            >= 1, so a weight of 1 (on-policy) is never truncated.
    """

    loss_type: str = "ppo_clip"
    rollout_is_threshold: float = 2.0

    def __post_init__(self):
        if self.loss_type not in ROLLOUT_CORRECTION_LOSSES:
            raise ValueError(
                f"actor.rollout_correction.loss_type must be one of {ROLLOUT_CORRECTION_LOSSES}, got {self.loss_type!r}"
            )
        threshold = self.rollout_is_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
            raise ValueError(f"actor.rollout_correction.rollout_is_threshold must be a number >= 1, got {threshold!r}")
        if threshold < 1:
            raise ValueError(
                f"actor.rollout_correction.rollout_is_threshold must be >= 1 (a weight of 1 is on-policy and must "
                f"pass untruncated), got {threshold}"
            )


@dataclass
class DiffusionActorConfig(BaseConfig):
    """Mini-batching and the loss settings shared by the algorithms' updates.

    Args:
        ppo_mini_batch_size (int): prompts per optimizer step, over all data-parallel ranks (verl's unit: each
            prompt brings its ``rollout_n`` samples, so a mini-batch is ``mini_batch_samples`` samples).
        rollout_n (int): samples per prompt, mirrored from ``actor_rollout_ref.rollout.n`` by the YAML (as verl's
            actor does); 1 when the actor is built without a rollout.
        ppo_micro_batch_size_per_gpu (int): samples per forward/backward on one rank; gradients
            accumulate over micro-batches × replayed steps up to a mini-batch.
        infer_micro_batch_size_per_gpu (int): samples per forward of the forward-only phases (``old_log_prob``,
            ``ref``), which keep no activations for a backward and so fit larger micro-batches; 0 (default) uses
            ``ppo_micro_batch_size_per_gpu``.
        ppo_epochs (int): passes over the batch per update.
        shuffle (bool): shuffle samples between epochs (seeded by ``seed`` and the epoch).
        clip_ratio (float): ε of the ratio clip of the clipped-ratio algorithms (1e-4 with ``sde`` in
            Flow-GRPO); the loss itself is the algorithm's (``algorithm=<name>``, ``docs/guide/algorithms.md``).
        kl_beta (float): β of the KL to the reference (LoRA disabled; full fine-tuning: a frozen copy of the
            base transformer, one more sharded weight copy); 0 skips the reference.
        seed (int): shuffling seed.
        use_rollout_log_probs (bool): take log π_old from the rollout's ``rollout_log_probs``
            instead of recomputing it with the actor (skips the ``old_log_prob`` phase). Valid
            because the rollout always samples with the actor's current weights (synced every
            step); the two agree to numerics (``docs/guide/training.md``).
        rollout_log_prob_check_freq (int): with ``use_rollout_log_probs``, at the first step and every this many
            steps after (steps 1, 1 + N, 1 + 2N, ...) the actor still replays a sample of the batch (the
            ``old_log_prob`` phase; the loss keeps the rollout's log-probs) and logs the gap as
            ``old_log_prob/rollout_diff_max``: the bypass assumes that gap is numerics, and a rollout that drifts from
            the actor (stale weights, a dtype or kernel change) shows here instead of as a silently wrong ratio.
            0 never checks.
        rollout_log_prob_check_per_prompt (int): the rows of each prompt group that check replays (the first ones; at
            most ``rollout_n``): a group's rows come from one rollout replica, so one row of each covers every replica
            at 1/``rollout_n`` of a full replay's cost, the loss needing none of it. 0 replays every row.
        rollout_correction (RolloutCorrectionConfig): with ``use_rollout_log_probs``, how the loss uses the rollout's
            log-probs (the clipped ratio, or a truncated importance weight that tolerates a bf16 rollout's gap).
        ema_decay (float): full fine-tuning only: d of an exponential moving average of the trained transformer,
            ``ema ← d·ema + (1 − d)·θ`` after every optimizer step, kept as an fp32 copy of each rank's local shards
            on the host (4 bytes per local parameter). Validation samples with it and checkpoints export it as
            ``transformer_ema/``; training rollouts always sample the live weights. 0 (default) keeps none; else in
            (0, 1). Refused with LoRA (``model.lora.rank`` > 0, checked with the model in
            ``verl_omni.trainer.config.validation``): a LoRA update is the product of two trained factors, and an
            average of the factors is not the average of the products, so it would not be an average of the
            policies trained (``docs/guide/training.md``).
        ulysses_sequence_parallel_size (int): verl's key: ranks that split each sample's tokens in the replay
            (Ulysses: every rank of a group replays the group's samples on its slice of their tokens, heads traded by
            all-to-all around attention; ``docs/guide/scale.md``). Must divide the transformer's attention heads and
            ``trainer.n_gpus_per_node``, and the model must declare it can split (checked with the model in
            ``verl_omni.trainer.config.validation``). 1 (default): no split. Copied into ``engine``, which reads it.
        engine (FSDPEngineConfig): verl's FSDP engine settings (``strategy`` must be ``fsdp2``).
        optim (FSDPOptimizerConfig): verl's optimizer and LR schedule settings.
        checkpoint (CheckpointConfig): verl's checkpoint settings (the engine writes the LoRA, or the full
            transformer, and exact-resume state, ``docs/guide/training.md``); ``save_lora_only`` as the YAML sets it.
    """

    ppo_mini_batch_size: int = 16
    rollout_n: int = 1
    ppo_micro_batch_size_per_gpu: int = 4
    infer_micro_batch_size_per_gpu: int = 0
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 1e-4
    kl_beta: float = 0.0
    seed: int = 0
    use_rollout_log_probs: bool = False
    rollout_log_prob_check_freq: int = 0
    rollout_log_prob_check_per_prompt: int = 1
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    ema_decay: float = 0.0
    ulysses_sequence_parallel_size: int = 1
    engine: FSDPEngineConfig = field(default_factory=lambda: FSDPEngineConfig(strategy="fsdp2"))
    optim: FSDPOptimizerConfig = field(default_factory=FSDPOptimizerConfig)
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig(save_lora_only=True))

    def __post_init__(self):
        for key in ("ppo_mini_batch_size", "rollout_n", "ppo_micro_batch_size_per_gpu", "ppo_epochs"):
            if getattr(self, key) < 1:
                raise ValueError(f"actor.{key} must be >= 1, got {getattr(self, key)}")
        infer = self.infer_micro_batch_size_per_gpu
        if isinstance(infer, bool) or not isinstance(infer, int) or infer < 0:
            raise ValueError(
                f"actor.infer_micro_batch_size_per_gpu must be an integer >= 0 (0: ppo_micro_batch_size_per_gpu), "
                f"got {infer!r}"
            )
        if not self.clip_ratio > 0:
            raise ValueError(f"actor.clip_ratio must be > 0, got {self.clip_ratio}")
        if self.kl_beta < 0:
            raise ValueError(f"actor.kl_beta must be >= 0, got {self.kl_beta}")
        freq = self.rollout_log_prob_check_freq
        if isinstance(freq, bool) or not isinstance(freq, int) or freq < 0:
            raise ValueError(f"actor.rollout_log_prob_check_freq must be an integer >= 0 (0: never), got {freq!r}")
        rows = self.rollout_log_prob_check_per_prompt
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= self.rollout_n:
            raise ValueError(
                f"actor.rollout_log_prob_check_per_prompt must be an integer in [0, rollout.n = {self.rollout_n}] "
                f"(the rows of each prompt group the check replays; 0: every row), got {rows!r}"
            )
        if self.rollout_correction.loss_type != "ppo_clip" and not self.use_rollout_log_probs:
            raise ValueError(
                f"actor.rollout_correction.loss_type={self.rollout_correction.loss_type} corrects for the rollout's "
                "log-probs standing in for log pi_old: set actor.use_rollout_log_probs=true, or leave loss_type=ppo_clip "
                "(the actor then recomputes log pi_old and there is nothing to correct)"
            )
        if not isinstance(self.ema_decay, int | float) or not (self.ema_decay == 0 or 0 < self.ema_decay < 1):
            raise ValueError(
                f"actor.ema_decay must be 0 (no EMA of the weights) or in (0, 1), e.g. 0.9; got {self.ema_decay!r}"
            )
        self._check_optim()
        self._mirror_sequence_parallel()
        if self.engine.strategy != "fsdp2":
            raise ValueError(
                f"actor.engine.strategy must be 'fsdp2' for diffusion models, got {self.engine.strategy!r}"
            )

    def _mirror_sequence_parallel(self) -> None:
        """verl's actor key is the one to set; the engine reads its own copy (as verl's actor hands it over)."""
        degree = self.ulysses_sequence_parallel_size
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"actor.ulysses_sequence_parallel_size must be an integer >= 1, got {degree!r}")
        engine_degree = self.engine.ulysses_sequence_parallel_size
        if engine_degree not in (1, degree):
            raise ValueError(
                f"actor.engine.ulysses_sequence_parallel_size={engine_degree} differs from "
                f"actor.ulysses_sequence_parallel_size={degree}: set actor.ulysses_sequence_parallel_size only"
            )
        self.engine.ulysses_sequence_parallel_size = degree

    def _check_optim(self) -> None:
        """verl's optimizer config checks none of these; a bad one shows only as a NaN loss or a crash after step 1."""
        optim = self.optim
        if not isinstance(optim.lr, int | float) or not math.isfinite(optim.lr) or optim.lr <= 0:
            raise ValueError(f"actor.optim.lr must be a finite number > 0, got {optim.lr!r}")
        if not 0 <= optim.weight_decay < 1:
            raise ValueError(f"actor.optim.weight_decay must be in [0, 1), got {optim.weight_decay!r}")
        if not 0 <= optim.lr_warmup_steps_ratio <= 1:
            raise ValueError(
                f"actor.optim.lr_warmup_steps_ratio must be in [0, 1], got {optim.lr_warmup_steps_ratio!r}"
            )
        if optim.clip_grad is not None and not optim.clip_grad > 0:
            raise ValueError(f"actor.optim.clip_grad must be > 0, got {optim.clip_grad!r}")

    @property
    def mini_batch_samples(self) -> int:
        """Samples per optimizer step: ``ppo_mini_batch_size`` counts prompts, each sampled ``rollout_n`` times."""
        return self.ppo_mini_batch_size * self.rollout_n

    @property
    def infer_micro_batch_size(self) -> int:
        """Samples per forward of the forward-only phases (``infer_micro_batch_size_per_gpu``, 0: the update's)."""
        return self.infer_micro_batch_size_per_gpu or self.ppo_micro_batch_size_per_gpu

    @property
    def old_log_prob_key(self) -> str:
        """The batch key the loss reads log π_old from: the rollout's own ``rollout_log_probs`` (bypass) or the
        actor's recomputed ``old_log_probs`` (a different tensor, hence a different name)."""
        return "rollout_log_probs" if self.use_rollout_log_probs else "old_log_probs"

    @property
    def rollout_is_truncated(self) -> bool:
        """The loss weighs each sample by a truncated importance weight against the rollout (no ratio clip)."""
        return self.use_rollout_log_probs and self.rollout_correction.loss_type == "reinforce"

    @property
    def rollout_gap_limit(self) -> float:
        """The largest |log π_actor − log π_rollout| the bypass loss takes as numerics: the clip range of the clipped
        ratio, or log C of the truncated weight (beyond it a weight is capped by the gap alone)."""
        return math.log(self.rollout_correction.rollout_is_threshold) if self.rollout_is_truncated else self.clip_ratio

    def validate(self, dp_size: int) -> None:
        """Checks that need the data-parallel size: each rank's share of a mini-batch is whole micro-batches."""
        samples = self.mini_batch_samples
        if samples % dp_size:
            raise ValueError(
                f"actor.ppo_mini_batch_size * rollout.n = {self.ppo_mini_batch_size} * {self.rollout_n} = {samples} "
                f"samples must divide by the data-parallel size {dp_size}"
            )
        per_rank = samples // dp_size
        if per_rank % self.ppo_micro_batch_size_per_gpu:
            raise ValueError(
                f"actor.ppo_mini_batch_size * rollout.n / dp = {per_rank} samples per rank must divide by "
                f"actor.ppo_micro_batch_size_per_gpu={self.ppo_micro_batch_size_per_gpu}"
            )
