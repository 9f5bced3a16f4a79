"""Preflight of ``main_flowgrpo``: each bad key, file or endpoint fails before verl, the engines or Ray are imported;
an algorithm or sampler the model cannot serve fails in the validation after it, before any engine or Ray.

Every case runs ``run_flowgrpo`` on the composed config (or the entry point in a fresh interpreter,
for the end-to-end cases) and expects a ``ValueError`` naming the key or file. The endpoint cases
use a real local HTTP server, up and then down.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_MODULES = ("ray", "vllm", "vllm_omni", "verl", "torch")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

    return ensure_tiny_prompts(tmp_path_factory.mktemp("prompts"))


def base_overrides(model, prompts, run_dir) -> list[str]:
    train, val = prompts
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"trainer.default_local_dir={run_dir}",
    ]


@pytest.fixture
def compose(tiny_qwen_image_path, prompts, tmp_path):
    from verl_omni.utils.config import compose_config

    def build(*overrides: str, model=tiny_qwen_image_path):
        return compose_config("flowgrpo_trainer", base_overrides(model, prompts, tmp_path / "run") + list(overrides))

    return build


def fails_before_ray(config, match: str) -> str:
    """``run_flowgrpo(config)`` raises a ``ValueError`` matching ``match`` and Ray was not started."""
    from verl_omni.trainer.main_flowgrpo import run_flowgrpo

    with pytest.raises(ValueError, match=match) as error:
        run_flowgrpo(config)
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    return str(error.value)


# ---- keys, types and ranges -------------------------------------------------------------------

BAD_VALUES = [
    # a string for an int names the key (verl's later crash came after step 1)
    (["trainer.save_freq=abc"], r"trainer.save_freq must be a number \(default 20\), got 'abc'"),
    (["actor_rollout_ref.actor.ppo_epochs=two"], r"actor_rollout_ref.actor.ppo_epochs must be a number"),
    (["trainer.save_freq=2.5"], r"trainer.save_freq must be an integer"),
    (["trainer.val_before_train=maybe"], r"trainer.val_before_train must be true or false"),
    (["trainer.save_freq=null"], r"trainer.save_freq must be an integer"),
    (["actor_rollout_ref.actor.optim.lr=-1e-3"], r"optim.lr must be a finite number > 0"),
    (["actor_rollout_ref.actor.optim.lr=nan"], r"actor_rollout_ref.actor.optim.lr=nan"),
    (["actor_rollout_ref.actor.optim.lr=inf"], r"optim.lr must be a finite number > 0"),
    (["actor_rollout_ref.actor.optim.weight_decay=-0.1"], r"optim.weight_decay"),
    (["actor_rollout_ref.rollout.agent.num_workers=0"], r"actor_rollout_ref.rollout.agent.num_workers must be >= 1"),
    (
        ["actor_rollout_ref.rollout.generation_timeout_s=0"],
        r"actor_rollout_ref.rollout.generation_timeout_s must be > 0",
    ),
    (["actor_rollout_ref.rollout.noise_level=1000"], r"actor_rollout_ref.rollout.noise_level must be in \[0, 1.414\]"),
    (
        ["actor_rollout_ref.rollout.sde_type=cps", "actor_rollout_ref.rollout.noise_level=1.2"],
        r"noise_level must be in \[0, 1\] for sde_type='cps'",
    ),
    (["actor_rollout_ref.rollout.val_noise_level=5"], r"actor_rollout_ref.rollout.val_noise_level"),
    (["+trainer.save_frequency=5"], r"trainer.save_frequency is not a config key \(did you mean 'save_freq'\?\)"),
    (["+actor_rollout_ref.rollout.noise_levle=0.5"], r"did you mean 'noise_level'"),
    (["trainer=3"], r"trainer is a group of keys"),
    # a key every algorithm has, checked for a non-default algorithm too
    (["algorithm=grpo_guard", "algorithm.drop_zero_std_groups=maybe"], r"algorithm.drop_zero_std_groups must be true"),
    (["algorithm=dance_grpo", "+algorithm.drop_zero_std_group=true"], r"did you mean 'drop_zero_std_groups'"),
]


@pytest.mark.parametrize(("overrides", "match"), BAD_VALUES, ids=[" ".join(o[0]) for o in BAD_VALUES])
def test_bad_value_fails_before_ray_naming_the_key(compose, overrides, match):
    fails_before_ray(compose(*overrides), match)


def test_unknown_key_lists_the_valid_keys_close_matches_first(compose):
    message = fails_before_ray(compose("+trainer.test_frq=2"), "trainer.test_frq")
    valid = message.split("valid keys here: ")[1]
    assert valid.startswith("['test_freq'")
    assert "'default_local_dir'" in valid and "'_target_'" not in valid


def test_free_form_nodes_and_float_values_of_int_defaults_pass(compose):
    from verl_omni.trainer.config.preflight import check_config

    # ray.init keyword arguments pass through; verl's rollout.top_p defaults to 1 but is a float field
    check_config(compose("+ray_kwargs.ray_init.object_store_memory=1000000000", "actor_rollout_ref.rollout.top_p=0.9"))


# ---- model directory --------------------------------------------------------------------------


@pytest.fixture
def model_copy(tiny_qwen_image_path, tmp_path):
    return Path(shutil.copytree(tiny_qwen_image_path, tmp_path / "model"))


def _truncate_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:8] + data[8:40])


def _bad_length(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:8] = (10**12).to_bytes(8, "little")
    path.write_bytes(bytes(data))


def _truncate_data(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 64])


@pytest.mark.parametrize("damage", [_truncate_header, _bad_length, _truncate_data], ids=lambda f: f.__name__)
def test_corrupt_safetensors_names_the_file(compose, model_copy, damage):
    weights = model_copy / "transformer" / "diffusion_pytorch_model.safetensors"
    damage(weights)
    fails_before_ray(compose(model=model_copy), f"{weights} is not a readable safetensors file")


def test_unreadable_component_config_names_the_file(compose, model_copy):
    (model_copy / "vae" / "config.json").write_text("{not json")
    fails_before_ray(compose(model=model_copy), f"{model_copy / 'vae' / 'config.json'} is not readable JSON")


def test_missing_component_names_it(compose, model_copy):
    shutil.rmtree(model_copy / "vae")
    fails_before_ray(compose(model=model_copy), "lists the component 'vae'")


def test_directory_without_index_names_the_key(compose, tmp_path):
    (tmp_path / "empty").mkdir()
    fails_before_ray(compose(model=tmp_path / "empty"), "actor_rollout_ref.model.path=.* has neither model_index.json")


# ---- data files -------------------------------------------------------------------------------


def _write(path: Path, frame) -> Path:
    frame.to_parquet(path)
    return path


def test_empty_parquet_names_the_file(compose, tmp_path):
    import pandas as pd

    empty = _write(tmp_path / "empty.parquet", pd.DataFrame({"prompt": pd.Series([], dtype=object)}))
    fails_before_ray(compose(f"data.train_files={empty}"), f"data.train_files: {empty} has no rows")


def test_parquet_without_the_prompt_column_names_key_file_and_columns(compose, tmp_path):
    import pandas as pd

    wrong = _write(tmp_path / "text.parquet", pd.DataFrame({"text": ["a red cat"] * 8}))
    message = fails_before_ray(compose(f"data.val_files={wrong}"), f"data.val_files: {wrong} has no prompt column")
    assert "'prompt' (data.prompt_key)" in message and "['text']" in message
    # the same file passes once data.prompt_key names its column
    from verl_omni.trainer.config.preflight import check_data_files

    check_data_files(compose(f"data.val_files={wrong}", f"data.train_files={wrong}", "data.prompt_key=text"))


def test_file_that_is_not_parquet_names_it(compose, tmp_path):
    text = tmp_path / "prompts.parquet"
    text.write_text("a red cat\n")
    fails_before_ray(compose(f"data.train_files={text}"), f"data.train_files: {text} is not a readable parquet file")


def test_an_editing_set_with_a_missing_source_image_names_key_file_and_row(compose, tmp_path):
    from PIL import Image

    from verl_omni.utils.dataset.edit_prompts import edit_row
    from verl_omni.utils.dataset.t2i_prompts import write_parquet

    Image.new("RGB", (8, 8)).save(tmp_path / "ok.png")
    rows = [edit_row("a red cat", [{"image": str(tmp_path / "ok.png")}], i, "train", "t") for i in range(8)]
    rows[5]["images"] = [{"image": str(tmp_path / "gone.png")}]
    path = write_parquet(rows, tmp_path / "edit.parquet")
    fails_before_ray(
        compose(f"data.train_files={path}"),
        rf"data.train_files: {path} row 5 \(images\), image 0: source image .*gone.png does not exist",
    )


@pytest.mark.parametrize("builder", ["qwen_image_edit", "wan2_2_i2v_a14b", "hunyuan_video_1_5_i2v"])
def test_a_model_that_takes_source_images_is_refused_a_text_prompt_set(compose, tiny_model, prompts, builder):
    """An editor or an image-to-video model given a set without the source-image column (a text prompt set) is
    refused before Ray, naming the key, the file, the model and the fix."""
    from verl_omni.pipelines.model_base import get_model_adapter

    path = tiny_model(builder)
    train, _ = prompts
    frames = ("actor_rollout_ref.rollout.num_frames=5",) if "i2v" in builder else ()
    message = fails_before_ray(
        compose(*frames, model=path),
        rf"data.train_files: {train} has no source-image column 'images' \(data.image_key\)",
    )
    assert f"{get_model_adapter(path).__name__} ({path}) takes 1 to 1 source images" in message
    assert "examples/data_process/edit_prompts.py" in message


def test_fewer_prompts_than_a_batch_is_refused(compose):
    fails_before_ray(compose("data.train_batch_size=1000"), "fewer than data.train_batch_size=1000")


# ---- offline preference sets (data.preference_files) -------------------------------------------

# what an offline Diffusion-DPO run needs besides the file (the file is added by ``offline``)
OFFLINE = (
    "algorithm=diffusion_dpo",
    "actor_rollout_ref.rollout.n=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
)


@pytest.fixture(scope="module")
def preference_rows(tmp_path_factory):
    """Four preference rows whose images are files: (prompt, chosen, rejected)."""
    from PIL import Image

    from verl_omni.utils.dataset.preference_data import preference_row

    folder = tmp_path_factory.mktemp("pair_images")
    Image.new("RGB", (8, 8), (220, 220, 220)).save(folder / "light.png")
    Image.new("RGB", (8, 8), (20, 20, 20)).save(folder / "dark.png")
    light, dark = {"image": str(folder / "light.png")}, {"image": str(folder / "dark.png")}
    return [preference_row(f"a red cat {i}", light, dark, i, "train", "t") for i in range(4)]


@pytest.fixture
def offline(compose, preference_rows, tmp_path):
    """The config of an offline run on ``rows`` (default: the four good ones), plus ``overrides``."""
    from verl_omni.utils.dataset.t2i_prompts import write_parquet

    def build(*overrides: str, rows=None, **model):
        path = write_parquet(preference_rows if rows is None else rows, tmp_path / "prefs.parquet")
        return compose(*OFFLINE, f"data.preference_files={path}", *overrides, **model)

    return build


def test_an_offline_preference_run_validates(offline):
    from verl_omni.trainer.config.preflight import check_config, check_resources
    from verl_omni.trainer.config.validation import validate_config

    config = offline()
    check_config(config)
    check_resources(config)
    assert validate_config(config).algorithm.name == "diffusion_dpo"


OFFLINE_REFUSALS = [
    (["algorithm=flow_grpo"], r"data.preference_files \(offline Diffusion-DPO\) trains Diffusion-DPO: set algorithm="),
    (["actor_rollout_ref.rollout.n=4"], r"set actor_rollout_ref.rollout.n=2 \(got 4\)"),
    (["trainer.test_freq=5"], r"set trainer.val_before_train=false and trainer.test_freq=0 \(got False and 5\)"),
    (["trainer.val_before_train=true"], r"set trainer.val_before_train=false and trainer.test_freq=0"),
    (["algorithm.reward_normalization=gdpo"], r"set algorithm.reward_normalization=sum"),
    (["data.train_batch_size=8"], r"data.preference_files hold 4 pairs, fewer than data.train_batch_size=8"),
]


@pytest.mark.parametrize(("overrides", "match"), OFFLINE_REFUSALS, ids=lambda v: str(v))
def test_an_offline_run_refuses_what_needs_a_rollout_naming_the_keys(offline, overrides, match):
    fails_before_ray(offline(*overrides), match)


def test_an_offline_set_with_a_missing_image_names_key_file_and_row(offline, preference_rows, tmp_path):
    rows = [dict(row) for row in preference_rows]
    rows[2]["chosen"] = {"image": str(tmp_path / "gone.png")}
    fails_before_ray(
        offline(rows=rows),
        r"data.preference_files: .*prefs.parquet row 2 \(chosen\): source image .*gone.png does not exist",
    )


def test_an_empty_preference_file_names_it(offline, tmp_path):
    import pandas as pd

    empty = _write(
        tmp_path / "empty.parquet", pd.DataFrame({c: pd.Series([], dtype=object) for c in ("chosen", "rejected")})
    )
    fails_before_ray(offline(f"data.preference_files={empty}"), rf"data.preference_files: {empty} has no rows")


@pytest.mark.parametrize(
    "builder, adapter",
    [
        pytest.param("qwen_image_edit", "QwenImageEditTrainingAdapter", id="qwen_image_edit"),
        pytest.param("wan2_2_i2v_a14b", "Wan22I2VA14BTrainingAdapter", id="wan2_2_i2v_a14b"),
    ],
)
def test_an_editing_model_is_refused_an_offline_set(offline, tiny_model, builder, adapter):
    """A model that takes source images (an editor, the image-to-video model) has no offline preference encoder."""
    fails_before_ray(offline(model=tiny_model(builder)), rf"{adapter} .* does not have: train this model online")


# ---- reward endpoints -------------------------------------------------------------------------


class _Scorer(http.server.BaseHTTPRequestHandler):
    """Answers POST with one score per image (the ``http`` scorer's schema); GET gets 405, as many services do."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._answer(200, {"scores": [0.5] * len(body["images"])})

    def do_GET(self):
        self._answer(405, {"detail": "Method Not Allowed"})

    def _answer(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def scoring_server():
    """``(url, stop)``: a real HTTP scoring service on a free local port; ``stop()`` takes it down."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scorer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()

    yield f"http://127.0.0.1:{server.server_address[1]}/score", stop
    if thread.is_alive():
        stop()


# the remote scorers and the params each needs besides its url
REMOTE_SCORERS = {"http": {}, "http_video": {}, "vlm_judge": {"model": "judge"}}


def _with_http_scorer(config, url: str, scorer: str = "http"):
    params = {"url": url, **REMOTE_SCORERS[scorer]}
    config.reward.diffusion.scorers = [{"type": "brightness"}, {"type": scorer, "params": params}]
    return config


@pytest.mark.parametrize("scorer", sorted(REMOTE_SCORERS))
def test_reward_endpoint_that_answers_passes_and_one_that_is_down_names_key_and_url(compose, scoring_server, scorer):
    from verl_omni.trainer.config.preflight import check_reward_endpoints

    url, stop = scoring_server
    check_reward_endpoints(_with_http_scorer(compose(), url, scorer))
    stop()
    message = fails_before_ray(_with_http_scorer(compose(), url, scorer), r"reward.diffusion.scorers\[1\].params.url")
    assert url in message and "reward.diffusion.preflight=false" in message


def test_reward_preflight_false_skips_the_endpoint_check(compose):
    from verl_omni.trainer.config.preflight import check_resources

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/score"
    check_resources(_with_http_scorer(compose("reward.diffusion.preflight=false"), closed))


# ---- end to end: the entry point in a fresh interpreter ---------------------------------------

# runs the entry point as ``python -m`` would, then reports which heavy modules it had imported
ENTRY = f"""
import json, runpy, sys
ENGINE_MODULES = {ENGINE_MODULES!r}
sys.argv = ["main_flowgrpo", *json.loads(sys.argv[1])]
try:
    runpy.run_module("verl_omni.trainer.main_flowgrpo", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as e:
    code = e.code
ray = sys.modules.get("ray")
started = bool(ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized())
print(json.dumps({{"code": code, "imported": [m for m in ENGINE_MODULES if m in sys.modules], "ray_started": started}}))
"""


def run_entry_point(*overrides: str, cwd: Path) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", ENTRY, json.dumps(list(overrides))],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("trainer.save_freq=abc", "trainer.save_freq must be a number"),
        ("data.prompt_key=caption", "has no prompt column 'caption' (data.prompt_key)"),
    ],
)
def test_entry_point_fails_without_importing_verl_torch_or_ray(
    tiny_qwen_image_path, prompts, tmp_path, override, match
):
    result, stderr = run_entry_point(
        *base_overrides(tiny_qwen_image_path, prompts, tmp_path / "run"), override, cwd=tmp_path
    )
    assert result["code"] == 1
    assert match in stderr
    assert result["imported"] == [], f"the preflight imported {result['imported']}"


@pytest.mark.slow
def test_validation_imports_no_engine(tiny_qwen_image_path, prompts, tmp_path, fresh_python):
    """The dataclass validation after the preflight imports verl (and with it Ray's module) but no vLLM stack."""
    code = f"""
import json, sys
from verl_omni.utils.config import compose_config
from verl_omni.trainer.config.preflight import check_config, check_resources
config = compose_config("flowgrpo_trainer", {base_overrides(tiny_qwen_image_path, prompts, tmp_path / "run")!r})
check_config(config)
check_resources(config)
after_preflight = [m for m in {ENGINE_MODULES!r} if m in sys.modules]
from verl_omni.trainer.config.validation import validate_config
validate_config(config)
import ray
print(json.dumps([after_preflight, [m for m in ("vllm", "vllm_omni") if m in sys.modules], ray.is_initialized()]))
"""
    after_preflight, engines, ray_started = json.loads(fresh_python(code).strip().splitlines()[-1])
    assert after_preflight == []
    assert engines == []
    assert not ray_started


# ---- algorithm x model pairings ----------------------------------------------------------------

# the tiny models (``tiny_model`` builders) and the algorithms (the Hydra group ``algorithm=<name>``), found, not listed
PAIRING_MODELS = (
    "qwen_image",
    "sd3",
    "flux",
    "z_image",
    "bagel",
    "wan2_2",
    "wan2_2_a14b",
    "qwen_image_edit",
    "qwen_image_edit_plus",
    "wan2_2_i2v_a14b",
    "hunyuan_video_1_5",
)
ALGORITHM_NAMES = sorted(p.stem for p in (REPO / "verl_omni" / "trainer" / "config" / "algorithm").glob("*.yaml"))
# what the models' adapters declare today: BAGEL's rollout records no clean ODE samples (DiffusionNFT's, AWM's and
# Diffusion-DPO's record)
# what a model needs besides the defaults whatever the algorithm: Z-Image cannot take an SDE step on its last step
# (sigma 0 -> 0), and the default window covers every step
MODEL_OVERRIDES = {"z_image": ["actor_rollout_ref.rollout.sde_window_size=2"]}
REFUSED_PAIRINGS = {
    ("bagel", "diffusion_nft"): "needs a rollout that records 'ode_samples'",
    ("bagel", "awm"): "needs a rollout that records 'ode_samples'",
    ("bagel", "diffusion_dpo"): "needs a rollout that records 'ode_samples'",
    ("bagel", "dgpo"): "needs a rollout that records 'ode_samples'",
}
# sampler settings given by hand that a model's rollout pipeline cannot run (MixGRPO-Flash on BAGEL's own loop)
REFUSED_SAMPLERS = [
    ("bagel", ["algorithm=mix_grpo", "actor_rollout_ref.rollout.ode_solver=dpmsolver++"], "ode_solver='dpmsolver++'"),
    (
        "bagel",
        ["algorithm=mix_grpo", "actor_rollout_ref.rollout.ode_post_window_ratio=0.4"],
        "ode_post_window_ratio=0.4",
    ),
]


def _adapter_name(model: str) -> str:
    return {
        "qwen_image": "QwenImage",
        "sd3": "SD3",
        "flux": "Flux",
        "z_image": "ZImage",
        "bagel": "Bagel",
        "wan2_2": "Wan22",
        "wan2_2_a14b": "Wan22A14B",
        "qwen_image_edit": "QwenImageEdit",
        "qwen_image_edit_plus": "QwenImageEditPlus",
        "wan2_2_i2v_a14b": "Wan22I2VA14B",
        "hunyuan_video_1_5": "HunyuanVideo15",
    }[model]


@pytest.fixture(scope="module")
def pairing_config(tiny_qwen_image_path, prompts, tmp_path_factory):
    """``pairing_config(model_path, run_dir, *overrides)``: the composed config of a pairing.

    Hydra composes each distinct set of group choices and overrides once per module (a composition parses the
    whole YAML tree, a second or more on two busy cores); each test gets its own copy with its model path and run
    directory set, the plain values a command line would set."""
    from omegaconf import OmegaConf

    from verl_omni.utils.config import compose_config

    composed = {}
    placeholder_run = tmp_path_factory.mktemp("pairing_run")

    def get(model_path: Path, run_dir: Path, *overrides: str):
        if overrides not in composed:
            base = base_overrides(tiny_qwen_image_path, prompts, placeholder_run)
            composed[overrides] = compose_config("flowgrpo_trainer", base + list(overrides))
        config = copy.deepcopy(composed[overrides])
        OmegaConf.update(config, "actor_rollout_ref.model.path", str(model_path))
        OmegaConf.update(config, "trainer.default_local_dir", str(run_dir))
        return config

    return get


@pytest.fixture(scope="module")
def edit_sets(tmp_path_factory):
    """``(train, val)`` sets with a source image per row, for the models that take source images."""
    from trainer_helpers import write_edit_prompt_files

    return write_edit_prompt_files(tmp_path_factory.mktemp("edit_prompts"))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@pytest.mark.parametrize("model", PAIRING_MODELS)
def test_each_algorithm_on_each_tiny_model_passes_or_is_refused_naming_both(
    pairing_config, tiny_model, edit_sets, tmp_path, model, algorithm
):
    """Every served pairing passes every check before Ray; an unserved one is refused naming the algorithm, the
    adapter, the model path and the algorithms that model does serve. A model that takes source images reads a set
    with them."""
    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.trainer.config.preflight import check_config, check_resources
    from verl_omni.trainer.config.validation import validate_config

    path = tiny_model(model)
    data = []
    if get_model_adapter(path).max_source_images:
        data = [f"data.train_files={edit_sets[0]}", f"data.val_files={edit_sets[1]}"]
    overrides = (f"algorithm={algorithm}", *MODEL_OVERRIDES.get(model, []), *data)
    config = pairing_config(path, tmp_path / "run", *overrides)
    if (model, algorithm) not in REFUSED_PAIRINGS:
        check_config(config)
        check_resources(config)
        configs = validate_config(config)
        assert configs.algorithm.name == algorithm and configs.model.adapter.__name__.startswith(_adapter_name(model))
        return
    message = fails_before_ray(config, rf"algorithm={algorithm}: {_adapter_name(model)}TrainingAdapter \(")
    assert f"actor_rollout_ref.model.path={path}" in message
    assert REFUSED_PAIRINGS[model, algorithm] in message
    served = [a for a in ALGORITHM_NAMES if (model, a) not in REFUSED_PAIRINGS]
    assert f"algorithms this model serves: {served}" in message


@pytest.mark.parametrize(("model", "overrides", "match"), REFUSED_SAMPLERS, ids=lambda v: str(v))
def test_a_sampler_setting_the_model_cannot_run_is_refused_and_another_model_takes_it(
    compose, tiny_model, model, overrides, match
):
    message = fails_before_ray(
        compose(*overrides, model=tiny_model(model)), re.escape(f"actor_rollout_ref.rollout.{match}")
    )
    assert f"{_adapter_name(model)}TrainingAdapter (actor_rollout_ref.model.path={tiny_model(model)}" in message
    assert "algorithm=mix_grpo" in message and "allowed: [" in message
    # the same setting on a model whose pipeline loops over the recorder's (thinned) schedule passes
    from verl_omni.trainer.config.validation import validate_config

    validate_config(compose(*overrides, model=tiny_model("qwen_image")))


# in a fresh interpreter (about a minute each on a busy machine: verl's import), one refusal of each kind: the entry
# point's exit and imports are the same for every pairing, whose messages the in-process tests above check
ENTRY_POINT_REFUSALS = [
    (model, [f"algorithm={algorithm}"], f"algorithm={algorithm}: ") for model, algorithm in list(REFUSED_PAIRINGS)[:1]
] + [(model, overrides, f"actor_rollout_ref.rollout.{match}") for model, overrides, match in REFUSED_SAMPLERS[:1]]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "overrides", "match"), ENTRY_POINT_REFUSALS, ids=lambda v: str(v))
def test_entry_point_refuses_an_unserved_pairing_before_any_engine_or_ray(
    tiny_model, prompts, tmp_path, model, overrides, match
):
    """``python -m verl_omni.trainer.main_flowgrpo`` exits 1 with the refusal: verl's config classes were imported
    (the adapter and the algorithm are looked up there), no vLLM engine and no Ray cluster."""
    path = tiny_model(model)
    result, stderr = run_entry_point(*base_overrides(path, prompts, tmp_path / "run"), *overrides, cwd=tmp_path)
    assert result["code"] == 1
    assert match in stderr and f"actor_rollout_ref.model.path={path}" in stderr
    assert not {"vllm", "vllm_omni"} & set(result["imported"]), result["imported"]
    assert not result["ray_started"]


@pytest.mark.parametrize(
    ("model", "adapter", "default"), [("flux", "FluxTrainingAdapter", 3.5), ("flux2", "Flux2TrainingAdapter", 4.0)]
)
def test_true_cfg_on_a_guidance_distilled_model_is_refused_before_ray(compose, tiny_model, model, adapter, default):
    """FLUX.1-dev and FLUX.2-dev embed their guidance (one pass per step): true CFG is refused naming the key, the
    adapter and the setting to use instead."""
    path = tiny_model(model)
    message = fails_before_ray(
        compose("actor_rollout_ref.rollout.true_cfg_scale=4", model=path),
        re.escape("actor_rollout_ref.rollout.true_cfg_scale=4: "),
    )
    assert f"{adapter} (actor_rollout_ref.model.path={path}, algorithm=flow_grpo)" in message
    assert "is guidance-distilled" in message and f"set guidance_scale (default {default})" in message


@pytest.mark.parametrize(
    ("model", "num_frames", "allowed"), [("wan2_2", 6, "allowed: 1, 5, 9, ..."), ("qwen_image", 5, "allowed: 1")]
)
def test_a_frame_count_the_model_cannot_generate_is_refused_before_ray(compose, tiny_model, model, num_frames, allowed):
    path = tiny_model(model)
    message = fails_before_ray(
        compose(f"actor_rollout_ref.rollout.num_frames={num_frames}", model=path),
        re.escape(f"actor_rollout_ref.rollout.num_frames={num_frames}: "),
    )
    assert f"actor_rollout_ref.model.path={path}" in message and allowed in message


@pytest.mark.parametrize(
    "builder, adapter",
    [
        pytest.param("wan2_2_a14b", "Wan22A14BTrainingAdapter", id="wan2_2_a14b"),
        pytest.param("wan2_2_i2v_a14b", "Wan22I2VA14BTrainingAdapter", id="wan2_2_i2v_a14b"),
    ],
)
def test_full_fine_tuning_of_the_two_expert_wan_is_refused_before_ray(compose, tiny_model, edit_sets, builder, adapter):
    """The A14Bs (text- and image-to-video, the latter on a set with source images) train a LoRA over both experts;
    full fine-tuning (no full-weight sync of two experts) is refused naming the key and the fix."""
    path = tiny_model(builder)
    data = [f"data.train_files={edit_sets[0]}", f"data.val_files={edit_sets[1]}"] if "i2v" in builder else []
    message = fails_before_ray(
        compose("actor_rollout_ref.rollout.num_frames=5", "actor_rollout_ref.model.lora.rank=0", *data, model=path),
        re.escape("actor_rollout_ref.model.lora.rank=0 (full fine-tuning) needs a full-weight sync"),
    )
    assert f"{adapter} ({path})" in message and "train a LoRA (rank > 0)" in message
