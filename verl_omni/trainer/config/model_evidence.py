"""Where the model capability matrix's claims are shown: the one part of ``docs/reference/models.md`` the code cannot
know.

What a model can do follows from its adapter's attributes (:mod:`verl_omni.trainer.config.model_table` reads them);
which test or measurement shows it is written here, per adapter class and capability. A "yes" without an entry
here is printed as "untested", and an entry whose ``shows`` disagrees with what the adapter says fails the
generator, so neither a claim nor a stale link can outlive the code. Every test named here must exist
(``tests/trainer/test_model_table.py``).

Add a model: an entry in :data:`MODELS` keyed by its adapter class name, with its evidence; a model without one is
still listed, by its class name, every capability its code allows "untested".
"""

from __future__ import annotations

from dataclasses import dataclass, field

# what a piece of evidence shows (a cell's verdict): the capability works, is refused before Ray, or does not apply
YES = "yes"
REFUSED = "refused"
NO = "no"


@dataclass(frozen=True)
class EvidenceTest:
    """A test that shows a cell: ``path::name``, the part of the parametrized id selecting this model, and what it
    shows when the test's name does not say it."""

    path: str
    name: str
    param: str | None = None
    what: str = ""
    shows: str = YES


@dataclass(frozen=True)
class EvidenceRun:
    """A measured run that shows a cell: a section (its heading, as written) of a page under ``benchmarks/results``."""

    path: str
    heading: str
    what: str = ""
    shows: str = YES


Evidence = EvidenceTest | EvidenceRun


@dataclass(frozen=True)
class Model:
    """A row's label and the evidence of its cells (capability key -> evidence)."""

    label: str
    evidence: dict[str, Evidence] = field(default_factory=dict)


# ---- the tests most models share, parametrized by the tiny model's name ------------------------------------------

ROLLOUT_ENGINE = "tests/workers/rollout/vllm_omni/test_diffusers_rollout_engine.py"
ADAPTERS_VS_DIFFUSERS = "tests/pipelines/test_diffusers_adapters.py"
MODELS_E2E = "tests/trainer/test_flowgrpo_models_e2e.py"
STOCK_SERVING = "tests/workers/rollout/vllm_omni/test_stock_lora_serving.py"
SEQUENCE_PARALLEL = "tests/workers/engine/test_sequence_parallel.py"
GPU_RUNS = "benchmarks/results/gpu_tests.md"
# the two-H200 run of the whole GPU suite: every diffusers model's bf16 rollout against its replay, BAGEL, the
# colocated Qwen-Image trainer
GPU_SUITE = EvidenceRun(
    GPU_RUNS,
    "What ran (2 × H200, 2026-11-28): the GPU suite on two GPUs, six xdist workers",
    "the GPU suite: bf16 rollout and its replay on the tiny model",
)


# one H200: the bf16 rollout against its replay of the models added after that suite run (two calls, one section)
NEW_MODELS_GPU = EvidenceRun(
    GPU_RUNS,
    "What ran (one H200, 2026-11-29): the new models' bf16 rollout against their replay",
    "bf16 rollout and its replay on the tiny model; full-size speed in models_gpu.md",
)


# one H200 at full size (random weights): the rollout against stock vLLM-Omni's and the LoRA replay of the models
# measured there; their tiny bf16 rollout against the replay is NEW_MODELS_GPU's run
FULL_SIZE_H200 = EvidenceRun(
    "benchmarks/results/models_gpu.md",
    "FLUX.2-dev, HunyuanVideo-1.5, LTX-2 and Wan2.2 I2V-A14B at full size on one H200 (2026-11-29)",
    "full size (random weights): the rollout against stock vLLM-Omni's and the LoRA replay; the tiny model's bf16 "
    "rollout against its replay in gpu_tests.md",
)


def rollout_engine(tiny: str) -> EvidenceTest:
    return EvidenceTest(ROLLOUT_ENGINE, "test_images_finite_log_probs_and_the_adapters_conditioning", tiny)


def engine_replay(tiny: str) -> EvidenceTest:
    return EvidenceTest(ROLLOUT_ENGINE, "test_actor_replay_reproduces_the_rollouts_log_probs", tiny)


def trainer_run(tiny: str) -> EvidenceTest:
    return EvidenceTest(MODELS_E2E, "test_one_replica_one_rank_trains_logs_and_syncs", tiny)


def diffusers_lora(tiny: str) -> EvidenceTest:
    return EvidenceTest(
        ADAPTERS_VS_DIFFUSERS, "test_saved_lora_loads_in_the_diffusers_pipeline_and_changes_the_image", tiny
    )


def stock_serving(tiny: str) -> EvidenceTest:
    return EvidenceTest(
        STOCK_SERVING, "test_stock_engine_serves_the_checkpoint_lora_and_a_later_request_without_it_is_the_base", tiny
    )


def split_replay(tiny: str) -> EvidenceTest:
    return EvidenceTest(SEQUENCE_PARALLEL, "test_split_replay_gives_the_unsplit_log_probs", tiny)


def source_image(tiny: str) -> EvidenceTest:
    return EvidenceTest(ROLLOUT_ENGINE, "test_the_source_image_changes_the_edit", tiny)


def diffusers_family(tiny: str) -> dict[str, Evidence]:
    """The cells every model of ``test_diffusers_rollout_engine.py`` and ``test_flowgrpo_models_e2e.py`` shares."""
    return {
        "rollout": rollout_engine(tiny),
        "replay": engine_replay(tiny),
        "trainer": trainer_run(tiny),
        "gpu": GPU_SUITE,
    }


# ---- refusals the code makes for every model alike (the check reads the adapter attribute) ------------------------

REFUSAL_TESTS: dict[str, EvidenceTest] = {
    "full_ft": EvidenceTest(
        "tests/trainer/test_flowgrpo_config.py",
        "test_full_fine_tuning_and_the_merged_lora_are_switches_and_bagel_refuses_both",
        shows=REFUSED,
    ),
    "merged_lora": EvidenceTest(
        "tests/trainer/test_flowgrpo_config.py",
        "test_full_fine_tuning_and_the_merged_lora_are_switches_and_bagel_refuses_both",
        shows=REFUSED,
    ),
    "sequence_parallel": EvidenceTest(
        SEQUENCE_PARALLEL, "test_a_model_that_cannot_split_is_refused_naming_key_model_and_degrees", shows=REFUSED
    ),
}

# ---- per model -----------------------------------------------------------------------------------------------------

QWEN_IMAGE_ROLLOUT = "tests/workers/rollout/vllm_omni/test_rollout_engine.py"
BAGEL_ROLLOUT = "tests/workers/rollout/vllm_omni/test_bagel_rollout_engine.py"
A14B_ROLLOUT = "tests/workers/rollout/vllm_omni/test_wan2_2_a14b_rollout.py"

MODELS: dict[str, Model] = {
    "QwenImageTrainingAdapter": Model(
        "Qwen-Image, Qwen-Image-2512",
        {
            "rollout": EvidenceTest(QWEN_IMAGE_ROLLOUT, "test_generate_returns_image_log_probs_trajectory_and_embeds"),
            "replay": EvidenceTest(
                QWEN_IMAGE_ROLLOUT, "test_recorded_log_probs_are_reproduced_by_the_diffusers_transformer"
            ),
            "trainer": EvidenceTest(
                "tests/trainer/test_flowgrpo_e2e.py", "test_two_replicas_two_ranks_train_with_rollout_log_probs"
            ),
            "lora_diffusers": EvidenceTest(
                "tests/workers/engine/test_diffusers_fsdp_engine.py",
                "test_saved_lora_loads_in_diffusers_and_is_the_trained_policy",
            ),
            "lora_stock": stock_serving("qwen_image"),
            "full_ft": EvidenceTest(
                "tests/trainer/test_flowgrpo_full_ft_e2e.py",
                "test_full_fine_tuning_trains_syncs_in_checked_buckets_and_the_rollout_samples_with_it",
            ),
            "merged_lora": EvidenceTest(
                "tests/workers/test_full_weight_sync.py",
                "test_merged_lora_sync_samples_what_the_lora_actor_computes_and_refuses_an_unknown_name",
            ),
            "sequence_parallel": split_replay("qwen_image"),
            "gpu": GPU_SUITE,
        },
    ),
    "BagelTrainingAdapter": Model(
        "BAGEL (7B MoT)",
        {
            "rollout": EvidenceTest(
                BAGEL_ROLLOUT, "test_generate_returns_images_log_probs_and_the_trajectory_per_sample"
            ),
            "replay": EvidenceTest(
                BAGEL_ROLLOUT,
                "test_replay_reproduces_rollout_log_probs",
                what="the bf16 rollout against the fp32 replay, within 2e-3",
                shows=NO,
            ),
            "trainer": EvidenceTest(
                "tests/trainer/test_bagel_flowgrpo_e2e.py",
                "test_bagel_trains_logs_and_syncs_with_recomputed_old_log_probs",
            ),
            "gpu": GPU_SUITE,
        },
    ),
    "SD3TrainingAdapter": Model(
        "SD3 / SD3.5 Medium, Large",
        {
            **diffusers_family("sd3"),
            "lora_diffusers": diffusers_lora("sd3"),
            "lora_stock": stock_serving("sd3"),
            "full_ft": EvidenceRun(
                "benchmarks/results/models_gpu.md",
                "SD3.5 Medium, full fine-tuning: one recipe step on one H100 (2026-11-26)",
                "one step of the recipe at full size (random weights), synced to the colocated rollout",
            ),
            # its trainer run serves the LoRA merged (model.lora.merge=true)
            "merged_lora": trainer_run("sd3"),
        },
    ),
    "FluxTrainingAdapter": Model(
        "FLUX.1-dev",
        {**diffusers_family("flux"), "lora_diffusers": diffusers_lora("flux"), "lora_stock": stock_serving("flux")},
    ),
    "Flux2TrainingAdapter": Model(
        "FLUX.2-dev",
        {
            "rollout": rollout_engine("flux2"),
            "replay": engine_replay("flux2"),
            "trainer": trainer_run("flux2"),
            "lora_diffusers": diffusers_lora("flux2"),
            "lora_stock": stock_serving("flux2"),
            "gpu": FULL_SIZE_H200,
        },
    ),
    "Flux2KleinTrainingAdapter": Model(
        "FLUX.2-klein base (4B, 9B)",
        {
            "rollout": rollout_engine("flux2_klein"),
            "replay": engine_replay("flux2_klein"),
            "trainer": trainer_run("flux2_klein"),
            "lora_diffusers": diffusers_lora("flux2_klein"),
            "sequence_parallel": split_replay("flux2_klein"),
            "gpu": NEW_MODELS_GPU,
        },
    ),
    "Flux2KleinDistilledTrainingAdapter": Model(
        "FLUX.2-klein 4B, 9B (step-distilled)",
        {
            "rollout": rollout_engine("flux2_klein_distilled"),
            "replay": engine_replay("flux2_klein_distilled"),
            "trainer": trainer_run("flux2_klein_distilled"),
            "lora_diffusers": diffusers_lora("flux2_klein_distilled"),
            "gpu": NEW_MODELS_GPU,
        },
    ),
    "ZImageTrainingAdapter": Model(
        "Z-Image, Z-Image-Turbo",
        {**diffusers_family("z_image"), "lora_diffusers": diffusers_lora("z_image")},
    ),
    "Wan22TrainingAdapter": Model(
        "Wan2.2 TI2V-5B",
        {
            **diffusers_family("wan2_2"),
            # the run's summary loads the trained LoRA into diffusers' WanPipeline and it changes the video
            "lora_diffusers": trainer_run("wan2_2"),
            "lora_stock": stock_serving("wan2_2"),
            "sequence_parallel": split_replay("wan2_2"),
            "video": rollout_engine("wan2_2"),
        },
    ),
    "Wan22A14BTrainingAdapter": Model(
        "Wan2.2 T2V-A14B (two experts)",
        {
            "rollout": EvidenceTest(A14B_ROLLOUT, "test_videos_and_windows_cover_both_experts"),
            "replay": EvidenceTest(A14B_ROLLOUT, "test_each_step_is_replayed_by_the_expert_that_sampled_it"),
            "trainer": trainer_run("wan2_2_a14b"),
            "lora_diffusers": EvidenceTest(
                "tests/pipelines/wan2_2/test_wan2_2_a14b_lora.py",
                "test_saved_lora_loads_into_both_experts_of_diffusers_wan_pipeline_and_changes_the_video",
            ),
            "full_ft": EvidenceTest(
                "tests/trainer/test_preflight.py",
                "test_full_fine_tuning_of_the_two_expert_wan_is_refused_before_ray",
                "wan2_2_a14b",
                shows=REFUSED,
            ),
            "sequence_parallel": split_replay("wan2_2_a14b"),
            "video": EvidenceTest(A14B_ROLLOUT, "test_videos_and_windows_cover_both_experts"),
            "gpu": EvidenceRun(
                "benchmarks/results/models_gpu.md",
                "Wan2.2 T2V-A14B: the LoRA replay of both experts on one H100 (2026-11-24)",
                "the actor's LoRA replay at full size (random weights) only; no rollout on a GPU",
            ),
        },
    ),
    "Wan22I2VA14BTrainingAdapter": Model(
        "Wan2.2 I2V-A14B (two experts, one source image)",
        {
            "rollout": rollout_engine("wan2_2_i2v_a14b"),
            "replay": engine_replay("wan2_2_i2v_a14b"),
            "trainer": trainer_run("wan2_2_i2v_a14b"),
            "lora_diffusers": EvidenceTest(
                "tests/pipelines/wan2_2_i2v/test_wan2_2_i2v_adapter.py",
                "test_saved_lora_loads_into_both_experts_of_diffusers_pipeline_and_changes_the_video",
            ),
            "lora_stock": stock_serving("wan2_2_i2v_a14b"),
            "full_ft": EvidenceTest(
                "tests/trainer/test_preflight.py",
                "test_full_fine_tuning_of_the_two_expert_wan_is_refused_before_ray",
                "wan2_2_i2v_a14b",
                shows=REFUSED,
            ),
            "sequence_parallel": split_replay("wan2_2_i2v_a14b"),
            "source_images": source_image("wan2_2_i2v_a14b"),
            "video": rollout_engine("wan2_2_i2v_a14b"),
            "gpu": FULL_SIZE_H200,
        },
    ),
    "LTX2TrainingAdapter": Model(
        "LTX-2 (text to video with its audio track)",
        {
            "rollout": rollout_engine("ltx2"),
            # over the joint latent: the video tokens and the audio tokens of each step
            "replay": engine_replay("ltx2"),
            "trainer": trainer_run("ltx2"),
            # the run's summary loads the trained LoRA into diffusers' LTX2Pipeline and it changes the video
            "lora_diffusers": trainer_run("ltx2"),
            "lora_stock": stock_serving("ltx2"),
            "video": rollout_engine("ltx2"),
            "gpu": FULL_SIZE_H200,
        },
    ),
    "HunyuanVideo15TrainingAdapter": Model(
        "HunyuanVideo-1.5 (text to video)",
        {
            **diffusers_family("hunyuan_video_1_5"),
            "gpu": FULL_SIZE_H200,
            # the run's summary loads the trained LoRA into diffusers' pipeline (its transformer's load_lora_adapter)
            # and it changes the video
            "lora_diffusers": trainer_run("hunyuan_video_1_5"),
            "lora_stock": stock_serving("hunyuan_video_1_5"),
            "video": rollout_engine("hunyuan_video_1_5"),
        },
    ),
    "HunyuanVideo15I2VTrainingAdapter": Model(
        "HunyuanVideo-1.5 I2V (one source image)",
        {
            "rollout": rollout_engine("hunyuan_video_1_5_i2v"),
            "replay": engine_replay("hunyuan_video_1_5_i2v"),
            "lora_diffusers": EvidenceTest(
                "tests/pipelines/hunyuan_video_1_5/test_hunyuan_video_1_5_adapter.py",
                "test_i2v_lora_saved_by_the_checkpoint_loads_as_the_summary_prints_and_changes_the_video",
            ),
            "lora_stock": stock_serving("hunyuan_video_1_5_i2v"),
            "source_images": source_image("hunyuan_video_1_5_i2v"),
            "video": rollout_engine("hunyuan_video_1_5_i2v"),
            "gpu": NEW_MODELS_GPU,
        },
    ),
    "QwenImageEditTrainingAdapter": Model(
        "Qwen-Image-Edit",
        {
            **diffusers_family("qwen_image_edit"),
            "lora_diffusers": diffusers_lora("qwen_image_edit"),
            "source_images": source_image("qwen_image_edit"),
        },
    ),
    "QwenImageEditPlusTrainingAdapter": Model(
        "Qwen-Image-Edit Plus (2509 / 2511)",
        {
            "rollout": rollout_engine("qwen_image_edit_plus"),
            "replay": engine_replay("qwen_image_edit_plus"),
            "lora_diffusers": EvidenceTest(
                "tests/pipelines/test_qwen_image_edit.py",
                "test_tiny_plus_runs_in_diffusers_with_two_images_and_a_saved_lora_changes_the_edit",
            ),
            "source_images": source_image("qwen_image_edit_plus"),
            "gpu": GPU_SUITE,
        },
    ),
    "FluxKontextTrainingAdapter": Model(
        "FLUX.1-Kontext-dev",
        {
            **diffusers_family("flux_kontext"),
            "lora_diffusers": diffusers_lora("flux_kontext"),
            "source_images": source_image("flux_kontext"),
        },
    ),
}
