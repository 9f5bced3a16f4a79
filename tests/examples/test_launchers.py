"""The per-model launchers compose, as Hydra reads them from the command line, into their preset plus their paths, and
into a config the preflight accepts.

Each launcher of ``examples/flowgrpo_trainer/`` runs for real with ``--cfg job`` appended (an extra
argument, passed through like any override): Hydra composes its overrides and prints the job config
instead of training. That config must equal its preset (``verl_omni/trainer/config/experiment/``, composed here with
Hydra's compose API and the same overrides) in every key but the ones the launcher's environment sets, so a lost
preset or a launcher value that shadows the preset shows here without the test retyping the recipe. It then goes
through what ``main_flowgrpo`` checks before Ray starts (keys and types, the model directory, the data files, every
dataclass and the model adapter's sampling rules) with ``MODEL_PATH`` set to the model's tiny random directory. No
training runs.

Each launcher with each registered algorithm (``algorithm=<name>`` appended) runs the command that
``docs/guide/algorithms.md`` ("Launchers") documents for the pairing: a served pairing passes every check
before Ray; the refused one fails with the pairing refusal.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "examples" / "flowgrpo_trainer"
PRESETS = REPO / "verl_omni" / "trainer" / "config" / "experiment"
# per model (a tiny-model builder): its launcher, run_<preset>.sh
RECIPES = {
    "sd3": "run_sd3_ocr_lora.sh",
    "flux": "run_flux_ocr_lora.sh",
    "flux2": "run_flux2_dev_ocr_lora.sh",
    "flux2_klein_distilled": "run_flux2_klein_4b_ocr_lora.sh",
    "z_image": "run_z_image_ocr_lora.sh",
    "wan2_2": "run_wan2_2_5b_ocr_lora.sh",
    "wan2_2_a14b": "run_wan2_2_a14b_ocr_lora.sh",
    "wan2_2_i2v_a14b": "run_wan2_2_i2v_a14b_vlm_judge_lora.sh",
    "ltx2": "run_ltx2_ocr_lora.sh",
    "hunyuan_video_1_5": "run_hunyuan_video_1_5_ocr_lora.sh",
    "hunyuan_video_1_5_i2v": "run_hunyuan_video_1_5_i2v_vlm_judge_lora.sh",
    "qwen_image_edit": "run_qwen_image_edit_vlm_judge_lora.sh",
    "flux_kontext": "run_flux_kontext_vlm_judge_lora.sh",
}
# the tiny builder of a launcher named after a model size (run_<name>_ocr_lora.sh with <name> no builder)
LAUNCHER_MODELS = {
    "wan2_2_5b": "wan2_2",
    "wan2_2_a14b": "wan2_2_a14b",
    "flux2_klein_4b": "flux2_klein_distilled",
    "flux2_dev": "flux2",
}
# passed after the launcher's own arguments: a CPU machine without the OCR service
PASS_THROUGH = ("trainer.device=cpu", "reward.diffusion.preflight=false")
# what a launcher's environment sets beside its paths: the reward server's URL and model, inside the scorer list
REWARD_SERVER = ("reward.diffusion.scorers",)


def preset_of(launcher: str) -> str:
    """``run_<preset>.sh -> <preset>``."""
    return launcher.removeprefix("run_").removesuffix(".sh")


def path_overrides(model_path: Path, data_dir: Path) -> tuple[str, ...]:
    """The keys a launcher sets from ``MODEL_PATH`` and ``DATA_DIR``."""
    return (
        f"actor_rollout_ref.model.path={model_path}",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/val.parquet",
    )


def resolved_without(config, keys: tuple[str, ...]) -> dict:
    """``config`` as a resolved dict, without ``keys`` (dotted)."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(config, resolve=True)
    for key in keys:
        *parents, leaf = key.split(".")
        node = values
        for parent in parents:
            node = node[parent]
        node.pop(leaf)
    return values


def assert_is_its_preset(launched, launcher: str, *overrides: str) -> None:
    """``launched`` (the launcher's job config) is its preset composed with ``overrides`` in every key but the reward
    server's, and it keeps the preset's scorer types."""
    from verl_omni.utils.config import compose_config

    preset = compose_config("flowgrpo_trainer", [f"+experiment={preset_of(launcher)}", *overrides])
    assert resolved_without(launched, REWARD_SERVER) == resolved_without(preset, REWARD_SERVER)
    launched_types = [scorer.type for scorer in launched.reward.diffusion.scorers]
    assert launched_types == [scorer.type for scorer in preset.reward.diffusion.scorers]


def test_every_preset_has_its_launcher():
    """One launcher per recipe preset (the bases under ``experiment/base/`` are not recipes)."""
    presets = {p.stem for p in PRESETS.glob("*.yaml")}
    assert presets == {preset_of(p.name) for p in LAUNCHERS.glob("run_*.sh")}
    assert set(RECIPES.values()) <= {f"run_{name}.sh" for name in presets}


@pytest.fixture(scope="module")
def ocr_dir(tmp_path_factory):
    """The OCR prompt set the launchers read, written by its own script (``examples/data_process``)."""
    out = tmp_path_factory.mktemp("ocr")
    script = REPO / "examples" / "data_process" / "ocr_prompts.py"
    subprocess.run(
        [sys.executable, str(script), "--out", str(out), "--train", "64", "--val", "16"], check=True, timeout=300
    )
    return out


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    """The tiny editing set (source images in the parquet), written by its own script, for the editing launchers."""
    out = tmp_path_factory.mktemp("edit")
    script = REPO / "examples" / "data_process" / "edit_prompts.py"
    subprocess.run([sys.executable, str(script), "--tiny", "--out", str(out)], check=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def data_dirs(ocr_dir, edit_dir):
    """``model path -> DATA_DIR``: an editing model's launcher (its adapter takes source images) reads the editing
    set, the others the OCR set."""
    from verl_omni.pipelines.model_base import get_model_adapter

    return lambda model_path: edit_dir if get_model_adapter(model_path).max_source_images else ocr_dir


def launch(launcher: str, model_path: Path, data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run ``launcher`` as a user would (``bash``, ``python3`` from this interpreter's environment)."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MODEL_PATH": str(model_path),
        "BAGEL_PATH": str(model_path),
        "DATA_DIR": str(data_dir),
    }
    return subprocess.run(
        ["bash", str(LAUNCHERS / launcher), *extra], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )


# the launcher runs the entry point in a fresh interpreter (Hydra's compose there): the full suite's
@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(RECIPES))
def test_launcher_composes_its_preset_and_passes_the_preflight(model, tiny_model, data_dirs, tmp_path):
    from omegaconf import OmegaConf

    from verl_omni.trainer.config.preflight import check_config, check_resources
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import register_resolvers

    launcher = RECIPES[model]
    model_path = tiny_model(model)
    data_dir = data_dirs(model_path)
    run_dir = f"trainer.default_local_dir={tmp_path / 'run'}"
    proc = launch(launcher, model_path, data_dir, *PASS_THROUGH, run_dir, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    register_resolvers()
    config = OmegaConf.create(proc.stdout)
    assert_is_its_preset(config, launcher, *path_overrides(model_path, data_dir), *PASS_THROUGH, run_dir)

    check_config(config)
    check_resources(config)
    configs = validate_config(config)

    assert config.actor_rollout_ref.model.path == str(model_path)
    assert configs.trainer.device == "cpu", "an extra argument overrides the launcher's own"
    assert configs.model.adapter.__name__.lower().startswith(model.replace("_", ""))
    spec = configs.rollout.sampling_spec(False, configs.model.adapter, "launcher")
    assert spec.uses_cfg == ((config.actor_rollout_ref.rollout.true_cfg_scale or 1.0) > 1)
    # the mini-batch counts prompts: a whole number of optimizer steps of whole prompt groups per step
    assert config.data.train_batch_size % configs.actor.ppo_mini_batch_size == 0
    assert configs.actor.mini_batch_samples == configs.actor.ppo_mini_batch_size * configs.rollout.n


# the launcher runs the entry point in a fresh interpreter (Hydra's compose there): the full suite's
@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen_image_edit", "flux_kontext", "wan2_2_i2v_a14b"])
def test_an_editing_launcher_is_graded_by_the_vlm_judge_its_preflight_reaches(
    model, tiny_model, edit_dir, tmp_path, monkeypatch
):
    """The editing launchers' reward is the ``vlm_judge`` scorer at ``JUDGE_URL`` / ``JUDGE_MODEL``. With the reward
    preflight on, as a user runs them, the preflight reaches that URL: a real local HTTP server the test starts
    answers it, and once the server is gone the run is refused before Ray, naming the key and how to skip the check.
    """
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from omegaconf import OmegaConf

    from verl_omni.trainer.config.preflight import check_config, check_resources
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import register_resolvers

    class NotFound(BaseHTTPRequestHandler):
        """What vLLM's server answers a GET of its API base: 404 (any HTTP answer proves a server listens)."""

        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.setenv("JUDGE_URL", url)
    monkeypatch.delenv("JUDGE_MODEL", raising=False)
    launcher = RECIPES[model]
    run_dir = f"trainer.default_local_dir={tmp_path / 'run'}"
    proc = launch(launcher, tiny_model(model), edit_dir, "trainer.device=cpu", run_dir, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    register_resolvers()
    config = OmegaConf.create(proc.stdout)
    check_config(config)
    try:
        check_resources(config)
    finally:
        server.shutdown()
        server.server_close()
    (scorer,) = validate_config(config).reward.scorers
    assert scorer.type == "vlm_judge"
    assert (scorer.params["url"], scorer.params["model"]) == (url, "Qwen/Qwen2.5-VL-7B-Instruct")
    assert scorer.params["parser"] == "regex" and "{prompt}" in scorer.params["prompt_template"]
    with pytest.raises(
        ValueError, match=rf"reward\.diffusion\.scorers\[0\]\.params\.url={url} does not answer"
    ) as error:
        check_resources(config)
    assert "reward.diffusion.preflight=false" in str(error.value)


# the launcher runs the entry point in a fresh interpreter (Hydra's compose there): the full suite's
@pytest.mark.slow
@pytest.mark.parametrize("model", ["flux", "flux2", "flux2_klein_distilled"])
def test_a_setting_the_model_cannot_honour_is_refused_through_the_launcher(model, tiny_model, ocr_dir, tmp_path):
    """True CFG on the guidance-distilled FLUX.1 and FLUX.2-dev and on the step-distilled FLUX.2-klein, given as an
    extra argument, is refused naming the key."""
    from omegaconf import OmegaConf

    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import register_resolvers

    launcher = RECIPES[model]
    extra = (
        *PASS_THROUGH,
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "actor_rollout_ref.rollout.true_cfg_scale=4",
    )
    proc = launch(launcher, tiny_model(model), ocr_dir, *extra, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    register_resolvers()
    with pytest.raises(ValueError, match="true_cfg_scale"):
        validate_config(OmegaConf.create(proc.stdout))


def test_launcher_without_model_path_says_what_to_set():
    env = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    proc = subprocess.run(
        ["bash", str(LAUNCHERS / RECIPES["sd3"]), "--cfg", "job"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode != 0 and "MODEL_PATH" in proc.stderr


# ---- each launcher with each algorithm ----------------------------------------------------------

DOC = REPO / "docs" / "guide" / "algorithms.md"
# one row per (launcher, algorithm): `| `run_<model>_<reward>_lora.sh` | `<algorithm>` | <command or refusal> |`
DOC_ROW = re.compile(r"^\| `(run_(\w+?)_(?:ocr|vlm_judge)_lora\.sh)` \| `(\w+)` \| (.+) \|$", re.MULTILINE)
# the model launchers (``run_<model>_<reward>_lora.sh``, ``<model>`` a tiny-model builder) and the Hydra group
# ``algorithm=<name>``: found on disk, so that a new launcher or algorithm needs its row in the doc
MODEL_LAUNCHERS = sorted(p.name for p in LAUNCHERS.glob("run_*_lora.sh"))
ALGORITHM_NAMES = sorted(p.stem for p in (REPO / "verl_omni" / "trainer" / "config" / "algorithm").glob("*.yaml"))


def documented_pairings() -> dict[tuple[str, str], tuple[str, str]]:
    """``(launcher, algorithm) -> (model, command cell)`` from the doc's launcher table."""
    return {(m[1], m[3]): (LAUNCHER_MODELS.get(m[2], m[2]), m[4]) for m in DOC_ROW.finditer(DOC.read_text())}


def test_the_doc_has_one_row_per_launcher_and_algorithm():
    rows = documented_pairings()
    assert set(rows) == {(launcher, name) for launcher in MODEL_LAUNCHERS for name in ALGORITHM_NAMES}
    assert len(MODEL_LAUNCHERS) >= 5 and "diffusion_nft" in ALGORITHM_NAMES


def entry_point_args(launcher: str, model_path: Path, data_dir: Path, shim_dir: Path, *extra: str) -> list[str]:
    """The arguments ``launcher`` hands ``python3 -m verl_omni.trainer.main_flowgrpo`` (its preset, the keys its
    environment sets, then ``extra``), read from a ``python3`` first on ``PATH`` that prints them: the bash wiring
    runs as a user's would, the entry point is not started."""
    shim = shim_dir / "python3"
    if not shim.exists():
        # the entry point's arguments, NUL-separated; any other python3 call of the launcher (a value it computes)
        # runs this interpreter
        shim.write_text(
            "#!/usr/bin/env bash\n"
            'if [ "${1:-}" = -m ] && [ "${2:-}" = verl_omni.trainer.main_flowgrpo ]; then printf "%s\\0" "$@"; '
            f'else exec "{sys.executable}" "$@"; fi\n'
        )
        shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{shim_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "MODEL_PATH": str(model_path),
        "BAGEL_PATH": str(model_path),
        "DATA_DIR": str(data_dir),
    }
    proc = subprocess.run(
        ["bash", str(LAUNCHERS / launcher), *extra], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = proc.stdout.split("\0")[:-1]
    assert args[:2] == ["-m", "verl_omni.trainer.main_flowgrpo"], args
    return args[2:]


# every launcher x algorithm: the launcher's own arguments (its bash runs), composed in this process by the Hydra
# compose API, as the entry point composes them; the launch of each launcher through the entry point's command line
# is the test above
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@pytest.mark.parametrize("launcher", MODEL_LAUNCHERS)
def test_each_launcher_runs_with_each_algorithm_its_model_serves(launcher, algorithm, tiny_model, data_dirs, tmp_path):
    """The documented command composes through Hydra and passes every check before Ray; a pairing the doc marks
    refused fails naming the algorithm, the model path and what the model serves instead."""
    from verl_omni.trainer.config.preflight import check_config, check_resources
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import compose_config

    model, cell = documented_pairings()[launcher, algorithm]
    model_path = tiny_model(model)
    served = cell.startswith("`bash ")
    if served:
        words = shlex.split(cell.strip("`"))
        assert words[:2] == ["bash", f"examples/flowgrpo_trainer/{launcher}"] and f"algorithm={algorithm}" in words
        args = words[2:]
    else:
        assert cell.startswith("refused before Ray"), cell
        args = [f"algorithm={algorithm}"]
    overrides = entry_point_args(
        launcher,
        model_path,
        data_dirs(model_path),
        tmp_path,
        *PASS_THROUGH,
        f"trainer.default_local_dir={tmp_path}",
        *args,
    )
    config = compose_config("flowgrpo_trainer", overrides)
    check_config(config)
    check_resources(config)
    if served:
        configs = validate_config(config)
        assert configs.algorithm.name == algorithm and configs.model.path == str(model_path)
        return
    with pytest.raises(ValueError, match=rf"algorithm={algorithm}: \w+ \(actor_rollout_ref\.model\.path=") as error:
        validate_config(config)
    assert str(model_path) in str(error.value) and "algorithms this model serves: [" in str(error.value)


# the launcher runs the entry point in a fresh interpreter (Hydra's compose there): the full suite's
@pytest.mark.slow
def test_the_tiny_cpu_launcher_is_the_default_run_on_the_cpu(tmp_path):
    """``run_tiny_cpu.sh``: ``flowgrpo_trainer.yaml``'s own run (what ``scripts/run.sh`` runs), pinned to the CPU."""
    from omegaconf import OmegaConf

    from verl_omni.utils.config import compose_config, register_resolvers

    out = f"trainer.default_local_dir={tmp_path}"
    proc = launch("run_tiny_cpu.sh", tmp_path, tmp_path, out, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    register_resolvers()
    config = OmegaConf.create(proc.stdout)
    assert_is_its_preset(config, "run_tiny_cpu.sh", out)
    default = compose_config("flowgrpo_trainer", [out])
    assert resolved_without(config, ("trainer.device",)) == resolved_without(default, ("trainer.device",))
    assert config.trainer.device == "cpu"


# the launcher runs the entry point in a fresh interpreter (Hydra's compose there): the full suite's
@pytest.mark.slow
def test_the_tiny_wan_cpu_launcher_composes_a_video_run_the_preflight_accepts(tiny_model, tmp_path):
    """``run_wan2_2_5b_tiny_cpu.sh``: the built-in CPU run with the tiny Wan2.2 and more than one frame (the e2e trainer
    test runs the same settings, ``tests/trainer/test_flowgrpo_models_e2e.py``)."""
    from omegaconf import OmegaConf

    from verl_omni.trainer.config.preflight import check_config, check_resources
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.main_flowgrpo import resolve_builtin_paths
    from verl_omni.utils.config import compose_config, register_resolvers

    overrides = (f"trainer.default_local_dir={tmp_path}", f"trainer.builtin_dir={tmp_path / 'builtin'}")
    proc = launch("run_wan2_2_5b_tiny_cpu.sh", tiny_model("wan2_2"), tmp_path, *overrides, "--cfg", "job")
    assert proc.returncode == 0, proc.stderr[-3000:]
    register_resolvers()
    config = OmegaConf.create(proc.stdout)
    model_path = f"actor_rollout_ref.model.path={tiny_model('wan2_2')}"
    assert_is_its_preset(config, "run_wan2_2_5b_tiny_cpu.sh", model_path, *overrides)
    builtin_run = compose_config("flowgrpo_trainer", ["+experiment=tiny_cpu", model_path, *overrides])
    only_frames = ("actor_rollout_ref.rollout.num_frames",)
    assert resolved_without(config, only_frames) == resolved_without(builtin_run, only_frames)
    # the built-in prompt set, as the entry point builds it before its checks
    resolve_builtin_paths(config)
    check_config(config)
    check_resources(config)
    configs = validate_config(config)
    spec = configs.rollout.sampling_spec(False, configs.model.adapter, "launcher")
    rollout = builtin_run.actor_rollout_ref.rollout
    assert spec.num_frames > 1 and (spec.height, spec.width, spec.uses_cfg) == (rollout.height, rollout.width, False)
    assert configs.model.adapter.__name__ == "Wan22TrainingAdapter" and configs.trainer.device == "cpu"
