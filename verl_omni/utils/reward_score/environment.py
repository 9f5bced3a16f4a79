"""A scorer's own Python environment: a virtual environment built from its requirements, once, and cached.

A scorer whose packages pin something the trainer's environment cannot have (an older numpy, mmcv for GenEval's
detector) cannot import into the trainer. Its requirements instead build a separate virtual environment with
``uv`` (``uv venv`` + ``uv pip install``), which resolves and installs in seconds from its own wheel cache; the
trainer's environment is never written to.

Cache: ``$VERL_OMNI_SCORER_ENV_DIR`` (default ``~/.cache/verl_omni/scorer_envs``) holds one directory per
environment, named by :meth:`ScorerEnvironment.key`: the first 16 hex digits of the SHA-256 of the sorted
requirement strings (and overrides, if any), the Python version and the platform. A finished environment holds
``environment.json`` (what it was built from); one without it is rebuilt. Builds go to a temporary sibling
directory that is renamed into place when complete, so an interrupted or concurrent build never leaves a half
environment under the key.

A build failure raises :class:`ScorerEnvironmentError` naming the requirement(s) the installer's report mentions
and the installer's own last lines, so a bad pin fails before anything else starts.

Inheriting the trainer's packages (``inherit=True``): some packages a scorer needs are too heavy to install twice
(torch from PyPI is a multi-GB CUDA build) and are pinned by nothing the scorer declares. Such an environment gets a
``.pth`` file listing the trainer's site-packages directories: Python appends them to ``sys.path`` after the
environment's own site-packages, so a package the requirements install (and its dependencies) shadows the trainer's
version, and one they do not install (torch) is imported from the trainer. The trainer's own ``.pth`` files are not
processed there, so its editable installs (``verl_omni`` itself) stay out. The installer resolves the requirements
on their own: a requirement that depends on torch would install a second torch; leave such packages to the
trainer. The Python version is then the trainer's (compiled packages are shared), and the key hashes the inherited
directories, so environments inheriting from two trainer environments do not share a cache entry.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV_VAR = "VERL_OMNI_SCORER_ENV_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/verl_omni/scorer_envs")
DONE_FILE = "environment.json"
# written into an inheriting environment's site-packages; the name sorts after the packages' own .pth files
INHERIT_FILE = "zz_verl_omni_trainer_packages.pth"
OVERRIDES_FILE = "overrides.txt"
# the installer's last lines kept in an error: enough for the resolver's explanation
ERROR_TAIL_LINES = 20


class ScorerEnvironmentError(RuntimeError):
    """A scorer's environment could not be built; the message names the failing requirement(s)."""


def cache_dir() -> Path:
    """Where built environments live: ``$VERL_OMNI_SCORER_ENV_DIR`` or ``~/.cache/verl_omni/scorer_envs``."""
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


@dataclass(frozen=True)
class ScorerEnvironment:
    """What a scorer's environment is built from.

    Args:
        requirements (tuple[str, ...]): pip requirement strings, e.g. ``("numpy==1.26.4",)``; at least one.
        python (str | None): the Python version (``"3.11"``); None: the trainer's own major.minor version.
        inherit (bool): import what the requirements do not install from the trainer's site-packages, searched
            after the environment's own (module docstring); the Python version must then be the trainer's.
        overrides (tuple[str, ...]): ``uv``'s override requirements (``uv pip install --override``), which replace
            what the requirements' own metadata asks for a package: a version, or, with a marker that never holds
            (``"opencv-python; sys_platform == 'never'"``), nothing, so that a dependency a package declares but
            the scorer does not use (a GUI OpenCV beside the headless one) is not installed.
    """

    requirements: tuple[str, ...]
    python: str | None = None
    inherit: bool = False
    overrides: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.requirements or not all(isinstance(r, str) and r.strip() for r in self.requirements):
            raise ValueError(f"requirements must be non-empty requirement strings, got {self.requirements!r}")
        if self.inherit and self.python not in (None, _trainer_python()):
            raise ValueError(
                f"python={self.python!r} with inherit=True: an environment that imports the trainer's packages runs"
                f" the trainer's Python ({_trainer_python()}); drop python or inherit"
            )
        if not all(isinstance(r, str) and r.strip() for r in self.overrides):
            raise ValueError(f"overrides must be non-empty requirement strings, got {self.overrides!r}")

    @property
    def python_version(self) -> str:
        return self.python or _trainer_python()

    def description(self) -> dict:
        """What the key hashes, also written to the finished environment's ``environment.json``."""
        description = {
            "requirements": sorted(r.strip() for r in self.requirements),
            "python": self.python_version,
            "platform": f"{sys.platform}-{platform.machine()}",
        }
        if self.inherit:
            description["inherit"] = trainer_site_packages()
        if self.overrides:  # absent when empty, so that the keys of environments without overrides stay as they were
            description["overrides"] = sorted(r.strip() for r in self.overrides)
        return description

    def key(self) -> str:
        text = json.dumps(self.description(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def path(self, root: Path | None = None) -> Path:
        return (root or cache_dir()) / self.key()

    def python_executable(self, root: Path | None = None) -> Path:
        return self.path(root) / "bin" / "python"


def _trainer_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def trainer_site_packages() -> list[str]:
    """The site-packages directories of the interpreter running this code (the trainer's), in its search order."""
    return [path for path in site.getsitepackages() if os.path.isdir(path)]


def _site_packages_of(python: Path) -> Path:
    """The site-packages directory of the environment whose interpreter is ``python``."""
    result = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(result.stdout.strip())


def _uv(*args: str) -> subprocess.CompletedProcess:
    """Run ``uv`` (the one installed beside the trainer's interpreter as a module, else the one on PATH)."""
    command = [sys.executable, "-m", "uv"] if _has_uv_module() else [shutil.which("uv") or "uv"]
    return subprocess.run([*command, *args], capture_output=True, text=True)


def _has_uv_module() -> bool:
    return importlib.util.find_spec("uv") is not None


def _failure(environment: ScorerEnvironment, step: str, result: subprocess.CompletedProcess) -> ScorerEnvironmentError:
    report = (result.stderr or result.stdout or "").strip()
    named = [r for r in environment.requirements if _requirement_name(r) in report.lower()]
    tail = "\n".join(report.splitlines()[-ERROR_TAIL_LINES:])
    failing = ", ".join(named) if named else "one of " + ", ".join(environment.requirements)
    return ScorerEnvironmentError(
        f"scorer environment {environment.key()} ({step}) failed on {failing}: fix or drop that requirement.\n{tail}"
    )


def _requirement_name(requirement: str) -> str:
    """The project name of a requirement string, lower case (``numpy==1.26`` -> ``numpy``)."""
    name = requirement.strip()
    for separator in "[=<>!~;@ ":
        name = name.split(separator, 1)[0]
    return name.lower()


def build(environment: ScorerEnvironment, root: Path | None = None) -> Path:
    """The environment's directory, built first if the cache does not hold it finished."""
    target = environment.path(root)
    if (target / DONE_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        # an inheriting environment shares compiled packages with the trainer: its very interpreter, not any 3.x
        interpreter = sys.executable if environment.inherit else environment.python_version
        result = _uv("venv", "--quiet", "--python", interpreter, str(staging))
        if result.returncode != 0:
            raise _failure(environment, f"creating a Python {environment.python_version} venv", result)
        overrides = []
        if environment.overrides:
            (staging / OVERRIDES_FILE).write_text("".join(r.strip() + "\n" for r in environment.overrides))
            overrides = ["--override", str(staging / OVERRIDES_FILE)]
        python = str(staging / "bin" / "python")
        result = _uv("pip", "install", "--quiet", "--python", python, *overrides, *environment.requirements)
        if result.returncode != 0:
            raise _failure(environment, "installing requirements", result)
        if environment.inherit:
            # plain path lines: appended to sys.path, after the environment's own site-packages
            paths = "".join(f"{path}\n" for path in trainer_site_packages())
            (_site_packages_of(staging / "bin" / "python") / INHERIT_FILE).write_text(paths)
        (staging / DONE_FILE).write_text(json.dumps(environment.description(), indent=1) + "\n")
        if (target / DONE_FILE).is_file():
            return target  # another process finished the same environment first
        if target.exists():
            shutil.rmtree(target)  # an unfinished leftover
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
