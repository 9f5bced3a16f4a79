"""Offline Diffusion-DPO (``data.preference_files``): the step trains on a preference file's pairs, with no rollout.

An online Diffusion-DPO step samples each prompt's group with the rollout engine, scores it, and the algorithm
pairs the group's best sample with its worst (:meth:`~verl_omni.algorithms.diffusion_dpo.DiffusionDPO.arrange_update`).
An offline step takes ``data.train_batch_size`` (prompt, chosen image, rejected image) rows of the files instead
(:class:`~verl_omni.utils.dataset.preference_data.PreferencePairs`) and makes each a group of two samples
(:class:`PreferenceBatches`): the model adapter's preference encoder turns the images into the clean latents an ODE
rollout records and the prompt into its recorded embeddings, the chosen sample is scored 1 and the rejected one 0,
and from there the step is the online one: the same advantage, pair layout, update and loss.

What starts: the actor's worker group only. No rollout replica, agent loop or reward worker, so there is no weight
sync either; validation samples with the rollout and is refused with preference files before Ray starts
(``trainer/config/validation.py``). The encoder (VAE and text encoder, no transformer) runs in this process.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import ray
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto

from verl_omni.trainer.diffusion.ray_trainer import RayFlowGRPOTrainer, _restore_info_logging
from verl_omni.utils.dataset.preference_data import PreferencePairs, load_pair

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# the scores that make a pair's chosen sample its group's best and the rejected one its worst
CHOSEN_SCORE, REJECTED_SCORE = 1.0, 0.0


class PreferenceBatches:
    """Dataloader batches of preference rows as the update's batch: rows (chosen, rejected) per pair, one ``uid``
    per pair, ``rm_scores`` 1 / 0, the encoder's clean latents and conditioning, and the replay's sampling spec."""

    def __init__(self, encoder, spec):
        self.encoder = encoder
        self.spec = spec

    def batch(self, rows: list[dict], step: int) -> DataProto:
        prompts, images, scores, uids = [], [], [], []
        for i, row in enumerate(rows):
            chosen, rejected = load_pair(row)
            prompts += [row["prompt"]] * 2
            images += [chosen, rejected]
            scores += [CHOSEN_SCORE, REJECTED_SCORE]
            uids += [f"pair-{step}-{i}"] * 2
        tensors = self.encoder.encode(prompts, images, self.spec.height, self.spec.width)
        tensors["rm_scores"] = torch.tensor(scores)
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"uid": np.array(uids, dtype=object)},
            meta_info={"sampling_spec": self.spec.to_dict()},
        )


class OfflinePreferenceTrainer(RayFlowGRPOTrainer):
    """:class:`RayFlowGRPOTrainer` whose step trains on preference pairs (module docstring): the actor only."""

    def _setup(self):
        self._check_device_layout()
        self._init_tokenizer()
        self._init_dataloader()
        model = self.configs.model
        spec = self.configs.rollout.sampling_spec(False, model.adapter, f"model.path={model.path}").replay()
        with self.watchdog.phase("engine_start"):
            self.resource_pool = self._actor_resource_pool()
            self._init_actor()  # the ranks load the model while the encoder loads here
            dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
            encoder = model.adapter.build_preference_encoder(model.path, self.device, dtype)
            self._actor_loaded()
            self._log_placement()
        self.preference_batches = PreferenceBatches(encoder, spec)
        self.weight_sync = None
        logger.info(
            "offline Diffusion-DPO: %d pairs from data.preference_files, no rollout engine", len(self.train_dataset)
        )
        self._load_checkpoint()
        _restore_info_logging()

    def _check_device_layout(self):
        """Only the actor's ranks are placed: the cluster must have a device (on CPU, a logical CPU) for each."""
        trainer = self.configs.trainer
        ranks = trainer.nnodes * trainer.n_gpus_per_node
        resource = "GPU" if self.device == "cuda" else "CPU"
        available = ray.cluster_resources().get(resource, 0.0)
        if ranks > available:
            raise ValueError(
                f"the actor asks {ranks} {resource}s (trainer.nnodes x trainer.n_gpus_per_node), the Ray cluster has "
                f"{available:g}: ask for fewer ranks or start the cluster with more"
            )

    def _init_dataloader(self):
        data = self.config.data
        files = data.preference_files
        self.train_dataset = PreferencePairs(
            [files] if isinstance(files, str) else list(files), str(data.get("prompt_key", "prompt"))
        )
        self.train_dataloader = StatefulDataLoader(
            self.train_dataset,
            batch_size=data.train_batch_size,
            shuffle=bool(data.get("shuffle", True)),
            generator=torch.Generator().manual_seed(int(data.get("seed") or 0)),
            drop_last=True,
            collate_fn=list,
        )
        self.steps_per_epoch = len(self.train_dataloader)
        trainer = self.configs.trainer
        self.total_training_steps = trainer.total_training_steps or self.steps_per_epoch * trainer.total_epochs
        self.val_dataloader = None

    def _placed_workers(self) -> dict:
        return {f"actor rank {i}": handle for i, handle in enumerate(self.actor_rollout_wg.workers)}

    def on_init_end(self):
        """No rollout to send a resumed actor's weights to."""

    def step(self, batch_dict: list[dict], metrics: dict, timing_raw: dict) -> DataProto:
        """One step on ``data.train_batch_size`` pairs: encode, the algorithm's advantage and pair layout, update."""
        with self._phase("encode", timing_raw):
            batch = self.preference_batches.batch(batch_dict, self.global_steps)
        self._skip_update = None
        return self._advantage_and_update(batch, metrics, timing_raw)

    def on_train_end(self):
        self.tracker.finish()
        self.write_summary(interrupted=False)
