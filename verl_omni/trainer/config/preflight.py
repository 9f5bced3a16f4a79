"""Preflight of ``main_flowgrpo``: what can be checked in seconds, before verl, the engines or Ray are imported.

The dataclasses (``validate_config``) are the home of every setting's range, but building them
imports verl, whose package imports torch, tensordict and Ray (about 15-20 s on a busy machine).
This module imports only the standard library, OmegaConf and pyarrow, and checks first:

* every key against the composed default tree (``_generated_flowgrpo_trainer.yaml``, the mirror of
  the dataclasses; the ``algorithm`` node from the chosen algorithm's ``algorithm/<name>.yaml``): a key the tree does not have is refused with the valid keys, close matches
  first; a value whose default is a bool, an int or a float must be one (``trainer.save_freq=abc``
  is refused naming the key); no value may be NaN;
* the model directory: ``model_index.json`` or ``config.json``, every component's JSON config,
  every safetensors header (the 8-byte length and the JSON header, not the weights);
* every data file: a readable, non-empty parquet with the prompt column (``data.prompt_key``); where it
  has a source-image column (``data.image_key``, verl's ``images``: an editing set), every image opens; an offline
  preference set (``data.preference_files``) replaces the training prompts, and its chosen and rejected images open;
* every reward endpoint (a scorer's ``params.url``) answers HTTP, unless ``reward.diffusion.preflight=false``.

Every error is a ``ValueError`` naming the key or file and the fix.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import struct
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

logger = logging.getLogger(__name__)

DEFAULTS_FILE = Path(__file__).resolve().parent / "_generated_flowgrpo_trainer.yaml"
# the Hydra group ``algorithm=<name>``: one node file per algorithm
ALGORITHM_DIR = Path(__file__).resolve().parent / "algorithm"
# the trainer's YAML: its ``algorithm`` node holds the keys every algorithm has (``AlgorithmConfig``)
TRAINER_FILE = Path(__file__).resolve().parent / "flowgrpo_trainer.yaml"
# nodes whose keys are passed through to a callee (``ray.init`` keyword arguments), not a dataclass
FREE_FORM_NODES = ("ray_kwargs.ray_init",)
# seconds an endpoint may take to answer the preflight request
ENDPOINT_TIMEOUT_S = 10.0
# the largest safetensors JSON header accepted (safetensors' own limit is 100 MB)
MAX_SAFETENSORS_HEADER = 100_000_000


def check_config(config: DictConfig) -> None:
    """Keys and scalar types of ``config`` against the composed default tree (before ``builtin://`` paths are built)."""
    check_keys_and_types(config, with_algorithm_node(load_defaults(), config))


def check_resources(config: DictConfig) -> None:
    """What the run reads: model directory, data files, reward endpoints (``builtin://`` paths resolved)."""
    check_model_dir(str(OmegaConf.select(config, "actor_rollout_ref.model.path")))
    check_data_files(config)
    if OmegaConf.select(config, "reward.diffusion.preflight", default=True):
        check_reward_endpoints(config)


# ---- keys and types ---------------------------------------------------------------------------


def load_defaults() -> DictConfig:
    """The composed default tree (interpolations unresolved), kept in sync with the YAML tree by a test."""
    return OmegaConf.load(DEFAULTS_FILE)


def with_algorithm_node(defaults: DictConfig, config: DictConfig) -> DictConfig:
    """The default tree with the ``algorithm`` node of the run's algorithm (``algorithm/<name>.yaml``).

    The generated tree holds the default algorithm's node; another algorithm (``algorithm=<name>``) has keys of
    its own on top of the keys every algorithm has (the trainer YAML's ``algorithm`` node). An algorithm without
    a YAML here (installed from another package) is checked by its dataclass.
    """
    name = OmegaConf.select(config, "algorithm.name", default=None)
    if name is None or name == OmegaConf.select(defaults, "algorithm.name", default=None):
        return defaults
    defaults = defaults.copy()
    node_file = ALGORITHM_DIR / f"{name}.yaml"
    # the node files are global (``# @package _global_``): their ``algorithm`` node, and rollout keys the tree has;
    # without one the node stays free-form (an empty node: its dataclass checks the keys)
    own = OmegaConf.load(node_file).algorithm if node_file.is_file() else None
    defaults.algorithm = OmegaConf.merge(OmegaConf.load(TRAINER_FILE).algorithm, own) if own is not None else {}
    return defaults


def check_keys_and_types(config: DictConfig, defaults: DictConfig) -> None:
    """Refuse keys the default tree lacks, values of the wrong scalar type, and NaN, naming the key."""
    default_values = OmegaConf.to_container(defaults, resolve=False)
    try:
        values = OmegaConf.to_container(config, resolve=True)
    except Exception as e:  # an interpolation names a missing key: OmegaConf's message says which
        # a node replaced by a value (``trainer=3``) breaks every interpolation that reads through it: name the
        # replaced node rather than the interpolation that tripped over it
        _check_node(OmegaConf.to_container(config, resolve=False), default_values, "")
        raise ValueError(f"the config does not resolve: {e}") from e
    _check_node(values, default_values, "")


def _check_node(values: Any, defaults: Any, prefix: str) -> None:
    if isinstance(values, list):
        for i, item in enumerate(values):
            _check_node(item, None, f"{prefix}[{i}]")
        return
    if not isinstance(values, dict):
        _check_scalar(values, defaults, prefix)
        return
    if not isinstance(defaults, dict):
        # a mapping where the tree has a scalar, list or null: the dataclass decides; still no NaN
        for key, value in values.items():
            _check_node(value, None, f"{prefix}.{key}" if prefix else str(key))
        return
    free_form = not defaults or prefix in FREE_FORM_NODES
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in defaults and not free_form:
            raise ValueError(_unknown_key_message(dotted, str(key), list(defaults)))
        _check_node(value, defaults.get(key), dotted)


def _unknown_key_message(dotted: str, key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
    ordered = close + sorted(k for k in valid if k not in close and k != "_target_")
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{dotted} is not a config key{hint}; valid keys here: {ordered}"


def _check_scalar(value: Any, default: Any, key: str) -> None:
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{key}=nan: no setting takes NaN")
    if value is None or default is None or isinstance(default, str) and "${" in default:
        return
    if isinstance(default, dict):
        raise ValueError(f"{key} is a group of keys, got the value {value!r}: set its keys ({key}.<name>=...)")
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int | float):
        # an int default does not make the field an int (verl's rollout.top_p: 1 is a float field);
        # whether a number must be whole is the dataclass' check
        ok, kind = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    else:
        return
    if not ok:
        raise ValueError(f"{key} must be {kind} (default {default!r}), got {value!r}")


# ---- model directory --------------------------------------------------------------------------


def check_model_dir(path: str) -> None:
    """The checkpoint's index, every component's JSON config and every safetensors header read; no weights loaded."""
    key = "actor_rollout_ref.model.path"
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"{key}={path} is not a directory: point it at a diffusers pipeline or BAGEL checkpoint")
    index, config = root / "model_index.json", root / "config.json"
    if not index.is_file() and not config.is_file():
        raise ValueError(
            f"{key}={path} has neither model_index.json (diffusers) nor config.json (BAGEL): "
            "point it at the checkpoint's top directory"
        )
    if index.is_file():
        components = _read_json(index, key)
        for name, entry in components.items():
            if name.startswith("_") or not isinstance(entry, list) or entry[0] is None:
                continue
            if not (root / name).is_dir():
                raise ValueError(
                    f"{key}={path}: model_index.json lists the component {name!r} but {root / name} is missing "
                    "(an incomplete download?)"
                )
    for json_file in sorted(root.rglob("*.json")):
        _read_json(json_file, key)
    for weights in sorted(root.rglob("*.safetensors")):
        check_safetensors_header(weights)


def _read_json(path: Path, key: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{key}: {path} is not readable JSON ({e}); re-download or rebuild the checkpoint") from e


def check_safetensors_header(path: Path) -> None:
    """A safetensors file's 8-byte little-endian header length and JSON header, and that every tensor fits the file."""
    fix = "re-download or re-save the checkpoint"
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", raw)
            if length > min(size - 8, MAX_SAFETENSORS_HEADER):
                raise ValueError(f"header length {length} exceeds the file ({size} bytes)")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        data_size = size - 8 - length
        for name, info in header.items():
            if name == "__metadata__":
                continue
            end = info.get("data_offsets", [0, math.inf])[1] if isinstance(info, dict) else math.inf
            if end > data_size:
                raise ValueError(f"tensor {name!r} ends at byte {end} of a {data_size}-byte data section (truncated)")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"actor_rollout_ref.model.path: {path} is not a readable safetensors file: {e}; {fix}") from e


# ---- data files -------------------------------------------------------------------------------


def check_data_files(config: DictConfig) -> None:
    """Every training (and, when validation runs, validation) parquet is readable, non-empty and has the prompt column."""
    prompt_key = str(OmegaConf.select(config, "data.prompt_key"))
    trainer = config.trainer
    # an offline preference run reads its pairs instead of the training prompts
    offline = OmegaConf.select(config, "data.preference_files", default=None) is not None
    if offline:
        _check_preference_files(config)
    keys = [] if offline else ["data.train_files"]
    if trainer.val_before_train or trainer.test_freq > 0:
        keys.append("data.val_files")
    image_key = str(OmegaConf.select(config, "data.image_key", default=None) or "images")
    for key in keys:
        rows = sum(_check_parquet(key, f, prompt_key, image_key) for f in _files(config, key))
        batch = OmegaConf.select(config, "data.train_batch_size")
        if key == "data.train_files" and isinstance(batch, int) and rows < batch:
            raise ValueError(
                f"{key} hold {rows} prompts, fewer than data.train_batch_size={batch}: add prompts or lower the batch"
            )


def _check_preference_files(config: DictConfig) -> None:
    """Each preference parquet opens, has rows, and every chosen and rejected image opens (named by file, row and
    column when not); together they hold at least a step's pairs."""
    from verl_omni.utils.dataset.preference_data import check_preference_images

    key = "data.preference_files"
    rows = 0
    for file in _files(config, key):
        if not Path(file).expanduser().is_file():
            raise ValueError(f"{key}: {file} does not exist (examples/data_process/preference_pairs.py writes one)")
        try:
            count = check_preference_images(Path(file).expanduser())
        except ValueError as e:
            raise ValueError(f"{key}: {e}; fix the row or rewrite the set") from e
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not parquet
            raise ValueError(f"{key}: {file} is not a readable parquet file ({e})") from e
        if count == 0:
            raise ValueError(f"{key}: {file} has no rows; write pairs into it or remove it from {key}")
        rows += count
    batch = OmegaConf.select(config, "data.train_batch_size")
    if isinstance(batch, int) and rows < batch:
        raise ValueError(
            f"{key} hold {rows} pairs, fewer than data.train_batch_size={batch} (pairs per step): add pairs or "
            "lower the batch"
        )


def _files(config: DictConfig, key: str) -> list[str]:
    files = OmegaConf.select(config, key)
    files = list(files) if isinstance(files, ListConfig | list | tuple) else [files]
    if not files or any(f is None for f in files):
        raise ValueError(f"{key} must name parquet files")
    return [str(f) for f in files]


def _check_parquet(key: str, file: str, prompt_key: str, image_key: str = "images") -> int:
    """Rows of one parquet file, after checking it opens, has ``prompt_key`` and, if it has ``image_key``,
    that every source image opens (PIL only: no torch)."""
    import pyarrow.parquet as pq

    path = Path(file).expanduser()
    if not path.is_file():
        raise ValueError(f"{key}: {file} does not exist (examples/data_process/ writes prompt sets)")
    try:
        meta = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not parquet
        raise ValueError(
            f"{key}: {file} is not a readable parquet file ({e}); rewrite it with pandas.to_parquet"
        ) from e
    columns = meta.schema_arrow.names
    if prompt_key not in columns:
        raise ValueError(
            f"{key}: {file} has no prompt column {prompt_key!r} (data.prompt_key); its columns: {columns}. "
            f"Rename the column or set data.prompt_key"
        )
    rows = meta.metadata.num_rows
    if rows == 0:
        raise ValueError(f"{key}: {file} has no rows; write prompts into it or remove it from {key}")
    if image_key in columns:
        from verl_omni.utils.dataset.edit_prompts import check_source_images

        try:
            check_source_images(path, image_key)
        except ValueError as e:
            raise ValueError(
                f"{key}: {e}; fix the row or rewrite the set (examples/data_process/edit_prompts.py)"
            ) from e
    return rows


# ---- reward endpoints -------------------------------------------------------------------------


def check_reward_endpoints(config: DictConfig) -> None:
    """Each scorer with a ``params.url`` gets an answer (any HTTP status) within seconds."""
    scorers = OmegaConf.select(config, "reward.diffusion.scorers") or []
    for i, scorer in enumerate(scorers):
        url = OmegaConf.select(scorer, "params.url") if isinstance(scorer, DictConfig) else None
        if isinstance(url, str) and url:
            check_endpoint(f"reward.diffusion.scorers[{i}].params.url", url)


def check_endpoint(key: str, url: str, timeout_s: float = ENDPOINT_TIMEOUT_S) -> None:
    """A GET of ``url`` gets any HTTP answer (a 404 or 405 still proves a server listens there)."""
    # no proxy from the environment: the scorers' aiohttp client does not use one either
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, method="GET"), timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ValueError(
            f"{key}={url} does not answer ({reason}): start the scoring service, fix the URL, or set "
            "reward.diffusion.preflight=false to skip this check"
        ) from e
