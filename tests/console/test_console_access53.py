"""Outsider round 53: approvers of an access request who use only the web console.

The process (``tests/outsider_access53/access53.bpmn``): a manager's approval as a user task
with a Camunda form (a required boolean, a required enum whose choices have names, a number
with bounds and a default), then a security review beside an automatic entitlement check that
settle the access level differently, a person picks it at the join, provisioning grants it.

A busy approver expects: the form's choices by the names the modeler gave them, a wrong answer
refused on the page naming the field, a justification holding ``<script>`` and quotes shown as
text, a double click that submits once, a typed answer that survives a reload, and a page that
follows what another approver did in another tab.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_helpers import Server, chromium, serve

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parents[1] / "outsider_access53"
TOKEN = "access53-token-7c1d"
WAIT = 15_000  # ms: the longest any single step may take
JUSTIFICATION = '<script>window.__xss53 = 1</script> needs "CRM" access & <b>now</b>'
REQUEST = {"requester": "ann", "system": "crm", "justification": JUSTIFICATION}


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-access53")


@pytest.fixture(scope="module")
def browser(tmp_module: Path) -> Iterator[Any]:
    with chromium(tmp_module, default_timeout=WAIT) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def server(tmp_module: Path, browser: Any) -> Iterator[Server]:
    catalog = tmp_module / "access53"
    shutil.copytree(HERE, catalog)
    with serve(tmp_module, TOKEN, catalog=catalog) as s:
        yield s


class Approver:
    """One approver's tab: signed in as the README says; records dialogs and page errors."""

    def __init__(self, browser: Any, server: Server, name: str) -> None:
        from playwright.sync_api import expect

        expect.set_options(timeout=WAIT)
        self.server, self.page = server, browser.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(server.url + "/")
        self.page.get_by_label("API token").fill(TOKEN)
        self.page.get_by_label("Your name").fill(name)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.locator("#list-view").wait_for(state="visible")

    def open(self, iid: str) -> Any:
        self.page.goto(f"{self.server.url}/#/instances/{iid}")
        self.page.locator("#inst-title").filter(has_text=iid).wait_for()
        self.page.locator("#inst-body").wait_for(state="visible")
        return self.page

    def assert_clean(self) -> None:
        assert self.dialogs == [] and self.errors == []
        assert self.page.evaluate("window.__xss53") is None
        assert self.page.locator("main script, main b").count() == 0


def start(server: Server) -> str:
    doc = server.api("POST", "/api/instances", json={"process_id": "access53", "data": REQUEST})
    assert [w["task_id"] for w in doc["waiting_for"]] == ["manager_approval"], doc
    return str(doc["instance_id"])


def user_inputs(server: Server, iid: str) -> list[Any]:
    tape = server.api("GET", f"/api/instances/{iid}/tape", params={"kind": "note"})
    return [e for e in tape["events"] if e.get("data", {}).get("note") == "user_input"]


def test_the_form_names_its_choices_and_refuses_wrong_data(server: Server, browser: Any) -> None:
    from playwright.sync_api import expect

    iid = start(server)
    ann = Approver(browser, server, "Ann Manager")
    page = ann.page
    page.locator("#instances a", has_text=iid).click()
    card = page.locator("#ut-list .user-task")
    expect(card).to_have_count(1)
    level = card.locator("li[data-field=access_level]")
    assert "Access level" in level.inner_text() and "required" in level.inner_text()
    # the enum's choices by the names the modeler gave them, beside the values to enter
    for name in ("Read only", "Read and write", "Administrator"):
        assert name in level.inner_text(), level.inner_text()
    ann.assert_clean()

    # wrong data: a required field left out, a choice that is no option, a number out of bounds
    area = card.locator("textarea")
    assert json.loads(area.input_value()) == {"valid_days": 30}
    complete = card.locator("button", has_text="Complete")
    complete.click()
    expect(card.locator(".error")).to_contain_text("field 'approved' is required and missing")
    expect(complete).to_be_enabled()
    area.fill('{"approved": "yes", "access_level": "root", "valid_days": 900}')
    complete.click()
    error = card.locator(".error")
    expect(error).to_contain_text("field 'valid_days' 900 is above the maximum 365")
    for said in ("field 'approved' \"yes\" is not true or false", "field 'access_level' \"root\" is not one of"):
        assert said in error.inner_text()
    expect(complete).to_be_enabled()
    assert server.api("GET", f"/api/instances/{iid}")["status"] == "waiting"

    # right data, with a busy approver's double click: one answer on the tape
    area = page.locator("#ut-list .user-task textarea")
    area.fill('{"approved": true, "access_level": "admin", "valid_days": 90}')
    page.locator("#ut-list .user-task button", has_text="Complete").dblclick()
    page.locator("#confirmations article").first.wait_for()
    assert [e["actor"] for e in user_inputs(server, iid)] == ["Ann Manager"]
    # the approver is told the answer went in (not only when the page last refreshed)
    expect(page.locator("#inst-state")).to_contain_text("Completed Manager approval")
    ann.assert_clean()


def approved(server: Server) -> str:
    """An access request the manager approved (by REST): it waits at the join."""
    iid = start(server)
    doc = server.api("POST", f"/api/instances/{iid}/user-tasks/manager_approval",
                     json={"data": {"approved": True, "access_level": "admin"}, "user": "Ann Manager"})
    assert [w["id"] for w in doc["waiting_for"]] == ["join/granted_level"], doc["waiting_for"]
    return iid


def test_the_join_is_answered_once_and_the_other_tab_follows(server: Server, browser: Any) -> None:
    from playwright.sync_api import expect

    iid = approved(server)
    bo, cy = Approver(browser, server, "Bo Security"), Approver(browser, server, "Cy Security")
    first, other = bo.open(iid), cy.open(iid)
    card = first.locator("#confirmations article")
    expect(card).to_have_count(1)
    # the key was not set before the split: "not set", not JSON's null (a value a branch could hold)
    expect(card.locator("dl.values .base dd")).to_have_text("not set")
    expect(first.locator("#diagram svg")).to_contain_text("Conflict on granted_level")
    expect(first.locator("#diagram svg")).to_contain_text("not set before")
    assert "was null" not in first.locator("#diagram svg").inner_html()
    card.locator("textarea").fill('admin rights need a second approver: "write" for now')
    card.get_by_role("button", name="\"write\"").dblclick()
    first.locator("#inst-status", has_text="completed").wait_for()
    expect(first.locator("#inst-state")).to_contain_text("Answered join/granted_level")
    tape = server.api("GET", f"/api/instances/{iid}/tape", params={"kind": "human_decision"})
    assert [(e["actor"], e["data"].get("value")) for e in tape["events"]] == [("Bo Security", "write")]
    assert server.api("GET", f"/api/instances/{iid}")["layers"]["L3"]["provisioned"] == "crm:write:30d"
    # the other tab follows without a reload: the decision card goes, the status is completed
    other.locator("#inst-status", has_text="completed").wait_for()
    expect(other.locator("#confirmations")).to_be_hidden()
    # the tape names the person and the reason; the justification is text in the layers
    decision = first.locator("#tape-list li.kind-human_decision")
    expect(decision).to_contain_text("Bo Security")
    expect(decision).to_contain_text('admin rights need a second approver: "write" for now')
    expect(first.locator("#layer-tables")).to_contain_text("<script>window.__xss53")
    expect(first.locator("#diagram svg .node.state-current")).to_have_count(0)
    bo.assert_clean(); cy.assert_clean()


def test_a_stale_tab_is_told_the_task_was_done(server: Server, browser: Any) -> None:
    """Two managers have the request open; one completes it. The other, whose tab has not
    refreshed yet, submits: the refusal stays on screen (the card it was written in goes)."""
    from playwright.sync_api import expect

    iid = start(server)
    ann, dee = Approver(browser, server, "Ann Manager"), Approver(browser, server, "Dee Manager")
    first, late = ann.open(iid), dee.open(iid)
    late.uncheck("#inst-auto")  # its refresh has not come yet when Dee submits
    expect(late.locator("#ut-list .user-task")).to_have_count(1)
    first.locator("#ut-list .user-task textarea").fill('{"approved": true, "access_level": "read"}')
    first.locator("#ut-list .user-task button", has_text="Complete").click()
    first.locator("#inst-status", has_text="completed").wait_for()

    late.locator("#ut-list .user-task textarea").fill('{"approved": false, "access_level": "read"}')
    late.locator("#ut-list .user-task button", has_text="Complete").click()
    late.locator("#inst-status", has_text="completed").wait_for()
    said = late.locator("[role=alert]:visible, [role=status]:visible").filter(has_text="was not")
    expect(said.first).to_be_visible()
    assert [e["actor"] for e in user_inputs(server, iid)] == ["Ann Manager"]
    ann.assert_clean(); dee.assert_clean()


def test_what_an_approver_typed_survives_a_reload(server: Server, browser: Any) -> None:
    from playwright.sync_api import expect

    iid = approved(server)
    bo = Approver(browser, server, "Bo Security")
    page = bo.open(iid)
    reason = page.locator("#confirmations article textarea")
    reason.fill("checked with the CRM owner")
    page.reload()
    page.locator("#inst-body").wait_for(state="visible")
    expect(page.locator("#confirmations article textarea")).to_have_value("checked with the CRM owner")

    other = start(server)
    page = bo.open(other)
    page.locator("#ut-list .user-task textarea").fill('{"approved": true, "access_level": "write"}')
    page.reload()
    page.locator("#inst-body").wait_for(state="visible")
    expect(page.locator("#ut-list .user-task textarea")).to_have_value('{"approved": true, "access_level": "write"}')
    bo.assert_clean()


def test_the_form_is_filled_in_by_its_fields_not_as_json(server: Server, browser: Any) -> None:
    """A busy approver picks the choices by name in the form's own controls; the data sent is
    what they picked (the JSON below follows them, for keys the form does not declare)."""
    from playwright.sync_api import expect

    iid = start(server)
    eve = Approver(browser, server, "Eve Manager")
    page = eve.open(iid)
    card = page.locator("#ut-list .user-task")
    level = card.get_by_label("Access level")
    assert [o.strip() for o in level.locator("option").all_inner_texts()] == \
        ["choose\u2026", "Read only", "Read and write", "Administrator"]
    expect(card.get_by_label("Valid for (days)")).to_have_value("30")
    card.get_by_label("Approve the request").select_option(label="Yes")
    level.select_option(label="Read and write")
    card.get_by_label("Valid for (days)").fill("14")
    assert json.loads(card.locator("textarea").input_value()) == \
        {"approved": True, "access_level": "write", "valid_days": 14}
    card.locator("button", has_text="Complete").click()
    # write access both checks grant: no conflict, provisioned at once
    expect(page.locator("#inst-state")).to_contain_text("Completed Manager approval; the instance is now completed")
    assert server.api("GET", f"/api/instances/{iid}")["layers"]["L3"]["provisioned"] == "crm:write:14d"
    assert [e["actor"] for e in user_inputs(server, iid)] == ["Eve Manager"]
    eve.assert_clean()
