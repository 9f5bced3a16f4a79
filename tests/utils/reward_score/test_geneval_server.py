"""The GenEval scorers on a tiny random DETR + CLIP: ``geneval_server`` against the reference server
(examples/reward_servers/), ``geneval`` with the same detector in its own environment.

The server is a real subprocess answering real HTTP on 127.0.0.1, started once for the module; the local
scorer's child runs in the environment built from its requirements (the suite's cache), also once for the
module. Both scorers' scores must equal GenEval's checks applied to the detections the server returns for
the same images (fetched here with a plain POST), for both reward modes, and the child must answer those
same detections.
"""

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, ScorerError, build_params, get_scorer_cls
from verl_omni.utils.reward_score.environment import CACHE_ENV_VAR
from verl_omni.utils.reward_score.geneval import GENEVAL_COLORS, check_metadata, evaluate_clauses, parse_detections
from verl_omni.utils.reward_score.http_client import image_to_png_base64
from verl_omni.utils.tiny_models import build_tiny_model
from verl_omni.utils.tiny_models.detr import TINY_DETR_CLASSES

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVER = REPO_ROOT / "examples" / "reward_servers" / "geneval_server.py"

METADATA = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}]},
    {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}]},
    {"tag": "color_attr", "include": [{"class": "cat", "count": 1, "color": "red"}, {"class": "car", "count": 1}]},
    {
        "tag": "position",
        "include": [{"class": "bench", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}],
    },
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    return build_tiny_model("detr", tmp_path_factory.mktemp("tiny_detr"), seed=0)


@pytest.fixture(scope="module")
def server_url(detector, tiny_clip_dir):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, str(SERVER), "--detector", str(detector), "--clip", str(tiny_clip_dir)]
    proc = subprocess.Popen([*cmd, "--device", "cpu", "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    # wait for the health answer (no time limit of ours: the module's pytest timeout bounds it)
    while True:
        if proc.poll() is not None:
            pytest.fail(f"GenEval server exited with {proc.returncode}: {proc.stderr.read()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/", timeout=5) as resp:
                assert json.loads(resp.read())["classes"] == sorted(TINY_DETR_CLASSES)
                break
        except OSError:
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    yield base + "/detect"
    proc.terminate()
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (len(METADATA), 3, 40, 48), dtype=torch.uint8, generator=gen)
    return ScoreBatch(images, ["p"] * len(METADATA), [json.dumps(m) for m in METADATA])


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())


def make(url, **params):
    cls = get_scorer_cls("geneval_server")
    return cls(build_params(cls.params_cls, {"url": url, **params}, "test"))


@pytest.fixture(scope="module")
def local_scorer(detector, tiny_clip_dir, scorer_env_dir):
    """One ``geneval`` scorer (one child process) for the module; its environment in the suite's cache."""
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV_VAR, str(scorer_env_dir))
    cls = get_scorer_cls("geneval")
    scorer = cls(build_params(cls.params_cls, {"detector": str(detector), "clip": str(tiny_clip_dir)}, "test"))
    yield scorer
    scorer.close()
    patch.undo()


def with_params(scorer, **params):
    """``scorer`` with other checks' params: they reach its child only through each request's options, so one
    child serves every parametrization."""
    scorer.params = dataclasses.replace(scorer.params, **params)
    return scorer


@pytest.fixture(scope="module")
def raw_detections(server_url, batch):
    """The server's answer for the batch, every class's colour asked, min score 0 (all detections)."""
    body = {
        "images": [image_to_png_base64(im) for im in batch.images],
        "color_classes": [list(TINY_DETR_CLASSES)] * len(batch),
        "min_score": 0.0,
        "max_objects": 16,
    }
    return post(server_url, body)["detections"]


def test_server_answers_detections_in_the_documented_schema(raw_detections):
    assert len(raw_detections) == len(METADATA)
    for per_class in raw_detections:
        assert per_class and set(per_class) <= set(TINY_DETR_CLASSES)
        for found in per_class.values():
            scores = [d["score"] for d in found]
            assert scores == sorted(scores, reverse=True) and len(found) <= 16
            assert all(len(d["box"]) == 4 and d["color"] in GENEVAL_COLORS for d in found)


def test_the_local_detector_answers_the_servers_detections(local_scorer, batch, raw_detections):
    options = {"color_classes": [list(TINY_DETR_CLASSES)] * len(batch), "min_score": 0.0, "max_objects": 16}
    local = local_scorer.request(batch.images, batch.prompts, None, options)
    assert [{k: [d["color"] for d in v] for k, v in a.items()} for a in local] == [
        {k: [d["color"] for d in v] for k, v in a.items()} for a in raw_detections
    ]
    for mine, served in zip(local, raw_detections, strict=True):
        for name, found in served.items():
            assert [d["score"] for d in mine[name]] == pytest.approx([d["score"] for d in found], abs=1e-5)
            assert [d["box"] for d in mine[name]] == [pytest.approx(d["box"], abs=1e-3) for d in found]


@pytest.mark.parametrize("threshold", [0.0, 0.3])
@pytest.mark.parametrize("reward", ["strict", "fraction"])
def test_scores_equal_the_checks_on_the_served_detections(
    server_url, local_scorer, batch, raw_detections, threshold, reward
):
    params = {"threshold": threshold, "counting_threshold": threshold, "reward": reward, "batch_size": 3}
    scorer = make(server_url, **params)
    expected = []
    for i, m in enumerate(METADATA):
        results = evaluate_clauses(check_metadata(m, "t"), parse_detections(raw_detections[i], "t"), scorer.params)
        expected.append(float(all(results)) if reward == "strict" else sum(results) / len(results))
    assert asyncio.run(scorer.score(batch)) == pytest.approx(expected, abs=1e-6)
    assert with_params(local_scorer, **params).score_sync(batch) == pytest.approx(expected, abs=1e-6)


def test_the_childs_refusal_of_bad_options_is_a_scorer_error(local_scorer, batch):
    with pytest.raises(
        ScorerError, match=r"(?s)GenEvalScorer failed.*'color_classes' must have one list per image \(4\), got 1"
    ):
        local_scorer.request(batch.images, batch.prompts, None, {"color_classes": [["cat"]]})
    assert local_scorer.request(batch.images[:1], ["p"], None, {"min_score": 1.0}) == [{}]  # the child lives on


def test_min_score_and_max_objects_limit_the_answer(server_url, batch):
    body = {"images": [image_to_png_base64(batch.images[0])], "min_score": 0.0, "max_objects": 1}
    answer = post(server_url, body)["detections"][0]
    assert all(len(found) == 1 and "color" not in found[0] for found in answer.values())
    assert post(server_url, {**body, "min_score": 1.0})["detections"] == [{}]


def test_bad_request_is_a_400_the_scorer_does_not_retry(server_url):
    request = urllib.request.Request(server_url, json.dumps({"images": ["not base64 png"]}).encode())
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=60)
    assert info.value.code == 400 and b"not a base64-encoded PNG" in info.value.read()


def test_unreachable_server_raises_scorer_error_after_retries(closed_port_url, batch):
    scorer = make(closed_port_url + "/detect", max_retries=1, backoff_s=0.0, max_backoff_s=0.0)
    with pytest.raises(ScorerError, match=r"scorer 'geneval_server': POST .* failed after 2 attempts"):
        asyncio.run(scorer.score(batch))


def test_missing_metadata_names_the_sample(server_url, batch):
    no_targets = ScoreBatch(batch.images, batch.prompts)
    with pytest.raises(ValueError, match=r"geneval metadata of sample 0 \(the ground truth\)"):
        asyncio.run(make(server_url).score(no_targets))
