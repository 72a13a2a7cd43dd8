"""The console in a real browser: headless Chromium against a ``layerflow serve`` started here.

The loan demo instance waits on the approval_status conflict at ``review_join``; a
loan officer signs in with the token, opens it, sees the join marked and both branch
values, looks at the context as it was at a tape event, answers with a reason, and
sees the instance complete with her answer on the tape. A wrong token shows an error
and no data. Screenshots at 1280x800 and 390x844 go to ``artifacts/`` (not committed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_helpers import ARTIFACTS, Server, chromium, serve

from engine.cli import LOAN_SCENARIOS

pytestmark = pytest.mark.slow

TOKEN = "console-e2e-token-5b21"
OFFICER = "Ann Officer"
CONFIRMATION = "review_join/approval_status"
WAIT = 15_000  # ms: the longest any single step may take


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-e2e")


@pytest.fixture(scope="module")
def context(tmp_module: Path) -> Iterator[Any]:
    with chromium(tmp_module, default_timeout=WAIT) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def server(tmp_module: Path, context: Any) -> Iterator[Server]:
    with serve(tmp_module, TOKEN) as s:
        yield s


@pytest.fixture(scope="module")
def conflict(server: Server) -> str:
    """The loan demo's conflict scenario, started through the REST API: it waits at the join."""
    server.api("POST", "/api/instances", json={"process_id": "loan_approval", "data": LOAN_SCENARIOS["fast"],
                                               "user": "e2e"})
    doc = server.api("POST", "/api/instances", json={"process_id": "loan_approval",
                                                     "data": LOAN_SCENARIOS["conflict"], "user": "e2e"})
    assert doc["status"] == "waiting"
    assert [w["id"] for w in doc["waiting_for"]] == [CONFIRMATION]
    return str(doc["instance_id"])


def shot(page: Any, name: str, *, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=full_page, timeout=WAIT)
    assert path.stat().st_size > 10_000
    return path


def api_calls(page: Any) -> list[str]:
    calls: list[str] = []
    page.on("request", lambda r: calls.append(f"{r.method} {r.url}") if "/api/" in r.url else None)
    return calls


def test_a_wrong_token_shows_an_error_and_no_data(server: Server, conflict: str, context: Any) -> None:
    page = context.new_page()
    calls = api_calls(page)
    page.goto(server.url + "/")
    assert page.locator("#login").is_visible()
    assert page.locator("#list-view").is_hidden() and page.locator("#instance-view").is_hidden()
    page.fill("#token", "not-the-token")
    page.fill("#user", "Eve")
    page.click("#login-submit")
    error = page.locator("#login-error")
    error.wait_for(state="visible")
    assert "refused" in error.inner_text()
    assert page.locator("#list-view").is_hidden() and page.locator("#instance-view").is_hidden()
    assert conflict not in page.content()
    assert page.evaluate("sessionStorage.getItem('layerflow.token')") is None
    # the only API call was the refused sign-in check; opening an instance by URL shows nothing either
    page.goto(f"{server.url}/#/instances/{conflict}")
    page.wait_for_timeout(300)
    assert page.locator("#login").is_visible() and page.locator("#instance-view").is_hidden()
    assert calls == [f"GET {server.url}/api/instance-summaries?limit=1"], calls
    page.close()


def test_a_loan_officer_answers_the_conflict(server: Server, conflict: str, context: Any) -> None:
    from playwright.sync_api import expect  # retries until the page shows it (WAIT): no race with rendering

    expect.set_options(timeout=WAIT)
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    calls = api_calls(page)
    page.goto(server.url + "/")

    # sign in with the keyboard only
    page.focus("#token")
    page.keyboard.type(TOKEN)
    page.keyboard.press("Tab")
    page.keyboard.type(OFFICER)
    page.keyboard.press("Enter")
    page.locator("#list-view").wait_for(state="visible")
    assert page.locator("#whoami").inner_text() == OFFICER

    # the list: both instances, the conflict one waiting for the decision; the status filter works
    row = page.locator("#instances tbody tr", has_text=conflict)
    row.wait_for()
    expect(page.locator("#instances tbody tr")).to_have_count(2)
    assert "waiting" in row.inner_text().lower() and CONFIRMATION in row.inner_text()
    page.select_option("#status-filter", "completed")
    # (not page.wait_for_function: when it has to poll it evaluates a string in the page, which
    # the console's Content-Security-Policy refuses, so it failed whenever the filter was slow)
    expect(page.locator("#instances tbody tr")).to_have_count(1)
    assert conflict not in page.locator("#instances").inner_text()
    page.select_option("#status-filter", "error")
    page.locator("#list-state", has_text="No error instances").wait_for()
    expect(page.locator("#instances")).to_be_hidden()
    page.select_option("#status-filter", "")
    row.wait_for()
    shot(page, "list-1280x800")

    # an unknown instance: a clear error, no stale data
    page.goto(f"{server.url}/#/instances/no-such-instance")
    page.locator("#inst-state.error", has_text="no instance no-such-instance").wait_for()
    expect(page.locator("#inst-body")).to_be_hidden()
    page.go_back()

    # the instance page
    row.get_by_role("link").click()
    page.wait_for_url(re.compile(rf"#/instances/{conflict}$"))
    page.locator("#inst-status", has_text="waiting").wait_for()
    join = page.locator("#diagram svg #node-review_join")
    join.wait_for()
    expect(join).to_have_class(re.compile(r"\bconflict\b"))
    assert page.locator("#diagram svg #node-risk_review").get_attribute("class").split().count("waiting") == 1
    callout = page.locator("#diagram svg .callout.open").text_content()
    assert 'finance_review: "approved"' in callout and 'risk_review: "rejected"' in callout, callout
    card = page.locator("#conf-list .confirmation")
    expect(card).to_have_count(1)
    assert "approved" in card.inner_text() and "rejected" in card.inner_text()
    assert re.search(r"\d+ min \d+ s left", card.locator(".time-left").inner_text())
    expect(page.locator("#layer-bars .bar-row")).to_have_count(6)
    expect(page.locator("#attention .scores li")).to_have_count(5)
    expect(page.locator("#compressions")).to_contain_text("No compressions")

    # the tape: filter by key, pick the risk review's write, see the branch context at that point
    page.fill("#f-key", "approval_status")
    event = page.locator("#tape-list li.kind-write", has_text="risk_review").filter(has_text="rejected")
    expect(event).to_have_count(1)
    event.locator("button").click()
    page.locator("#replay-banner").wait_for(state="visible")
    assert "risk_review" in page.locator("#replay-text").inner_text()
    history = page.locator("#layer-tables details.layer", has_text="L3 HISTORY")
    history.locator("tr", has_text="approval_status").filter(has_text='"rejected"').wait_for()
    page.click("#replay-exit")
    page.locator("#replay-banner").wait_for(state="hidden")
    page.fill("#f-key", "")

    page.locator("#main").evaluate("el => window.scrollTo(0, 0)")
    shot(page, "instance-1280x800")
    shot(page, "instance-1280x800-full", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()  # as a phone opens it: the token is still in this tab's session storage
    page.locator("#diagram svg #node-review_join").wait_for()
    page.locator("#conf-list .confirmation").wait_for()
    page.wait_for_timeout(200)
    box = page.locator("#diagram").bounding_box()
    spot = page.locator("#diagram svg #node-review_join").bounding_box()
    assert box["x"] <= spot["x"] and spot["x"] + spot["width"] <= box["x"] + box["width"], "the join is out of view"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "the page scrolls sideways on a phone"
    shot(page, "instance-390x844")
    shot(page, "instance-390x844-full", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})

    # answer: a reason is required; then one keyboard press on the option
    buttons = card.locator(".options button")
    buttons.filter(has_text="pending_dual_approval").click()
    assert "reason" in card.locator(".error").inner_text().lower()
    assert page.evaluate("document.activeElement.id").startswith("reason-")
    page.keyboard.type("Dual approval: high risk and above 100,000")
    for _ in range(3):  # approved, rejected, pending_dual_approval
        page.keyboard.press("Tab")
    assert "pending_dual_approval" in page.evaluate("document.activeElement.textContent")
    page.keyboard.press("Enter")
    page.locator("#inst-status", has_text="completed").wait_for()
    expect(page.locator("#confirmations")).to_be_hidden()
    resolved = page.locator("#diagram svg .callout.resolved")
    resolved.wait_for()
    assert '"pending_dual_approval" (human)' in resolved.text_content()
    assert "conflict" not in (page.locator("#diagram svg #node-review_join").get_attribute("class") or "")

    decision = page.locator("#tape-list li.event", has_text="human_decision")
    decision.wait_for()
    assert OFFICER in decision.inner_text() and "pending_dual_approval" in decision.inner_text()
    assert "Dual approval" in decision.inner_text()
    shot(page, "instance-completed-1280x800", full_page=True)

    # the answer is on the tape, by the officer, and the instance is completed (through the API)
    tape = server.api("GET", f"/api/instances/{conflict}/tape", params={"kind": "note"})
    decisions = [e for e in tape["events"] if e.get("data", {}).get("note") == "human_decision"]
    assert [(e["actor"], e["data"]["value"]) for e in decisions] == [(OFFICER, "pending_dual_approval")]
    assert server.api("GET", f"/api/instances/{conflict}")["status"] == "completed"

    # every call of the page went to a documented endpoint of the OpenAPI schema
    paths = server.api("GET", "/openapi.json")["paths"]
    patterns = [(m.upper(), re.compile("^" + re.sub(r"\{[^}]+\}", "[^?]+", p) + "(\\?.*)?$"))
                for p, ops in paths.items() for m in ops]
    for call in calls:
        method, url = call.split(" ", 1)
        path = url[len(server.url):]
        assert any(m == method and rx.match(path) for m, rx in patterns), f"undocumented call: {call}"
    page.close()


def test_a_reviewer_completes_a_user_task(server: Server, context: Any) -> None:
    """A user task waiting in a parallel branch is completed in the console: what the task's
    documentation asks is shown, data that is not a JSON object is refused on the page, and
    the submitted object reaches the join and the script after it."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    doc = server.api("POST", "/api/instances", json={"process_id": "parallel_user_task", "data": {"title": "Q3 plan"}})
    assert [w["task_id"] for w in doc["waiting_for"]] == ["review"]
    iid = doc["instance_id"]
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(server.url + "/")
    page.fill("#token", TOKEN)
    page.fill("#user", OFFICER)
    page.click("#login-submit")
    page.locator("#list-view").wait_for(state="visible")
    page.goto(f"{server.url}/#/instances/{iid}")
    card = page.locator("#ut-list .user-task")
    expect(card).to_have_count(1)
    assert "Review the draft" in card.inner_text() and '"approved": true|false' in card.inner_text()
    expect(page.locator("#confirmations")).to_be_hidden()

    area = card.locator("textarea")
    area.fill('["not", "an object"]')
    card.locator("button", has_text="Complete").click()
    expect(card.locator(".error")).to_contain_text("JSON object")
    assert server.api("GET", f"/api/instances/{iid}")["status"] == "waiting"

    area.fill('{"approved": true, "reviewer": "Ann"}')
    card.locator("button", has_text="Complete").click()
    page.locator("#inst-status", has_text="completed").wait_for()
    expect(page.locator("#user-tasks")).to_be_hidden()
    done = server.api("GET", f"/api/instances/{iid}")
    assert done["status"] == "completed"
    assert done["layers"]["L3"]["outcome"] == "published by Ann, cost 120"
    tape = server.api("GET", f"/api/instances/{iid}/tape", params={"kind": "note"})
    given = [e for e in tape["events"] if e.get("data", {}).get("note") == "user_input"]
    assert [(e["actor"], e["data"]["keys"]) for e in given] == [(OFFICER, ["approved", "reviewer"])]
    shot(page, "user-task-completed-1280x800", full_page=True)

    # a cancelled one: its badge, who and why, and nothing to complete
    other = server.api("POST", "/api/instances", json={"process_id": "parallel_user_task", "data": {"title": "Q4"}})
    server.api("POST", f"/api/instances/{other['instance_id']}/cancel", json={"reason": "plan dropped", "user": "Bo"})
    page.goto(f"{server.url}/#/instances/{other['instance_id']}")
    page.locator("#inst-status.status-cancelled", has_text="cancelled").wait_for()
    expect(page.locator("#inst-facts")).to_contain_text("by Bo: plan dropped")
    expect(page.locator("#user-tasks")).to_be_hidden()
    page.close()


def test_a_user_task_form_is_shown_and_checked(tmp_module: Path, context: Any) -> None:
    """A user task whose modeler declared a form (Camunda formData): the console lists its fields
    and starts the data from their defaults; an answer that does not fit the form is refused on
    the page with the field named, and the instance still waits; a fitting one completes it."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    forms = Path(__file__).resolve().parents[1] / "engine" / "fixtures" / "forms"
    with serve(tmp_module, TOKEN, catalog=forms) as server:
        doc = server.api("POST", "/api/instances", json={"process_id": "invoice_approval", "data": {}})
        iid = doc["instance_id"]
        page = context.new_page()
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto(server.url + "/")
        page.fill("#token", TOKEN)
        page.fill("#user", OFFICER)
        page.click("#login-submit")
        page.locator("#list-view").wait_for(state="visible")
        page.goto(f"{server.url}/#/instances/{iid}")
        card = page.locator("#ut-list .user-task")
        expect(card).to_have_count(1)
        fields = card.locator(".form-fields li")
        expect(fields).to_have_count(4)
        assert [fields.nth(i).get_attribute("data-field") for i in range(4)] == \
            ["approved", "amount", "cost_center", "comment"]
        assert "Amount" in fields.nth(1).inner_text() and "required" in fields.nth(1).inner_text()
        assert '"ops" (Operations), "sales" (Sales)' in fields.nth(2).inner_text()
        area = card.locator("textarea")
        assert json.loads(area.input_value()) == {"approved": False, "cost_center": "ops"}

        area.fill('{"approved": true, "amount": "abc"}')
        card.locator("button", has_text="Complete").click()
        expect(card.locator(".error")).to_contain_text("field 'amount'")
        # the refusal reloads the instance and redraws the card with the refused draft, and only then
        # enables Complete again: an answer typed before that redraw would be replaced by the draft
        expect(card.locator("button", has_text="Complete")).to_be_enabled()
        assert server.api("GET", f"/api/instances/{iid}")["status"] == "waiting"

        area.fill('{"approved": true, "amount": 120}')
        card.locator("button", has_text="Complete").click()
        page.locator("#inst-status", has_text="completed").wait_for()
        done = server.api("GET", f"/api/instances/{iid}")
        assert done["layers"]["L3"]["amount"] == 120 and done["layers"]["L3"]["cost_center"] == "ops"
        shot(page, "user-task-form-1280x800", full_page=True)
        page.close()


def test_a_form_starts_from_the_value_the_prescript_set(tmp_module: Path, context: Any) -> None:
    """A field whose key the task's preScript set starts from that value, not from its default:
    completing the form as shown keeps it."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    forms = Path(__file__).resolve().parents[1] / "engine" / "fixtures" / "forms"
    with serve(tmp_module, TOKEN, catalog=forms) as server:
        iid = server.api("POST", "/api/instances", json={"process_id": "cost_center_review", "data": {}})["instance_id"]
        page = context.new_page()
        page.goto(server.url + "/")
        page.fill("#token", TOKEN)
        page.fill("#user", OFFICER)
        page.click("#login-submit")
        page.locator("#list-view").wait_for(state="visible")
        page.goto(f"{server.url}/#/instances/{iid}")
        card = page.locator("#ut-list .user-task")
        expect(card).to_have_count(1)
        area = card.locator("textarea")
        assert json.loads(area.input_value()) == {"cost_center": "sales", "approved": False}
        card.locator("button", has_text="Complete").click()
        page.locator("#inst-status", has_text="completed").wait_for()
        assert server.api("GET", f"/api/instances/{iid}")["layers"]["L3"]["cost_center"] == "sales"
        page.close()
