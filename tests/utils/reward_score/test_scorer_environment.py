"""A scorer's own environment: built once from its requirements with a pin the trainer's environment does not have,
cached under its key, and a requirement that cannot install fails naming it. An inheriting environment imports its
own pins first and the rest from the trainer's site-packages."""

import json
import os
import subprocess
import sys

import numpy
import pytest

from verl_omni.utils.reward_score.environment import (
    DONE_FILE,
    ScorerEnvironment,
    ScorerEnvironmentError,
    build,
    trainer_site_packages,
)

OLD_NUMPY = "numpy==1.26.4"


@pytest.fixture(scope="session")
def env_root(tmp_path_factory):
    """One cache directory for the session: an environment is built once however many tests use it."""
    return tmp_path_factory.mktemp("scorer_envs")


def test_key_ignores_requirement_order_and_tells_pins_apart():
    a = ScorerEnvironment(("numpy==1.26.4", "pillow"))
    assert a.key() == ScorerEnvironment(("pillow", "numpy==1.26.4")).key()
    assert a.key() != ScorerEnvironment(("numpy==1.26.3", "pillow")).key()
    assert a.key() != ScorerEnvironment(("numpy==1.26.4", "pillow"), python="3.10").key()


def test_inheriting_is_part_of_the_key_and_needs_the_trainers_python():
    assert ScorerEnvironment((OLD_NUMPY,), inherit=True).key() != ScorerEnvironment((OLD_NUMPY,)).key()
    other = "3.10" if sys.version_info[:2] != (3, 10) else "3.12"
    with pytest.raises(ValueError, match=f"python='{other}' with inherit=True"):
        ScorerEnvironment((OLD_NUMPY,), python=other, inherit=True)


def test_overrides_tell_environments_apart_and_no_overrides_keeps_the_description():
    plain = ScorerEnvironment(("paddleocr",))
    assert "overrides" not in plain.description()
    dropped = ScorerEnvironment(("paddleocr",), overrides=("opencv-python; sys_platform == 'never'",))
    assert dropped.key() != plain.key()
    assert dropped.description()["overrides"] == ["opencv-python; sys_platform == 'never'"]
    with pytest.raises(ValueError, match="overrides must be non-empty"):
        ScorerEnvironment(("paddleocr",), overrides=(" ",))


def test_empty_requirements_are_refused():
    with pytest.raises(ValueError, match="requirements must be non-empty"):
        ScorerEnvironment(())


@pytest.mark.slow
def test_a_conflicting_pin_gets_its_own_environment_built_once(env_root):
    assert numpy.__version__ != "1.26.4"
    environment = ScorerEnvironment((OLD_NUMPY,))
    path = build(environment, env_root)
    done = (path / DONE_FILE).stat().st_mtime_ns
    version = subprocess.run(
        [str(environment.python_executable(env_root)), "-c", "import numpy; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "1.26.4"
    assert build(environment, env_root) == path
    assert (path / DONE_FILE).stat().st_mtime_ns == done
    assert [p.name for p in env_root.iterdir()] == [environment.key()]


@pytest.mark.slow
def test_a_requirement_that_cannot_install_fails_naming_it(env_root):
    bad = "verl-omni-no-such-package-for-tests==0.0.1"
    environment = ScorerEnvironment((bad,))
    with pytest.raises(ScorerEnvironmentError, match=f"failed on {bad}"):
        build(environment, env_root)
    assert not environment.path(env_root).exists()


@pytest.mark.slow
def test_an_inheriting_environment_imports_its_pins_first_and_the_rest_from_the_trainer(env_root):
    """numpy: pinned by the environment, shadows the trainer's numpy 2; yaml: not installed there, imported from
    the trainer's site-packages; verl_omni (an editable install, a .pth of the trainer's): not importable."""
    environment = ScorerEnvironment((OLD_NUMPY,), inherit=True)
    path = build(environment, env_root)
    probe = (
        "import json, importlib.util, numpy, yaml;"
        "print(json.dumps([numpy.__version__, numpy.__file__, yaml.__file__,"
        " importlib.util.find_spec('verl_omni') is None]))"
    )
    # neither PYTHONPATH nor this checkout as the working directory: only the environment's search path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python = str(environment.python_executable(env_root))
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env, cwd=path)
    assert result.returncode == 0, result.stderr
    version, numpy_file, yaml_file, no_verl_omni = json.loads(result.stdout)
    assert numpy.__version__ != "1.26.4"
    assert version == "1.26.4" and numpy_file.startswith(str(path))
    assert any(yaml_file.startswith(site) for site in trainer_site_packages())
    assert no_verl_omni
