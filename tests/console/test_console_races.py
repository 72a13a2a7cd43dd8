"""The console's two load races, made to happen: a response the page asked for is held back
(Playwright's request routing) until the user has acted, then delivered late.

1. A periodic refresh of the instance is in flight when an answer is refused (the refusal is
   on the tape: a new version). The refresh then lands with the version from before the
   refusal; the page must not submit the next answer with it (a stale version is refused).
2. The instance's context is still loading when the user picks a tape event; the late
   current context must not paint over the context replayed at that event.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_helpers import Server, chromium, serve

from engine.cli import LOAN_SCENARIOS

pytestmark = pytest.mark.slow

TOKEN = "console-races-token-9d3e"
WAIT = 15_000  # ms
FORMS = Path(__file__).resolve().parents[1] / "engine" / "fixtures" / "forms"


class Held:
    """Holds back the first response to a request ``match`` accepts once ``armed``: it is
    fetched from the server when the page asks (so it holds what the server had then) and
    delivered only on ``release()``."""

    def __init__(self, page: Any, match: Any) -> None:
        self.page, self.armed, self.route, self.response = page, False, None, None
        page.route(match, self._handle)

    def _handle(self, route: Any) -> None:
        if not self.armed or self.route is not None:
            route.continue_()
            return
        self.route, self.response = route, route.fetch()

    def wait(self, ms: int) -> None:
        for _ in range(ms // 50):
            if self.route is not None:
                return
            self.page.wait_for_timeout(50)
        raise AssertionError(f"the page sent no matching request within {ms} ms")

    def release(self) -> None:
        assert self.route is not None
        self.route.fulfill(response=self.response)
        self.armed = False


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-races")


@pytest.fixture(scope="module")
def context(tmp_module: Path) -> Iterator[Any]:
    with chromium(tmp_module, default_timeout=WAIT) as ctx:
        yield ctx


def sign_in(page: Any, server: Server) -> None:
    page.goto(server.url + "/")
    page.fill("#token", TOKEN)
    page.fill("#user", "Ann Officer")
    page.click("#login-submit")
    page.locator("#list-view").wait_for(state="visible")


def test_a_refresh_in_flight_at_a_refusal_does_not_leave_a_stale_version(tmp_module: Path, context: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    with serve(tmp_module, TOKEN, catalog=FORMS) as server:
        iid = server.api("POST", "/api/instances", json={"process_id": "invoice_approval", "data": {}})["instance_id"]
        page = context.new_page()
        sign_in(page, server)
        page.goto(f"{server.url}/#/instances/{iid}")
        card = page.locator("#ut-list .user-task")
        expect(card).to_have_count(1)
        version = server.api("GET", f"/api/instances/{iid}")["version"]

        # the next periodic refresh (every 5 s) is held with what the server has now
        refresh = Held(page, f"**/api/instances/{iid}")
        refresh.armed = True
        refresh.wait(8_000)
        page.uncheck("#inst-auto")  # no later refresh comes to put things right

        card.locator("textarea").fill('{"approved": true, "amount": "abc"}')
        card.locator("button", has_text="Complete").click()
        expect(card.locator(".error")).to_contain_text("field 'amount'")
        assert server.api("GET", f"/api/instances/{iid}")["version"] > version  # the refusal is on the tape
        refresh.release()  # the refresh lands with the version from before the refusal

        card = page.locator("#ut-list .user-task")
        card.locator("textarea").fill('{"approved": true, "amount": 120}')
        card.locator("button", has_text="Complete").click()
        page.locator("#inst-status", has_text="completed").wait_for()
        assert "changed meanwhile" not in page.locator("#ut-list").inner_text()
        assert server.api("GET", f"/api/instances/{iid}")["status"] == "completed"
        page.close()


def test_a_late_context_load_does_not_paint_over_a_picked_replay(tmp_module: Path, context: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    with serve(tmp_module, TOKEN) as server:
        doc = server.api("POST", "/api/instances", json={"process_id": "loan_approval",
                                                         "data": LOAN_SCENARIOS["conflict"], "user": "e2e"})
        iid = doc["instance_id"]
        assert doc["status"] == "waiting" and "risk_level" in doc["layers"]["L3"]
        page = context.new_page()
        sign_in(page, server)

        # the current context (a replay with no `until`) is held while the page opens
        current = Held(page, lambda url: "/replay?" in url and "until=" not in url)
        current.armed = True
        page.goto(f"{server.url}/#/instances/{iid}")
        current.wait(WAIT)

        # the first tape event: the instance's start, before any activity wrote risk_level
        first = page.locator('#tape-list li.event button[data-context="main"][data-seq="1"]')
        first.click()
        page.locator("#replay-banner").wait_for(state="visible")
        banner = page.locator("#replay-text").inner_text()
        seq = first.get_attribute("data-seq")
        assert f"after #{seq} " in banner, banner
        tables = page.locator("#layer-tables")
        expect(tables.locator("details.layer").first).to_be_visible()
        assert "risk_level" not in tables.inner_text()

        with page.expect_response(lambda r: "/replay?" in r.url and "until=" not in r.url):
            current.release()
        page.wait_for_timeout(300)  # the page handles the late response
        assert page.locator("#replay-text").inner_text() == banner
        assert page.locator("#replay-banner").is_visible()
        assert "risk_level" not in tables.inner_text(), "the late current context painted over the replay"
        page.close()
