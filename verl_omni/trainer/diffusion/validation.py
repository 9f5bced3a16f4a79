"""The trainer's validation: ODE samples of the held-out prompts, scored, shown and watched by the reward guard.

A mixin of :class:`~verl_omni.trainer.diffusion.ray_trainer.RayFlowGRPOTrainer` (as
:class:`~verl_omni.trainer.diffusion.worker_setup.WorkerSetup` is): it reads the trainer's workers, tracker, run
directory and configs, and keeps the validation and the guard's decision on its alarm in one place.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from verl_omni.pipelines.rollout_output import AUDIO_KEY, AUDIO_RATE_KEY
from verl_omni.trainer.diffusion.reward_guard import GuardAlarm, GuardStop
from verl_omni.trainer.diffusion.run_dir import complete_steps
from verl_omni.trainer.diffusion.tracking import log_image_grid, log_videos
from verl_omni.utils.dataset.prompt_dataset import prompt_text
from verl_omni.utils.image_grid import save_grid
from verl_omni.utils.video import write_mp4

logger = logging.getLogger(__name__)


class ValidationSteps:
    """``_validate`` (at ``trainer.test_freq`` and before training), its samples, videos and the guard's alarm."""

    def _validate(self) -> dict[str, float]:
        """ODE samples (noise 0) of the held-out prompts, scored; the image grid goes to disk and the tracker.

        With ``actor.ema_decay`` > 0 the EMA of the weights samples them: it goes to the rollout before and the live
        weights after (at step 0 the two are the same, nothing is pushed); training rollouts never see it.
        """
        if not (self.configs.actor.ema_decay > 0 and self.global_steps > 0):
            return self._validation_samples()
        with self.weight_sync.ema_weights(self.global_steps):
            return self._validation_samples()

    def _validation_samples(self) -> dict[str, float]:
        images, scores, prompts, sounds = [], [], [], []
        for batch_dict in self.val_dataloader:
            batch = self._generate(self._prompt_batch(batch_dict, 1, validate=True), {})
            if "rm_scores" not in batch.batch.keys():
                batch = self._compute_reward(batch, {})
            images.append(batch.batch["responses"])
            if AUDIO_KEY in batch.batch.keys():
                rates = batch.non_tensor_batch[AUDIO_RATE_KEY]
                sounds.extend(zip(batch.batch[AUDIO_KEY], (int(r) for r in rates), strict=True))
            scores.append(batch.batch["rm_scores"].float())
            prompts.extend(prompt_text(p, "raw_prompt") for p in batch.non_tensor_batch["raw_prompt"])
        images, scores = torch.cat(images), torch.cat(scores)
        shown = images[: self.configs.trainer.val_grid_images]
        path = self.local_dir / "images" / f"val_step_{self.global_steps}.png"
        grid = save_grid(shown, per_row=int(np.ceil(np.sqrt(len(shown)))), path=path)
        log_image_grid(self.tracker, "val/images", grid, self.global_steps)
        if shown.ndim == 5:
            self._save_videos(shown, sounds[: len(shown)])
        logger.info("validation at step %d: mean score %.4f, grid %s", self.global_steps, scores.mean(), path)
        metrics = {
            "val/score/mean": scores.mean().item(),
            "val/score/max": scores.max().item(),
            "val/score/min": scores.min().item(),
        }
        if self.guard is not None:
            guard_metrics, self.guard_alarm = self.guard.observe(
                self.global_steps, images, prompts, scores.mean().item()
            )
            metrics.update(guard_metrics)
        return metrics

    def _guard_fired(self, alarm: GuardAlarm) -> None:
        """``reward.guard.action``: ``warn`` logs the reason and goes on; ``stop`` saves a checkpoint of this step,
        writes the reason into the summary and raises :class:`GuardStop` (``main_flowgrpo`` exits with status 3)."""
        self.guard_alarm = None
        if self.configs.guard.action == "warn":
            logger.warning("%s; going on (reward.guard.action=warn)", alarm.reason())
            return
        logger.error("%s; stopping (reward.guard.action=stop)", alarm.reason())
        if self.global_steps not in complete_steps(self.local_dir):
            self._save_checkpoint()
        self.weight_sync.close()
        self.tracker.finish()
        self.write_summary(interrupted=False, stop_reason=alarm.reason())
        raise GuardStop(alarm)

    def _save_videos(self, videos: torch.Tensor, sounds: list[tuple[torch.Tensor, int]]) -> None:
        """Validation videos ``[N, F, 3, H, W]``: an mp4 per sample beside the grid (the contact sheet, frames side
        by side), at the model's frame rate, with the sample's sound track when the model makes sound (``sounds``:
        per video its waveform and rate; empty for a silent model), and to the video-capable trackers (wandb: the
        mp4s; tensorboard: GIFs)."""
        folder = self.local_dir / "images" / f"val_step_{self.global_steps}"
        fps = self.configs.model.adapter.video_fps
        tracks = sounds or [(None, None)] * len(videos)
        paths = [
            write_mp4(video, folder / f"sample_{i}.mp4", fps, audio=wave, sample_rate=rate)
            for i, (video, (wave, rate)) in enumerate(zip(videos, tracks, strict=True))
        ]
        log_videos(self.tracker, "val/videos", videos, paths, fps, self.global_steps)
