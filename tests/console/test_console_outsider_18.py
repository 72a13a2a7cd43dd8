"""Outsider round 18 on the web console: a reviewer's day in a real browser.

Written from DESIGN.md, the README's console section and issues #8/#9 only. The process
(``unseen18/review18.bpmn``) has two reviewers in parallel whose verdicts carry HTML, a join
that asks a person (options, a default, a timeout), a user task and a compressing step. A
second catalog process, ``review18_quick``, is the same with a one-second timeout.

Expected, as a user reads the docs:
- a wrong token shows an error and no data; before signing in, the page holds no instance
  data and makes no data call; the token never goes to the URL or to local storage;
- the list shows new instances and status changes without a reload;
- the instance page shows what REST returns: tokens per layer, keys, the conflict's branch
  values, the attention scores, the tape's length, the compressions;
- a decision answered in the page (keyboard only) resolves it: the tape's human_decision
  names the person who signed in, ``_mergedConflicts`` holds the resolution; a second answer
  from a stale page, and an answer after the timeout settled it, are refused with a message
  the user sees;
- values holding ``<script>`` or ``"><img onerror>`` are text, never markup or code;
- an instance that completes or is cancelled while its page is open is shown as such, and
  its stale decision card cannot change it.
"""

from __future__ import annotations

import re
import shutil
import time
from datetime import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import local_http
import pytest
from console_helpers import Server, chromium, serve

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "unseen18"
TOKEN = "cn18-token-9f3e1c"
SECRET = "sk-cn18-never-shown-without-token"
USER = "Zoë <b>Reviewer</b>"
APPLICANT = '"><img src=x onerror="window.__xss18=\'start\'">'
WAIT = 15_000  # ms: the longest any single step may take


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-outsider-18")


@pytest.fixture(scope="module")
def catalog(tmp_module: Path) -> Path:
    cat = tmp_module / "catalog18"
    cat.mkdir()
    for f in HERE.iterdir():
        shutil.copy(f, cat / f.name)
    bpmn = (HERE / "review18.bpmn").read_text()
    (cat / "review18_quick.bpmn").write_text(
        bpmn.replace('id="review18"', 'id="review18_quick"').replace('"review18_defs"', '"review18q_defs"'))
    config = (HERE / "review18.layerflow.yaml").read_text()
    assert "timeout: 600" in config
    (cat / "review18_quick.layerflow.yaml").write_text(config.replace("timeout: 600", "timeout: 1"))
    return cat


@pytest.fixture(scope="module")
def browser(tmp_module: Path) -> Iterator[Any]:
    with chromium(tmp_module, default_timeout=WAIT) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def server(tmp_module: Path, catalog: Path, browser: Any) -> Iterator[Server]:
    with serve(tmp_module, TOKEN, catalog=catalog) as s:
        yield s


def start(server: Server, process_id: str = "review18") -> str:
    doc = server.api("POST", "/api/instances", json={"process_id": process_id, "data": {"applicant": APPLICANT}})
    assert doc["status"] == "waiting", doc
    assert [w["id"] for w in doc["waiting_for"]] == ["join/verdict"]
    return str(doc["instance_id"])


class Watched:
    """A page that records dialogs, page errors and the API calls it makes."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.calls: list[tuple[str, str, str | None]] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.calls.append((r.method, r.url, r.headers.get("authorization")))
                     if "/api/" in r.url else None)

    def sign_in(self, server: Server, token: str = TOKEN, user: str = USER) -> None:
        self.page.goto(server.url + "/")
        self.page.get_by_label("API token").fill(token)
        self.page.get_by_label("Your name").fill(user)
        self.page.get_by_role("button", name="Sign in").click()

    def open_instance(self, server: Server, iid: str) -> None:
        self.page.goto(f"{server.url}/#/instances/{iid}")
        self.page.locator("#inst-title").filter(has_text=iid).wait_for()
        until(lambda: self.page.locator("#inst-status").inner_text().strip(), "the instance's status")
        self.page.locator("#tape-list li, #tape-list [data-seq]").first.wait_for()

    def assert_clean(self) -> None:
        """No script from the data ran: no dialog, no page error, no marker set, no injected element."""
        assert self.dialogs == []
        assert self.errors == []
        assert self.page.evaluate("window.__xss18") is None
        assert self.page.locator("img[src='x'], img[onerror]").count() == 0
        assert self.page.locator("main script, main b, main i").count() == 0

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    w = Watched(browser)
    yield w
    w.close()


def refusal(page: Any, pattern: str) -> str:
    """The refusal the user sees after a click, once the page has settled (reloaded, redrawn)."""
    message = page.locator("[role=alert]:visible, [role=status]:visible").filter(has_text=re.compile(pattern, re.I))
    message.first.wait_for()
    page.wait_for_load_state("networkidle")
    assert message.first.is_visible(), "the refusal stays on screen after the page reloaded the instance"
    return str(message.first.inner_text())


def until(check: Any, what: str, seconds: float = 15) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


# --- sign in -------------------------------------------------------------------------------

def test_a_wrong_token_is_refused_visibly_and_shows_no_data(server: Server, watched: Watched) -> None:
    iid = start(server)
    raw = local_http.get(server.url + "/", timeout=10).text  # the page as served, without a token
    assert iid not in raw and SECRET not in raw and TOKEN not in raw
    assert local_http.get(server.url + "/api/instances", timeout=10).status_code == 401

    watched.sign_in(server, token="not-the-token")
    error = watched.page.locator("#login-error")
    error.wait_for(state="visible")
    assert error.inner_text().strip(), "the refusal says something"
    assert watched.page.get_by_label("API token").is_visible()
    html = watched.page.content()
    assert iid not in html and SECRET not in html and "review18" not in html
    assert watched.page.evaluate("JSON.stringify(window.localStorage)") == "{}"
    # every data call it made was refused; none carried the token in the URL
    assert all("not-the-token" not in url for _, url, _ in watched.calls)


def test_the_token_goes_in_a_header_to_this_server_only(server: Server, watched: Watched) -> None:
    iid = start(server)
    watched.sign_in(server)
    watched.page.locator("#list-view").wait_for(state="visible")
    watched.page.get_by_role("cell", name="review18").first.wait_for()
    assert watched.calls, "the list came from the API"
    for _, url, auth in watched.calls:
        assert url.startswith(server.url + "/api/")
        assert TOKEN not in url
        if not url.endswith("/api/health"):
            assert auth == f"Bearer {TOKEN}"
    assert TOKEN not in watched.page.url
    assert watched.page.evaluate("JSON.stringify(window.localStorage)") == "{}"
    watched.assert_clean()
    # signing out forgets the token and takes the data off the page
    watched.page.get_by_role("button", name="Sign out").click()
    watched.page.get_by_label("API token").wait_for()
    assert TOKEN not in watched.page.evaluate("JSON.stringify(window.sessionStorage)")
    assert iid not in watched.page.locator("body").inner_text()


# --- the list ------------------------------------------------------------------------------

def test_the_list_shows_new_instances_and_status_changes_without_a_reload(server: Server,
                                                                         watched: Watched) -> None:
    first = start(server)
    watched.sign_in(server)
    rows = watched.page.locator("#list-view tbody tr")
    row = rows.filter(has_text=first)
    row.wait_for()
    assert "waiting" in row.inner_text().lower()
    doc = server.api("GET", f"/api/instances/{first}")
    assert str(doc["tokens"]["total"]) in row.inner_text()
    assert "join/verdict" in row.inner_text()

    second = start(server)  # from this process, while the page is open
    rows.filter(has_text=second).wait_for()
    server.api("POST", f"/api/instances/{first}/cancel", json={"reason": "duplicate <script>x</script>"})
    until(lambda: "cancelled" in rows.filter(has_text=first).inner_text().lower(), "the cancelled status")

    watched.page.get_by_label("Status").select_option("cancelled")
    until(lambda: rows.filter(has_text=second).count() == 0 and rows.filter(has_text=first).count() == 1,
          "the status filter")
    watched.assert_clean()


# --- the instance page against REST --------------------------------------------------------

def test_the_instance_page_shows_what_rest_returns(server: Server, watched: Watched) -> None:
    iid = start(server)
    doc = server.api("GET", f"/api/instances/{iid}")
    tape = server.api("GET", f"/api/instances/{iid}/tape")
    inspect = server.api("POST", "/api/context-governance/inspect", json={"instance_id": iid})
    watched.sign_in(server)
    watched.open_instance(server, iid)
    page = watched.page
    assert page.locator("#inst-status").inner_text().strip().lower() == doc["status"]

    bars = page.locator("#layer-bars")
    for n in range(6):
        layer = f"L{n}"
        bars.get_by_role("img", name=f"{layer}: {doc['tokens'][layer]} tokens", exact=True).wait_for()
    assert str(doc["tokens"]["total"]) in page.locator("#inst-facts").inner_text()

    page.locator("#layer-tables").get_by_text("applicant", exact=True).wait_for()
    tables = page.locator("#layer-tables").inner_text()
    for n in (1, 3):
        for key, value in doc["layers"][f"L{n}"].items():
            assert key in tables
            if isinstance(value, str):
                assert value[:20] in tables, (key, value)

    conflict = doc["conflicts"][0]
    page.locator("#conflicts .conflict-line").first.wait_for()  # drawn after the diagram's own fetch
    shown = page.locator("#conflicts").inner_text()
    assert conflict["key"] in shown
    for branch, value in conflict["values"].items():
        assert f'{branch} = "' in shown and value.replace('"', '\\"') in shown

    card = page.locator("#conf-list article", has_text="join/verdict")
    (confirmation,) = doc["confirmations"]
    assert [b.inner_text() for b in card.get_by_role("button").all()] == [o["label"] for o in confirmation["options"]]
    assert '"hold"' in card.locator(".deadline").inner_text()

    history = inspect["L3"]["attention_score"]
    for name, value in history.items():
        label = page.locator("#attention").get_by_role("img", name=re.compile(rf"^{name} "))
        assert label.get_attribute("aria-label").startswith(f"{name} {value:.2f}"), name

    until(lambda: f"{tape['count']} of {tape['count']}" in page.locator("#tape-count").inner_text(),
          "the tape count")
    watched.assert_clean()


def test_replaying_a_tape_event_shows_the_context_rest_replays(server: Server, watched: Watched) -> None:
    iid = start(server)
    events = server.api("GET", f"/api/instances/{iid}/tape?kind=write")["events"]
    title_write = next(e for e in events if any(c[1] == "title" for c in e.get("changes", [])))
    rest = server.api("GET", f"/api/instances/{iid}/replay?context=main&until={title_write['seq']}")
    watched.sign_in(server)
    watched.open_instance(server, iid)
    page = watched.page
    page.locator("#f-kind").select_option("write")
    page.locator("#tape-list").get_by_text(f"#{title_write['seq']}", exact=True).first.click()
    page.locator("#replay-banner").wait_for(state="visible")
    assert [k["key"] for k in rest["layers"]["L4"]["keys"]] == ["title"]
    tables = page.locator("#layer-tables")
    until(lambda: "notes" not in tables.inner_text(), "the context as it was at the event")  # notes came later
    assert "<script>window.__xss18 = 'title'</script>Q3" in tables.inner_text()
    assert str(title_write["seq"]) in page.locator("#replay-banner").inner_text()
    watched.assert_clean()


# --- answering --------------------------------------------------------------------------------

def tab_to(page: Any, is_it: str, what: str, limit: int) -> None:
    """Press Tab until ``is_it`` (a JS predicate on the focused element) holds."""
    for _ in range(limit + 1):
        if page.evaluate(f"(el => !!el && ({is_it}))(document.activeElement)"):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"{what} is not reachable with Tab within {limit} presses")


def answer_with_keyboard(page: Any, option_label_part: str, reason: str) -> None:
    """From the top of the page: Tab to the "a decision waits" link, Enter, Tab to the reason,
    type it, Tab to the option, Enter. No mouse."""
    page.reload()  # the focus starts at the top of the page
    page.locator("#decision-alert-link").wait_for()
    tab_to(page, "el.id === 'decision-alert-link'", "the link to the waiting decision", 40)
    page.keyboard.press("Enter")
    tab_to(page, "el.tagName === 'TEXTAREA' && el.closest('#conf-list')", "the reason box", 5)
    page.keyboard.type(reason)
    tab_to(page, f"el.tagName === 'BUTTON' && el.innerText.includes({option_label_part!r})",
           f"the option {option_label_part!r}", 10)
    page.keyboard.press("Enter")


def test_answering_with_the_keyboard_resolves_it_and_names_the_person(server: Server, browser: Any,
                                                                     watched: Watched) -> None:
    iid = start(server)
    stale = Watched(browser)  # a colleague who opened the same decision before
    try:
        stale.sign_in(server, user="Colleague")
        stale.open_instance(server, iid)
        stale.page.locator("#inst-auto").uncheck()

        watched.sign_in(server)
        watched.open_instance(server, iid)
        answer_with_keyboard(watched.page, "Escalate", "Board must <script>see</script> it")
        # (while the answer is being applied the instance runs and waits for nothing yet)
        until(lambda: [w["kind"] for w in server.api("GET", f"/api/instances/{iid}")["waiting_for"]][:1] == ["user_task"],
              "the decision to be taken")
        doc = server.api("GET", f"/api/instances/{iid}")
        merged = doc["layers"]["L4"].get("_mergedConflicts") or doc["layers"]["L3"]["_mergedConflicts"]
        assert merged[-1]["key"] == "verdict"
        assert merged[-1]["resolution"]["value"] == "escalate"
        assert merged[-1]["resolution"]["resolver"] == "human"
        assert "Board must <script>see</script> it" in merged[-1]["resolution"]["reason"]
        (decision,) = [e for e in server.api("GET", f"/api/instances/{iid}/tape")["events"]
                       if (e.get("data") or {}).get("note") == "human_decision"]
        assert decision["actor"] == USER
        assert decision["data"]["value"] == "escalate"
        # the page shows it answered and now asks for the sign-off
        watched.page.locator("#user-tasks").wait_for(state="visible")
        until(lambda: watched.page.locator("#conf-list article:visible").count() == 0, "the answered card to go")
        assert watched.page.locator("#whoami").inner_text() == USER

        # the colleague's stale card: a second answer is refused, visibly, and changes nothing
        card = stale.page.locator("#conf-list article").first
        card.get_by_label("Reason (recorded on the tape)").fill("I think otherwise")
        card.get_by_role("button", name=re.compile("hold")).click()
        error = refusal(stale.page, "already")
        assert USER in error and "escalate" in error, error
        assert "answer again" not in error  # there is nothing left to answer
        after = server.api("GET", f"/api/instances/{iid}")
        assert after["version"] == doc["version"]
        watched.assert_clean()
        stale.assert_clean()
    finally:
        stale.close()


def test_an_answer_after_the_timeout_settled_it_is_refused_visibly(server: Server, watched: Watched) -> None:
    iid = start(server, "review18_quick")
    watched.sign_in(server)
    watched.open_instance(server, iid)
    watched.page.locator("#inst-auto").uncheck()
    card = watched.page.locator("#conf-list article").first
    card.wait_for()
    # the timeout runs out; a resume that brings no answer applies it (as a worker or `timers --fire`)
    due = server.api("GET", f"/api/instances/{iid}")["waiting_for"][0]["due"]
    until(lambda: time.time() > datetime.fromisoformat(due).timestamp(), "the timeout", seconds=10)
    settled = server.api("POST", f"/api/instances/{iid}/resume", json={})
    assert settled["waiting_for"][0]["task_id"] == "sign_off"
    (confirmation,) = settled["confirmations"]
    assert confirmation["timed_out"] is True and confirmation["answer"] == "hold"

    card.get_by_label("Reason (recorded on the tape)").fill("late, sorry")
    card.get_by_role("button", name=re.compile("from reviewer_a")).click()
    error = refusal(watched.page, "already")
    assert "timeout" in error and "hold" in error, error
    assert "answer again" not in error
    after = server.api("GET", f"/api/instances/{iid}")
    assert after["version"] == settled["version"]
    assert after["confirmations"][0]["answer"] == "hold"
    watched.assert_clean()


def test_a_cancelled_instance_is_shown_cancelled_and_its_open_card_refuses(server: Server,
                                                                         watched: Watched) -> None:
    iid = start(server)
    watched.sign_in(server)
    watched.open_instance(server, iid)
    page = watched.page
    page.locator("#conf-list article").first.wait_for()
    server.api("POST", f"/api/instances/{iid}/cancel", json={"reason": "withdrawn"})
    # the page refreshes by itself and says it
    until(lambda: page.locator("#inst-status").inner_text().strip().lower() == "cancelled", "the cancelled badge")
    cards = page.locator("#conf-list article:visible")
    if cards.count():  # a card still shown must not let anyone answer a cancelled instance
        cards.first.get_by_label("Reason (recorded on the tape)").fill("too late")
        cards.first.get_by_role("button").first.click()
        refusal(page, "cancel")
    assert server.api("GET", f"/api/instances/{iid}")["status"] == "cancelled"
    watched.assert_clean()


def test_an_instance_completing_while_open_shows_completed_and_its_compression(server: Server,
                                                                            watched: Watched) -> None:
    iid = start(server)
    server.api("POST", "/api/confirmations/join/verdict", json={"value": "hold", "instance_id": iid})
    watched.sign_in(server)
    watched.open_instance(server, iid)
    page = watched.page
    page.locator("#user-tasks").wait_for(state="visible")
    done = server.api("POST", f"/api/instances/{iid}/user-tasks/sign_off", json={"data": {"signed": True}})
    assert done["status"] == "completed"
    until(lambda: page.locator("#inst-status").inner_text().strip().lower() == "completed", "the completed badge")
    until(lambda: page.locator("#user-tasks").is_hidden(), "the user task to go")
    (compression,) = done["compressions"]
    shown = page.locator("#compressions").inner_text()
    assert compression["activity_id"] in shown
    assert str(compression["tokens_before"]) in shown and str(compression["tokens_after"]) in shown
    page.locator("#layer-bars").get_by_role("img", name=f"L3: {done['tokens']['L3']} tokens", exact=True).wait_for()
    watched.assert_clean()


@pytest.mark.parametrize("settle", ["person", "timeout"])
def test_a_late_answer_from_a_stale_client_is_told_it_was_answered(server: Server, settle: str) -> None:
    """The version a client read before the decision was taken is stale by then; what it is told
    is the fact that matters to it: the decision is taken, by whom (README: a second answer gets
    409 ``already_answered`` naming the first), not "load it again and repeat the change"."""
    iid = start(server, "review18" if settle == "person" else "review18_quick")
    seen = server.api("GET", f"/api/instances/{iid}")["version"]
    if settle == "person":
        server.api("POST", "/api/confirmations/join/verdict",
                   json={"value": "hold", "instance_id": iid, "user": "First Person", "expected_version": seen})
    else:
        due = server.api("GET", f"/api/instances/{iid}")["waiting_for"][0]["due"]
        until(lambda: time.time() > datetime.fromisoformat(due).timestamp(), "the timeout", seconds=10)
        assert server.api("POST", f"/api/instances/{iid}/resume", json={})["confirmations"][0]["timed_out"]
    r = local_http.post(f"{server.url}/api/confirmations/join/verdict", headers={"Authorization": f"Bearer {TOKEN}"},
                   json={"value": "escalate", "instance_id": iid, "user": "Second", "expected_version": seen},
                   timeout=30)
    assert r.status_code == 409
    error = r.json()["error"]
    assert error["kind"] == "already_answered", error
    assert ("First Person" if settle == "person" else "timeout") in error["message"]


def test_the_answer_it_below_link_keeps_the_instance_open(server: Server, watched: Watched) -> None:
    """"Answer it below" takes the user to the decision of this instance, not away from it."""
    iid = start(server)
    watched.sign_in(server)
    watched.open_instance(server, iid)
    page = watched.page
    page.get_by_role("link", name="Answer it below").click()
    page.wait_for_load_state("networkidle")
    assert page.locator("#instance-view").is_visible(), "the instance page is still shown"
    assert page.locator("#list-view").is_hidden()
    assert page.url.endswith(f"#/instances/{iid}")
    assert page.get_by_label("Reason (recorded on the tape)").is_visible()
    assert page.evaluate("document.activeElement.closest('#confirmations') !== null"), "focus moved to the decision"
    page.get_by_role("link", name="Skip to content").focus()
    page.keyboard.press("Enter")
    assert page.url.endswith(f"#/instances/{iid}") and page.locator("#instance-view").is_visible()
    assert page.evaluate("document.activeElement.id") == "main"
