"""SD3.5, FLUX.1, FLUX.2-dev, FLUX.2-klein (base and step-distilled), Z-Image, Qwen-Image-Edit and FLUX.1-Kontext training adapters against their own diffusers pipelines (CPU, fp32).

The reference sampler is each model's diffusers pipeline itself, run with a scheduler whose
``step`` is the shared SDE step over per-sample windows and records what a rollout records: the
pipeline does its own prompt encoding, latent layout, schedule, CFG or guidance embedding, and
hands our step the velocity. The adapter must then predict the same velocity from the recorded
tensors, rebuild the same schedule, and replay the same log-probs (≤ 1e-5). A LoRA saved the way
checkpoints save it must load with the pipeline's ``load_lora_weights`` and change the image.

Qwen-Image-Edit's pipeline conditions on its source image at 1024² pixels, 16k latent tokens of the tiny
4x VAE (minutes per sample on this CPU): its module-level ``calculate_dimensions`` is called with
:data:`EDIT_CONDITION_AREA` instead, the area the adapter's ``condition_area`` setting gives the rollout. FLUX.1-Kontext's pipeline is called with
its auto-resize off and ``max_area`` the output's (it would sample and condition at about 1024² otherwise): it
conditions on the source image at its own size, as the rollout does by default.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import pytest
import torch

PROMPTS = ["a red apple on a table", 'a blue boat near the beach, a sign that says "OK"']
STEPS, HEIGHT, WIDTH, WINDOW, NOISE_LEVEL = 4, 32, 64, 2, 0.7
# the editing model's source-image area (a 40x24 image conditions at 64x32: a grid unlike the output's)
EDIT_CONDITION_AREA = 48 * 48


def _source_images() -> list:
    """One source image per prompt (the editing models)."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    return [Image.fromarray(rng.randint(0, 256, (24, 40, 3), dtype=np.uint8)) for _ in PROMPTS]


@dataclass(frozen=True)
class Model:
    """What differs per model in these tests: its builder, adapter, guidance and how its pipeline encodes."""

    builder: str
    adapter: str
    cfg_scale: float  # SamplingSpec.true_cfg_scale (classic convention; 1 = no CFG)
    call_kwargs: dict = field(default_factory=dict)  # the pipeline's own guidance arguments
    model_kwargs: dict = field(default_factory=dict)
    guidance_scale: float | None = None  # SamplingSpec.guidance_scale (distilled models)
    packed: bool = False  # the pipeline denoises packed tokens already (FLUX)


MODELS = {
    "sd3": Model("sd3", "verl_omni.pipelines.sd3.training_adapter:SD3TrainingAdapter", 4.5, {"guidance_scale": 4.5}),
    "flux": Model(
        "flux",
        "verl_omni.pipelines.flux.training_adapter:FluxTrainingAdapter",
        1.0,
        {"guidance_scale": 2.5},
        guidance_scale=2.5,
        packed=True,
    ),
    "z_image": Model(
        "z_image",
        "verl_omni.pipelines.z_image.training_adapter:ZImageTrainingAdapter",
        4.0,
        {"guidance_scale": 3.0, "cfg_normalization": True, "cfg_truncation": 0.3},
        {"cfg_normalization": 1.0, "cfg_truncation": 0.3},
    ),
    "qwen_image_edit": Model(
        "qwen_image_edit",
        "verl_omni.pipelines.qwen_image_edit.training_adapter:QwenImageEditTrainingAdapter",
        4.0,
        {"true_cfg_scale": 4.0, "negative_prompt": [" "] * len(PROMPTS), "image": _source_images()},
        {"condition_area": EDIT_CONDITION_AREA},
        packed=True,
    ),
    "flux2": Model(
        "flux2",
        "verl_omni.pipelines.flux2.training_adapter:Flux2TrainingAdapter",
        1.0,
        {"guidance_scale": 2.5},
        guidance_scale=2.5,
        packed=True,
    ),
    "flux2_klein": Model(
        "flux2_klein",
        "verl_omni.pipelines.flux2_klein.training_adapter:Flux2KleinTrainingAdapter",
        4.0,
        {"guidance_scale": 4.0},
        packed=True,
    ),
    "flux2_klein_distilled": Model(
        "flux2_klein_distilled",
        "verl_omni.pipelines.flux2_klein.training_adapter:Flux2KleinDistilledTrainingAdapter",
        1.0,
        {"guidance_scale": 1.0},
        packed=True,
    ),
    "flux_kontext": Model(
        "flux_kontext",
        "verl_omni.pipelines.flux_kontext.training_adapter:FluxKontextTrainingAdapter",
        1.0,
        {"guidance_scale": 2.5, "image": _source_images(), "_auto_resize": False, "max_area": HEIGHT * WIDTH},
        guidance_scale=2.5,
        packed=True,
    ),
}


def _adapter(model: Model):
    module, name = model.adapter.split(":")
    return getattr(importlib.import_module(module), name)


def _conditioning(name: str, pipe, prompts: list[str], cfg: bool) -> dict[str, torch.Tensor]:
    """The conditioning tensors the rollout records, from the pipeline's own encoder."""
    with torch.no_grad():
        if name == "sd3":
            pe, npe, pooled, npooled = pipe.encode_prompt(
                list(prompts), None, None, device="cpu", do_classifier_free_guidance=cfg, negative_prompt=""
            )
            out = {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}
            if cfg:
                out |= {"negative_prompt_embeds": npe, "negative_pooled_prompt_embeds": npooled}
            return out
        if name in ("flux", "flux_kontext"):
            pe, pooled, _ = pipe.encode_prompt(list(prompts), None, device="cpu")
            out = {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}
            return out | (_kontext_source(pipe) if name == "flux_kontext" else {})
        if name.startswith("flux2"):
            out = {"prompt_embeds": pipe.encode_prompt(list(prompts), device="cpu")[0]}
            if cfg:
                out["negative_prompt_embeds"] = pipe.encode_prompt([""] * len(prompts), device="cpu")[0]
            return out
        if name == "z_image":
            pos, neg = pipe.encode_prompt(list(prompts), "cpu", cfg, [""] * len(prompts))
            out = _padded(pos, "prompt_embeds")
            return out | (_padded(neg, "negative_prompt_embeds") if cfg else {})
        if name == "qwen_image_edit":
            return _edit_conditioning(pipe, prompts, cfg)
    raise KeyError(name)


def _edit_conditioning(pipe, prompts: list[str], cfg: bool) -> dict[str, torch.Tensor]:
    """Qwen-Image-Edit: the VL embeddings of prompt + source image, the source image's packed latents and grid."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit

    sources = MODELS["qwen_image_edit"].call_kwargs["image"]
    width, height, _ = edit.calculate_dimensions(EDIT_CONDITION_AREA, sources[0].size[0] / sources[0].size[1])
    images = pipe.image_processor.resize(sources, height, width)

    def encoded(texts: list[str]):
        embeds, mask = pipe.encode_prompt(texts, images, device="cpu")
        # diffusers drops an all-ones mask; the rollout records it
        return embeds, torch.ones(embeds.shape[:2], dtype=torch.long) if mask is None else mask

    pe, mask = encoded(list(prompts))
    out = {"prompt_embeds": pe, "prompt_embeds_mask": mask}
    if cfg:
        npe, nmask = encoded([" "] * len(prompts))
        out |= {"negative_prompt_embeds": npe, "negative_prompt_embeds_mask": nmask}
    latents = pipe._encode_vae_image(pipe.image_processor.preprocess(images, height, width).unsqueeze(2), None)
    rows, cols = latents.shape[3] // 2, latents.shape[4] // 2
    out["image_latents"] = pipe._pack_latents(latents, len(prompts), latents.shape[1], 2 * rows, 2 * cols)
    out["image_latents_grid"] = torch.tensor([[[rows, cols]]] * len(prompts))
    return out


def _kontext_source(pipe) -> dict[str, torch.Tensor]:
    """FLUX.1-Kontext: the source images' packed latents at their own size (multiples of the tiny model's 8 px)
    and their grid."""
    sources = MODELS["flux_kontext"].call_kwargs["image"]
    width, height = sources[0].size
    latents = pipe._encode_vae_image(pipe.image_processor.preprocess(sources, height, width), None)
    rows, cols = latents.shape[2] // 2, latents.shape[3] // 2
    packed = pipe._pack_latents(latents, len(sources), latents.shape[1], 2 * rows, 2 * cols)
    return {"image_latents": packed, "image_latents_grid": torch.tensor([[[rows, cols]]] * len(sources))}


def _padded(rows: list[torch.Tensor], key: str) -> dict[str, torch.Tensor]:
    """Variable-length rows as the rollout records them: right-padded ``[B, L, D]`` and a ``[B, L]`` mask."""
    length = max(r.shape[0] for r in rows)
    embeds = torch.stack([torch.cat([r, r.new_zeros(length - r.shape[0], r.shape[1])]) for r in rows])
    mask = torch.stack([torch.arange(length) < r.shape[0] for r in rows]).long()
    return {key: embeds, f"{key}_mask": mask}


class RecordingSDEScheduler:
    """Mixin for the pipeline's scheduler: ``step`` is the shared SDE step inside each sample's window,
    recording (packed) latents, log-probs, timesteps and the velocity the pipeline passed in."""

    def arm(self, levels: torch.Tensor, generators: list[torch.Generator], packed: bool):
        self.levels, self.generators, self.packed, self.calls = levels, generators, packed, 0
        self.rec = {k: [[] for _ in generators] for k in ("latents", "log_probs", "timesteps", "velocities")}

    def step(self, model_output, timestep, sample, return_dict=False, **kwargs):
        from verl_omni.pipelines.diffusers_adapter import pack_latents
        from verl_omni.pipelines.schedulers import sde_step_with_logprob
        from verl_omni.pipelines.schedulers.flow_match_sde import ode_step

        levels = self.levels[:, self.calls]
        self.calls += 1
        if not bool(levels.any()):
            # outside every window: the Euler step, as the rollout takes it (the SDE kernel is 0/0 at σ = 0,
            # Z-Image's last step)
            sigma, sigma_next = self.sigmas[self.calls - 1], self.sigmas[self.calls]
            return (ode_step(sample, model_output, float(sigma_next - sigma)).to(sample.dtype),)
        out = sde_step_with_logprob(self, model_output, timestep, sample, levels, generator=self.generators)
        pack = (lambda x: x) if self.packed else pack_latents
        x, x_next, v = pack(sample.float()), pack(out.prev_sample), pack(model_output.float())
        for b, level in enumerate(levels.tolist()):
            if level > 0:
                if not self.rec["latents"][b]:
                    self.rec["latents"][b].append(x[b])
                self.rec["latents"][b].append(x_next[b])
                self.rec["log_probs"][b].append(out.log_prob[b])
                self.rec["timesteps"][b].append(torch.as_tensor(timestep, dtype=torch.float32).reshape(()))
                self.rec["velocities"][b].append(v[b])
        return (out.prev_sample.to(sample.dtype),)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def tiny_path(model_name, tiny_model):
    return tiny_model(MODELS[model_name].builder)


@pytest.fixture(scope="module", autouse=True)
def edit_condition_area():
    """Qwen-Image-Edit's pipeline conditions at :data:`EDIT_CONDITION_AREA` pixels (module docstring)."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit

    stock = edit.calculate_dimensions
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(edit, "calculate_dimensions", lambda area, ratio: stock(EDIT_CONDITION_AREA, ratio))
        yield


@pytest.fixture(scope="module")
def pipe(tiny_path):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def recorded(model_name, pipe, tiny_path):
    """A batch sampled by the model's diffusers pipeline with SDE windows, as a rollout records it."""
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.pipelines.schedulers import (
        FlowMatchSDEDiscreteScheduler,
        sample_sde_window_start,
        window_noise_levels,
    )

    model, adapter = MODELS[model_name], _adapter(MODELS[model_name])
    scheduler_cls = type("Recording", (RecordingSDEScheduler, FlowMatchSDEDiscreteScheduler), {})
    pipe.scheduler = scheduler_cls.from_config(pipe.scheduler.config)
    seeds = [2, 5]  # windows start at different steps (Z-Image: one sample past the CFG truncation)
    window_end = adapter.max_sde_window_end(STEPS)
    starts = [sample_sde_window_start(s, STEPS, WINDOW, (0, window_end)) for s in seeds]
    levels = torch.tensor([window_noise_levels(STEPS, st, WINDOW, NOISE_LEVEL) for st in starts])
    pipe.scheduler.arm(levels, [torch.Generator().manual_seed(100 + s) for s in seeds], model.packed)
    images = pipe(
        prompt=list(PROMPTS),
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=STEPS,
        generator=[torch.Generator().manual_seed(s) for s in seeds],
        output_type="pt",
        **model.call_kwargs,
    ).images
    rec = {k: torch.stack([torch.stack(v) for v in vs]) for k, vs in pipe.scheduler.rec.items()}
    batch = {
        "all_latents": rec["latents"],
        "all_timesteps": rec["timesteps"],
        **_conditioning(model_name, pipe, PROMPTS, model.cfg_scale > 1),
    }
    spec = SamplingSpec.resolve(
        dict(
            num_inference_steps=STEPS,
            height=HEIGHT,
            width=WIDTH,
            noise_level=NOISE_LEVEL,
            true_cfg_scale=model.cfg_scale,
            model_kwargs=model.model_kwargs,
            guidance_scale=model.guidance_scale,
            sde_window_size=WINDOW,
        ),
        adapter,
    )
    assert spec.window_range == (0, window_end)
    return {"batch": batch, "rec": rec, "spec": spec, "images": images, "sigmas": pipe.scheduler.sigmas.clone()}


def test_pipeline_generates_an_image_from_the_tiny_directory(recorded):
    images = recorded["images"]
    assert images.shape == (len(PROMPTS), 3, HEIGHT, WIDTH)
    assert torch.isfinite(images).all() and float(images.std()) > 0


def test_adapter_schedule_equals_the_pipelines(model_name, tiny_path, recorded):
    adapter = _adapter(MODELS[model_name])
    scheduler = adapter.build_scheduler(tiny_path)
    adapter.set_schedule(scheduler, recorded["spec"], recorded["batch"]["all_latents"].shape[2])
    torch.testing.assert_close(scheduler.sigmas, recorded["sigmas"], rtol=0, atol=1e-7)


def test_step_velocity_equals_the_pipelines_guided_velocity(model_name, pipe, tiny_path, recorded):
    adapter = _adapter(MODELS[model_name])
    vae_scale = adapter.vae_scale_factor(tiny_path)
    assert vae_scale == pipe.vae_scale_factor
    with torch.no_grad():
        for j in range(WINDOW):
            v = adapter.step_velocity(pipe.transformer, recorded["batch"], j, recorded["spec"], vae_scale)
            torch.testing.assert_close(v.float(), recorded["rec"]["velocities"][:, j], rtol=0, atol=1e-5)


def test_replay_reproduces_the_samplers_log_probs(model_name, pipe, tiny_path, recorded):
    from verl_omni.workers.utils.replay import check_replay_batch, prepare_scheduler, replay_step

    adapter, batch, spec = _adapter(MODELS[model_name]), recorded["batch"], recorded["spec"]
    check_replay_batch(batch, spec, adapter)
    scheduler = adapter.build_scheduler(tiny_path)
    prepare_scheduler(adapter, scheduler, spec, batch["all_latents"].shape[2])
    with torch.no_grad():
        replayed = torch.stack(
            [
                replay_step(
                    adapter, pipe.transformer, scheduler, batch, j, spec, adapter.vae_scale_factor(tiny_path)
                ).log_prob
                for j in range(WINDOW)
            ],
            dim=1,
        )
    assert torch.isfinite(recorded["rec"]["log_probs"]).all()
    assert (replayed - recorded["rec"]["log_probs"]).abs().max() <= 1e-5


def test_saved_lora_loads_in_the_diffusers_pipeline_and_changes_the_image(model_name, tiny_path, tmp_path):
    from diffusers import DiffusionPipeline
    from peft import LoraConfig

    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, gather_lora_state_dict, save_lora_dir

    adapter = _adapter(MODELS[model_name])
    module = adapter.build_module(tiny_path)
    torch.manual_seed(0)
    module.add_adapter(
        LoraConfig(r=4, lora_alpha=4, target_modules=list(adapter.lora_target_modules), init_lora_weights=False)
    )
    # the checkpoint's whole lora/ directory: diffusers must pick its own file next to the PEFT layout
    save_lora_dir(
        adapter, tmp_path / "lora", gather_lora_state_dict(module), module.peft_config[ADAPTER_NAME].to_dict()
    )

    pipe = DiffusionPipeline.from_pretrained(tiny_path)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(
        height=HEIGHT, width=HEIGHT, num_inference_steps=2, output_type="pt", **MODELS[model_name].call_kwargs
    )
    if "image" in kwargs:
        kwargs |= {"image": kwargs["image"][0], "negative_prompt": " "}
    base = pipe(prompt=PROMPTS[0], generator=torch.Generator().manual_seed(0), **kwargs).images
    pipe.load_lora_weights(tmp_path / "lora")
    wrapped = [n for n, m in pipe.transformer.named_modules() if hasattr(m, "lora_A")]
    assert len(wrapped) == len({k.rsplit(".lora_", 1)[0] for k in gather_lora_state_dict(module)})
    tuned = pipe(prompt=PROMPTS[0], generator=torch.Generator().manual_seed(0), **kwargs).images
    assert (tuned - base).abs().max() > 1e-3


def test_builder_is_deterministic_per_seed_and_small(model_name, tiny_path, tmp_path):
    from verl_omni.utils.tiny_models import build_tiny_model, directory_digest

    again = build_tiny_model(MODELS[model_name].builder, tmp_path / "same", seed=0)
    assert directory_digest(again) == directory_digest(tiny_path)
    size = sum(f.stat().st_size for f in tiny_path.rglob("*") if f.is_file())
    assert size < 8 * 2**20


def test_adapter_is_registered_under_the_pipeline_class(model_name, tiny_path):
    from verl_omni.pipelines.model_base import MODEL_ADAPTERS, architecture_name

    adapter = _adapter(MODELS[model_name])
    # a variant of the registered adapter (the step-distilled FLUX.2-klein) is the checkpoint's own pick
    assert MODEL_ADAPTERS.get(architecture_name(tiny_path)).for_checkpoint(tiny_path) is adapter
    assert adapter.lora_file_pipeline == architecture_name(tiny_path)
    # the tiny VAE downsamples less than the released 8x: sizes that suit the released model suit it too
    assert adapter.latent_multiple % (2 * adapter.vae_scale_factor(tiny_path)) == 0


def test_fsdp_blocks_and_lora_targets_name_modules_of_the_transformer(model_name, pipe):
    adapter = _adapter(MODELS[model_name])
    classes = {type(m).__name__ for m in pipe.transformer.modules()}
    assert set(adapter.fsdp_wrap_blocks) <= classes
    names = [n for n, _ in pipe.transformer.named_modules()]
    for target in adapter.lora_target_modules:
        assert any(n.endswith(f".{target}") for n in names), target


def test_prompt_token_ids_are_the_rollout_tokenizers_unpadded_ids(model_name, pipe):
    adapter = _adapter(MODELS[model_name])
    tokenizer = getattr(pipe, adapter.tokenizer_subfolder)
    # FLUX.2-dev's pipeline holds a processor; the agent loop loads the tokenizer inside it (AutoTokenizer)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    ids = adapter.prompt_token_ids(tokenizer, PROMPTS[0])
    template = len(adapter.prompt_token_ids(tokenizer, ""))
    assert 3 < len(ids) - template < 77 and tokenizer.pad_token_id not in ids[1:-1]
    assert "apple" in tokenizer.decode(ids)


@pytest.mark.parametrize(
    ("adapter", "default"),
    [
        ("verl_omni.pipelines.flux.training_adapter:FluxTrainingAdapter", 3.5),
        ("verl_omni.pipelines.flux2.training_adapter:Flux2TrainingAdapter", 4.0),
    ],
)
def test_guidance_distilled_flux_refuses_true_cfg(adapter, default):
    """FLUX.1-dev and FLUX.2-dev embed their guidance: true CFG is refused by the spec check the trainer runs before
    Ray starts, and by the replay."""
    from verl_omni.pipelines.sampling import SamplingSpec

    adapter = _adapter(Model("", adapter, 1.0))
    spec = SamplingSpec(num_inference_steps=4, height=32, width=32, true_cfg_scale=4.0)
    with pytest.raises(ValueError, match="guidance-distilled") as error:
        adapter.step_velocity(None, {}, 0, spec, 4)
    assert "true_cfg_scale=4.0" in str(error.value)
    name = adapter.__name__
    with pytest.raises(ValueError, match=rf"true_cfg_scale=4.0: {name} .*guidance_scale \(default {default}\)"):
        spec.for_model(adapter)
    assert SamplingSpec.resolve(dict(num_inference_steps=4, height=32, width=32), adapter).guidance_scale == default


def test_z_image_windows_stop_before_its_sigma_zero_step():
    from verl_omni.pipelines.flux.training_adapter import FluxTrainingAdapter
    from verl_omni.pipelines.z_image.training_adapter import ZImageTrainingAdapter

    assert ZImageTrainingAdapter.max_sde_window_end(10) == 9
    assert FluxTrainingAdapter.max_sde_window_end(10) == 10
    from verl_omni.pipelines.sampling import SamplingSpec

    with pytest.raises(ValueError, match=r"sde_window_range=\[0, 10\]: ZImageTrainingAdapter.*allowed: r1 <= 9"):
        SamplingSpec(sde_window_range=(0, 10)).for_model(ZImageTrainingAdapter)


def test_flux2_klein_distilled_refuses_cfg_and_the_base_defaults_to_it(tiny_model):
    from verl_omni.pipelines.flux2_klein.training_adapter import (
        Flux2KleinDistilledTrainingAdapter,
        Flux2KleinTrainingAdapter,
    )
    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.pipelines.sampling import SamplingSpec

    distilled = get_model_adapter(tiny_model("flux2_klein_distilled"))
    assert distilled is Flux2KleinDistilledTrainingAdapter
    assert get_model_adapter(tiny_model("flux2_klein")) is Flux2KleinTrainingAdapter
    values = dict(num_inference_steps=4, height=32, width=32)
    # null true_cfg_scale: the base samples with the pipelines' CFG 4, the distilled one without
    assert SamplingSpec.resolve(values, Flux2KleinTrainingAdapter).true_cfg_scale == 4.0
    assert not SamplingSpec.resolve(values, distilled).uses_cfg
    with pytest.raises(ValueError, match=r"true_cfg_scale=4.0: Flux2KleinDistilledTrainingAdapter .*allowed: \[1.0\]"):
        SamplingSpec.resolve(values | {"true_cfg_scale": 4.0}, distilled)
    with pytest.raises(ValueError, match="step-distilled FLUX.2-klein samples without CFG"):
        distilled.step_velocity(None, {}, 0, SamplingSpec(true_cfg_scale=4.0, **values), 4)
