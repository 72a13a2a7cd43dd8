"""The README's commands outside the tour block (which tests/test_readme.py runs), pasted
as written: the workers section (on a private Redis key prefix), the config snippet of
"Configuring activities", the handler snippet, the REST endpoint table; and a handler reference that cannot be
found is refused by ``validate`` and ``run`` before anything runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "LAYERFLOW_STORE": f"sqlite:///{tmp_path / 'readme.db'}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("LAYERFLOW_MODEL_API_BASE", None)
    return env


def _layerflow(line: str) -> list[str]:
    """A README line `layerflow ARGS  # comment` as the argv of `python -m engine.cli ARGS`."""
    words = shlex.split(line.split("#", 1)[0])
    assert words[0] == "layerflow", line
    return [sys.executable, "-m", "engine.cli", *words[1:]]


def _block(after: str, lang: str) -> str:
    section = README.split(after, 1)[1]
    found = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert found, f"README lost the {lang} block after {after!r}"
    return found.group(1)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "bpmn_examples").symlink_to(ROOT / "bpmn_examples")
    (tmp_path / "application.json").write_text(json.dumps({"amount": 20000, "applicant_id": "APP007",
                                                           "purpose": "equipment"}))
    return tmp_path


def test_the_workers_section_runs(scratch: Path) -> None:
    redis = pytest.importorskip("redis")
    # the README's Redis, or the one the suite is given (its own database: $REDIS_URL)
    server = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").split("?", 1)[0]
    try:
        redis.Redis.from_url(server).ping()
    except Exception:  # noqa: BLE001
        pytest.skip("no Redis on 127.0.0.1:6379")
    prefix = f"readme{uuid.uuid4().hex[:8]}"
    lines = [line for line in _block("## Many workers", "bash").splitlines() if line.strip()]
    assert [shlex.split(line)[1] for line in lines] == ["submit", "worker", "worker"]
    env = _env(scratch)
    url = f"{server}?prefix={prefix}"
    # a private stream too: other workers on this Redis must not take (or be handed) these entries
    stream = ["--stream", f"{prefix}:ready"]
    submit, worker, dead = (_layerflow(line.replace("redis://127.0.0.1:6379/0", url)) + stream for line in lines)
    try:
        out = subprocess.run(submit, cwd=scratch, env=env, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr
        instance_id = out.stdout.strip().split()[-1]
        # `layerflow worker` runs until stopped: here it stops after the one entry
        out = subprocess.run(worker + ["--stop-after", "1"], cwd=scratch, env=env, capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr
        out = subprocess.run(dead, cwd=scratch, env=env, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 0 and "0 dead" in out.stdout + out.stderr, out.stdout + out.stderr
        shown = subprocess.run([sys.executable, "-m", "engine.cli", "inspect", instance_id, "--store", url, "--json"],
                               cwd=scratch, env=env, capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL)
        assert json.loads(shown.stdout)["status"] == "completed", shown.stdout[-500:]
        # the prose after the block: `layerflow list --store ...` shows what the workers ran
        section = README.split("## Many workers", 1)[1].split("\n## ", 1)[0]
        listing = re.search(r"`(layerflow list --store redis://127\.0\.0\.1:6379/0)`", section)
        assert listing, "README lost how to see what the workers ran"
        listed = subprocess.run(_layerflow(listing.group(1).replace("redis://127.0.0.1:6379/0", url)), cwd=scratch,
                                env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert listed.returncode == 0 and f"{instance_id}  loan_approval  completed" in listed.stdout, listed.stdout
    finally:
        client = redis.Redis.from_url(server)
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)


def test_the_config_snippet_validates_against_the_loan_process(scratch: Path) -> None:
    (scratch / "snippet.yaml").write_text(_block("## Configuring activities", "yaml"))
    out = subprocess.run([sys.executable, "-m", "engine.cli", "validate", "bpmn_examples/loan_approval.bpmn",
                          "--config", "snippet.yaml"], cwd=scratch, env=_env(scratch), capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_handler_snippet_runs(scratch: Path) -> None:
    code = _block("Handlers are Python functions", "python")
    code += "\nfrom engine.handlers import REGISTRY\nassert REGISTRY.get('risk_assessment') is risk_assessment\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=_env(scratch), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("replace", "words"), [
    ("loan_handlers.py:risk_assessment", ("missing_handlers.py", "not found", "risk_assessment")),
    ("loan_handlers.py:no_such_function", ("no_such_function", "loan_handlers.py", "risk_assessment")),
    ("no_such_package.handlers:run", ("no_such_package.handlers",)),
])
def test_a_handler_that_cannot_be_found_is_refused_before_anything_runs(scratch: Path, replace: str,
                                                                        words: tuple[str, ...]) -> None:
    original = (ROOT / "bpmn_examples" / "loan_approval.layerflow.yaml").read_text()
    broken = replace.replace("loan_handlers.py:risk_assessment", "missing_handlers.py:risk_assessment")
    (scratch / "broken.yaml").write_text(original.replace("handler: loan_handlers.py:risk_assessment",
                                                          f"handler: {broken}"))
    env = _env(scratch)
    out = subprocess.run([sys.executable, "-m", "engine.cli", "validate", "bpmn_examples/loan_approval.bpmn",
                          "--config", "broken.yaml"], cwd=scratch, env=env, capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 2
    for word in (*words, "broken.yaml", "handler"):
        assert word in out.stdout + out.stderr, word
    run = subprocess.run([sys.executable, "-m", "engine.cli", "run", "bpmn_examples/loan_approval.bpmn", "--config",
                          "broken.yaml", "--data", "application.json", "--json"], cwd=scratch, env=env,
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode == 2
    doc = json.loads(run.stdout)
    assert doc["instance_id"] is None and "risk_assessment" in doc["error"]["message"]
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--json"], cwd=scratch, env=env,
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    # nothing half-written: not even an empty store, which `list` does not make either
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert not (scratch / "readme.db").exists()


def _readme_endpoints() -> list[tuple[str, str]]:
    """Each `METHOD /path` the README's endpoint table names, `{a,b}` spelled out."""
    table = README.split("| endpoint | what |", 1)[1].split("\n\n", 1)[0]
    found = []
    for method, path in re.findall(r"`(GET|POST) (/[^`?]*)", table):
        alternatives = re.search(r"\{([\w-]+(?:,[\w-]+)+)\}", path)
        names = alternatives.group(1).split(",") if alternatives else [None]
        found += [(method, path.replace(alternatives.group(0), n) if n else path) for n in names]
    return found


def test_the_endpoint_table_names_served_routes_and_the_start_body_works(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    app = create_app("memory://", ROOT / "bpmn_examples", "t0ken")
    def shape(path: str) -> str:
        return re.sub(r"\{[^}]+\}", "{}", path)

    served = {(m, shape(r.path)) for r in app.routes for m in getattr(r, "methods", ())}
    named = [(m, shape(p)) for m, p in _readme_endpoints()]
    assert ("POST", "/api/instances") in named and ("GET", "/api/processes") in named
    assert not [e for e in named if e not in served], served
    body = re.search(r"start one with `(\{.*?\})`", README).group(1)
    assert '"process_id"' in body and '"data"' in body  # the fields the request below sends
    with TestClient(app) as client:
        auth = {"Authorization": "Bearer t0ken"}
        ids = [p["id"] for p in client.get("/api/processes", headers=auth).json()]
        started = client.post("/api/instances", headers=auth, json={
            "process_id": "loan_approval", "data": {"amount": 20000, "applicant_id": "A1", "purpose": "x"}})
    assert "loan_approval" in ids and started.status_code == 201 and started.json()["status"] == "completed"


# ----------------------------------------------------------------- the prose's commands, options and settings

_SUBCOMMANDS = ("run", "demo", "resume", "inspect", "tape", "replay", "snapshot", "rollback", "cancel", "send",
                "timers", "list", "validate", "schema", "serve", "submit", "worker")


def _prose() -> str:
    """The README without its fenced blocks (which the tests above run)."""
    return re.sub(r"```.*?```", "", README, flags=re.S)


def _inline_commands() -> list[str]:
    """Each code span of the prose that reads as a command: `layerflow SUB ...` or `SUB ID ...`."""
    found = []
    for span in re.findall(r"`([^`\n]+)`", _prose()):
        words = span.split()
        if words[0] == "layerflow" and len(words) > 1:
            found.append(span)
        elif words[0] in _SUBCOMMANDS and len(words) > 1 and words[1] == "ID":
            found.append("layerflow " + span)
    return found


def test_every_command_the_prose_names_parses_against_the_cli() -> None:
    """A subcommand, option or argument the README shows in passing exists: each span is parsed as
    the CLI parses it (placeholders such as ID or SEQ stand for values; an option shown without its
    value, `tape ID --kind`, is fine; an unknown option or a surplus argument is not)."""
    import click

    from engine.cli import main

    spans = _inline_commands()
    assert any(s.startswith("layerflow resume ID --set") for s in spans) and len(spans) > 20, spans
    for span in spans:
        words = shlex.split(span)[1:]
        command: click.Command = main
        while isinstance(command, click.Group) and words and words[0] in command.commands:
            command = command.commands[words.pop(0)]
        assert command is not main, f"README names no layerflow command in `{span}`"
        try:
            command.make_context(command.name or "layerflow", list(words))
        except click.NoSuchOption as err:
            raise AssertionError(f"README `{span}`: {err.format_message()}") from err
        except click.UsageError as err:
            assert "unexpected extra argument" not in err.format_message(), f"README `{span}`: {err}"


def test_every_option_the_readme_names_exists() -> None:
    import click

    from engine.cli import main

    have: set[str] = set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            have.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(main)
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", README)) - {"--quick"}  # --quick: the benches'
    assert {"--answer", "--store", "--timer-interval"} <= named
    assert not sorted(named - have)


def test_every_setting_the_readme_names_is_read() -> None:
    named = set(re.findall(r"\b(LAYERFLOW_[A-Z_]+)\b", README))
    assert {"LAYERFLOW_STORE", "LAYERFLOW_API_TOKEN"} <= named
    code = "\n".join(p.read_text() for d in ("engine", "context_layers") for p in (ROOT / d).rglob("*.py"))
    assert not sorted(n for n in named if f'"{n}"' not in code)


def test_the_default_store_is_where_the_readme_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from context_layers.stores import default_store_url

    said = re.search(r"Runs are\s+kept in a SQLite file in your data directory \(`\$XDG_DATA_HOME/([^`]+)`,\s+"
                     r"`~/\.local/share/([^`]+)` when it is unset", README)
    assert said, "README no longer says where the default store is"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_store_url() == f"sqlite:///{tmp_path / 'data' / said.group(1)}"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_store_url() == f"sqlite:///{tmp_path / '.local' / 'share' / said.group(2)}"


def test_the_benchmark_lines_name_every_bench() -> None:
    named = re.findall(r"^python (bench/\S+\.py)", _block("## Benchmarks", "bash"), re.M)
    shipped = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").glob("*.py")
                     if p.name.startswith(("bench_", "eval_")))
    assert sorted(named) == shipped


def _run_span(span: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_layerflow(span) + ["--json"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)


def test_the_example_runs_the_prose_shows_work_as_written(scratch: Path) -> None:
    """`layerflow run bpmn_examples/...` in the prose: each runs as pasted (completes, or waits where the
    README says so) and the answer the README gives the one that waits completes it."""
    env = _env(scratch)
    runs = [s for s in _inline_commands() if s.startswith("layerflow run bpmn_examples/")]
    assert {"xor_loop", "purchase_collaboration", "business_rules"} <= {s.split("/")[1].split(".")[0] for s in runs}
    for span in runs:
        out = _run_span(span, scratch, env)
        doc = json.loads(out.stdout)
        assert out.returncode in (0, 3) and doc["status"] in ("completed", "waiting"), (span, out.stderr[-1500:])
        if "purchase_collaboration" in span:
            assert doc["status"] == "waiting"
            answer = re.search(r"`(layerflow resume ID --answer approve_offer=[^`]+)`", README)
            assert answer, "README lost how to answer the collaboration's approval"
            done = _run_span(answer.group(1).replace(" ID ", f" {doc['instance_id']} "), scratch, env)
            assert done.returncode == 0 and json.loads(done.stdout)["status"] == "completed", done.stderr[-1500:]
        else:
            assert doc["status"] == "completed", span
        if "business_rules" in span:
            said = re.search(r"writes `route` `(\"\w+\")` and `priority` `(\"\w+\")`", README)
            assert said, "README lost what the DMN example writes"
            history = doc["layers"]["L3"]
            assert [history["route"], history["priority"]] == [json.loads(said.group(1)), json.loads(said.group(2))]


def _table_row(endpoint: str) -> str:
    table = README.split("| endpoint | what |", 1)[1].split("\n\n", 1)[0]
    row = next((line for line in table.splitlines() if endpoint in line), None)
    assert row, f"README's endpoint table lost {endpoint}"
    return row


def test_the_endpoint_table_bodies_drive_a_waiting_instance_to_its_end() -> None:
    """The request bodies as the table spells them: a user task's `{"data": ...}`, a message's
    `{"name": ..., "payload": ...}`, a cancel's `{"reason": ...}`, a confirmation's `{"value": ...}`
    with `"instance_id"` when several instances wait on that id, a resume's `{"answers": ...}`."""
    from fastapi.testclient import TestClient

    from engine.api import create_app

    def fields(endpoint: str) -> list[str]:
        return re.findall(r'"(\w+)"', " ".join(re.findall(r"`(\{[^`]*\})`", _table_row(endpoint))))

    assert fields("/user-tasks/{task}") == ["data"]
    assert fields("/events`") == ["name", "payload"]
    assert fields("/cancel`") == ["reason"]
    assert fields("/resume`") == ["answers"]
    assert fields("/api/confirmations/{id}") == ["value"]
    assert '`"answer"`' in _table_row("/api/confirmations/{id}") and '`"instance_id"`' in _table_row(
        "/api/confirmations/{id}")
    app = create_app("memory://", ROOT / "bpmn_examples", "t0ken")
    with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as client:
        def start(process_id: str, data: dict) -> dict:
            started = client.post("/api/instances", json={"process_id": process_id, "data": data})
            assert started.status_code == 201, started.text
            return started.json()

        draft = start("parallel_user_task", {"title": "Q3 report"})
        assert draft["status"] == "waiting" and draft["waiting_for"][0]["task_id"] == "review"
        done = client.post(f"/api/instances/{draft['instance_id']}/user-tasks/review",
                           json={"data": {"approved": True, "reviewer": "ann"}})
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text

        claim = start("message_wait", {"claim_id": "CL-1042"})
        sent = client.post(f"/api/instances/{claim['instance_id']}/events",
                           json={"name": "documents_received", "payload": {"files": ["police_report.pdf"]}})
        assert sent.status_code == 200 and sent.json()["status"] == "completed", sent.text
        duplicate = start("message_wait", {"claim_id": "CL-1042"})
        cancelled = client.post(f"/api/instances/{duplicate['instance_id']}/cancel", json={"reason": "duplicate claim"})
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text

        conflict = {"amount": 120000, "applicant_id": "APP001", "purpose": "business loan", "industry": "gambling"}
        first, second = start("loan_approval", conflict), start("loan_approval", conflict)
        assert first["waiting_for"][0]["id"] == "review_join/approval_status"
        confirmations = client.get("/api/confirmations").json()
        assert {c["id"] for c in confirmations} == {"review_join/approval_status"}
        ambiguous = client.post("/api/confirmations/review_join/approval_status", json={"value": "rejected"})
        assert ambiguous.status_code == 400 and "instance_id" in ambiguous.text
        answered = client.post("/api/confirmations/review_join/approval_status",
                               json={"value": "pending_dual_approval", "instance_id": first["instance_id"]})
        assert answered.status_code == 200 and answered.json()["status"] == "completed", answered.text
        resumed = client.post(f"/api/instances/{second['instance_id']}/resume",
                              json={"answers": {"confirmations": {"review_join/approval_status": "rejected"}}})
        assert resumed.status_code == 200 and resumed.json()["status"] == "completed", resumed.text


def test_every_api_endpoint_but_health_needs_the_token() -> None:
    """README: every `/api/` endpoint but `/api/health` needs the bearer token; the console and the
    docs are open."""
    from fastapi.testclient import TestClient

    from engine.api import create_app

    said = re.search(r"Every `/api/` endpoint but `(/api/\w+)` needs\s+`Authorization: Bearer \$LAYERFLOW_API_TOKEN`;"
                     r" the console \(`/`\) and the docs \(`/docs`, `/openapi.json`\) are open", README)
    assert said, "README no longer says which endpoints need the token"
    app = create_app("memory://", ROOT / "bpmn_examples", "t0ken")
    with TestClient(app) as client:
        for route in app.routes:
            path = getattr(route, "path", "")
            if not path.startswith("/api/"):
                continue
            url = re.sub(r"\{[^}]+\}", "x", path)
            for method in sorted(getattr(route, "methods", ())):
                status = client.request(method, url, json={}).status_code
                assert (status != 401) == (path == said.group(1)), (method, path, status)
        assert [client.get(p).status_code for p in ("/", "/docs", "/openapi.json")] == [200, 200, 200]


def test_serve_names_the_store_it_keeps_instances_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README: the server keeps instances in the CLI's store (`--store`, else LAYERFLOW_STORE, else the
    data directory's file) and names it as it starts."""
    import uvicorn
    from click.testing import CliRunner

    from engine.cli import main

    assert re.search(r"same store as the CLI \(`--store`, else\s+`LAYERFLOW_STORE`, else the file in your data "
                     r"directory; it names it as it starts\)", README)
    served: list[object] = []

    def run(server: uvicorn.Server, sockets: list[object] | None = None) -> None:
        served.append(server.config.app)
        server.started = True
        for sock in sockets or []:
            sock.close()  # type: ignore[attr-defined]
    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)  # sqlite:///env.db is relative to it
    runner = CliRunner()
    for store_env, option, expected in ((None, [], f"sqlite:///{tmp_path / 'data' / 'layerflow' / 'layerflow.db'}"),
                                        ("sqlite:///env.db", [], "sqlite:///env.db"),
                                        ("sqlite:///env.db", ["--store", "memory://"], "memory://")):
        if store_env:
            monkeypatch.setenv("LAYERFLOW_STORE", store_env)
        else:
            monkeypatch.delenv("LAYERFLOW_STORE", raising=False)
        out = runner.invoke(main, ["serve", "--catalog", str(ROOT / "bpmn_examples"), "--token", "t", "--port", "0",
                                   *option])
        assert out.exit_code == 0, out.output
        assert f"store {expected}" in out.output, out.output
    assert len(served) == 3


def test_a_handler_file_named_in_the_config_is_found_beside_the_process(tmp_path: Path) -> None:
    """README: `handler: file.py:function`, the file relative to the process's folder, a plain
    function; or `package.module:function` on PYTHONPATH. Run from another folder."""
    assert re.search(r"`handler: file\.py:function` \(the file relative to the\s+process's folder", README)
    assert "`handler: package.module:function` (importable, on `PYTHONPATH`)" in README
    folder = tmp_path / "processes"
    (folder / "pkg").mkdir(parents=True)
    (folder / "check.bpmn").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="t">\n'
        '  <bpmn:process id="check" isExecutable="true">\n'
        '    <bpmn:startEvent id="start"/><bpmn:serviceTask id="size"/><bpmn:serviceTask id="label"/>'
        '<bpmn:endEvent id="end"/>\n'
        '    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="size"/>'
        '<bpmn:sequenceFlow id="f2" sourceRef="size" targetRef="label"/>'
        '<bpmn:sequenceFlow id="f3" sourceRef="label" targetRef="end"/>\n'
        '  </bpmn:process>\n</bpmn:definitions>\n')
    (folder / "my_handlers.py").write_text("def size(ctx):\n    return {'big': ctx['n'] > 10}\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "labels.py").write_text("def label(ctx):\n    return {'label': 'big' if ctx['big'] else 'small'}\n")
    (folder / "check.layerflow.yaml").write_text("size:\n  handler: my_handlers.py:size\n"
                                                 "label:\n  handler: pkg.labels:label\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(elsewhere)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    out = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(folder / "check.bpmn"), "--data", '{"n": 12}',
                          "--json"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["layers"]["L3"]["label"] == "big", out.stderr[-1500:]


def test_the_rest_block_serves_and_its_curl_starts_an_instance(scratch: Path) -> None:
    """The REST section's block as pasted (on a free port instead of 8765, a scratch store): the
    server starts, and the block's curl commands get the answers the comments after them name."""
    import shutil
    import socket
    import time

    import httpx

    import local_http

    if not shutil.which("curl"):
        pytest.skip("no curl on this machine")
    section = README.split("## REST API and console", 1)[1].split("\n## ", 1)[0]
    block = "".join(re.findall(r"```bash\n(.*?)```", section, re.S))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    lines = [line for line in block.replace("8765", port).splitlines() if line.strip() and not line.startswith("#")]
    exports = [line for line in lines if line.startswith("export ")]
    serve = [line for line in lines if line.startswith("layerflow serve")]
    curls = [line for line in lines if line.startswith("curl ")]
    assert exports == ["export LAYERFLOW_API_TOKEN=change-me"] and len(serve) == 1 and curls, block
    env = {**_env(scratch), "LAYERFLOW_API_TOKEN": "change-me"}
    proc = subprocess.Popen(_layerflow(serve[0]) + ["--log-level", "warning"], cwd=scratch, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if local_http.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        for line in curls:
            command, _, expected = line.partition("#")
            out = subprocess.run(["bash", "-c", command], cwd=scratch, env=env, capture_output=True, text=True,
                                 timeout=120, stdin=subprocess.DEVNULL)
            assert out.returncode == 0, out.stderr
            for word in re.findall(r'"[^"]+"', expected):  # the comment quotes what the answer holds
                assert word.replace('"', "") in out.stdout.replace('"', ""), (line, out.stdout[-800:])
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "store sqlite:///" in (proc.stderr.read() if proc.stderr else "")


def test_the_store_named_on_stderr_never_shows_a_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` and `serve` name their store as they start; a Redis password in its URL is not printed."""
    import uvicorn
    from click.testing import CliRunner

    from engine import cli as cli_module
    from engine.cli import main

    def run(server: uvicorn.Server, sockets: list[object] | None = None) -> None:
        server.started = True
        for sock in sockets or []:
            sock.close()  # type: ignore[attr-defined]
    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setattr(cli_module, "default_store_url", lambda: "redis://:s3cret@127.0.0.1:1/0")
    monkeypatch.setattr("engine.store.default_store_url", lambda: "redis://:s3cret@127.0.0.1:1/0")
    monkeypatch.setattr("engine.api.create_app", lambda *a, **kw: object())
    served = CliRunner().invoke(main, ["serve", "--catalog", str(ROOT / "bpmn_examples"), "--token", "t",
                                       "--port", "0"])
    assert served.exit_code == 0 and "store redis://***@127.0.0.1:1/0" in served.output, served.output
    assert "s3cret" not in served.output
    assert cli_module._store_name(None) == "redis://***@127.0.0.1:1/0"
    assert cli_module._store_name("redis://user:pw@h:6379/2") == "redis://***@h:6379/2"


def _required(schema: dict[str, Any]) -> set[str]:
    """The fields a body schema requires: listed in ``required``, or required by any one of its names
    (an ``allOf`` entry ``anyOf: [{required: [name]}, {required: [alias]}, ...]`` whose other names
    are described as "the same as `name`": the camelCase and other names the server takes)."""
    out = set(schema.get("required", []))
    for rule in schema.get("allOf", []):
        names = [r["required"][0] for r in rule.get("anyOf", []) if set(r) == {"required"} and len(r["required"]) == 1]
        if names and len(names) == len(rule["anyOf"]) and all(
                schema["properties"][n].get("description") == f"the same as `{names[0]}`" for n in names[1:]):
            out.add(names[0])
    return out


def test_the_governance_row_names_each_operation_s_required_fields() -> None:
    """What the table says compress, resolve, rollback and branch-evaluate need is what the server
    requires (besides `instance_id`), and a body with only those fields is accepted."""
    from fastapi.testclient import TestClient

    from engine.api import create_app

    row = _table_row("/api/context-governance/{inspect,")
    said = re.search(r"compress takes `(\w+)` \(((?:`\w+`(?:, )?)+)\), resolve `(\w+)` and `(\w+)`, rollback `(\w+)`, "
                     r"branch-evaluate `(\w+)`", row)
    assert said, "README's governance row no longer names the operations' required fields"
    action, actions, resolution, reason, snapshot_id, required_keys = said.groups()
    app = create_app("memory://", ROOT / "bpmn_examples", "t0ken")
    with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as client:
        schemas = client.get("/openapi.json").json()["components"]["schemas"]
        required = {op: _required(schemas[f"{name}Request"]) for op, name in (
            ("compress", "Compress"), ("resolve", "Resolve"), ("rollback", "Rollback"),
            ("branch-evaluate", "BranchEvaluate"))}
        assert required == {"compress": {action}, "resolve": {resolution, reason}, "rollback": {snapshot_id},
                            "branch-evaluate": {required_keys}}
        assert re.findall(r"`(\w+)`", actions) == list(
            schemas["CompressRequest"]["properties"][action].get("enum") or
            [v for s in schemas["CompressRequest"]["properties"][action].get("anyOf", []) for v in s.get("enum", [])])
        started = client.post("/api/instances", json={"process_id": "loan_approval", "data": {
            "amount": 20000, "applicant_id": "A1", "purpose": "x"}}).json()
        iid = started["instance_id"]
        snap = client.post("/api/context-governance/snapshot", json={"instance_id": iid}).json()["snapshot_id"]
        for op, body in (("compress", {action: "evaluate"}), ("rollback", {snapshot_id: snap}),
                         ("branch-evaluate", {required_keys: ["risk_level"]})):
            answer = client.post(f"/api/context-governance/{op}", json={"instance_id": iid, **body})
            assert answer.status_code == 200, (op, answer.text)
