"""``trainer.trainer_mode=separate_async``: the rollout generates the next steps' batches while the actor trains.

verl 0.9.1's separate-pools trainer (``verl/trainer/ppo/v1/trainer_separate_async.py``) and its one-step
off-policy recipe (``verl/experimental/one_step_off_policy/``) keep the rollout on devices of its own and
start the next batch's generation before the current update; this mode does the same as a few hooks on
:class:`RayFlowGRPOTrainer` (the step and ``fit`` are the sync trainer's):

* ``gen`` of step k takes step k's batch from the queue (generated ahead; the first step, and the first after
  a resume, generate in the step) and queues the generation of the steps up to k + ``max_staleness`` on a
  background thread: they run on the rollout replicas while the actor computes steps k's phases;
* ``sync`` waits until the queued generations are done (the rollout is idle), then pushes the new weights:
  a generation never mixes two weight versions, and a batch generated at step k carries version k-1;
* every sample carries ``weight_version``, the version of the weights that sampled it; the staleness of step
  k's batch is (k-1) - version (``async/staleness``), at most ``trainer.max_staleness``;
* the ratio divides by the rollout's log-probs (``actor.use_rollout_log_probs=true``, validated): the sampling
  policy's. The ``old_log_prob`` phase replays the batch with that same weight version (kept on each actor
  rank before the update that replaced it, :mod:`~verl_omni.workers.engine.fsdp.policy_versions`) and logs the
  gap to the rollout's log-probs as ``old_log_prob/rollout_diff_max``, as the sync trainer does.

Checkpoints are taken at a step boundary with the dataloader's position after the step's own batch; the
generations queued ahead are discarded and, after a resume, redone with the checkpoint's weights (the first
resumed step is on-policy, staleness 0).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from verl import DataProto
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls, register_trainer

from verl_omni.trainer.diffusion.ray_trainer import RayFlowGRPOTrainer

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# per-sample tensor: the weight version (updates applied) that sampled the row
WEIGHT_VERSION_KEY = "weight_version"


def trainer_class(mode: str) -> type[RayFlowGRPOTrainer]:
    """The trainer of ``trainer.trainer_mode`` (validated by ``FlowGRPOTrainerConfig``)."""
    return get_trainer_cls("flowgrpo" if mode == "sync" else f"flowgrpo_{mode}")


class Lookahead(Iterator):
    """The training batches, with a look at the next ones, remembering the dataloader's position after each.

    A checkpoint of step k must resume after step k's batch although the batches of the steps queued
    ahead have already been drawn: :meth:`state_after` gives the state as it was then.
    """

    def __init__(self, source: Iterator, dataloader):
        self._source, self._dataloader = source, dataloader
        self._buffer: deque = deque()
        self._pulled = 0
        self._consumed = 0
        self._states: dict[int, dict] = {}

    def _pull(self) -> None:
        self._states[self._pulled] = self._dataloader.state_dict()
        self._buffer.append(next(self._source))
        self._pulled += 1

    def __next__(self):
        if not self._buffer:
            self._pull()
        self._consumed += 1
        self._states = {n: s for n, s in self._states.items() if n >= self._consumed}
        return self._buffer.popleft()

    def peek(self, ahead: int):
        """The item ``ahead`` places after the next one (0: the next)."""
        while len(self._buffer) <= ahead:
            self._pull()
        return self._buffer[ahead]

    def state_after(self, consumed: int) -> dict:
        """The dataloader's state once ``consumed`` items had been taken (the current one or later)."""
        if consumed == self._pulled:
            return self._dataloader.state_dict()
        if consumed not in self._states:
            raise ValueError(f"no dataloader state after item {consumed}: kept {sorted(self._states)}")
        return self._states[consumed]


def _weight_version(batch: DataProto) -> int:
    """The one weight version that sampled ``batch`` (a generation never spans two)."""
    versions = batch.batch[WEIGHT_VERSION_KEY].unique().tolist()
    if len(versions) != 1:
        raise RuntimeError(f"a rollout batch must come from one weight version, got {versions}")
    return int(versions[0])


@dataclass
class QueuedRollout:
    """A generation for ``step`` launched with the rollout at weight ``version``: ``(batch, metrics)`` when done."""

    step: int
    version: int
    future: Future


@register_trainer("flowgrpo_separate_async")
class RayFlowGRPOSeparateAsyncTrainer(RayFlowGRPOTrainer):
    """Flow-GRPO with the rollout of the next ``max_staleness`` steps running while the actor trains."""

    # generations run ahead of training (the dataloader's position is counted from the steps consumed): a preempted
    # step always finishes, then is checkpointed
    can_abandon_step = False

    def __init__(self, config, configs, run_dir=None):
        super().__init__(config, configs, run_dir)
        self.trainer_mode = "separate_async"
        self.max_staleness = configs.trainer.max_staleness
        # the check of the sampling policy: the actor replays the batch with the weights that sampled it
        self.recompute_old_log_prob = True
        self.rollout_version = 0
        self._queue: deque[QueuedRollout] = deque()
        # one thread: queued generations run one after another, in step order
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout_ahead")

    # ---- data --------------------------------------------------------------------------------

    def _train_batches(self):
        self._batches = Lookahead(super()._train_batches(), self.train_dataloader)
        self._first_step = self.global_steps
        return self._batches

    def _dataloader_state(self) -> dict:
        return self._batches.state_after(self.global_steps - self._first_step + 1)

    # ---- phases --------------------------------------------------------------------------------

    def _generate(self, batch: DataProto, metrics: dict) -> DataProto:
        """This step's batch from the queue (else generated now), then the next steps' generations queued."""
        if batch.meta_info.get("validate"):
            return super()._generate(batch, metrics)
        step = self.global_steps
        if self._queue and self._queue[0].step == step:
            output, gen_metrics = self._queue.popleft().future.result()
            metrics["async/prefetched"] = 1.0
        else:
            output, gen_metrics = self._rollout(batch, self.rollout_version)
            metrics["async/prefetched"] = 0.0
        if list(output.non_tensor_batch["uid"]) != list(batch.non_tensor_batch["uid"]):
            raise RuntimeError(f"step {step}: the queued rollout holds other prompts than the step's batch")
        metrics.update(gen_metrics)
        version = _weight_version(output)
        staleness = step - 1 - version
        if not 0 <= staleness <= self.max_staleness:
            raise RuntimeError(
                f"step {step} got samples of weight version {version}: staleness {staleness} outside "
                f"[0, trainer.max_staleness={self.max_staleness}]"
            )
        metrics.update({"async/staleness": float(staleness), "async/weight_version": float(version)})
        self._queue_ahead(step)
        return output

    def _rollout(self, prompts: DataProto, version: int) -> tuple[DataProto, dict]:
        """The sync trainer's generation (here possibly on the background thread), each row tagged with ``version``."""
        metrics: dict = {}
        output = super()._generate(prompts, metrics)
        output.batch[WEIGHT_VERSION_KEY] = torch.full((len(output),), version, dtype=torch.long)
        return output, metrics

    def _queue_ahead(self, step: int) -> None:
        """Launch the generations of the steps after ``step`` up to ``step + max_staleness`` (and the last step),
        with the rollout's current weights."""
        last = min(step + self.max_staleness, self.total_training_steps)
        start = self._queue[-1].step + 1 if self._queue else step + 1
        for ahead in range(start, last + 1):
            prompts = self._prompt_batch(self._batches.peek(ahead - step - 1), self.n, validate=False, step=ahead)
            future = self._pool.submit(self._rollout, prompts, self.rollout_version)
            self._queue.append(QueuedRollout(ahead, self.rollout_version, future))

    def _old_policy_request(self, batch: DataProto) -> DataProto:
        """The replay of the weight version that sampled the batch (a kept one when the actor has moved on)."""
        from verl_omni.workers.engine_workers import POLICY_VERSION_KEY

        request = super()._old_policy_request(batch)
        version = _weight_version(batch)
        if version != self.global_steps - 1:
            request.meta_info[POLICY_VERSION_KEY] = int(version)
        return request

    def _update_actor(self, batch: DataProto, metrics: dict) -> DataProto:
        """Before the update replaces them, the actor ranks keep the weights the queued batches were sampled with."""
        keep = sorted({queued.version for queued in self._queue})
        self.actor_rollout_wg.keep_policy_version(self.global_steps - 1, keep)
        metrics["async/kept_weight_versions"] = float(len(keep))
        return super()._update_actor(batch, metrics)

    def _sync_weights(self, metrics: dict) -> None:
        """Wait until the queued generations are done (no generation mixes two versions), then push; a queued
        generation that failed raises here, before its step."""
        start = time.perf_counter()
        for queued in self._queue:
            queued.future.result()
        metrics["timing_s/rollout_wait"] = time.perf_counter() - start
        super()._sync_weights(metrics)
        self.rollout_version = self.global_steps

    def on_train_end(self):
        self._pool.shutdown(wait=True)
        super().on_train_end()
