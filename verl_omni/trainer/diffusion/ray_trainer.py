"""``RayFlowGRPOTrainer``: the step loop on verl's single controller, for every algorithm (``algorithm=<name>``).

It extends verl's v1 ``PPOTrainer`` (``verl/trainer/ppo/v1/trainer_base.py``) and keeps its
shape: ``init`` → ``_setup`` + ``on_init_end``; ``fit`` runs steps; a step is a column of
phases, each one timer around one method taking ``(batch, metrics)``; mode differences
(colocated sleep/wake) live in the ``on_*`` hooks. It keeps verl's checkpoint layout
(``global_step_<N>/actor`` + ``data.pt`` + ``latest_checkpointed_iteration.txt``) and
``Tracking``, but writes and resumes checkpoints through :mod:`run_dir` (written under a temporary
name and renamed when complete; resumed only from a complete one; the directory locked). It
overrides the data path: verl's v1 loop moves token sequences through TransferQueue with nested
response tensors, while a diffusion batch is a plain ``DataProto`` of images, latents and prompt
embeddings (``docs/guide/training.md``, "The step"). Processes: the trainer (this, in the driver), the
actor worker group (``DiffusionActorWorker``, one Ray actor per rank, FSDP2), the vLLM-Omni rollout
replicas with their load balancer and agent-loop workers, and the reward loop workers.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from verl import DataProto
from verl.protocol import unpad_dataproto
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.tracking import Tracking

from verl_omni.algorithms.flow_grpo_math import zero_std_groups
from verl_omni.algorithms.reward_normalization import gdpo_scores, per_scorer_advantage_metrics
from verl_omni.trainer.config.validation import RunConfigs
from verl_omni.trainer.diffusion import non_finite, rollout_check
from verl_omni.trainer.diffusion.preemption import Preempted, PreemptionRequest, StepAbandoned
from verl_omni.trainer.diffusion.reward_guard import GuardAlarm, RewardGuard
from verl_omni.trainer.diffusion.run_dir import RunDir, open_run_dir
from verl_omni.trainer.diffusion.tracking import keep_metrics_until
from verl_omni.trainer.diffusion.validation import ValidationSteps
from verl_omni.trainer.diffusion.watchdog import PhaseWatchdog
from verl_omni.trainer.diffusion.worker_setup import WorkerSetup
from verl_omni.utils.reward_score.multi import EXTRA_INFO_PREFIX
from verl_omni.workers.rollout.weight_sync import RolloutWeightSync
from verl_omni.workers.utils.replay import get_replay
from verl_omni.workers.utils.sample_mask import SAMPLE_MASK_KEY

# where the adv phase leaves an algorithm's update layout for the update phase (DataProto.meta_info)
UPDATE_ROWS_KEY = "update_rows"

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


def _restore_info_logging() -> None:
    """Undo a global ``logging.disable(INFO)`` left behind by vLLM 0.26's ``suppress_logging``.

    It wraps config default factories (``vllm/engine/arg_utils.py``) without try/finally, so when
    one raises (as on CPU) INFO stays disabled process-wide and the trainer's progress lines vanish.
    """
    if logging.root.manager.disable >= logging.INFO:
        logging.disable(logging.NOTSET)
        logger.warning("re-enabled INFO logging that vLLM's suppress_logging had left disabled")


@register_trainer("flowgrpo")
class RayFlowGRPOTrainer(WorkerSetup, ValidationSteps, PPOTrainer):
    """Synchronous Flow-GRPO: generate → reward → old log-prob → (ref) → advantage → update → sync."""

    # a preempted step may be dropped before the actor's phases (preemption.py): the dataloader's position before
    # its batch is what the checkpoint of the previous step holds
    can_abandon_step = True

    def __init__(self, config: DictConfig, configs: RunConfigs, run_dir: RunDir | None = None):
        """``run_dir``: what ``open_run_dir`` decided before Ray started (opened here when not given)."""
        # verl's __init__ builds a TransferQueue replay buffer; this trainer feeds the step directly
        self.config = config
        self.configs = configs
        self.checkpoint_callback = build_checkpoint_callback(config)
        self.trainer_mode = "sync"
        self.use_critic = False
        # the algorithm's declarations decide the optional phases and what the actor is sent (docs/guide/algorithms.md)
        self.algorithm = configs.algorithm_cls
        phases = self.algorithm.phases(configs.algorithm, configs.actor)
        self.use_reference_policy, self.recompute_old_log_prob = phases.reference, phases.old_log_prob
        self.old_outputs = list(phases.old_outputs)
        self.loss_keys = self.algorithm.build_loss(configs.actor, configs.algorithm).required_keys
        # groups whose rewards are all equal leave the update: the actor gets a per-sample mask
        # (docs/guide/algorithms.md)
        self.drop_zero_std_groups = configs.algorithm.drop_zero_std_groups
        self.update_keys = self.loss_keys + ((SAMPLE_MASK_KEY,) if self.drop_zero_std_groups else ())
        self.colocate = configs.trainer.colocate_rollout
        self.n = configs.rollout.n
        # what the actor replays (docs/design.md, "The actor's batch"): the recorded trajectory and the
        # model's conditioning
        uses_cfg = configs.rollout.sampling_spec(adapter=configs.model.adapter).uses_cfg
        trajectory = get_replay(self.algorithm.rollout_record).trajectory_keys
        self.replay_keys = trajectory + configs.model.adapter.required_keys(uses_cfg)
        self.device = configs.trainer.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.run_dir = run_dir or open_run_dir(configs.trainer)
        self.local_dir = self.run_dir.root
        self.global_steps = 0
        # a preemption signal's request (the entry point installs the handlers once Ray started); the step of the
        # newest complete checkpoint (None: none yet), so that a preempted run does not save the same step twice
        self.preemption = PreemptionRequest(configs.trainer.preempt_grace_s)
        self._saved_step: int | None = None
        # the previous step's wall time (None before the first), which decides whether a preempted step may finish
        self._last_step_s: float | None = None
        self._step_started = time.monotonic()
        self._data_state_before_step: dict | None = None
        # trainer.nan_policy (non_finite.py): why this step's update is dropped (None: it is not), and how many were
        self._skip_update: str | None = None
        self._non_finite_skipped = 0
        # held-out scorers and image statistics at each validation (docs/guide/rewards.md, "Reward-hacking guard")
        self.guard = RewardGuard(configs.guard) if configs.guard.enabled else None
        self.guard_alarm: GuardAlarm | None = None
        # the actor ranks' init_model calls in flight (_init_actor starts them, _actor_loaded waits)
        self._actor_init = None
        # a phase that does not finish within its trainer.watchdog limit fails the run naming it (watchdog.py)
        self.watchdog = PhaseWatchdog(configs.trainer.watchdog, self.phase_workers)
        # the summary's wall time counts from here: worker start-up is part of a run's time
        self.started = time.monotonic()

    # ---- setup -----------------------------------------------------------------------------

    def _setup(self):
        self._check_device_layout()
        self._init_tokenizer()
        self._init_dataloader()
        with self.watchdog.phase("engine_start"):
            self._start_workers()
        # built once: every sync of the run goes through it (the transport and payload the config names)
        self.weight_sync = RolloutWeightSync.from_configs(
            self.actor_rollout_wg,
            self.llm_server_manager.server_handles,
            self.configs.rollout,
            self.configs.model.lora,
            self.colocate,
            self.device,
        )
        self._load_checkpoint()
        _restore_info_logging()

    def on_init_end(self):
        """A resumed actor's weights go to the rollout before the first step."""
        if self.global_steps > 0:
            self._sync_weights({})

    # the device layout check, the dataloaders and the workers' start: WorkerSetup (worker_setup.py)

    # ---- the loop --------------------------------------------------------------------------

    def fit(self):
        """Train ``total_training_steps`` steps (from a resumed step when there is a checkpoint)."""
        if self.preemption.requested:  # during the workers' start: nothing trained, nothing to save
            raise Preempted(self.preemption.signame, self._saved_step)
        self.tracker = self._init_tracker()
        if self.configs.trainer.val_before_train and self.global_steps == 0:
            with self.watchdog.phase("testing", 0):
                self.tracker.log(data=self._validate(), step=0)
        progress = tqdm(
            total=self.total_training_steps, initial=self.global_steps, desc=f"{self.algorithm.display_name()} steps"
        )
        self.global_steps += 1
        batches = self._train_batches()
        while self.global_steps <= self.total_training_steps:
            self._stop_if_preempted(self.global_steps - 1)
            is_last_step = self.global_steps == self.total_training_steps
            metrics, timing_raw = {}, {}
            self._step_started = time.monotonic()
            if self.can_abandon_step:
                self._data_state_before_step = self._dataloader_state()
            try:
                with marked_timer("step", timing_raw):
                    batch = self.step(next(batches), metrics, timing_raw)
            except StepAbandoned:
                self._stop_if_preempted(self.global_steps - 1, self._data_state_before_step)
            if self._due(self.configs.trainer.test_freq, is_last_step) and not self.preemption.requested:
                with self._phase("testing", timing_raw):
                    metrics.update(self._validate())
            # the checkpoint comes after the step's validation and right before its metrics line: a run that dies
            # anywhere in the step resumes from the previous checkpoint and redoes the whole step, its validation and
            # its metrics line included, instead of going on from a step whose line was never written
            if self._due(self.configs.trainer.save_freq, is_last_step):
                with self._phase("save_checkpoint", timing_raw):
                    self._save_checkpoint()
                timing_raw["step"] += timing_raw["save_checkpoint"]
            self._compute_metrics(batch, metrics, timing_raw, self.global_steps, self._epoch())
            self.tracker.log(data=metrics, step=self.global_steps)
            if self.guard_alarm is not None:
                self._guard_fired(self.guard_alarm)
            progress.update(1)
            self._last_step_s = time.monotonic() - self._step_started
            self._stop_if_preempted(self.global_steps)
            self.global_steps += 1
        progress.close()
        self.on_train_end()

    def _advantage_and_update(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        """The algorithm's advantages, then its update of the actor, each checked for non-finite values; shared by the
        online step and the offline preference step (``offline_preferences.py``)."""
        with self._phase("adv", timing_raw):
            batch = self._compute_advantage(batch, metrics)
        self._check_rows("advantages", batch, f"the advantage ({self.algorithm.display_name()})")
        with self._phase("update_actor", timing_raw):
            batch = self._update_actor(batch, metrics)
        if bad := non_finite.bad_update_metrics(metrics):
            self._non_finite(f"the actor's update reported {bad} (ranks' loss / gradient norm)")
        metrics["training/non_finite_steps_skipped"] = float(self._non_finite_skipped)
        return batch

    def _stop_if_preempted(self, finished: int, data_state: dict | None = None) -> None:
        """On a preemption request: checkpoint step ``finished`` (unless its checkpoint exists) and raise
        :class:`Preempted`. ``data_state``: the dataloader's position after that step when it is not the current one.
        """
        if not self.preemption.requested:
            return
        if finished != self._saved_step:
            self._save_checkpoint(step=finished, data_state=data_state)
        self.tracker.finish()
        raise Preempted(self.preemption.signame, self._saved_step)

    def step(self, batch_dict: dict, metrics: dict, timing_raw: dict) -> DataProto:
        """One step on one batch of prompts; each phase is one timed method call, gated by the algorithm."""
        # 1. prompts → rollout.n interleaved rows per prompt, tagged with the prompt's uid
        batch = self._prompt_batch(batch_dict, self.n, validate=False)
        # 2. sample images, recording what the algorithm needs (an SDE window's latents and log-probs)
        with self._phase("gen", timing_raw):
            self.on_sample_begin()
            batch = self._generate(batch, metrics)
            self.on_sample_end()
        # 3. score them, unless the agent loop streamed rm_scores already
        if "rm_scores" not in batch.batch.keys():
            with self._phase("reward", timing_raw):
                batch = self._compute_reward(batch, metrics)
        # 4. the old policy's replay by the actor (else the rollout's log-probs are used, a sample checked now and then)
        if self.recompute_old_log_prob:
            with self._phase("old_log_prob", timing_raw):
                batch = self._compute_old_log_prob(batch, metrics)
        elif self._rollout_log_prob_check_due(batch):
            with self._phase("old_log_prob", timing_raw):
                self._check_rollout_log_probs(batch, metrics)
        # 5. the reference's means, for the KL term
        if self.use_reference_policy:
            with self._phase("ref", timing_raw):
                batch = self._compute_ref_log_prob(batch, metrics)
        self._skip_update = None
        self._check_rows("rm_scores", batch, f"the reward (scorers: {self._scorer_names()})")
        # 6-7. the algorithm's advantages and its update of the LoRA (or the full transformer)
        batch = self._advantage_and_update(batch, metrics, timing_raw)
        # 8. the new weights to every rollout replica
        with self._phase("sync", timing_raw):
            self._sync_weights(metrics)
        return batch

    # ---- phases ----------------------------------------------------------------------------

    def _prompt_batch(self, batch_dict: dict, repeat: int, validate: bool, step: int | None = None) -> DataProto:
        """A DataProto of prompts for ``step`` (default: this one), one ``uid`` per prompt (deterministic:
        resumes reproduce routing)."""
        step = self.global_steps if step is None else step
        batch = DataProto.from_single_dict(batch_dict)
        prefix = "val" if validate else "train"
        batch.non_tensor_batch["uid"] = np.array([f"{prefix}-{step}-{i}" for i in range(len(batch))], dtype=object)
        batch = batch.repeat(repeat_times=repeat, interleave=True)
        # the rollout seeds each row from (rollout.seed, global_steps, row): validation always passes
        # step 0, so every validation draws the same noise and its grids compare across training
        batch.meta_info.update(global_steps=0 if validate else step, validate=validate)
        return batch

    def _generate(self, batch: DataProto, metrics: dict) -> DataProto:
        self._new_engine_batches()  # validation's batches are not this step's
        output = self.agent_loop_manager.generate_sequences(batch)
        metrics.update({k: float(v) for k, v in output.meta_info.pop("timing", {}).items()})
        sizes = self._new_engine_batches()
        if sizes:
            # a step's group requests should share few transformer batches (docs/perf.md)
            metrics["rollout/engine_batches"] = float(len(sizes))
            metrics["rollout/requests_per_engine_batch"] = float(np.mean(sizes))
        return output

    def _new_engine_batches(self) -> list[int]:
        """Requests per transformer batch the replicas ran since the last call (empty for pipelines not counting)."""
        handles = self.llm_server_manager.server_handles
        per_server = ray.get([server.request_batch_sizes.remote() for server in handles])
        seen = self._engine_batches_seen
        self._engine_batches_seen = [len(sizes) for sizes in per_server]
        return [size for sizes, start in zip(per_server, seen, strict=True) for size in sizes[start:]]

    def _compute_reward(self, batch: DataProto, metrics: dict) -> DataProto:
        scored = self.reward_loop_manager.compute_rm_score(batch)
        metrics.update(scored.meta_info.pop("metrics", {}))
        scored.meta_info.pop("reward_extra_keys", None)
        return batch.union(scored)

    def _compute_old_log_prob(self, batch: DataProto, metrics: dict) -> DataProto:
        old = self.actor_rollout_wg.compute_log_prob(self._old_policy_request(batch)).batch
        batch.batch.update(old)
        if "rollout_log_probs" in batch.batch.keys():
            # the actor replays what the rollout sampled: they agree to numerics (docs/guide/training.md)
            metrics[rollout_check.GAP_METRIC] = rollout_check.rollout_gap(
                old["old_log_probs"], batch.batch["rollout_log_probs"], self.configs.actor, self.global_steps
            )
        return batch

    def _check_rollout_log_probs(self, batch: DataProto, metrics: dict) -> None:
        """The actor's replay of a sample of the batch (``actor.rollout_log_prob_check_per_prompt`` rows of each
        prompt group) against the log-probs the loss divides by: only the gap is kept."""
        rows = rollout_check.check_rows(
            batch.non_tensor_batch["uid"], self.configs.actor.rollout_log_prob_check_per_prompt
        )
        request, pad = rollout_check.check_request(self._actor_input(batch), rows, self.actor_rollout_wg.world_size)
        old = unpad_dataproto(self.actor_rollout_wg.compute_log_prob(request), pad).batch["old_log_probs"]
        rollout = batch.batch["rollout_log_probs"][torch.from_numpy(rows)]
        metrics[rollout_check.GAP_METRIC] = rollout_check.rollout_gap(
            old, rollout, self.configs.actor, self.global_steps
        )
        metrics[rollout_check.CHECK_ROWS_METRIC] = float(len(rows))

    def _rollout_log_prob_check_due(self, batch: DataProto) -> bool:
        """In bypass (the loss divides by the rollout's log-probs), whether this step replays a sample anyway to
        log how far the actor is from the rollout (``actor.rollout_log_prob_check_freq``): the run's first step, so a
        rollout that does not match the actor shows before the loss has trained on its ratios, then every N-th."""
        freq = self.configs.actor.rollout_log_prob_check_freq
        return freq > 0 and (self.global_steps - 1) % freq == 0 and "rollout_log_probs" in batch.batch.keys()

    def _old_policy_request(self, batch: DataProto) -> DataProto:
        """The actor's input for the old policy's replay: the current weights, the ones that sampled the batch."""
        (request := self._actor_input(batch)).meta_info["old_outputs"] = self.old_outputs
        return request

    def _compute_ref_log_prob(self, batch: DataProto, metrics: dict) -> DataProto:
        out = self.actor_rollout_wg.compute_ref_log_prob(self._actor_input(batch))
        batch.batch["ref_prev_sample_mean"] = out.batch["ref_prev_sample_mean"]
        return batch

    def _compute_advantage(self, batch: DataProto, metrics: dict) -> DataProto:
        scores = batch.batch["rm_scores"].float()
        uids = batch.non_tensor_batch["uid"]
        advantage_scores = self._advantage_scores(batch, scores, metrics)
        batch.batch["advantages"] = self.algorithm.compute_advantage(advantage_scores, uids, self.configs.algorithm)
        zero_std, zero_std_frac = zero_std_groups(advantage_scores, uids)
        if self.drop_zero_std_groups:
            batch.batch[SAMPLE_MASK_KEY] = ~zero_std.cpu()
        # an algorithm whose loss couples samples lays out the update rows (Algorithm.arrange_update)
        rows = self.algorithm.arrange_update(advantage_scores, uids, self.configs.algorithm)
        if rows is not None:
            batch.meta_info[UPDATE_ROWS_KEY] = rows
            metrics.update(rows.metrics)
        metrics.update(
            {
                "critic/score/mean": scores.mean().item(),
                "critic/score/max": scores.max().item(),
                "critic/score/min": scores.min().item(),
                "critic/score/zero_std_group_frac": zero_std_frac,
                "critic/score/zero_std_samples_dropped": float(zero_std.sum()) if self.drop_zero_std_groups else 0.0,
                "critic/advantages/mean": batch.batch["advantages"].mean().item(),
                "critic/advantages/max": batch.batch["advantages"].max().item(),
                "critic/advantages/min": batch.batch["advantages"].min().item(),
            }
        )
        return batch

    def _check_rows(self, key: str, batch: DataProto, source: str) -> None:
        """``batch[key]`` finite in every sample, else ``trainer.nan_policy`` decides (:mod:`non_finite`)."""
        if self._skip_update or key not in batch.batch.keys():
            return
        values = batch.batch[key]
        if rows := non_finite.bad_rows(values):
            self._non_finite(non_finite.describe_rows(key, values, batch.non_tensor_batch["uid"], rows, source))

    def _non_finite(self, what: str) -> None:
        """``stop``: raise naming the step and ``what``; ``skip_step``: the step's update is dropped, logged, counted."""
        if self.configs.trainer.nan_policy == "stop":
            raise non_finite.error(self.global_steps, what)
        if self._skip_update is None:
            self._non_finite_skipped += 1
        self._skip_update = what
        logger.warning("step %d: %s; its update is dropped (trainer.nan_policy=skip_step)", self.global_steps, what)

    def _scorer_names(self) -> str:
        return ", ".join(str(getattr(s, "type", s)) for s in self.configs.reward.scorers)

    def _advantage_scores(self, batch: DataProto, scores: torch.Tensor, metrics: dict) -> torch.Tensor:
        """The score the algorithm's group advantage reads: the combined reward (``sum``), or GDPO's weighted
        mean of each scorer's group-normalised reward (``gdpo``, with per-scorer metrics)."""
        if self.configs.algorithm.reward_normalization != "gdpo":
            return scores
        scorers = self.configs.reward.scorers
        per_scorer = {s.label: batch.non_tensor_batch[EXTRA_INFO_PREFIX + s.label] for s in scorers}
        combined, normalized = gdpo_scores(
            per_scorer, {s.label: s.weight for s in scorers}, batch.non_tensor_batch["uid"]
        )
        metrics.update(per_scorer_advantage_metrics(normalized, batch.non_tensor_batch["uid"]))
        return combined.to(scores.device)

    def _update_actor(self, batch: DataProto, metrics: dict) -> DataProto:
        """The algorithm's update; none when ``drop_zero_std_groups`` or the algorithm's update layout left every sample
        out (logged, not an error), or when the step's rewards or advantages are not finite under
        ``trainer.nan_policy=skip_step``."""
        if self._skip_update:
            return batch
        skip = self.drop_zero_std_groups and not bool(batch.batch[SAMPLE_MASK_KEY].any())
        metrics["critic/score/zero_std_update_skipped"] = float(skip)
        if skip:
            logger.warning("step %d: every prompt group's rewards are equal: no update", self.global_steps)
            return batch
        rows = batch.meta_info.get(UPDATE_ROWS_KEY)
        if rows is not None and not bool(rows.keep.any()):
            logger.warning(
                "step %d: the algorithm's update layout trains no sample (its pairs or groups need unequal rewards): "
                "no update",
                self.global_steps,
            )
            metrics["critic/score/zero_std_update_skipped"] = 1.0
            return batch
        if rows is None:
            # the keys the algorithm's loss declares (e.g. log π_old, advantages, the reference's means), and the mask
            request = self._actor_input(batch, self.update_keys)
        else:
            request = self._arranged_input(batch, rows)
        output = self.actor_rollout_wg.update_actor(request)
        metrics.update(reduce_metrics(output.meta_info["metrics"]))  # per rank, equal (reduced over ranks)
        return batch

    def _arranged_input(self, batch: DataProto, rows) -> DataProto:
        """The update batch laid out as the algorithm's :class:`~verl_omni.algorithms.UpdateRows` say: its rows in
        their order, the loss's per-row keys, and the rows it trains on as the ``sample_mask``."""
        given = [k for k in self.loss_keys if k not in rows.keys]
        request = self._actor_input(batch, tuple(given)).select_idxs(rows.order)
        for key, values in rows.keys.items():
            request.batch[key] = values
        request.batch[SAMPLE_MASK_KEY] = rows.keep
        return request

    def _sync_weights(self, metrics: dict) -> None:
        """The actor's weights to every replica, checked there (or this raises): :attr:`weight_sync`."""
        metrics.update(self.weight_sync.sync(self.global_steps))

    def _actor_input(self, batch: DataProto, extra: tuple[str, ...] = ()) -> DataProto:
        # a key the rollout did not record is reported by the actor's replay check, naming it
        keys = [k for k in self.replay_keys if k in batch.batch.keys()] + list(extra)
        return batch.select(batch_keys=keys, non_tensor_batch_keys=[], meta_info_keys=["sampling_spec"])

    # ---- metrics, logging ------------------------------------------------------------------

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timing_raw.items()})
        metrics["perf/images_per_s"] = len(batch) / timing_raw["step"]
        metrics.update({"training/global_step": global_steps, "training/epoch": epoch})

    def _init_tracker(self) -> Tracking:
        """verl's ``Tracking`` with the JSONL file and tensorboard under ``default_local_dir``.

        verl's file backend truncates its file; a resumed run first keeps the lines of the steps
        it resumes from, so ``metrics.jsonl`` stays one object per step over the whole run.
        """
        self.local_dir.mkdir(parents=True, exist_ok=True)
        metrics_file = self.local_dir / "metrics.jsonl"
        kept = keep_metrics_until(metrics_file, self.global_steps)
        os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics_file)
        os.environ["TENSORBOARD_DIR"] = str(self.local_dir / "tensorboard")
        trainer = self.configs.trainer
        tracker = Tracking(
            project_name=trainer.project_name,
            experiment_name=trainer.experiment_name,
            default_backend=list(trainer.logger),
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        if kept and "file" in tracker.logger:
            tracker.logger["file"].fp.write(kept)
        return tracker

    # ---- hooks and helpers -----------------------------------------------------------------

    def on_sample_end(self):
        """Colocated: the replicas give the devices back to the actor phases."""
        if self.colocate:
            self._call_servers("sleep")

    def on_step_end(self):
        """Weights are synced in the step's ``sync`` phase."""

    def on_train_end(self):
        self.weight_sync.close()
        self.tracker.finish()
        self.write_summary(interrupted=False)

    def write_summary(self, interrupted: bool, stop_reason: str | None = None) -> None:
        """``summary.txt`` and ``reward_curve.png`` next to ``metrics.jsonl`` (``flowgrpo/summary.py``)."""
        from verl_omni.trainer.diffusion.summary import write_summary

        model = self.configs.model
        write_summary(
            self.local_dir,
            getattr(self, "total_training_steps", 0),
            time.monotonic() - self.started,
            model.path,
            model.adapter.lora_file_pipeline,
            algorithm=self.algorithm.display_name(),
            interrupted=interrupted,
            stop_reason=stop_reason,
        )

    # ---- checkpoints -----------------------------------------------------------------------

    def _save_checkpoint(self, step: int | None = None, data_state: dict | None = None):
        """The actor's ranks and the dataloader state into ``global_step_<N>.partial``, then committed.

        ``step`` (default: this one) and ``data_state`` (default: the dataloader's position now): a preempted
        run saves the step before the one it dropped, with the position before that step's batch.

        verl's version writes ``global_step_<N>`` in place and the tracker right after: a kill
        mid-save leaves a checkpoint that resumes wrongly. Here the directory is renamed only when
        everything is written, then the tracker moves and ``max_actor_ckpt_to_keep`` prunes.
        """
        step = self.global_steps if step is None else step
        partial = self.run_dir.begin_checkpoint(step)
        try:
            # blocks until every rank has written its files
            self.actor_rollout_wg.save_checkpoint(str(partial / "actor"), None, step)
            torch.save(self._dataloader_state() if data_state is None else data_state, partial / "data.pt")
        except (OSError, ray.exceptions.RayTaskError) as e:  # a full disk or an unwritable path, here or on a rank
            raise self.run_dir.save_failed(step, e) from e
        path = self.run_dir.commit_checkpoint(step, keep=self.configs.trainer.max_actor_ckpt_to_keep)
        self._saved_step = step
        logger.info("checkpoint of step %d complete: %s", step, path)
        self.checkpoint_callback.on_save(trainer=self, global_step=step, checkpoint_dir=str(path), async_save=False)

    def _load_checkpoint(self):
        """Load the complete checkpoint ``open_run_dir`` chose (none: step 0), actor and dataloader."""
        target = self.run_dir.resume_from
        self.global_steps = self.run_dir.resume_step
        self._saved_step = None if target is None else self.global_steps
        if target is None:
            logger.info("a new run in %s", self.local_dir)
            return
        logger.info("resuming from %s at step %d", target, self.global_steps)
        self.actor_rollout_wg.load_checkpoint(local_path=str(target / "actor"))
        self.train_dataloader.load_state_dict(torch.load(target / "data.pt", weights_only=False))

    def _call_servers(self, method: str) -> None:
        ray.get([getattr(server, method).remote() for server in self.llm_server_manager.server_handles])

    def _dataloader_state(self) -> dict:
        """The dataloader's position after this step's batch (what a resume continues from)."""
        return self.train_dataloader.state_dict()

    def _train_batches(self):
        """Training batches across epochs; the dataloader's state (saved in checkpoints) resumes mid-epoch."""
        while True:
            yield from self.train_dataloader

    def _epoch(self) -> int:
        return (self.global_steps - 1) // self.steps_per_epoch

    def _due(self, freq: int, is_last_step: bool) -> bool:
        return freq > 0 and (is_last_step or self.global_steps % freq == 0)

    @contextmanager
    def _phase(self, name: str, timing_raw: dict):
        """``marked_timer`` plus a progress line (phases take minutes on large models); a preempted step may be
        dropped here, before one of its phases (:meth:`PreemptionRequest.abandon_before`); bounded by the watchdog."""
        if self.can_abandon_step and self.preemption.abandon_before(
            name, time.monotonic() - self._step_started, self._last_step_s
        ):
            logger.warning(
                "step %d dropped before %s: preempted by %s", self.global_steps, name, self.preemption.signame
            )
            raise StepAbandoned(name)
        logger.info("step %d/%d: %s", self.global_steps, self.total_training_steps, name)
        start = time.perf_counter()
        with self.watchdog.phase(name, self.global_steps), marked_timer(name, timing_raw):
            yield
        logger.info("step %d: %s done in %.1f s", self.global_steps, name, time.perf_counter() - start)
