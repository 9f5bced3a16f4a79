"""The CPU patches of vLLM-Omni internals: applied on the version they were written for, skipped loudly
on any other, and the engine-start settings they read checked before an engine sees them."""

import gc
import logging
import threading

import pytest

from verl_omni.platforms import cpu_patches, forked_workers


def test_patches_apply_on_the_installed_vllm_omni_and_only_once():
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine
    from vllm_omni.version import __version__

    assert __version__.startswith(cpu_patches.PATCHED_VLLM_OMNI_VERSIONS)
    applied = cpu_patches.apply_all()
    assert set(applied) == set(cpu_patches.PATCHES)
    dummy_run = DiffusionEngine._dummy_run
    assert dummy_run.__name__ == "_sized_dummy_run"
    from vllm_omni.diffusion import diffusion_engine

    # the module global step_streaming reads at each wait; an engine started earlier in this process may have
    # raised it further (its warm-up's own bound, engine_start_timeout_s), never lowered it
    assert diffusion_engine._ASYNC_OUTPUT_TIMEOUT >= cpu_patches.OUTPUT_READY_TIMEOUT_S > 30.0
    cpu_patches.apply_all()
    assert DiffusionEngine._dummy_run is dummy_run
    from vllm_omni.diffusion.executor import multiproc_executor

    assert isinstance(multiproc_executor.mp, forked_workers.ForkedWorkerStart)


def test_a_custom_ops_native_forward_runs_uncompiled():
    """vLLM compiles an off-by-default custom op's native forward with inductor (the text encoders' ``SiluAndMul``):
    on CPU, with the patch, the op keeps the plain function and computes what it documents."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul

    cpu_patches.apply_all()
    with set_current_vllm_config(VllmConfig()):
        op = SiluAndMul()
    # a compiled forward is a wrapper carrying the function's name, not the function
    assert op._forward_method is SiluAndMul.forward_native
    x = torch.randn(3, 8)
    torch.testing.assert_close(op(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def _report_worker_start(queue) -> None:
    """A stand-in worker main: runs parallel-sized torch ops and reports how it was started."""
    import multiprocessing

    import torch

    x = torch.randn(512, 512)
    _ = (x @ x).sum() + torch.nn.functional.conv2d(torch.randn(1, 8, 32, 32), torch.randn(8, 8, 3, 3)).sum()
    queue.put((multiprocessing.current_process()._start_method, torch.get_num_threads()))


def test_forked_workers_compute_after_the_parent_used_its_thread_pool():
    """A worker started the way the patched executor starts one is a fork (it inherits this process's imports)
    and computes although this process ran OpenMP-parallel torch ops first (a forked child that kept the parent's
    thread count hung in its first one: libgomp's pool does not survive a fork)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1024, 1024)
        assert float((x @ x).abs().sum()) > 0  # this process's OpenMP pool is now in use
        start = forked_workers.ForkedWorkerStart()
        start.set_start_method("spawn", force=True)  # what vLLM-Omni's executor calls: ignored
        queue = start._context.Queue()
        worker = start.Process(target=_report_worker_start, args=(queue,), daemon=True)
        worker.start()
        worker.join(120)
        alive = worker.is_alive()
        if alive:
            worker.kill()
        assert not alive and worker.exitcode == 0, "the forked worker hung or failed in its first torch op"
    finally:
        torch.set_num_threads(threads)
    assert queue.get(timeout=10) == ("fork", 1)


class _WaitsOnLockWhenFinalized:
    """Garbage whose finalizer takes a lock: a cycle, so only the collector frees it (as a grpc or asyncio object
    a Ray actor left unreachable would wait on a lock of one of its threads)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.cycle = self

    def __del__(self) -> None:
        with self.lock:
            pass


def _collect_and_report(queue) -> None:
    """A stand-in worker main: what vLLM's ``DeviceMemoryProfiler`` does first at model load."""
    import gc

    gc.collect()
    queue.put(("collected", gc.isenabled()))


def test_forked_workers_never_finalize_the_parents_garbage():
    """The parent's garbage at the fork is frozen in the worker (``gc.freeze``): a worker's ``gc.collect()`` does
    not run a finalizer that waits on a lock another thread of the parent held at the fork (that thread does
    not exist in the fork: the full suite's hang at model load). The parent's own collector is back on after."""
    lock = threading.Lock()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(120)

    enabled = gc.isenabled()
    gc.disable()  # the garbage below must still be there at the fork
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert holding.wait(10)
        _WaitsOnLockWhenFinalized(lock)
        start = forked_workers.ForkedWorkerStart()
        queue = start._context.Queue()
        worker = start.Process(target=_collect_and_report, args=(queue,), daemon=True)
        worker.start()
        assert gc.get_freeze_count() == 0 and not gc.isenabled()  # this process: unfrozen, as the test left it
        worker.join(60)
        alive = worker.is_alive()
        if alive:
            worker.kill()
        assert not alive and worker.exitcode == 0, "the forked worker hung in gc.collect() on the parent's garbage"
        assert queue.get(timeout=10) == ("collected", True)  # the worker's collector is on, as a spawned one's
    finally:
        release.set()
        holder.join(10)
        gc.collect()  # the lock is free now: this process finalizes its garbage itself
        if enabled:
            gc.enable()


def _open_store_as_the_worker_does(od_config, queue) -> None:
    """A stand-in worker main: what vLLM-Omni's ``DiffusionWorker.init_device`` does with the config's port (the
    ``env://`` rendezvous of a one-rank group, whose store binds ``MASTER_PORT``)."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(od_config.master_port))
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    dist.destroy_process_group()
    queue.put("store opened")


def test_a_lone_forked_worker_opens_its_store_although_the_configs_port_was_taken_since():
    """vLLM-Omni's config picks the worker's port in the engine's process and the worker binds it later; a port
    another process took in between killed the worker at start (CI: the engine's pipe closed, ``EOFError``). The
    engine's only worker binds a port the OS assigns instead. Here the config's port is taken by a listening socket
    after the config picked it (the race, caused), and the worker still opens its store."""
    import socket

    from vllm_omni.diffusion.data import OmniDiffusionConfig

    od_config = OmniDiffusionConfig(model="unused", num_gpus=1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", od_config.master_port))
        taken.listen(1)
        start = forked_workers.ForkedWorkerStart()
        queue = start._context.Queue()
        worker = start.Process(target=_open_store_as_the_worker_does, args=(od_config, queue), daemon=True)
        worker.start()
        worker.join(120)
        alive = worker.is_alive()
        if alive:
            worker.kill()
        assert not alive and worker.exitcode == 0, "the worker could not open its store on the config's taken port"
    assert queue.get(timeout=10) == "store opened"
    assert od_config.master_port != 0, "the engine's own config is untouched (only the worker's copy changes)"


def test_output_ready_wait_keeps_a_longer_wait_an_engine_start_set_first(monkeypatch):
    from vllm_omni.diffusion import diffusion_engine

    # the order the CI run met: an engine's warm-up (engine_start_timeout_s 1200) before this patch
    monkeypatch.setattr(diffusion_engine, "_ASYNC_OUTPUT_TIMEOUT", 1200.0)
    monkeypatch.setattr(cpu_patches, "_applied", cpu_patches._applied - {"output_ready_wait"})
    cpu_patches.patch_output_ready_wait()
    assert diffusion_engine._ASYNC_OUTPUT_TIMEOUT == 1200.0
    monkeypatch.setattr(diffusion_engine, "_ASYNC_OUTPUT_TIMEOUT", 30.0)
    monkeypatch.setattr(cpu_patches, "_applied", cpu_patches._applied - {"output_ready_wait"})
    cpu_patches.patch_output_ready_wait()
    assert diffusion_engine._ASYNC_OUTPUT_TIMEOUT == cpu_patches.OUTPUT_READY_TIMEOUT_S


def test_patches_are_skipped_with_a_warning_naming_them_on_another_version(caplog):
    before = sorted(cpu_patches._applied)
    with caplog.at_level(logging.WARNING, logger=cpu_patches.__name__):
        applied = cpu_patches.apply_all(installed_version="0.27.0")
    assert applied == before
    (record,) = [r for r in caplog.records if r.name == cpu_patches.__name__]
    message = record.getMessage()
    assert "found 0.27.0: not applied" in message and "engine_warmup" in message
    assert "PATCHED_VLLM_OMNI_VERSIONS" in message


def test_engine_start_config_carries_size_and_bound_and_refuses_a_non_positive_bound():
    config = cpu_patches.engine_start_config((32, 48), 90.5, "rollout.engine_start_timeout_s")
    assert config[cpu_patches.ENGINE_START_KEY] == {
        "height": 32,
        "width": 48,
        "timeout_s": 90.5,
        "timeout_key": "rollout.engine_start_timeout_s",
    }
    with pytest.raises(ValueError, match="rollout.engine_start_timeout_s must be > 0"):
        cpu_patches.engine_start_config((32, 32), 0, "rollout.engine_start_timeout_s")


def test_rollout_engine_bounds_the_start_by_its_setting_and_refuses_a_second_name_for_it(tiny_qwen_image_path):
    from verl_omni.workers.config.rollout import ENGINE_START_TIMEOUT_KEY
    from verl_omni.workers.rollout.vllm_omni.engine import OmniRolloutEngine

    rollout = OmniRolloutEngine(str(tiny_qwen_image_path), warmup_size=(32, 32), engine_start_timeout_s=99.5)
    kwargs = rollout.engine_kwargs
    assert kwargs["init_timeout"] == kwargs["stage_init_timeout"] == 100
    assert kwargs["additional_config"][cpu_patches.ENGINE_START_KEY]["timeout_key"] == ENGINE_START_TIMEOUT_KEY
    with pytest.raises(ValueError, match=r"engine_kwargs.vllm_omni.init_timeout is set by .*engine_start_timeout_s"):
        OmniRolloutEngine(str(tiny_qwen_image_path), init_timeout=5)


@pytest.mark.slow
def test_the_general_plugin_installs_the_final_pixels_hook_off_the_cpu_platform_too(fresh_python):
    code = (
        "import os\n"
        "os.environ['VERL_OMNI_CPU_PLATFORM'] = '0'\n"
        "from verl_omni.platforms import cpu_patches, omni_general_plugin\n"
        "omni_general_plugin()\n"
        "from vllm_omni.diffusion import diffusion_engine\n"
        "print(diffusion_engine.get_diffusion_post_process_func.__name__, sorted(cpu_patches._applied))\n"
    )
    assert "post_process_lookup []" in fresh_python(code)


def test_a_process_with_a_distributed_default_group_spawns_its_workers():
    """A fork would inherit this process's ``torch.distributed`` default group and hang in its first collective (an
    FSDP actor beside an in-process engine did): such a process spawns; without the group it forks again."""
    import torch.distributed as dist

    start = forked_workers.ForkedWorkerStart()
    assert start.forks() and start.Process(target=print)._start_method == "fork"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert not start.forks()
        assert start.Process(target=print)._start_method == "spawn"
        assert start._context.get_start_method() == "spawn", "the executor's Event and Pipe from the same context"
    finally:
        dist.destroy_process_group()
    assert start.forks()
