"""Loading a process: BPMN (through ``engine.spiff``) plus per-element config.

Config of one element = its BPMN extension config (``spiffworkflow:activityConfig``
JSON, then ``layerflow:config`` JSON over it), then the config file beside the
process (``PROCESS.layerflow.yaml``), whose fields replace the extension's. The file's
``system:`` becomes L0 at instance start and ``data_layers:`` says where initial data
keys go (default PROCESS). Nothing is returned for a process that does not validate.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree
from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException

from context_layers import ActivityExtensionConfig, Layer, config_from_dict
from context_layers.errors import ConfigError, ProcessError

from . import configfile, dmn, spiff

__all__ = ["Process", "load_process", "extension_configs"]

_BASE_DIRS: dict[tuple[str, str], Path] = {}  # (first path, cwd when it is relative) -> its folder


@dataclass
class Process:
    """A parsed, validated process, ready to start instances from."""

    id: str
    spec: Any
    subprocess_specs: dict[str, Any]
    configs: dict[str, ActivityExtensionConfig] = field(default_factory=dict)
    system: dict[str, Any] = field(default_factory=dict)
    data_layers: dict[str, Layer] = field(default_factory=dict)
    paths: tuple[str, ...] = ()
    config_path: str | None = None
    name: str | None = None
    # the config file's ``process: {redact: ...}``: what an element without its own ``redact`` takes
    redact: bool | list[str] | None = None
    # path -> sha256 of each file the process was loaded from (BPMN, DMN, config files): what
    # ``definition`` compares the files on disk against; empty for records from before it
    digests: dict[str, str] = field(default_factory=dict)
    _record: tuple[tuple[Any, ...], dict[str, Any]] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def base_dir(self) -> Path | None:
        if not self.paths:
            return None
        # resolve() is a filesystem walk, and handlers and retrieval ask after every activity
        first = self.paths[0]
        key = (first, "" if os.path.isabs(first) else os.getcwd())
        found = _BASE_DIRS.get(key)
        if found is None:
            found = _BASE_DIRS[key] = Path(first).resolve().parent
        return found

    @property
    def knowledge_dir(self) -> Path | None:
        base = self.base_dir
        return base / "knowledge" if base is not None else None

    def config(self, element_id: str) -> ActivityExtensionConfig | None:
        return self.configs.get(element_id)

    def redact_for(self, element_id: str) -> bool | list[str]:
        """What the engine hides from a model on this element's behalf: its config's ``redact``
        when it sets one, else the process's (``process: {redact: ...}``), else on (True)."""
        cfg = self.configs.get(element_id)
        if cfg is not None and "redact" in cfg.model_fields_set:
            return cfg.redact
        return True if self.redact is None else self.redact

    def element_ids(self) -> list[str]:
        ids: dict[str, None] = {}
        for s in [self.spec, *self.subprocess_specs.values()]:
            for ts in spiff.iter_user_specs(s):
                ids.setdefault(ts.bpmn_id, None)
        return list(ids)

    def activity_ids(self) -> frozenset[str]:
        """The BPMN ids of the activities (not the gateways or events) of the process and of its
        sub-processes and called processes."""
        return frozenset(spiff.spec_bpmn_id(ts) for s in [self.spec, *self.subprocess_specs.values()]
                         for ts in s.task_specs.values() if spiff.is_activity(ts))

    def user_task_ids(self) -> list[str]:
        """The BPMN ids of the tasks that wait for a person's data (user, manual and plain tasks
        SpiffWorkflow runs by hand), of the process and of its sub-processes and called processes:
        what answers' ``user_tasks`` may name."""
        ids: dict[str, None] = {}
        for s in [self.spec, *self.subprocess_specs.values()]:
            for ts in spiff.iter_user_specs(s):
                if getattr(ts, "manual", False):
                    ids.setdefault(ts.bpmn_id, None)
        return list(ids)

    def join_ids(self) -> list[str]:
        """The ids of the joins that may ask a person about a conflict (``GATEWAY_ID/KEY`` answers
        name them): the joining gateways of the process and of its sub-processes and called
        processes, the implicit join each of them ends in (``<process>.EndJoin``), and each parallel
        multi-instance sub-process or call activity, where its instances meet as branches."""
        ids: dict[str, None] = {}
        for s in [self.spec, *self.subprocess_specs.values()]:
            for ts in s.task_specs.values():
                if spiff.is_join(ts) or spiff.merges_instances(ts):
                    ids.setdefault(spiff.spec_bpmn_id(ts), None)
        return sorted(ids, key=lambda i: i.endswith(".EndJoin"))  # the drawn gateways first

    def to_record(self) -> dict[str, Any]:
        """What an instance record keeps of its process (the spec travels inside the workflow JSON).

        Built once and shared by the records of every instance of this process, until a
        field is replaced (governance replaces ``configs`` on a config change); the
        returned dict must not be changed."""
        parts = (self.id, self.name, self.paths, self.config_path, self.configs, self.system, self.data_layers,
                 self.redact, self.digests)
        cached = self._record
        if cached is not None and all(a is b for a, b in zip(cached[0], parts)):
            return cached[1]
        record: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "paths": list(self.paths),
            "config_path": self.config_path,
            "configs": {k: c.model_dump(mode="json", by_alias=True, exclude_unset=True) for k, c in self.configs.items()},
            "system": self.system,
            "data_layers": {k: str(v) for k, v in self.data_layers.items()},
        }
        if self.redact is not None:  # records of processes without it stay as they were
            record["redact"] = self.redact
        if self.digests:
            record["digests"] = dict(self.digests)
        self._record = (parts, record)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any], spec: Any, subprocess_specs: dict[str, Any]) -> "Process":
        return cls(
            id=record["id"], spec=spec, subprocess_specs=subprocess_specs,
            configs={k: ActivityExtensionConfig.model_validate(v) for k, v in record.get("configs", {}).items()},
            system=dict(record.get("system", {})),
            data_layers={k: Layer.parse(v) for k, v in record.get("data_layers", {}).items()},
            paths=tuple(record.get("paths", ())), config_path=record.get("config_path"), name=record.get("name"),
            redact=record.get("redact"), digests=dict(record.get("digests") or {}),
        )

    def definition(self) -> dict[str, Any]:
        """Which definition this process (an instance's: the one it started with) is, and whether the
        files it was loaded from still read so: ``version`` (a digest of those files, ``None`` for an
        instance from before versions were kept), each file's ``path``, ``sha256`` and ``now``
        (``same``, ``changed``, ``gone``), and ``on_disk``, the worst of them (``unknown``: no digests)."""
        files = [{"path": path, "sha256": digest, "now": _file_now(path, digest)} for path, digest in self.digests.items()]
        states = {f["now"] for f in files}
        on_disk = next((s for s in ("changed", "gone") if s in states), "same") if files else "unknown"
        return {"version": definition_version(self.digests), "files": files, "on_disk": on_disk}


def _as_paths(path_or_paths: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(path_or_paths, (str, Path)):
        return [Path(path_or_paths)]
    return [Path(p) for p in path_or_paths]


def load_process(path_or_paths: str | Path | Iterable[str | Path], process_id: str | None = None, *,
                 config: str | Path | None = None, validate: bool = True) -> Process:
    """Parse BPMN file(s), merge element configs, validate; raise ``ProcessError`` / ``ConfigError``.

    ``config`` is the config file (default: ``<stem>.layerflow.yaml|.yml|.json`` beside the
    first BPMN file, when there is one).
    """
    paths = _as_paths(path_or_paths)
    if not paths:
        raise ProcessError("no BPMN file given")
    for p in paths:
        if not p.is_file():
            raise ProcessError(f"{p}: {'DMN' if p.suffix.lower() == '.dmn' else 'BPMN'} file not found")
    # DMN files given with the BPMN, and those beside it that define a decision a task names
    paths = dmn.with_dmn_beside(configfile.main_file_first(paths, process_id) if config is None else paths)
    decision_paths = [p for p in paths if dmn.is_dmn(p)]
    bpmn_paths = [p for p in paths if p not in decision_paths]
    if not bpmn_paths:
        raise ProcessError(f"{paths[0]}: only DMN files given; give the BPMN file of the process too")

    config_path = Path(config) if config is not None else _find_config(bpmn_paths[0])
    file_cfg = _load_config_file(config_path) if config_path is not None else None

    chosen = _validate(paths, config_path, process_id) if validate else None
    file_elements = {eid: cfg for eid, (_, cfg) in
                     _file_configs(bpmn_paths, config_path, file_cfg["elements"] if file_cfg else {}).items()}

    parser = spiff.LayerflowBpmnParser(branch_conditions=branch_conditions(file_elements) if file_elements else None)
    try:
        for p in decision_paths:
            parser.add_dmn_xml(dmn.read_dmn(p).root, filename=str(p))
        for p in bpmn_paths:
            # from bytes, as validate reads them: the XML declaration names the encoding (SpiffWorkflow's
            # add_bpmn_files decodes every file as UTF-8 and fails on an ISO-8859-1 export)
            xml = etree.XMLParser(resolve_entities=False, no_network=True)  # as validate's: data, not a fetch
            parser.add_bpmn_xml(etree.fromstring(p.read_bytes(), xml), filename=str(p))
    except ValidationException as err:
        raise ProcessError(_spiff_message(err)) from None
    except Exception as err:  # lxml syntax errors and the like
        raise ProcessError(f"{bpmn_paths[0]}: cannot parse BPMN: {err}") from None

    pid = process_id or (file_cfg.get("process_id") if file_cfg else None) or chosen
    executable = parser.get_process_ids()
    if pid is None:
        if len(executable) != 1:
            which = ", ".join(executable) or "none"
            raise ProcessError(f"{bpmn_paths[0]}: {len(executable)} executable processes ({which}); "
                               "choose one with process_id (CLI: --process)")
        pid = executable[0]
    try:
        if pid in parser.collaborations and pid not in executable:
            # its executable pools run together, exchanging messages (engine.collaboration)
            spec, subprocess_specs = parser.get_collaboration(pid)
            spec.description = _collaboration_name(bpmn_paths, pid)
        else:
            spec = parser.get_spec(pid)
            subprocess_specs = parser.get_subprocess_specs(pid)
    except ValidationException as err:
        raise ProcessError(_spiff_message(err)) from None
    except Exception as err:
        known = ", ".join(executable) or "none"
        raise ProcessError(f"{bpmn_paths[0]}: process {pid!r} not found or not executable ({err}); "
                           f"executable processes: {known}") from None

    configs = extension_configs([spec, *subprocess_specs.values()])
    for element_id, cfg in file_elements.items():
        configs[element_id] = configs[element_id].merged_with(cfg) if element_id in configs else cfg
    if file_cfg is not None and validate:
        known_ids = {ts.bpmn_id for s in [spec, *subprocess_specs.values()] for ts in spiff.iter_user_specs(s)}
        if spiff.is_collaboration(spec):
            known_ids.add(pid)  # its pools' branches, its end join's settings (engine.collaboration)
        unknown = [i for i in file_cfg["elements"] if i not in known_ids]
        if unknown:
            raise ConfigError(f"{config_path}: config for element(s) {', '.join(map(repr, unknown))} that "
                              f"the process {pid!r} does not have; known ids: {', '.join(sorted(known_ids))}")

    return Process(
        id=pid, spec=spec, subprocess_specs=subprocess_specs, configs=configs,
        system=dict(file_cfg["system"]) if file_cfg else {},
        data_layers=dict(file_cfg["data_layers"]) if file_cfg else {},
        # absolute: an instance is resumed from wherever the operator stands, and its handler files
        # and knowledge/ are found beside the process, not beside that working directory
        paths=tuple(os.path.abspath(p) for p in [*bpmn_paths, *decision_paths]),
        config_path=os.path.abspath(config_path) if config_path else None,
        name=getattr(spec, "description", None),
        redact=file_cfg.get("redact") if file_cfg else None,
        digests=_digests([*bpmn_paths, *decision_paths,
                          *([config_path] if config_path is not None else []),
                          *(c.path for c in configfile.called_process_configs(bpmn_paths, config_path))]),
    )


# --------------------------------------------------------------------------- versions

_DIGESTS: dict[str, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, sha256): files are read once per edit


def file_digest(path: str | Path) -> str | None:
    """The sha256 of the file's bytes; None when it cannot be read (gone, or on another machine)."""
    key = os.path.abspath(path)
    try:
        st = os.stat(key)
        known = _DIGESTS.get(key)
        if known is not None and known[:2] == (st.st_mtime_ns, st.st_size):
            return known[2]
        digest = hashlib.sha256(Path(key).read_bytes()).hexdigest()
    except OSError:
        return None
    if len(_DIGESTS) > 4096:
        _DIGESTS.clear()
    _DIGESTS[key] = (st.st_mtime_ns, st.st_size, digest)
    return digest


def _digests(paths: Iterable[Path]) -> dict[str, str]:
    out = {}
    for p in paths:
        digest = file_digest(p)
        if digest is not None:
            out[os.path.abspath(p)] = digest
    return out


def definition_version(digests: Mapping[str, str]) -> str | None:
    """12 hex digits naming a definition: the same files (by content, wherever they lie) give the same."""
    if not digests:
        return None
    return hashlib.sha256("\n".join(sorted(digests.values())).encode()).hexdigest()[:12]


def _file_now(path: str, digest: str) -> str:
    now = file_digest(path)
    return "gone" if now is None else "same" if now == digest else "changed"


def _collaboration_name(bpmn_paths: list[Path], collaboration_id: str) -> str | None:
    for p in bpmn_paths:
        root = etree.fromstring(p.read_bytes(), etree.XMLParser(resolve_entities=False, no_network=True))
        for el in root.iter("{http://www.omg.org/spec/BPMN/20100524/MODEL}collaboration"):
            if el.get("id") == collaboration_id:
                name = el.get("name")
                return str(name) if name is not None else None
    return None


def extension_configs(specs: Iterable[Any]) -> dict[str, ActivityExtensionConfig]:
    """Configs from ``spiffworkflow:activityConfig`` and ``layerflow:config`` of every element."""
    configs: dict[str, ActivityExtensionConfig] = {}
    for s in specs:
        source = getattr(s, "file", None) or ""
        for ts in spiff.iter_user_specs(s):
            ext = getattr(ts, "extensions", None) or {}
            merged: dict[str, Any] = {}
            for field_name, label in (("activityConfig", "spiffworkflow:activityConfig"), ("layerflow", "layerflow:config")):
                text = ext.get(field_name)
                if text is None or not str(text).strip():
                    continue
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{source}: element {ts.bpmn_id!r}: {label} is not valid JSON "
                                      f"({err.msg} at line {err.lineno} of the element text)") from None
                if not isinstance(data, dict):
                    raise ConfigError(f"{source}: element {ts.bpmn_id!r}: {label} must be a JSON object")
                merged.update(data)
            if merged:
                configs[ts.bpmn_id] = config_from_dict(merged, source=source, element_id=ts.bpmn_id)
    return configs


# --------------------------------------------------------------------------- config file

def config_file_changes(process: Process, specs: Iterable[Any],
                        started: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, tuple[str, list[str]]]:
    """How the config files ``process`` was loaded from (its own, and those beside the BPMN of the
    processes it calls) configure its elements now, against the configs ``process`` runs with (an
    instance's: those it started with): element id -> (the file, the changed fields,
    ``"humanConfirm.timeout 60 -> 600"``) (``specs``: the instance's specs, for the elements' own
    extension configs, which come from the BPMN the instance keeps). ``started``: the whole config
    (``dump_full``) each element changed at runtime started with, which the file is compared
    against instead: a runtime change is no change of the file. Empty when the files are
    unchanged, gone (a worker on another machine) or no longer load (``validate`` tells why)."""
    main = Path(process.config_path) if process.config_path else None
    bpmn = [Path(p) for p in process.paths if not dmn.is_dmn(Path(p))]
    if (main is not None and not main.is_file()) or not all(p.is_file() for p in bpmn):
        return {}
    try:
        files = _file_configs(bpmn, main, _load_config_file(main)["elements"] if main is not None else {})
        now = extension_configs(specs)
    except (ConfigError, ProcessError, OSError):
        return {}
    for element_id, (_, cfg) in files.items():
        now[element_id] = now[element_id].merged_with(cfg) if element_id in now else cfg
    changes: dict[str, tuple[str, list[str]]] = {}
    for element_id in sorted(set(now) | set(process.configs)):
        if started and element_id in started:  # both whole, defaults too: the same shape
            old, new = dict(started[element_id]), (now.get(element_id) or ActivityExtensionConfig()).dump_full()
        else:
            old, new = (_dump(c.get(element_id)) for c in (process.configs, now))
        fields = _changed_fields(old, new)
        if fields:
            changes[element_id] = (str(files[element_id][0]) if element_id in files else str(main), fields)
    return changes


def config_file_section_changes(process: Process) -> dict[str, list[str]]:
    """How the config file's ``system:`` and ``process:`` sections read now, against the values
    ``process`` runs with (an instance's: those it started with): section -> the changed fields
    (``"policy 'a' -> 'b'"``). Empty when unchanged, gone or no longer loading, as
    ``config_file_changes``."""
    if not process.config_path or not Path(process.config_path).is_file():
        return {}
    try:
        loaded = _load_config_file(Path(process.config_path))
    except (ConfigError, ProcessError, OSError):
        return {}
    options_now: dict[str, Any] = {} if loaded["redact"] is None else {"redact": loaded["redact"]}
    options_then: dict[str, Any] = {} if process.redact is None else {"redact": process.redact}
    if loaded["process_id"] and loaded["process_id"] != process.id:  # new instances start another process
        options_now["process_id"], options_then["process_id"] = loaded["process_id"], process.id
    changes = {"system": _changed_fields(process.system, loaded["system"], flat=True),
               "process": _changed_fields(options_then, options_now, flat=True)}
    return {section: fields for section, fields in changes.items() if fields}


def _dump(config: ActivityExtensionConfig | None) -> dict[str, Any]:
    return {} if config is None else config.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _changed_fields(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "", *,
                    flat: bool = False) -> list[str]:
    """``FIELD OLD -> NEW`` for each field that differs, down into nested objects and into lists of
    one length (``humanConfirm.timeout``, ``conflictPolicy.rules[0].confirm``: values cut short to
    fit a line would hide what changed) unless ``flat`` (a SYSTEM value is one value); ``(unset)``
    for a field one side does not set."""
    out = []
    for name in sorted(set(old) | set(new), key=str):
        a, b = old.get(name, _UNSET), new.get(name, _UNSET)
        if a != b:
            out.extend(_changed_value(f"{prefix}{name}", a, b) if not flat else [f"{prefix}{name} {_shown(a)} -> {_shown(b)}"])
    return out


def _changed_value(where: str, a: Any, b: Any) -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return _changed_fields(a, b, f"{where}.")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b)) if x != y for line in _changed_value(f"{where}[{i}]", x, y)]
    return [f"{where} {_shown(a)} -> {_shown(b)}"]


_UNSET = object()


def _shown(value: Any) -> str:
    if value is _UNSET:
        return "(unset)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a timeout of 60 s, as the file says it
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _find_config(bpmn: Path) -> Path | None:
    return configfile.find_config_beside(bpmn)


def branch_conditions(elements: Mapping[str, ActivityExtensionConfig]) -> dict[str, dict[str, str]]:
    """Gateway id -> {branch id: condition} of config entries (``spiff.LayerflowBpmnParser``)."""
    return {eid: {b.id: b.condition.strip() for b in cfg.branches if b.condition and b.condition.strip()}
            for eid, cfg in elements.items() if cfg.branches}


def _file_configs(bpmn_paths: list[Path], config_path: Path | None,
                  main_elements: Mapping[str, ActivityExtensionConfig]) -> dict[str, tuple[Path | None, ActivityExtensionConfig]]:
    """element id -> (the config file that configures it, its config): the files beside the BPMN of
    the called processes first, then the process's own (``main_elements``, from ``config_path``),
    which wins where both name an element. Raises on a called file's problems."""
    found: dict[str, tuple[Path | None, ActivityExtensionConfig]] = {}
    for called in configfile.called_process_configs(bpmn_paths, config_path):
        called.raise_for_problems()
        found.update({eid: (called.path, cfg) for eid, cfg in called.elements.items()})
    found.update({eid: (config_path, cfg) for eid, cfg in main_elements.items()})
    return found


def _load_config_file(path: Path) -> dict[str, Any]:
    """``{"system", "data_layers", "process_id", "elements"}`` from the config file; raises on problems."""
    loaded = configfile.load_config_file(path)
    loaded.raise_for_problems()
    return {"system": dict(loaded.system), "data_layers": dict(loaded.data_layers),
            "process_id": loaded.process_id, "elements": dict(loaded.elements), "redact": loaded.process.get("redact")}


def _validate(paths: list[Path], config_path: Path | None, process_id: str | None) -> str | None:
    """``engine.validate`` reports every problem at once; nothing runs on a process with one.
    Returns the process to start: the one asked for, else the one executable process no
    other loaded process calls (a caller and its called processes may share a file)."""
    from . import validate as validate_module

    report = validate_module.validate_process(paths, config_path, process_id, parser_factory=spiff.LayerflowBpmnParser)
    validate_module.raise_for_problems(report)
    return report.process_id


def _spiff_message(err: ValidationException) -> str:
    where = getattr(err, "file_name", "") or ""
    line = getattr(err, "line_number", None) or getattr(err, "sourceline", None)
    ident = getattr(err, "id", None)
    parts = [f"{where}:{line}" if line else where or "<bpmn>"]
    if ident:
        parts.append(f"element {ident!r}")
    msg = getattr(err, "error", None) or str(err)
    return ": ".join(parts) + f": {msg}"
