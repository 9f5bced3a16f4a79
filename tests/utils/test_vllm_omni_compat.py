"""The vLLM-Omni gaps worked around on every device: each workaround in place on the versions its gap was seen
open in, restored after, and skipped with a warning naming the gap on any other version."""

import logging

from verl_omni.platforms import cpu_patches
from verl_omni.utils import vllm_omni_compat


def test_z_image_gap_is_worked_around_on_its_versions_only(tmp_path, caplog):
    """On 0.26 the stock Z-Image pipeline's transformer class takes the checkpoint's sizes while it is built, and is
    restored after; on a version the gap was not seen in, nothing is patched and a warning names the gap."""
    import json

    from vllm_omni.diffusion.models.z_image import pipeline_z_image

    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"dim": 32, "n_layers": 2, "_class_name": "x"}))
    original = pipeline_z_image.ZImageTransformer2DModel
    with vllm_omni_compat.z_image_transformer_from_checkpoint(str(tmp_path), installed="0.26.0"):
        patched = pipeline_z_image.ZImageTransformer2DModel
        assert patched.func is original and patched.keywords == {"dim": 32, "n_layers": 2}
    assert pipeline_z_image.ZImageTransformer2DModel is original
    with caplog.at_level(logging.WARNING, logger=vllm_omni_compat.__name__):
        with vllm_omni_compat.z_image_transformer_from_checkpoint(str(tmp_path), installed="0.27.0"):
            assert pipeline_z_image.ZImageTransformer2DModel is original
    message = " ".join(r.getMessage() for r in caplog.records if r.name == vllm_omni_compat.__name__)
    assert "z_image_transformer_sizes" in message and "found 0.27.0" in message and "PIPELINE_GAPS" in message


def _stock_edit_sizes(tmp_path, source_size: tuple[int, int], plus: bool = False) -> list[tuple[int, int]]:
    """(w, h) at which vLLM-Omni's Qwen-Image-Edit(-Plus) pre-process conditions one ``source_size`` image: Edit's
    one size, Plus's VAE and vision-tower sizes (the pre-process reads only the model directory's VAE config)."""
    import json
    import types

    from PIL import Image
    from vllm_omni.diffusion.models.qwen_image import pipeline_qwen_image_edit, pipeline_qwen_image_edit_plus
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    (tmp_path / "vae").mkdir(exist_ok=True)
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"temporal_downsample": [False, True, True], "z_dim": 4}))
    od_config = types.SimpleNamespace(model=str(tmp_path))
    if plus:
        pre_process = pipeline_qwen_image_edit_plus.get_qwen_image_edit_plus_pre_process_func(od_config)
    else:
        pre_process = pipeline_qwen_image_edit.get_qwen_image_edit_pre_process_func(od_config)
    prompt = {"prompt": "edit", "multi_modal_data": {"image": Image.new("RGB", source_size)}}
    params = OmniDiffusionSamplingParams(height=32, width=32, seed=0)
    info = pre_process(OmniDiffusionRequest(prompt=prompt, sampling_params=params, request_id="r")).prompt
    info = info["additional_information"]
    if plus:
        assert tuple(info["vae_images"][0].shape[-2:]) == info["vae_image_sizes"][0][::-1]
        return [info["vae_image_sizes"][0], info["condition_image_sizes"][0]]
    assert tuple(info["preprocessed_image"].shape[-2:]) == (info["calculated_height"], info["calculated_width"])
    return [(info["calculated_width"], info["calculated_height"])]


def test_qwen_image_edit_condition_area_is_set_on_its_versions_only(tmp_path, caplog):
    """The stock edit pre-processes condition a 3:2 source at 1024² pixels (Plus: its vision tower at 384²); inside
    the override at the area asked (the size our pipeline's ``condition_area`` gives), restored after; on another
    version nothing is patched."""
    from verl_omni.pipelines.qwen_image_edit.rollout_request import CONDITION_SIDE_MULTIPLE
    from verl_omni.pipelines.rollout_request import condition_size

    stock = {False: [(1248, 832)], True: [(1248, 832), (480, 320)]}
    small = condition_size(768, 512, 96 * 64, CONDITION_SIDE_MULTIPLE)
    assert small == (96, 64)
    for plus in (False, True):
        assert _stock_edit_sizes(tmp_path, (768, 512), plus) == stock[plus]
        with vllm_omni_compat.qwen_image_edit_condition_area(96 * 64, installed="0.26.0") as in_place:
            assert in_place and _stock_edit_sizes(tmp_path, (768, 512), plus) == [small] * len(stock[plus])
        assert _stock_edit_sizes(tmp_path, (768, 512), plus) == stock[plus]
    with caplog.at_level(logging.WARNING, logger=vllm_omni_compat.__name__):
        with vllm_omni_compat.qwen_image_edit_condition_area(96 * 64, installed="0.27.0") as in_place:
            assert not in_place and _stock_edit_sizes(tmp_path, (768, 512)) == stock[False]
    message = " ".join(r.getMessage() for r in caplog.records if r.name == vllm_omni_compat.__name__)
    assert "qwen_image_edit_condition_area" in message and "found 0.27.0" in message


def test_the_cpu_warm_up_conditions_an_edit_models_source_at_the_warm_up_size(tmp_path):
    """The sized warm-up's blank source image (the warm-up's height x width) is conditioned at that size by the
    Qwen-Image-Edit pipelines, not at 1024²; another model's pre-process is left alone."""
    with cpu_patches._warmup_condition_area("QwenImageEditPlusPipeline", 32, 64):
        assert _stock_edit_sizes(tmp_path, (64, 32), plus=True) == [(64, 32), (64, 32)]
    with cpu_patches._warmup_condition_area("QwenImageEditPipeline", 32, 32):
        assert _stock_edit_sizes(tmp_path, (32, 32)) == [(32, 32)]
    with cpu_patches._warmup_condition_area("QwenImagePipeline", 32, 32):
        assert _stock_edit_sizes(tmp_path, (32, 32)) == [(1024, 1024)]


def test_final_pixels_hook_is_installed_once_on_its_versions_only(caplog):
    """On 0.26 the engine's post-process lookup is wrapped once (an engine built afterwards passes a rollout's final
    pixels through, ``tests/pipelines/test_rollout_output.py``); on another version a warning names the gap."""
    from vllm_omni.diffusion import diffusion_engine

    assert vllm_omni_compat.patch_final_pixels_postprocess()
    lookup = diffusion_engine.get_diffusion_post_process_func
    assert lookup.__name__ == "post_process_lookup"
    assert vllm_omni_compat.patch_final_pixels_postprocess()
    assert diffusion_engine.get_diffusion_post_process_func is lookup
    with caplog.at_level(logging.WARNING, logger=vllm_omni_compat.__name__):
        assert not vllm_omni_compat.patch_final_pixels_postprocess(installed="0.28.1")
    message = " ".join(r.getMessage() for r in caplog.records if r.name == vllm_omni_compat.__name__)
    assert "final_pixels_postprocess" in message and "found 0.28.1" in message and "PIPELINE_GAPS" in message


def test_a_parked_output_goes_to_its_waiter_registered_before_the_park_else_it_stays_parked():
    """Gap ``async_output_handover``: the executor's output cache, asked to park an output whose request registered a
    waiter meanwhile, resolves that waiter (a result or the error) and parks nothing; with no waiter it parks, as
    upstream does, for the request's later ``wait_output_ready``. Real futures; the engine-level interleaving is
    ``tests/workers/rollout/vllm_omni/test_rollout_engine.py``'s."""
    import concurrent.futures

    def done(result=None, error=None) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        future.set_exception(error) if error else future.set_result(result)
        return future

    late, failed = concurrent.futures.Future(), concurrent.futures.Future()
    waiters = {"late": late, "failed": failed}
    parked = vllm_omni_compat._HandingOverOutputs(waiters, {"earlier": done("kept")})
    parked["late"] = done("pixels")
    parked["failed"] = done(error=RuntimeError("packing failed"))
    parked["early"] = done("for later")
    assert late.result(timeout=0) == "pixels"
    assert isinstance(failed.exception(timeout=0), RuntimeError) and "packing failed" in str(failed.exception())
    assert waiters == {}
    assert set(parked) == {"earlier", "early"} and parked["early"].result() == "for later"


def test_async_output_handover_is_installed_once_on_its_versions_only(caplog):
    """On 0.26 the executor's pump start is wrapped once (each executor started afterwards gets the handing-over
    cache); on another version a warning names the gap and nothing is wrapped."""
    from vllm_omni.diffusion.executor.multiproc_executor import MultiprocDiffusionExecutor

    assert vllm_omni_compat.patch_async_output_handover()
    start = MultiprocDiffusionExecutor._start_result_pump
    assert start.__code__.co_name == "start_pump_handing_over" and start.__wrapped__.__name__ == "_start_result_pump"
    assert vllm_omni_compat.patch_async_output_handover()
    assert MultiprocDiffusionExecutor._start_result_pump is start
    with caplog.at_level(logging.WARNING, logger=vllm_omni_compat.__name__):
        assert not vllm_omni_compat.patch_async_output_handover(installed="0.28.1")
    message = " ".join(r.getMessage() for r in caplog.records if r.name == vllm_omni_compat.__name__)
    assert "async_output_handover" in message and "found 0.28.1" in message and "PIPELINE_GAPS" in message


def test_a_checkpoint_is_served_as_its_own_class_where_vllm_omni_would_guess_another_from_its_directory(
    tmp_path, caplog
):
    """vLLM-Omni 0.26 names a HunyuanVideo-1.5 image-to-video checkpoint in a directory whose name holds
    ``hunyuan_video_15`` as the text-to-video pipeline; the engine's kwargs then name the checkpoint's class. The same
    checkpoint elsewhere, and a text-to-video one so named, need none; on a version the gap was not seen in, none."""
    import json

    def checkpoint(directory: str, class_name: str):
        path = tmp_path / directory
        path.mkdir()
        (path / "model_index.json").write_text(json.dumps({"_class_name": class_name}))
        return path

    i2v = "HunyuanVideo15ImageToVideoPipeline"
    guessed = checkpoint("tiny_hunyuan_video_15_i2v", i2v)
    assert vllm_omni_compat.checkpoint_model_class(guessed, installed="0.26.0") == {"model_class_name": i2v}
    assert vllm_omni_compat.checkpoint_model_class(checkpoint("plain", i2v), installed="0.26.0") == {}
    t2v = checkpoint("hunyuan_video_15_t2v", "HunyuanVideo15Pipeline")
    assert vllm_omni_compat.checkpoint_model_class(t2v, installed="0.26.0") == {}
    with caplog.at_level(logging.WARNING, logger=vllm_omni_compat.__name__):
        assert vllm_omni_compat.checkpoint_model_class(guessed, installed="0.27.0") == {}
    assert "model_class_from_directory_name" in caplog.text
