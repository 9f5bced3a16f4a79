"""Session-wide fixtures: tiny random models are built once per test session; one Ray cluster serves
every test that runs on Ray (each start of a Ray node costs seconds to tens of seconds on 2 cores).

Importing ``verl_omni`` here would register things as a side effect; fixtures import lazily.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

RAY = str(Path(sys.executable).parent / "ray")
REPO = str(Path(__file__).resolve().parents[1])
# logical CPUs of each node: a 2 replicas + 2 ranks run reserves 6 (ranks, replicas, reward and agent-loop workers)
CPUS_PER_NODE = 6


# after the ``-m`` selection has removed its tests: a module's cost counts only the tests that will run
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The longest modules first, each module's tests kept together and in order.

    The suite runs on parallel workers (``scripts/test.sh``: ``pytest -n 2 --dist loadfile
    --no-loadscope-reorder``), which take files in this order as they become free: the long files started
    first and the short ones filling in after keep one worker from running a long file alone at the end.
    A module's expected length is what it declares: ``slow`` modules before the others, and among them the
    larger ``timeout`` first (the trainer runs declare theirs). Modules that declare neither (the quick tier is
    all of them) go by their number of tests, most first: collection order would leave the largest quick files,
    which sort late by path, to start last."""
    default_timeout = float(config.getini("timeout") or 0)

    def cost(module) -> tuple[bool, float, int]:
        tests = [item for item in items if item.module is module]
        slow = any(item.get_closest_marker("slow") for item in tests)
        timeouts = [m.args[0] for item in tests if (m := item.get_closest_marker("timeout")) and m.args]
        return not slow, -max(timeouts, default=default_timeout), -len(tests)

    costs = {}
    for item in items:
        if item.module not in costs:
            costs[item.module] = cost(item.module)
    items.sort(key=lambda item: costs[item.module])


# set by ``main_flowgrpo.keep_log_level`` in the process that runs the entry point: a test that runs it in-process
# (``run_flowgrpo(config)``) would hand pytest's root level (WARNING) to every later subprocess, whose trainer would
# then hide its INFO progress lines once vLLM is imported (tests wait for those lines)
LEAKING_ENV = ("SAGEMAKER_CONTAINER_LOG_LEVEL",)


@pytest.fixture(autouse=True)
def no_leaked_environment():
    """What a test's in-process entry point added to ``os.environ`` of :data:`LEAKING_ENV` is taken back after it."""
    before = {key: os.environ.get(key) for key in LEAKING_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def no_process_group_left_in_the_dtensor_cache():
    """After each test, this thread's DTensor sharding-propagation cache is emptied: its entries hold the meshes, and
    with them the gloo process groups, of a test's FSDP2 work. A group destroyed by its fixture but still held there
    was freed later inside a forked engine worker of this process (an in-process engine's), whose fork had none of
    the group's threads: the worker hung in ``~ProcessGroupGloo`` (seen once in the full suite, ``py-spy``). Only
    tests share a process between FSDP2 and an engine; the trainer's engines live in processes without a group."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch._C, "_clear_DTensor_sharding_propagator_cache"):
        torch._C._clear_DTensor_sharding_propagator_cache()


@pytest.fixture(scope="session")
def fresh_python():
    """``run(code) -> stdout``: code in a new interpreter, as a Ray or engine worker starts; fails with its stderr."""

    def run(code: str, timeout: float = 600) -> str:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    return run


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(builder, dtype="float32") -> Path``: the tiny random model of that builder (``python -m
    verl_omni.utils.tiny_models``'s names), seed 0, built at most once per session and dtype."""
    from verl_omni.utils.tiny_models import build_tiny_model

    built = {}

    def get(builder: str, dtype: str = "float32"):
        if (builder, dtype) not in built:
            out = tmp_path_factory.mktemp(f"tiny_{builder}_{dtype}")
            built[builder, dtype] = build_tiny_model(builder, out, seed=0, dtype=dtype)
        return built[builder, dtype]

    return get


@pytest.fixture(scope="session")
def tiny_qwen_image_path(tiny_model):
    """Directory of a tiny random Qwen-Image (diffusers layout), built once per session with seed 0."""
    return tiny_model("qwen_image")


@pytest.fixture(scope="session")
def tiny_qwen_image_bf16_path(tiny_model):
    """The same tiny Qwen-Image saved in bf16, like the released checkpoint (GPU engines run it in bf16)."""
    return tiny_model("qwen_image", "bfloat16")


@pytest.fixture(scope="session")
def tiny_bagel_path(tiny_model):
    """Directory of a tiny random BAGEL (checkpoint layout, fp32), built once per session with seed 0."""
    return tiny_model("bagel")


@pytest.fixture(scope="session")
def tiny_bagel_bf16_path(tmp_path_factory):
    """The same tiny BAGEL saved in bf16, as GPU engines run it."""
    from verl_omni.utils.tiny_models import build_tiny_model

    return build_tiny_model("bagel", tmp_path_factory.mktemp("tiny_bagel_bf16"), seed=0, dtype="bfloat16")


SAMPLING_ARGS = ["--n", "2", "--steps", "4", "--size", "32", "--window", "2", "--cfg", "4.0", "--seed", "3"]


def record_batch(model_path, out_file) -> dict:
    """Sample a batch with the one-process reference (``sanity_step``) and store it with its reference numbers.

    Stores the recorded window, the sampler's log-probs, ``sanity_step``'s replayed log-probs and
    the base model's replayed means μ (no LoRA, no FSDP) for the engine to be compared against.
    """
    from diffusers import QwenImagePipeline

    from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
    from verl_omni.pipelines.schedulers import FlowMatchSDEDiscreteScheduler
    from verl_omni.trainer import sanity_step
    from verl_omni.workers.utils.replay import prepare_scheduler, replay_step

    args = sanity_step.parse_args(["--model-path", str(model_path), *SAMPLING_ARGS])
    pipe = QwenImagePipeline.from_pretrained(model_path)
    scheduler = FlowMatchSDEDiscreteScheduler.from_config(pipe.scheduler.config)
    prompts = [p for p in sanity_step.PROMPTS for _ in range(args.n)]
    prompt, negative = sanity_step.encode(pipe, prompts, " ")
    seeds = [args.seed * 1000 + i for i in range(len(prompts))]
    rec = sanity_step.sample_with_logprob(pipe, scheduler, prompt, negative, args, seeds)
    spec = sanity_step.sampling_spec(args).replay()
    with torch.no_grad():
        rec["sanity_log_probs"] = sanity_step.replay_log_probs(pipe.transformer, scheduler, rec, args)
        prepare_scheduler(QwenImageTrainingAdapter, scheduler, spec, rec["all_latents"].shape[2])
        means = [
            replay_step(QwenImageTrainingAdapter, pipe.transformer, scheduler, rec, j, spec, rec["vae_scale_factor"])
            for j in range(rec["all_timesteps"].shape[1])
        ]
    rec["base_prev_sample_mean"] = torch.stack([m.prev_sample_mean for m in means], dim=1)
    rec["spec"] = spec.to_dict()
    torch.save(rec, out_file)
    return rec


@pytest.fixture(scope="session")
def recorded_qwen_image_batch(tiny_qwen_image_path, tmp_path_factory):
    """``(path, dict)`` of a batch sampled from the tiny model with ``sanity_step`` (CFG 4, W=2), with reference numbers."""
    path = tmp_path_factory.mktemp("recorded") / "recorded.pt"
    return path, record_batch(tiny_qwen_image_path, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_pids(root: str) -> list[int]:
    """Processes of this cluster only: every Ray process of a node names its temp dir on its command line."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if root in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
            pids.append(proc.pid)
    return pids


# how long the cluster's processes get to exit after SIGTERM (then SIGKILL), and after SIGKILL
STOP_GRACE_S = 3.0


def _stop(root: str) -> None:
    """SIGTERM the cluster's processes, SIGKILL what is left after :data:`STOP_GRACE_S`; returns once none is
    left (or the grace ran out again), instead of sleeping the full grace after each signal."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _cluster_pids(root)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = _cluster_pids(root)
        if not pids:
            return


# `ray start` on a busy machine can miss Ray's fixed 30 s node start-up wait (verl_omni/utils/ray_start.py)
NODE_START_ATTEMPTS = 3


def _start_node(cmd: list[str], env: dict, temp_dir: str) -> None:
    """``ray start`` a node, again (at most :data:`NODE_START_ATTEMPTS` times) after a start that timed out,
    stopping what the failed attempt left (its processes name ``temp_dir``)."""
    for attempt in range(1, NODE_START_ATTEMPTS + 1):
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if out.returncode == 0:
            return
        _stop(temp_dir)
        if attempt == NODE_START_ATTEMPTS or "timed out during startup" not in out.stdout + out.stderr:
            raise RuntimeError(f"{' '.join(cmd)} failed (attempt {attempt}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")


@contextlib.contextmanager
def ray_nodes(*cpus_per_node: int, dashboard: bool = False):
    """``(address, env, dashboard_url, node_dirs)`` of a new Ray cluster on this machine: a head and one more node
    per further entry of ``cpus_per_node`` (each node's logical CPUs), joined with ``ray start --address``.

    Its own port and temp dirs (``node_dirs``: the head's first; every process of a node names its dir on its
    command line), so other Ray clusters on the machine are left alone (no ``ray stop``): stopped by PID on exit.
    ``dashboard``: the head serves one on a free port (the state API, ``list_actors``, needs it), else
    ``dashboard_url`` is None.
    """
    root = tempfile.mkdtemp(prefix="rmn_", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
        "RAY_AUTH_MODE": "disabled",
        "RAY_agent_register_timeout_ms": "120000",
        # a worker that dies of a signal (SIGSEGV, SIGABRT) prints its Python stacks to its stderr, which Ray
        # streams to the run's driver: a test that loses a worker then shows where it died
        "PYTHONFAULTHANDLER": "1",
    }
    port = _free_port()
    address = f"127.0.0.1:{port}"
    node_dirs = [f"{root}/head", *(f"{root}/node{i}" for i in range(1, len(cpus_per_node)))]
    head = ["--head", f"--port={port}"]
    url = None
    if dashboard:
        dashboard_port = _free_port()
        head.append(f"--dashboard-port={dashboard_port}")
        url = f"http://127.0.0.1:{dashboard_port}"
    else:
        head.append("--include-dashboard=false")
    try:
        for i, (cpus, node_dir) in enumerate(zip(cpus_per_node, node_dirs, strict=True)):
            where = head if i == 0 else [f"--address={address}"]
            cmd = [RAY, "start", *where, f"--temp-dir={node_dir}", f"--num-cpus={cpus}", "--disable-usage-stats"]
            _start_node(cmd, env, node_dir)
        yield address, env, url, node_dirs
    finally:
        _stop(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_cluster():
    """``(address, env, dashboard)`` of the session's Ray cluster: a head + one worker node on this machine.

    Every trainer run joins it (``ray_kwargs.ray_init.address``) instead of starting its own node; a run's
    actors end with its driver, so runs follow each other on it. The head runs a dashboard on a free port: the
    state API (``list_actors``) is served by it.
    """
    with ray_nodes(CPUS_PER_NODE, CPUS_PER_NODE, dashboard=True) as (address, env, dashboard, _):
        yield address, env, dashboard


@pytest.fixture(scope="session")
def new_ray_cluster():
    """:func:`ray_nodes`, for a test that needs a cluster of its own (one it may break, or other node sizes)."""
    return ray_nodes


@pytest.fixture(scope="session")
def ray_connect(ray_cluster):
    """``connect(**ray_init_kwargs)``: ``ray.init`` this process to the session's cluster under the cluster's
    auth mode. A driver under token auth (Ray's default for a local start, which sets ``RAY_AUTH_MODE`` in this
    process) sees its actors on this no-auth cluster cancelled before they run; a module that starts its own
    local Ray therefore starts it without auth too (tests/reward_loop/test_reward_placement.py)."""
    import ray

    address, env, _ = ray_cluster

    def connect(**kwargs) -> None:
        os.environ["RAY_AUTH_MODE"] = env["RAY_AUTH_MODE"]
        ray.init(address=address, **kwargs)

    return connect


@pytest.fixture(scope="module")
def ray_driver(ray_cluster, ray_connect):
    """``ray``, this process connected to the session's cluster for one module (whose workers import this
    checkout); the module's actors end with the connection."""
    import ray

    ray_connect(runtime_env={"env_vars": {"PYTHONPATH": ray_cluster[1]["PYTHONPATH"]}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def scorer_env_dir(request, tmp_path_factory):
    """The scorer-environment cache of the suite (``VERL_OMNI_SCORER_ENV_DIR``): under the pytest cache, so an
    environment is built once and kept for later sessions; a session directory when the cache is disabled."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("scorer_envs") if cache is not None else tmp_path_factory.mktemp("scorer_envs")
