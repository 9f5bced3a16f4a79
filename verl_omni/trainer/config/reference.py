"""The config reference page, ``docs/reference/config.md``, generated from the config's own two sources.

Every key of the composed ``flowgrpo_trainer`` config that belongs to one of our dataclasses is described by
that dataclass's ``Args:`` docstring; the comment above the key in the YAML tree fills in where the docstring
has nothing (verl's keys we set) and says why the built-in run picks its value. The page is committed so that
it can be read on GitHub; ``python -m verl_omni.trainer.config.reference`` (or
``scripts/generate_trainer_config.sh``, which also rewrites the composed YAML) rewrites it and
``tests/trainer/test_config_reference.py`` fails when it is stale.

The dataclasses are read from their source (``ast``), not imported: importing them imports verl and torch,
which would make the staleness test slow for no gain.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from verl_omni.utils.config import CONFIG_DIR

CONFIG_NAME = "flowgrpo_trainer"
REPO_ROOT = CONFIG_DIR.parents[2]
PACKAGE_DIR = REPO_ROOT / "verl_omni"
PAGE = REPO_ROOT / "docs" / "reference" / "config.md"
ALGORITHM_DIR = CONFIG_DIR / "algorithm"
ALGORITHMS_PACKAGE_DIR = PACKAGE_DIR / "algorithms"
COMMAND = "bash scripts/generate_trainer_config.sh"

_KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][\w]*):(?:\s|$)")
_ARG_LINE = re.compile(r"^(\s*)(\w+) \((.+?)\):\s*(.*)$")
# a defaults-list entry of ours: "- <group>@<target key>: <file name>" or "- <group>: <file name>"
_DEFAULTS_ENTRY = re.compile(r"^\s*-\s*([\w/]+)(?:@([\w.]+))?:\s*(\w+)\s*$")


@dataclass
class ClassDoc:
    """What the reference needs of one config dataclass, read from its source."""

    name: str
    path: Path
    summary: str
    args: dict[str, tuple[str, str]] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)


def parse_args_section(docstring: str) -> dict[str, tuple[str, str]]:
    """``{name: (type, description)}`` of a Google-style ``Args:`` section (continuation lines joined)."""
    lines = docstring.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return {}
    args: dict[str, tuple[str, str]] = {}
    entry_indent = None
    current = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line)
        if match and (entry_indent is None or indent == entry_indent):
            entry_indent = indent
            current = match.group(2)
            args[current] = (match.group(3).strip("`"), match.group(4).strip())
        elif current is not None and indent > entry_indent:
            kind, text = args[current]
            args[current] = (kind, f"{text} {line.strip()}")
        else:
            break
    return args


def _class_doc(node: ast.ClassDef, path: Path) -> ClassDoc:
    docstring = ast.get_docstring(node) or ""
    doc = ClassDoc(
        name=node.name,
        path=path,
        summary=" ".join(docstring.split("\n\n")[0].split()),
        args=parse_args_section(docstring),
        bases=[ast.unparse(base).split(".")[-1] for base in node.bases],
    )
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            name = statement.target.id
            if name.startswith("_") or "ClassVar" in ast.unparse(statement.annotation):
                continue
            doc.annotations[name] = ast.unparse(statement.annotation)
            if statement.value is not None:
                doc.defaults[name] = ast.unparse(statement.value)
    return doc


def read_class_docs(paths: list[Path]) -> dict[str, ClassDoc]:
    """Every class defined in ``paths``, by name (our config class names are unique)."""
    docs: dict[str, ClassDoc] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                docs[node.name] = _class_doc(node, path)
    return docs


def documented_args(name: str, classes: dict[str, ClassDoc]) -> dict[str, tuple[str, str]]:
    """The ``Args:`` of class ``name`` and of its bases that are ours (a subclass's entry wins)."""
    doc = classes.get(name)
    if doc is None:
        return {}
    args: dict[str, tuple[str, str]] = {}
    for base in doc.bases:
        args.update(documented_args(base, classes))
    args.update(doc.args)
    return args


def dataclass_defaults(name: str, classes: dict[str, ClassDoc]) -> dict[str, str]:
    """Field defaults of class ``name`` and its bases that are ours, as source text."""
    doc = classes.get(name)
    if doc is None:
        return {}
    defaults: dict[str, str] = {}
    for base in doc.bases:
        defaults.update(dataclass_defaults(base, classes))
    defaults.update(doc.defaults)
    return defaults


def yaml_comments(path: Path) -> dict[str, str]:
    """``{dotted key: comment}`` of the comment block right above each mapping key of a YAML file
    (keys inside list items are skipped: a list is documented as a whole)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        if not stripped or stripped.startswith("-"):
            pending = []
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            pending = []
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [match.group(2)])
        if pending:
            comments[key] = " ".join(pending)
        stack.append((indent, match.group(2)))
        pending = []
    return comments


def node_files(root_file: Path) -> list[tuple[Path, str]]:
    """``(file, mount key)`` of the config tree's own nodes in ``root_file``'s defaults list (verl's nodes,
    which are not in our config directory, are skipped); ``@package _global_`` files mount at the root."""
    files = [(root_file, "")]
    for line in root_file.read_text().splitlines():
        match = _DEFAULTS_ENTRY.match(line)
        if match is None:
            continue
        group, target, name = match.groups()
        path = CONFIG_DIR / group / f"{name}.yaml"
        if not path.is_file():
            continue
        global_package = "@package _global_" in path.read_text().split("\n", 1)[0]
        files.append((path, "" if global_package else (target or group)))
    return files


def comment_index(files: list[tuple[Path, str]]) -> dict[str, list[tuple[Path, str]]]:
    """``{full dotted key: [(file, comment), ...]}`` over the mounted files, in defaults-list order."""
    index: dict[str, list[tuple[Path, str]]] = {}
    for path, mount in files:
        for key, comment in yaml_comments(path).items():
            full = f"{mount}.{key}" if mount else key
            index.setdefault(full, []).append((path, comment))
    return index


def _relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def _inline(value) -> str:
    """A config value as one line of YAML flow style."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not value.strip():
        return f'"{value}"'
    return str(value)


def select(config: dict, key: str, default=None):
    """The value at dotted ``key`` of a plain nested mapping, else ``default``."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def flatten(node: dict, prefix: str = "") -> dict[str, object]:
    """``{dotted key: value}`` of every key of a nested mapping (mappings included, the defaults list left out)."""
    flat = {}
    for key, value in node.items():
        if key == "defaults":
            continue
        full = f"{prefix}.{key}" if prefix else str(key)
        flat[full] = value
        if isinstance(value, dict):
            flat.update(flatten(value, full))
    return flat


def node_values(files: list[tuple[Path, str]]) -> dict[str, object]:
    """``{full dotted key: value}`` that the node files other than the root set (what a key is before the root
    file's overrides)."""
    values: dict[str, object] = {}
    for path, mount in files[1:]:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        values.update(flatten(loaded, mount))
    return values


def _literal(source: str):
    """A dataclass default given as a literal, else a marker that compares unequal to every config value."""
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return _literal


def _default_text(source: str) -> str:
    """A dataclass default's source as the page writes values: a literal in YAML's spelling, an empty factory as
    its empty value, anything else as written."""
    literal = _literal(source)
    if literal is not _literal:
        return _inline(literal)
    factory = re.fullmatch(r"field\(default_factory=(dict|list)\)", source)
    if factory:
        return "{}" if factory.group(1) == "dict" else "[]"
    return source


@dataclass
class Section:
    """One dataclass-backed node of the composed config."""

    key: str
    class_name: str
    values: dict
    title: str = ""


class Reference:
    """Renders the page from the composed config, the dataclass sources and the YAML comments."""

    def __init__(
        self,
        config: dict,
        classes: dict[str, ClassDoc],
        comments: dict[str, list[tuple[Path, str]]],
        baselines: dict[str, object],
    ):
        self.config = config
        self.baselines = baselines
        self.classes = classes
        self.comments = comments
        self.root_file = CONFIG_DIR / f"{CONFIG_NAME}.yaml"

    def sections(self, node: dict, prefix: str = "") -> list[Section]:
        """Every node whose ``_target_`` is one of our dataclasses, outermost first."""
        found = []
        target = node.get("_target_")
        if isinstance(target, str) and target.startswith("verl_omni."):
            class_name = target.split(".")[-1]
            if class_name not in self.classes:
                raise LookupError(f"{prefix}: _target_ {target!r} names no class found in its module")
            found.append(Section(prefix, class_name, node))
        for key, value in node.items():
            if isinstance(value, dict) and key != "hydra":
                found += self.sections(value, f"{prefix}.{key}" if prefix else key)
        return found

    def _comment(self, key: str, run_file: bool) -> str:
        for path, comment in self.comments.get(key, []):
            if (path == self.root_file) == run_file:
                return comment
        return ""

    def baseline(self, full_key: str, name: str, defaults: dict[str, str]):
        """A key's value before the root file's overrides: its node file's, else the dataclass's literal default,
        else ``_literal`` (unknown)."""
        if full_key in self.baselines:
            return self.baselines[full_key]
        return _literal(defaults[name]) if name in defaults else _literal

    def entry(self, full_key: str, name: str, value, args, defaults, annotations) -> list[str]:
        """The lines of one key: type, default, meaning, and the built-in run's value and reason where it differs."""
        kind, text = args.get(name, (annotations.get(name, ""), ""))
        run_comment = self._comment(full_key, run_file=True)
        text = text or self._comment(full_key, run_file=False) or run_comment
        baseline = self.baseline(full_key, name, defaults)
        known = baseline is not _literal
        overridden = bool(run_comment) and known and not isinstance(value, dict) and baseline != value
        facts = [f"`{kind}`"] if kind else []
        if not isinstance(value, dict):
            facts.append(f"default `{_inline(baseline if overridden else value)}`")
        literal = _literal(defaults[name]) if name in defaults else _literal
        if literal is not _literal and full_key in self.baselines and literal != self.baselines[full_key]:
            facts.append(f"the dataclass's own default `{defaults[name]}`")
        lines = [f"- **`{name}`** ({'; '.join(facts)}): {text or '(no description)'}"]
        if overridden:
            reason = f": {run_comment}" if run_comment != text else ""
            lines.append(f"  *Built-in run*: `{_inline(value)}`{reason}")
        return lines

    def nested_entries(self, full_key: str, values: dict) -> list[str]:
        """The keys of a verl node inside one of ours (``engine``, ``optim``...) that our YAML sets and explains."""
        lines = []
        for name, value in values.items():
            sub_key = f"{full_key}.{name}"
            if name == "_target_" or sub_key not in self.comments:
                continue
            text = self._comment(sub_key, run_file=False) or self._comment(sub_key, run_file=True)
            lines.append(f"  - `{name}` (default `{_inline(value)}`): {text}")
        return lines

    def render_section(self, section: Section, nested: set[str]) -> list[str]:
        doc = self.classes[section.class_name]
        args = documented_args(section.class_name, self.classes)
        defaults = dataclass_defaults(section.class_name, self.classes)
        annotations = {}
        for name in [*doc.bases, section.class_name]:
            annotations.update(self.classes[name].annotations if name in self.classes else {})
        title = section.title or f"`{section.key}`"
        lines = [f"## {title}", "", f"`{section.class_name}` in `{_relative(doc.path)}`: {doc.summary}", ""]
        unexplained = []
        for name, value in section.values.items():
            full_key = f"{section.key}.{name}"
            if name == "_target_":
                continue
            if full_key in nested:
                lines.append(f"- **`{name}`**: its own node, [`{full_key}`](#{_anchor(full_key)}).")
                continue
            if name not in args and full_key not in self.comments:
                unexplained.append(name)
                continue
            lines += self.entry(full_key, name, value, args, defaults, annotations)
            if isinstance(value, dict) and value:
                lines += self.nested_entries(full_key, value)
        if unexplained:
            keys = ", ".join(f"`{name}`" for name in unexplained)
            lines += ["", f"verl's keys of this node, as verl defines them (set only to use a verl feature): {keys}."]
        return [*lines, ""]

    def list_entry_sections(self, section: Section) -> list[str]:
        """A section for each list of our dataclass entries in a node (``reward.diffusion.scorers``): one entry's
        keys, from the entry class's ``Args:``, with the entry dataclass's defaults."""
        lines = []
        for name, (kind, _) in documented_args(section.class_name, self.classes).items():
            match = re.fullmatch(r"list\[(\w+)\]", kind)
            if match is None or match.group(1) not in self.classes:
                continue
            entry_class = match.group(1)
            doc = self.classes[entry_class]
            defaults = dataclass_defaults(entry_class, self.classes)
            lines += [
                f"## `{section.key}.{name}[i]`",
                "",
                f"`{entry_class}` in `{_relative(doc.path)}`: {doc.summary}",
                "",
            ]
            for key, (entry_kind, text) in documented_args(entry_class, self.classes).items():
                default = f"; default `{_default_text(defaults[key])}`" if key in defaults else ""
                lines.append(f"- **`{key}`** (`{entry_kind}`{default}): {text}")
            lines.append("")
        return lines

    def algorithm_sections(self) -> list[str]:
        """One section per algorithm YAML: the ``algorithm`` node it selects and the other keys it sets."""
        from verl_omni.utils.config import compose_config

        lines = []
        for path in sorted(ALGORITHM_DIR.glob("*.yaml")):
            name = path.stem
            class_name = _algorithm_config_class(name)
            config = OmegaConf.to_container(compose_config(CONFIG_NAME, [f"algorithm={name}"]), resolve=False)
            comments = {key: [(path, text)] for key, text in yaml_comments(path).items()}
            baselines = {**self.baselines, **flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=False))}
            reference = Reference(config, self.classes, {**self.comments, **comments}, baselines)
            section = Section("algorithm", class_name, config["algorithm"], f"`algorithm` with `algorithm={name}`")
            lines += reference.render_section(section, nested=set())
            others = [key for key in comments if not key.startswith("algorithm") and "." in key]
            leaves = [key for key in others if not any(other.startswith(f"{key}.") for other in others)]
            if leaves:
                lines.append(f"It also sets (`{_relative(path)}`; a command-line override still wins):")
                for key in leaves:
                    value = select(config, key)
                    lines.append(f"- `{key}` = `{_inline(value)}`: {comments[key][0][1]}")
                lines.append("")
        return lines

    def other_keys(self, covered: set[str]) -> list[str]:
        """Keys the trainer YAML sets outside our dataclass nodes (verl's ``data``, ``reward``, Ray's)."""
        lines = ["## Other keys the trainer YAML sets", ""]
        lines.append(f"verl's own nodes and Ray's arguments, as `{_relative(self.root_file)}` sets them.")
        lines.append("")
        for key, entries in self.comments.items():
            leaf = select(self.config, key, default=_literal)
            if key.split(".")[0] in ("hydra", "defaults") or any(key == c or key.startswith(f"{c}.") for c in covered):
                continue
            if isinstance(leaf, dict) or leaf is _literal:
                continue
            lines.append(f"- `{key}` (default `{_inline(leaf)}`): {entries[0][1]}")
        return [*lines, ""]

    def render(self) -> str:
        sections = [s for s in self.sections(self.config) if s.key != "algorithm"]
        nested = {s.key for s in sections}
        lines = [
            "# Config reference",
            "",
            f"<!-- Generated by `{COMMAND}` from the config dataclasses and the YAML tree; do not edit. -->",
            "",
            f"Generated by `{COMMAND}` (it runs `python -m verl_omni.trainer.config.reference`) from the `Args:`",
            "docstrings of the config dataclasses and the comments of the YAML tree under",
            "`verl_omni/trainer/config/`; do not edit it by hand. Every key is set on the command line as a Hydra",
            "override, `python -m verl_omni.trainer.main_flowgrpo <dotted key>=<value>`. A key's default is its YAML",
            "node's value (else its dataclass's). Where `flowgrpo_trainer.yaml` sets another for the built-in tiny run,",
            "that value and its reason follow as *Built-in run*; the launchers in `examples/flowgrpo_trainer/` set",
            "their own for real models. Where a dataclass's own default differs from its YAML node's, it is named:",
            "that is what a config built in code gets. The fully composed config is",
            "`verl_omni/trainer/config/_generated_flowgrpo_trainer.yaml`.",
            "",
        ]
        toc = [f"- [`{s.key}`](#{_anchor(s.key)})" for s in sections]
        toc += [
            f"- [`{line[4:-1]}`](#{_anchor(line[4:-1])})"
            for s in sections
            for line in self.list_entry_sections(s)
            if line.startswith("## ")
        ]
        toc += ["- [`algorithm`](#algorithm-with-algorithmflow_grpo) (one section per algorithm)"]
        toc += ["- [Other keys the trainer YAML sets](#other-keys-the-trainer-yaml-sets)"]
        lines += [*toc, ""]
        for section in sections:
            lines += self.render_section(section, nested)
            lines += self.list_entry_sections(section)
        lines += self.algorithm_sections()
        lines += self.other_keys({s.key for s in sections} | {"algorithm"})
        return "\n".join(lines).rstrip() + "\n"


def _anchor(key: str) -> str:
    """GitHub's heading anchor of ``## `key```: lower case, punctuation other than ``-``/``_`` dropped."""
    return re.sub(r"[^a-z0-9_\- ]", "", key.lower()).replace(" ", "-")


def _algorithm_config_class(name: str) -> str:
    """The ``config_cls`` that ``verl_omni/algorithms/<name>.py`` declares on its algorithm class."""
    tree = ast.parse((ALGORITHMS_PACKAGE_DIR / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "config_cls" for t in node.targets):
            return ast.unparse(node.value)
    return "AlgorithmConfig"


def _targets(node) -> set[str]:
    """Every ``_target_`` of ours in a nested config."""
    found = set()
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and target.startswith("verl_omni."):
            found.add(target)
        for value in node.values():
            found |= _targets(value)
    elif isinstance(node, list):
        for value in node:
            found |= _targets(value)
    return found


def _module_file(module: str) -> Path:
    """The source file of a dotted module of this package."""
    path = REPO_ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def config_sources(config: dict) -> list[Path]:
    """The files whose classes the page documents: those the config's ``_target_`` names (wherever a node's
    dataclass lives), the config dataclasses' own folders and the algorithms'. A target whose file is missing is
    an error: the page would otherwise leave its node out without a word."""
    files = {
        *(PACKAGE_DIR / "workers" / "config").glob("*.py"),
        CONFIG_DIR / "config.py",
        *ALGORITHMS_PACKAGE_DIR.glob("*.py"),
    }
    for target in _targets(config):
        path = _module_file(target.rsplit(".", 1)[0])
        if not path.is_file():
            raise FileNotFoundError(f"the config names _target_ {target!r}, but {path} does not exist")
        files.add(path)
    return sorted(files)


def render() -> str:
    """The page's text."""
    from verl_omni.utils.config import compose_config

    config = OmegaConf.to_container(compose_config(CONFIG_NAME), resolve=False)
    classes = read_class_docs(config_sources(config))
    files = node_files(CONFIG_DIR / f"{CONFIG_NAME}.yaml")
    return Reference(config, classes, comment_index(files), node_values(files)).render()


if __name__ == "__main__":
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
