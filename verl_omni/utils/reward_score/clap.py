"""``clap``: CLAP audio-text similarity (Wu et al. 2023, LAION-CLAP, arXiv:2211.06687) of a sample's sound and prompt.

The score is the cosine similarity of the CLAP audio embedding of the sample's waveform and the CLAP text
embedding of its prompt, both from transformers' ``ClapModel.get_audio_features`` / ``get_text_features`` (the
projected embeddings). The model's ``logit_scale_a`` / ``logit_scale_t`` are not applied: they only scale the
contrastive logits in training, so the score is the plain cosine, range [-1, 1], as ``clip_score`` is for images.

The directory at ``params.model_path`` is what ``ClapModel.from_pretrained`` and ``ClapProcessor.from_pretrained``
load (e.g. ``laion/clap-htsat-unfused`` saved locally); nothing is downloaded. Waveforms are resampled (torchaudio's
sinc resampler) from the batch's ``sample_rate`` to the rate the processor's feature extractor was built for (48
kHz for LAION-CLAP) before the feature extractor turns them into mel spectrograms; a waveform longer than the
extractor's ``max_length_s`` (10 s for LAION-CLAP) is cut by it as the checkpoint was trained (a random crop, or
fused chunks for a fusion model), so such a sample's score varies between calls.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.local_files import require_dir, require_file
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

_CACHE: dict[tuple[str, str], tuple[object, object]] = {}
_CACHE_LOCK = threading.Lock()
WHAT = "a CLAP checkpoint saved by ClapModel.save_pretrained with its ClapProcessor (e.g. laion/clap-htsat-unfused)"


@dataclass
class ClapParams(BaseConfig):
    """Args:
    model_path (str): local directory with the CLAP model and processor (required).
    batch_size (int): samples per forward pass. Default 16.
    device (str): torch device of the model. Default ``"cpu"``.
    """

    model_path: str = ""
    batch_size: int = 16
    device: str = "cpu"

    def __post_init__(self):
        if not self.model_path:
            raise ValueError(f"model_path must name a local directory holding {WHAT}, got ''")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def load_clap(model_path: str, device: str):
    """``(model, processor)`` for ``model_path`` on ``device``, loaded once per process and device."""
    from transformers import ClapModel, ClapProcessor

    key = (model_path, device)
    with _CACHE_LOCK:
        if key not in _CACHE:
            require_file(require_dir(model_path, "model_path", WHAT), "config.json", "model_path", WHAT)
            logger.info("loading CLAP scorer model from %s on %s", model_path, device)
            model = ClapModel.from_pretrained(model_path).to(device).eval()
            _CACHE[key] = (model, ClapProcessor.from_pretrained(model_path))
        return _CACHE[key]


def resample(wave: torch.Tensor, rate: int, target_rate: int) -> torch.Tensor:
    """``wave`` (float32 ``[samples]``) at ``target_rate``; unchanged when the rates agree."""
    if rate == target_rate:
        return wave
    import torchaudio.functional

    return torchaudio.functional.resample(wave, rate, target_rate)


@register_scorer("clap")
class ClapScorer(ThreadedScorer):
    """CLAP: cosine of the audio and prompt embeddings (no logit scale). Range [-1, 1]."""

    params_cls = ClapParams
    audio_input = True

    @torch.no_grad()
    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model, processor = load_clap(self.params.model_path, self.params.device)
        rate = processor.feature_extractor.sampling_rate
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            stop = start + self.params.batch_size
            waves = [resample(w, batch.sample_rate, rate).numpy() for w in batch.audio[start:stop]]
            audio = processor.feature_extractor(waves, sampling_rate=rate, return_tensors="pt")
            text = processor.tokenizer(batch.prompts[start:stop], padding=True, truncation=True, return_tensors="pt")
            device = self.params.device
            audio_emb = model.get_audio_features(**{k: v.to(device) for k, v in audio.items()}).pooler_output
            text_emb = model.get_text_features(**{k: v.to(device) for k, v in text.items()}).pooler_output
            cosine = torch.nn.functional.cosine_similarity(audio_emb.float(), text_emb.float(), dim=-1)
            scores.extend(cosine.cpu().tolist())
        return scores
