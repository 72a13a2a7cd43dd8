"""Schemathesis against the app's own OpenAPI schema: no request it can make gets a 5xx, nor a
status code its operation does not list (engine.api.ROUTE_ERRORS), nor a body other than the
schema listed for that code (the instance document, the error body).

Bounded: ``LAYERFLOW_SCHEMATHESIS_EXAMPLES`` examples per operation (default 8 in CI,
25 otherwise), derandomized so a run is repeatable. Half of the generated bodies and
paths are pointed at real instances (one waiting at a user task, one at a join
conflict), so the operations run past "not found" too.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="install the dev extra: pip install -e '.[dev]'")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance  # noqa: E402

from engine.api import create_app  # noqa: E402
from engine.governance import GovernanceService, StartArgs  # noqa: E402
from engine.runtime import Engine  # noqa: E402
from governance_helpers import LOAN_CONFLICT, NOTES, TOKEN, make_catalog  # noqa: E402

EXAMPLES = int(os.environ.get("LAYERFLOW_SCHEMATHESIS_EXAMPLES") or (8 if os.environ.get("CI") else 25))
AUTH = {"Authorization": f"Bearer {TOKEN}"}

_catalog = make_catalog(Path(tempfile.mkdtemp(prefix="layerflow-schemathesis-")))
_service = GovernanceService(Engine("memory://"), _catalog)
_REAL = [_service.start(StartArgs(process_id="notes_review", data=NOTES))["instance_id"],
         _service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))["instance_id"]]
app = create_app(_service, token=TOKEN)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


def _aim(case) -> None:  # type: ignore[no-untyped-def]
    """Point about half of the cases at a real instance (deterministically, by their content)."""
    pick = zlib.crc32(repr((case.path_parameters, case.body)).encode()) % 4
    if pick >= len(_REAL):
        return
    if isinstance(case.body, dict) and "instance_id" in case.body:
        case.body["instance_id"] = _REAL[pick]
    if case.path_parameters and "instance_id" in case.path_parameters:
        case.path_parameters["instance_id"] = _REAL[pick]


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):  # type: ignore[no-untyped-def]
    _aim(case)
    case.call_and_validate(headers=AUTH, checks=[not_a_server_error, status_code_conformance,
                                                 response_schema_conformance])


def test_the_instances_survived_the_run():
    """The instances the run aimed at are still loadable (nothing left them corrupt)."""
    for instance_id in _REAL:
        assert _service.document(instance_id)["instance_id"] == instance_id
