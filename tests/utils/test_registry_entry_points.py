"""Out-of-tree models, scorers, tiny builders and algorithms register through entry points, with no list edited.

A real distribution (``verl-omni-oot-example``) is written to a temporary folder, packed as a wheel
and installed by pip into a target folder of its own; a fresh interpreter with that folder on
``PYTHONPATH`` sees its entry points through ``importlib.metadata``, as it would after a ``pip install``
(the project's environment is left as it is). There it builds its tiny checkpoint, whose
``model_index.json`` names its pipeline class, and finds its adapter, its scorer, its builder and its
algorithm (which the example model cannot serve: the pairing is refused naming both).
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import verl_omni

DIST = "verl_omni_oot_example"
VERSION = "0.1.0"
ENTRY_POINTS = {
    "verl_omni.model_adapters": {
        "OotExamplePipeline": "oot_example.adapter:OotExampleAdapter",
        # a name a built-in already holds: refused on lookup, never silently shadowing the built-in
        "BagelForConditionalGeneration": "oot_example.adapter:OotExampleAdapter",
        # a module that does not exist: the lookup names the entry point
        "BrokenPipeline": "oot_example.missing:Adapter",
    },
    "verl_omni.reward_scorers": {"oot_constant": "oot_example.scorer:ConstantScorer"},
    "verl_omni.tiny_models": {"oot_example": "oot_example.tiny:build_tiny_oot_example"},
    "verl_omni.algorithms": {"oot_nft_like": "oot_example.algorithm:OotAlgorithm"},
}
SOURCES = {
    "oot_example/__init__.py": '"""An out-of-tree verl_omni model: adapter, scorer and tiny builder."""\n',
    "oot_example/adapter.py": '''
        from verl_omni.pipelines.model_base import ModelAdapter


        class OotExampleAdapter(ModelAdapter):
            """Registered by its entry point alone (no decorator)."""

            rollout_pipeline = "oot_example.pipeline.OotExamplePipeline"
            lora_target_modules = ("to_q",)
    ''',
    "oot_example/scorer.py": '''
        from verl_omni.utils.reward_score import ScoreBatch, ThreadedScorer


        class ConstantScorer(ThreadedScorer):
            """0.25 for every image. Range [0.25, 0.25]."""

            def score_sync(self, batch: ScoreBatch) -> list[float]:
                return [0.25] * len(batch)
    ''',
    "oot_example/algorithm.py": '''
        from verl_omni.algorithms import ODE_SAMPLES
        from verl_omni.algorithms.flow_grpo import FlowGRPO


        class OotAlgorithm(FlowGRPO):
            """Registered by its entry point alone; trains on clean ODE samples (no log-probs)."""

            rollout_record = ODE_SAMPLES
            uses_log_probs = False
    ''',
    "oot_example/tiny.py": """
        import json
        from pathlib import Path


        def build_tiny_oot_example(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "model_index.json").write_text(json.dumps({"_class_name": "OotExamplePipeline", "seed": seed}))
            return out_dir
    """,
}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(folder: Path) -> Path:
    """A PEP 427 wheel of the example distribution (written directly: no build backend needed offline)."""
    dist_info = f"{DIST}-{VERSION}.dist-info"
    files = {name: textwrap.dedent(text).lstrip().encode() for name, text in SOURCES.items()}
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n".encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: verl_omni-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist_info}/entry_points.txt"] = "".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in ENTRY_POINTS.items()
    ).encode()
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{DIST}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


@pytest.fixture(scope="module")
def oot_env(tmp_path_factory):
    """Environment of a fresh interpreter that has the example distribution installed (pip, into a target folder)."""
    root = tmp_path_factory.mktemp("oot")
    site = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site)]
    subprocess.run([*pip, str(_write_wheel(root))], check=True, capture_output=True, text=True)
    env = dict(os.environ)
    project = str(Path(verl_omni.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), project, env.get("PYTHONPATH")) if p)
    return env, root


def _run(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_installed_entry_points_register_adapter_scorer_and_tiny_builder(oot_env):
    env, root = oot_env
    code = textwrap.dedent(
        f"""
        import asyncio, json, sys
        import torch
        from verl_omni.pipelines.model_base import MODEL_ADAPTERS, get_model_adapter
        from verl_omni.utils.reward_score import ScoreBatch, available_scorers, get_scorer_cls
        from verl_omni.utils.tiny_models import available_builders, build_tiny_model
        from verl_omni.algorithms import ALGORITHMS, check_model_supports, get_algorithm

        out = {{"adapters": MODEL_ADAPTERS.names(), "algorithms": ALGORITHMS.names()}}
        out["algorithm_module_imported_by_listing"] = "oot_example.algorithm" in sys.modules
        out["adapter_module_imported_by_listing"] = "oot_example.adapter" in sys.modules
        path = build_tiny_model("oot_example", {str(root / "ckpt")!r}, seed=3)
        adapter = get_model_adapter(path)
        out["adapter"] = f"{{adapter.__module__}}:{{adapter.__qualname__}}"
        out["rollout_pipeline"] = adapter.rollout_pipeline
        out["scorers"] = available_scorers()
        scorer = get_scorer_cls("oot_constant")()
        batch = ScoreBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), ["a", "b"])
        out["scores"] = asyncio.run(scorer.score(batch))
        out["builders"] = available_builders()
        algorithm = get_algorithm("oot_nft_like")
        out["algorithm"] = f"{{algorithm.__module__}}:{{algorithm.__qualname__}}:{{algorithm.name}}"
        try:
            check_model_supports(algorithm, adapter, path)
            out["pairing"] = "no error"
        except ValueError as e:
            out["pairing"] = str(e)
        for name in ("BagelForConditionalGeneration", "BrokenPipeline"):
            try:
                MODEL_ADAPTERS.get(name)
                out[name] = "no error"
            except (ValueError, ImportError) as e:
                out[name] = f"{{type(e).__name__}}: {{e}}"
        print(json.dumps(out))
        """
    )
    result = _run(env, "-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # listed from the entry points' metadata alone; loaded on the first lookup of that name
    assert {"OotExamplePipeline", "QwenImagePipeline", "BagelForConditionalGeneration"} <= set(out["adapters"])
    assert not out["adapter_module_imported_by_listing"]
    assert out["adapter"] == "oot_example.adapter:OotExampleAdapter"
    assert out["rollout_pipeline"] == "oot_example.pipeline.OotExamplePipeline"
    assert {"oot_constant", "brightness"} <= set(out["scorers"]) and out["scores"] == [0.25, 0.25]
    assert {"oot_example", "qwen_image", "bagel", "clip"} <= set(out["builders"])
    assert {"oot_nft_like", "flow_grpo", "grpo_guard"} <= set(out["algorithms"])
    assert not out["algorithm_module_imported_by_listing"]
    assert out["algorithm"] == "oot_example.algorithm:OotAlgorithm:oot_nft_like"
    assert "algorithm=oot_nft_like" in out["pairing"] and "OotExampleAdapter" in out["pairing"]
    assert "ode_samples" in out["pairing"]
    assert (
        out["BagelForConditionalGeneration"].startswith("ValueError")
        and "already registered" in out["BagelForConditionalGeneration"]
    )
    assert out["BrokenPipeline"].startswith("ImportError") and "oot_example.missing:Adapter" in out["BrokenPipeline"]


@pytest.mark.slow
def test_tiny_model_cli_lists_and_builds_an_entry_point_builder(oot_env):
    env, root = oot_env
    listing = _run(env, "-m", "verl_omni.utils.tiny_models", "--help")
    assert listing.returncode == 0 and "oot_example" in listing.stdout, listing.stderr[-2000:]
    built = _run(env, "-m", "verl_omni.utils.tiny_models", "oot_example", "--out", str(root / "cli"), "--seed", "5")
    assert built.returncode == 0, built.stderr[-2000:]
    assert json.loads((root / "cli" / "model_index.json").read_text()) == {
        "_class_name": "OotExamplePipeline",
        "seed": 5,
    }


def test_unknown_architecture_lists_the_registered_ones_and_how_to_add_one(tmp_path):
    from verl_omni.pipelines.model_base import ADAPTER_ENTRY_POINT_GROUP, get_model_adapter

    (tmp_path / "model_index.json").write_text('{"_class_name": "NoSuchPipeline"}')
    with pytest.raises(ValueError, match="NoSuchPipeline") as e:
        get_model_adapter(tmp_path)
    message = str(e.value)
    assert f"model.path={tmp_path}" in message
    assert "QwenImagePipeline" in message and "BagelForConditionalGeneration" in message
    assert ADAPTER_ENTRY_POINT_GROUP in message and "@register_model_adapter" in message


def test_unknown_scorer_and_tiny_model_say_how_to_add_one():
    from verl_omni.utils.reward_score import SCORER_ENTRY_POINT_GROUP, get_scorer_cls
    from verl_omni.utils.tiny_models import TINY_MODEL_ENTRY_POINT_GROUP, get_builder

    with pytest.raises(ValueError, match=f"@register_scorer.*{SCORER_ENTRY_POINT_GROUP}"):
        get_scorer_cls("no_such_scorer")
    with pytest.raises(ValueError, match=f"build_tiny_<name>.*{TINY_MODEL_ENTRY_POINT_GROUP}"):
        get_builder("no_such_model")


def test_builtins_are_found_by_package_without_a_list():
    from verl_omni.pipelines.model_base import MODEL_ADAPTERS
    from verl_omni.utils.reward_score import available_scorers
    from verl_omni.utils.tiny_models import available_builders

    # every model package's training_adapter.py registers; `schedulers` (shared code, no adapter) adds nothing
    assert {"QwenImagePipeline", "BagelForConditionalGeneration"} <= set(MODEL_ADAPTERS.names())
    # every scorer module of verl_omni/utils/reward_score registers
    assert {"brightness", "jpeg_compressibility", "ocr", "pickscore", "clip_score", "aesthetic", "http"} <= set(
        available_scorers()
    )
    # modules with a build_tiny_<name> are builders; the shared tokenizer module is not
    assert {"qwen_image", "bagel", "clip"} <= set(available_builders()) and "tokenizer" not in available_builders()


def test_importing_tiny_models_stays_free_of_torch():
    code = "import sys, verl_omni.utils.tiny_models as t; t.available_builders(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]
