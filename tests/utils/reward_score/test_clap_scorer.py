"""The ``clap`` scorer on a tiny random ``ClapModel`` built here, checked against transformers' own embeddings.

The tiny checkpoint keeps LAION-CLAP's layout (HTSAT audio tower, RoBERTa text tower, ``ClapProcessor`` with a
byte-level BPE tokenizer trained offline) at toy sizes; its feature extractor runs at 16 kHz, so that a batch at
another rate exercises the resampling.
"""

import asyncio
import math

import numpy as np
import pytest
import torch

from verl_omni.utils.reward_score import MultiReward, ScoreBatch, build_params, get_scorer_cls
from verl_omni.utils.reward_score.multi import WeightedScorer
from verl_omni.utils.reward_score.video import score_any

RATE = 16_000
# 16 mel bins at 16 kHz leave a mel filter empty, which transformers warns of each time it builds the extractor
pytestmark = pytest.mark.filterwarnings("ignore:At least one mel filter has all zero values:UserWarning")
PROMPTS = ["a dog barking", "a bird singing in a tree", "rain on a window"]


@pytest.fixture(scope="module")
def tiny_clap_dir(tmp_path_factory):
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, ClapProcessor, RobertaTokenizer

    from verl_omni.utils.tiny_models.tokenizer import train_bpe

    vocab, merges = train_bpe(300)
    full_vocab = {token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])}
    # in the trained ids' order: the dict's own order follows the process's hash seed, and with it the tiny model's scores
    for token in sorted(vocab, key=vocab.get):
        full_vocab.setdefault(token, len(full_vocab))
    tokenizer = RobertaTokenizer(vocab=full_vocab, merges=merges, model_max_length=32)
    features = ClapFeatureExtractor(
        feature_size=16, sampling_rate=RATE, hop_length=160, max_length_s=2, fft_window_size=400
    )
    features.truncation = "rand_trunc"  # the unfused layout (one mel channel), as laion/clap-htsat-unfused
    config = ClapConfig(
        text_config=dict(
            vocab_size=len(full_vocab),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            max_position_embeddings=40,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        ),
        audio_config=dict(
            num_mel_bins=16,
            spec_size=64,
            patch_size=4,
            patch_stride=[4, 4],
            patch_embeds_hidden_size=16,
            hidden_size=32,
            depths=[1, 1],
            num_attention_heads=[2, 2],
            window_size=4,
            enable_fusion=False,
            projection_hidden_size=32,
        ),
        projection_dim=16,
    )
    out = tmp_path_factory.mktemp("tiny_clap")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ClapModel(config).eval().save_pretrained(out)
    ClapProcessor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(out)
    return str(out)


def make_clap(model_path, **overrides):
    cls = get_scorer_cls("clap")
    return cls(build_params(cls.params_cls, {"model_path": model_path, **overrides}, "test"))


def sine(freq_hz, seconds, rate):
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    return (0.5 * torch.sin(2 * math.pi * freq_hz * t)).float()


def frames(size):
    return torch.zeros(size, 3, 8, 8, dtype=torch.uint8)


def reference_cosines(model_path, waves, prompts):
    """Per sample, one at a time: transformers' ClapProcessor, get_audio_features, get_text_features, cosine."""
    from transformers import ClapModel, ClapProcessor

    model, processor = ClapModel.from_pretrained(model_path).eval(), ClapProcessor.from_pretrained(model_path)
    out = []
    with torch.no_grad():
        for wave, prompt in zip(waves, prompts, strict=True):
            inputs = processor(text=[prompt], audio=[wave.numpy()], sampling_rate=RATE, return_tensors="pt")
            audio = model.get_audio_features(input_features=inputs["input_features"], is_longer=inputs["is_longer"])
            text = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            out.append(float(torch.nn.functional.cosine_similarity(audio.pooler_output, text.pooler_output)))
    return out


def test_scores_are_transformers_audio_text_cosines_batched_or_not(tiny_clap_dir):
    noise = torch.Generator().manual_seed(0)
    waves = [sine(440, 1.0, RATE), sine(2000, 0.5, RATE), 0.1 * torch.randn(12_000, generator=noise)]
    batch = ScoreBatch(frames(3), PROMPTS, audio=waves, sample_rate=RATE)
    scores = asyncio.run(make_clap(tiny_clap_dir, batch_size=2).score(batch))
    expected = reference_cosines(tiny_clap_dir, waves, PROMPTS)
    assert scores == pytest.approx(expected, abs=1e-5)
    assert all(-1 <= s <= 1 for s in scores) and len({round(s, 4) for s in scores}) == 3


def test_a_sine_batch_at_another_rate_is_resampled_to_the_models(tiny_clap_dir):
    """The same tones written at 8 kHz and at the model's 16 kHz score alike: the 8 kHz batch is resampled."""
    scorer = make_clap(tiny_clap_dir)
    tones = [440, 1000, 3000]
    at_8k = ScoreBatch(frames(3), PROMPTS, audio=[sine(f, 1.0, 8_000) for f in tones], sample_rate=8_000)
    at_16k = ScoreBatch(frames(3), PROMPTS, audio=[sine(f, 1.0, RATE) for f in tones], sample_rate=RATE)
    low, native = asyncio.run(scorer.score(at_8k)), asyncio.run(scorer.score(at_16k))
    assert low == pytest.approx(native, abs=0.02)
    # the tones differ, so their scores do: a scorer reading one waveform for all would give equal ones
    assert len({round(s, 3) for s in native}) == 3


def test_on_a_video_batch_the_audio_scorer_scores_each_sample_once_beside_a_frame_scorer(tiny_clap_dir):
    waves = [sine(440, 1.0, RATE), sine(2000, 1.0, RATE)]
    videos = torch.stack([torch.full((3, 3, 8, 8), v, dtype=torch.uint8) for v in (51, 204)])
    batch = ScoreBatch(videos, PROMPTS[:2], audio=waves, sample_rate=RATE)
    clap = make_clap(tiny_clap_dir)
    entries = [
        WeightedScorer("clap", clap, 1.0, True),
        WeightedScorer("brightness", get_scorer_cls("brightness")(), 1.0, True),
    ]
    result = asyncio.run(MultiReward(entries).score(batch))
    expected = reference_cosines(tiny_clap_dir, waves, PROMPTS[:2])
    assert result.per_scorer["clap"] == pytest.approx(expected, abs=1e-5)
    assert result.per_scorer["brightness"] == pytest.approx([0.2, 0.8])
    assert result.rewards == pytest.approx([(expected[0] + 0.2) / 2, (expected[1] + 0.8) / 2], abs=1e-5)


def test_a_batch_without_audio_is_refused_by_name(tiny_clap_dir):
    with pytest.raises(ValueError, match="scorer 'clap' scores audio but the batch has none"):
        asyncio.run(score_any(make_clap(tiny_clap_dir), ScoreBatch(frames(1), ["p"]), "clap"))


def test_missing_weights_name_the_directory(tmp_path):
    missing = tmp_path / "clap-htsat-unfused"
    with pytest.raises(FileNotFoundError, match=rf"model_path='{missing}' is not a directory; it must hold a CLAP"):
        make_clap(str(missing)).score_sync(ScoreBatch(frames(1), ["p"], audio=[sine(440, 0.1, RATE)], sample_rate=RATE))
    with pytest.raises(FileNotFoundError, match=rf"model_path='{tmp_path}' has no config.json"):
        make_clap(str(tmp_path)).score_sync(
            ScoreBatch(frames(1), ["p"], audio=[sine(440, 0.1, RATE)], sample_rate=RATE)
        )
    cls = get_scorer_cls("clap")
    with pytest.raises(ValueError, match=r"^k\.model_path must name a local directory holding a CLAP checkpoint"):
        build_params(cls.params_cls, {}, "k")


@pytest.mark.parametrize(
    "audio,sample_rate,message",
    [
        ([torch.zeros(4)], None, "sample_rate must be a positive integer"),
        ([torch.zeros(4, dtype=torch.float64)], RATE, r"audio\[0\] must be a non-empty float32 waveform"),
        ([torch.zeros(2, 4)], RATE, r"audio\[0\] must be a non-empty float32 waveform"),
        ([torch.zeros(4), torch.zeros(4)], RATE, r"audio must have one waveform per image \(1\)"),
        (None, RATE, "sample_rate=16000 is set but the batch has no audio"),
    ],
)
def test_score_batch_checks_its_audio(audio, sample_rate, message):
    with pytest.raises(ValueError, match=message):
        ScoreBatch(frames(1), ["p"], audio=audio, sample_rate=sample_rate)


def test_select_keeps_the_samples_audio():
    waves = [sine(440, 0.1, RATE), sine(880, 0.2, RATE)]
    one = ScoreBatch(frames(2), ["a", "b"], audio=waves, sample_rate=RATE).select(1)
    assert one.audio[0] is waves[1] and one.sample_rate == RATE and np.isclose(len(one.audio[0]), 3200)


def test_the_reward_manager_hands_clap_a_rollouts_stereo_sound_as_its_mono_mix(tiny_clap_dir):
    """A video model's rollout batch as the agent loop writes it (videos, stereo waveforms ``[B, 2, samples]`` under
    ``audio``, their rates under ``audio_sample_rate``: LTX-2's vocoder makes 24 kHz stereo) reaches the ``clap``
    entry of the reward manager: each reward is the CLAP cosine of the sample's mono mix, resampled to the model's
    16 kHz, with its prompt."""
    from omegaconf import OmegaConf
    from verl import DataProto

    from verl_omni.pipelines.rollout_output import AUDIO_KEY, AUDIO_RATE_KEY
    from verl_omni.reward_loop import DiffusionRewardManager
    from verl_omni.utils.reward_score.clap import resample

    rate = 24_000
    stereo = torch.stack(
        [torch.stack([sine(440, 1.0, rate), sine(660, 1.0, rate)]), torch.stack([sine(2000, 1.0, rate)] * 2)]
    )
    videos = torch.stack([torch.full((3, 3, 8, 8), v, dtype=torch.uint8) for v in (51, 204)])
    data = DataProto.from_dict(
        tensors={"responses": videos, AUDIO_KEY: stereo},
        non_tensors={"raw_prompt": np.array(PROMPTS[:2], dtype=object), AUDIO_RATE_KEY: np.array([rate, rate])},
    )
    entry = {"type": "clap", "params": {"model_path": str(tiny_clap_dir)}}
    config = OmegaConf.create(
        {
            "reward": {
                "reward_manager": {"source": "register", "name": "diffusion", "module": {"path": None, "name": None}},
                "custom_reward_function": {"path": None, "name": "compute_score"},
                "diffusion": {"scorers": [entry]},
            }
        }
    )
    out = asyncio.run(DiffusionRewardManager(config).run_batch(data))
    mono = [resample(wave.mean(dim=0), rate, RATE) for wave in stereo]
    expected = reference_cosines(tiny_clap_dir, mono, PROMPTS[:2])
    assert [o["reward_score"] for o in out] == pytest.approx(expected, abs=1e-5)
    assert expected[0] != pytest.approx(expected[1], abs=1e-4)
