"""The config file beside a process: ``PROCESS.layerflow.yaml`` (or ``.yml``, ``.json``).

Shape (YAML shown; a ``.json`` file has the same shape)::

    system:                  # L0 SYSTEM values, frozen at instance start
      policy: "Loans over 100,000 need two reviews."
    data_layers:             # optional: where initial --data keys go (default: PROCESS, L1)
      draft_notes: WORKING
    process:                 # optional process-level options
      process_id: loan_approval
      redact: true           # what elements without their own ``redact`` hide from a model
    risk_assessment:         # every other top-level key: a BPMN element id
      preserveKeys: [risk_level]      # -> ActivityExtensionConfig (camelCase or snake_case)

``system``, ``data_layers`` and ``process`` are reserved: a BPMN element with one of
those ids cannot be configured here (use its extension element instead).

Loading never stops at the first mistake. Every problem lands in
``ProcessConfigFile.problems`` with file, line (from the YAML marks; JSON is read as
YAML for its marks), element id and field, and whatever was valid is still returned,
so ``layerflow validate`` can show all of them at once. Callers that only want a good
file call ``ProcessConfigFile.raise_for_problems()``.

``Problem`` lives here rather than in ``engine.validate`` because the validator builds
on this module; ``engine.validate`` re-exports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from lxml import etree

from context_layers.config import ActivityExtensionConfig, config_from_dict
from context_layers.errors import ConfigError
from context_layers.layers import Layer

__all__ = [
    "CONFIG_SUFFIXES",
    "PROCESS_OPTIONS",
    "RESERVED_KEYS",
    "Problem",
    "ProcessConfigFile",
    "called_process_configs",
    "find_config_beside",
    "load_config_file",
    "main_file_first",
]

CONFIG_SUFFIXES = (".layerflow.yaml", ".layerflow.yml", ".layerflow.json")
RESERVED_KEYS = ("system", "data_layers", "process")
# Known keys of the ``process:`` mapping. Extend here when the engine grows an option.
PROCESS_OPTIONS = ("process_id", "redact")

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a process or its config. ``code`` is stable; ``message`` says what to do.

    ``str(problem)`` is the one-line form the CLI prints:
    ``loan.bpmn:12: element 'risk_assesment': field 'preserveKeys': <message>``.
    """

    code: str
    message: str
    file: str | None = None
    line: int | None = None
    element_id: str | None = None
    field: str | None = None
    column: int | None = None
    severity: Severity = "error"

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line:
            where += f":{self.line}"
            if self.column:
                where += f":{self.column}"
        parts = [where]
        if self.severity == "warning":
            parts.append("warning")
        if self.element_id:
            parts.append(f"element {self.element_id!r}")
        if self.field:
            parts.append(f"field {self.field!r}")
        return ": ".join(parts) + ": " + self.message

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": str(self)}


@dataclass(frozen=True)
class ProcessConfigFile:
    """A loaded config file. ``elements`` holds only the entries that validated."""

    path: Path
    system: Mapping[str, Any] = field(default_factory=dict)
    data_layers: Mapping[str, Layer] = field(default_factory=dict)
    process: Mapping[str, Any] = field(default_factory=dict)
    elements: Mapping[str, ActivityExtensionConfig] = field(default_factory=dict)
    # Every element id written in the file, valid config or not, in file order.
    element_ids: tuple[str, ...] = ()
    # The entries that did not validate, read without their bad fields: never run, only cross-checked
    # by ``layerflow validate``, so that one bad field does not hide the element's other mistakes.
    partial: Mapping[str, ActivityExtensionConfig] = field(default_factory=dict, repr=False, compare=False)
    problems: tuple[Problem, ...] = ()
    _lines: Mapping[tuple[str, ...], int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    @property
    def process_id(self) -> str | None:
        value = self.process.get("process_id")
        return value if isinstance(value, str) else None

    def line_of(self, *path: str | int) -> int | None:
        """Line of the key at ``path`` (e.g. ``("risk_assessment", "branches", 0, "id")``).

        Falls back to the nearest enclosing key that has a line; None when unknown.
        """
        keys = tuple(str(p) for p in path)
        while keys:
            if keys in self._lines:
                return self._lines[keys]
            keys = keys[:-1]
        return None

    def raise_for_problems(self) -> None:
        """Raise one ``ConfigError`` naming every error (warnings do not raise)."""
        errors = [p for p in self.problems if p.severity == "error"]
        if errors:
            raise ConfigError(
                f"{len(errors)} problem(s) in config file {self.path}:\n  " + "\n  ".join(str(p) for p in errors),
                problems=[{**p.to_dict(), "id": p.element_id} for p in errors],
            )


def find_config_beside(bpmn_path: str | Path) -> Path | None:
    """``<stem>.layerflow.yaml``, ``.yml`` or ``.json`` next to the BPMN file, the first that exists."""
    for candidate in configs_beside(bpmn_path):
        return candidate
    return None


def configs_beside(bpmn_path: str | Path) -> list[Path]:
    """Every config file next to the BPMN file, in the order ``find_config_beside`` prefers them."""
    path = Path(bpmn_path)
    return [c for c in (path.with_name(path.stem + s) for s in CONFIG_SUFFIXES) if c.is_file()]


_BPMN = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


def main_file_first(paths: list[Path], process_id: str | None) -> list[Path]:
    """``paths`` with the file of the process that runs first, the one its config file is looked for
    beside (``run called.bpmn main.bpmn`` as ``run main.bpmn called.bpmn``): the file defining
    ``process_id``, else the one of the executable process no given file calls. As given when that is
    no single file, or a file does not parse (validate says why)."""
    if len(paths) < 2:
        return paths
    defined: dict[str | None, Path] = {}
    called: set[str | None] = set()
    for path in paths:
        try:
            root = etree.parse(str(path), etree.XMLParser(resolve_entities=False, no_network=True)).getroot()
        except (etree.XMLSyntaxError, OSError):
            return paths
        for proc in root.iter(f"{_BPMN}process"):
            if (proc.get("isExecutable") or "true").lower() != "false":
                defined.setdefault(proc.get("id"), path)
        called |= {c.get("calledElement") for c in root.iter(f"{_BPMN}callActivity")}
    wanted = [process_id] if process_id else [p for p in defined if p not in called]
    mains = {defined[p] for p in wanted if p in defined}
    if len(mains) != 1:
        return paths
    first = mains.pop()
    return [first, *(p for p in paths if p != first)]


def called_process_configs(bpmn_paths: list[Path], main_config: Path | None) -> list[ProcessConfigFile]:
    """The config files beside the other BPMN files given with a process (``run main.bpmn
    called.bpmn``: the processes its call activities call), each configuring the elements of its
    own file, with a ``file.py`` handler found beside that file. The first file's config (or
    ``--config``) is the process's; its ``system:`` and ``data_layers:`` are the only ones read."""
    seen = {main_config.resolve()} if main_config is not None else set()
    called: list[ProcessConfigFile] = []
    for bpmn in bpmn_paths[1:]:
        found = find_config_beside(bpmn)
        if found is None or found.resolve() in seen:
            continue
        seen.add(found.resolve())
        loaded = load_config_file(found)
        base = found.resolve().parent
        called.append(replace(loaded, elements={eid: _handler_beside(cfg, base) for eid, cfg in loaded.elements.items()}))
    return called


def _handler_beside(cfg: ActivityExtensionConfig, base: Path) -> ActivityExtensionConfig:
    """``file.py:function`` made absolute against ``base``, the called file's config folder (a relative
    handler file is otherwise looked for beside the first BPMN file)."""
    module, _, attr = cfg.handler.rpartition(":") if isinstance(cfg.handler, str) else ("", "", "")
    if not module.endswith(".py") or Path(module).is_absolute():
        return cfg
    return cfg.model_copy(update={"handler": f"{base / module}:{attr}"})


def load_config_file(path: str | Path) -> ProcessConfigFile:
    """Read a process config file (YAML or JSON, by extension); collect every problem, never raise on content."""
    path = Path(path)
    loader = _Loader(path)
    return loader.load()


class _Loader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = str(path)
        self.problems: list[Problem] = []
        self.lines: dict[tuple[str, ...], int] = {}

    def problem(self, code: str, message: str, *, path: tuple[Any, ...] = (), element_id: str | None = None,
                field: str | None = None, line: int | None = None, column: int | None = None,
                severity: Severity = "error") -> None:
        if line is None and path:
            line = self._line(path)
        self.problems.append(Problem(code, message, self.file, line, element_id, field, column, severity))

    def _line(self, path: tuple[Any, ...]) -> int | None:
        keys = tuple(str(p) for p in path)
        while keys:
            if keys in self.lines:
                return self.lines[keys]
            keys = keys[:-1]
        return None

    def result(self, **parts: Any) -> ProcessConfigFile:
        problems = sorted(self.problems, key=lambda p: p.line or 0)
        return ProcessConfigFile(path=self.path, problems=tuple(problems),
                                 _lines=MappingProxyType(self.lines), **parts)

    def load(self) -> ProcessConfigFile:
        suffix = self.path.suffix.lower()
        if suffix not in (".yaml", ".yml", ".json"):
            self.problem("config_file_type", f"unsupported config file type {suffix or '(none)'!r}; "
                         "name it PROCESS.layerflow.yaml, .yml or .json")
            return self.result()
        try:
            text = self.path.read_text(encoding="utf-8-sig")  # a byte order mark is no part of the JSON
        except FileNotFoundError:
            self.problem("config_file_not_found", "config file not found; check the path given to --config")
            return self.result()
        except (OSError, UnicodeDecodeError) as err:
            self.problem("config_file_unreadable", f"cannot read config file: {err}")
            return self.result()

        data = self._parse(text, json_file=suffix == ".json")
        if data is _FAILED:
            return self.result()
        if data is None:
            return self.result()
        if not isinstance(data, dict):
            self.problem("config_not_mapping", f"the top level must be a mapping of BPMN element ids to "
                         f"activity config (plus system:, data_layers:, process:), got {_type_name(data)}", line=1)
            return self.result()

        system = self._system(data.get("system"))
        data_layers = self._data_layers(data.get("data_layers"))
        process = self._process(data.get("process"))
        elements: dict[str, ActivityExtensionConfig] = {}
        partial: dict[str, ActivityExtensionConfig] = {}
        element_ids: list[str] = []
        for key, value in data.items():
            if key in RESERVED_KEYS:
                continue
            if not isinstance(key, str):
                hint = " (YAML reads yes/no/on/off as booleans: quote the id)" if isinstance(key, bool) else ""
                self.problem("config_element_id", f"top-level key {key!r} is not a BPMN element id: "
                             f"element ids are strings{hint}", path=(str(key),))
                continue
            element_ids.append(key)
            config = self._element(key, value)
            if config is not None:
                elements[key] = config
            elif (rest := _without_bad_fields(value, self.file, key)) is not None:
                partial[key] = rest
        return self.result(system=MappingProxyType(system), data_layers=MappingProxyType(data_layers),
                           process=MappingProxyType(process), elements=MappingProxyType(elements),
                           element_ids=tuple(element_ids), partial=MappingProxyType(partial))

    # -- parsing ---------------------------------------------------------------------------

    def _parse(self, text: str, *, json_file: bool) -> Any:
        # One YAML pass gives the data and the node tree (line numbers, duplicate keys). JSON
        # is read by json for its stricter errors; as it is (nearly) YAML, the same pass gives
        # its lines.
        if json_file:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                self.problem("config_syntax", f"invalid JSON: {err.msg}; fix the syntax",
                             line=err.lineno, column=err.colno)
                return _FAILED
            try:
                node, _ = _compose(text)
            except yaml.YAMLError:
                return data
        else:
            try:
                node, data = _compose(text)
            except yaml.MarkedYAMLError as err:
                mark = err.problem_mark or err.context_mark
                what = " ".join(s for s in (err.context, err.problem) if s)
                self.problem("config_syntax", f"invalid YAML: {what}; fix the syntax",
                             line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None)
                return _FAILED
            except yaml.YAMLError as err:
                self.problem("config_syntax", f"invalid YAML: {err}; fix the syntax")
                return _FAILED
        if node is not None:
            self._index(node, ())
        return data

    def _index(self, node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    continue
                key = key_node.value
                if not key_node.tag.endswith(":str"):  # ``yes:`` / ``1:`` keys: index them as loaded
                    key = str(_compose(key)[1])
                line = key_node.start_mark.line + 1
                if key in seen:
                    where = f"element {key!r}" if not path and key not in RESERVED_KEYS else f"key {key!r}"
                    self.problem("config_duplicate_key", f"{where} appears twice (first on line {seen[key]}); "
                                 "the later one would silently replace the first: merge them",
                                 line=line, element_id=path[0] if path else (key if key not in RESERVED_KEYS else None),
                                 field=".".join((*path[1:], key)) if path else None)
                seen.setdefault(key, line)
                self.lines.setdefault((*path, key), line)
                self._index(value_node, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.lines.setdefault((*path, str(i)), item.start_mark.line + 1)
                self._index(item, (*path, str(i)))

    # -- sections --------------------------------------------------------------------------

    def _system(self, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem("config_invalid_system", f"system: must be a mapping of L0 SYSTEM keys to values, "
                         f"got {_type_name(value)}", path=("system",), field="system")
            return {}
        system: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                self.problem("config_invalid_system", f"SYSTEM key {key!r} must be a non-empty string; quote it",
                             path=("system", str(key)), field=f"system.{key}")
                continue
            bad = _non_json_path(item)
            if bad is not None:
                where, kind = bad
                self.problem("config_invalid_system", f"value is not JSON-compatible ({kind} at "
                             f"{'system.' + key + where!r}); write a string, number, bool, null, list or mapping "
                             "(quote dates)", path=("system", key), field=f"system.{key}")
                continue
            system[key] = item
        return system

    def _data_layers(self, value: Any) -> dict[str, Layer]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem("config_invalid_data_layers", f"data_layers: must be a mapping of data key to layer "
                         f"(e.g. notes: WORKING), got {_type_name(value)}", path=("data_layers",), field="data_layers")
            return {}
        layers: dict[str, Layer] = {}
        for key, name in value.items():
            field_name = f"data_layers.{key}"
            if not isinstance(key, str) or not key:
                self.problem("config_invalid_data_layers", f"data key {key!r} must be a non-empty string",
                             path=("data_layers", str(key)), field=field_name)
                continue
            layer = _parse_layer(name)
            if layer is None:
                self.problem("config_invalid_data_layers", f"unknown layer {name!r}; use L1..L5 or PROCESS, "
                             "KNOWLEDGE, HISTORY, WORKING, EPHEMERAL", path=("data_layers", key), field=field_name)
                continue
            if layer is Layer.SYSTEM:
                self.problem("config_invalid_data_layers", "initial data cannot go to SYSTEM (L0); "
                             "put fixed values under system: instead", path=("data_layers", key), field=field_name)
                continue
            if layer is Layer.EPHEMERAL:
                self.problem("config_ephemeral_data", f"data key {key!r} goes to EPHEMERAL (L5), which is cleared at "
                             "the end of every activity: only the first activity sees it; map it to WORKING to hand "
                             "it on, or leave it to PROCESS to keep it", path=("data_layers", key), field=field_name,
                             severity="warning")
            layers[key] = layer
        return layers

    def _process(self, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem("config_invalid_process", f"process: must be a mapping of process options "
                         f"({', '.join(PROCESS_OPTIONS)}), got {_type_name(value)}", path=("process",), field="process")
            return {}
        options: dict[str, Any] = {}
        for key, item in value.items():
            field_name = f"process.{key}"
            if key not in PROCESS_OPTIONS:
                self.problem("config_invalid_process", f"unknown process option {key!r}; known options: "
                             f"{', '.join(PROCESS_OPTIONS)}", path=("process", str(key)), field=field_name)
                continue
            if key == "process_id" and (not isinstance(item, str) or not item.strip()):
                self.problem("config_invalid_process", "process_id must be the id of a bpmn:process (a string)",
                             path=("process", key), field=field_name)
                continue
            if key == "redact" and not (isinstance(item, bool) or (isinstance(item, list) and all(
                    isinstance(p, str) and p.strip() for p in item))):
                self.problem("config_invalid_process", "redact takes true (hide passwords, API keys and tokens "
                             "from the model: the default), false (send the values as they are) or a list of extra "
                             f"glob patterns of key names to hide too, e.g. ['*iban*']; got {item!r}",
                             path=("process", key), field=field_name)
                continue
            options[key] = item.strip() if isinstance(item, str) else item
        return options

    def _element(self, element_id: str, value: Any) -> ActivityExtensionConfig | None:
        if value is None:  # ``task_id:`` with nothing under it: an empty config
            value = {}
        try:
            return config_from_dict(value, source=self.file, element_id=element_id)
        except ConfigError as err:
            for p in err.problems:
                field_path = p.get("field") or "(config)"
                path = (element_id,) if field_path == "(config)" else (element_id, *field_path.split("."))
                self.problem("invalid_config_field", _config_message(p.get("message", "")),
                             path=path, element_id=element_id, field=field_path)
            return None


def _without_bad_fields(value: Any, source: str, element_id: str) -> ActivityExtensionConfig | None:
    """An element's config read without the top-level fields it was refused for (their problems are
    reported already), or None when what is left does not validate either."""
    if not isinstance(value, dict):
        return None
    try:
        config_from_dict(value, source=source, element_id=element_id)
    except ConfigError as err:
        bad = {_plain_name(str(p.get("field") or "").split(".")[0]) for p in err.problems}
    else:
        return None
    rest = {k: v for k, v in value.items() if _plain_name(str(k)) not in bad}
    if not bad or "" in bad or len(rest) == len(value):
        return None
    try:
        return config_from_dict(rest, source=source, element_id=element_id)
    except ConfigError:
        return None


def _plain_name(name: str) -> str:
    """``branchPriority`` and ``branch_priority`` alike."""
    return name.replace("_", "").lower()


_FAILED = object()
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when installed: same result, faster


def _compose(text: str) -> tuple[yaml.Node | None, Any]:
    """The node tree and the data built from it, from one parse."""
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def _config_message(message: str) -> str:
    """pydantic's text, plus what to do when it does not already say it."""
    message = message.removeprefix("Value error, ")
    if "unknown field" in message or ";" in message:
        return message
    if message.startswith("Field required"):
        return f"{message}; add this field"
    return f"{message}; correct this value"


def _parse_layer(name: Any) -> Layer | None:
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        return None
    try:
        return Layer.parse(name)
    except ValueError:
        return None


def _type_name(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def _non_json_path(value: Any, where: str = "") -> tuple[str, str] | None:
    """``(path, type name)`` of the first value that is not JSON-compatible, or None."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, "non-finite number")
    if isinstance(value, list):
        for i, item in enumerate(value):
            bad = _non_json_path(item, f"{where}[{i}]")
            if bad is not None:
                return bad
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where}.{key}", f"non-string key {key!r}"
            bad = _non_json_path(item, f"{where}.{key}")
            if bad is not None:
                return bad
        return None
    return where, type(value).__name__
