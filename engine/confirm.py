"""Asking a person at the terminal: a confirmation as numbered options with its deadline
counting down, a user task as one JSON object.

The CLI asks only when stdin is a terminal (``stdin_is_terminal``): a pipe, a closed
stdin, ``/dev/null`` or CI never get a prompt, and the instance waits instead (exit
3). The prompt counts down to the confirmation's persisted ``deadline`` (so a resumed
instance does not get a fresh timeout); when it runs out the prompt returns
``TimedOut`` and the engine applies the confirmation's own rule (its default, or an
escalation; see ``engine.gateway_steps.GatewaySteps.time_out``). An escalated confirmation has
no countdown any more: a supervisor answers it, or leaves it waiting.
"""

from __future__ import annotations

import json
import re
import select
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from .runtime import TimedOut

__all__ = ["TerminalPrompt", "stdin_is_terminal", "terminal_text"]


def stdin_is_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default ``sys.stdin``) is an open terminal. A closed or missing
    stdin (``python ... 0<&-`` leaves ``sys.stdin`` None) is not one."""
    stream = sys.stdin if stream is None else stream
    try:
        return bool(stream is not None and not stream.closed and stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def _select_wait(stream: IO[str], seconds: float) -> bool:
    ready, _, _ = select.select([stream], [], [], seconds)
    return bool(ready)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# control characters (terminal escapes, a bare \r, the bell) and bidi overrides: a question a model
# wrote, talked into it by text it read, could otherwise clear or rewrite the lines a person reads
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_text(value: Any) -> str:
    """``value`` as text with each control character shown as its escape (``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))


class TerminalPrompt:
    """The ``ask`` callback of ``Engine.run`` for a person at a terminal.

    ``wait(stream, seconds)`` says whether a line can be read within ``seconds`` (default:
    ``select``); ``clock`` is the engine's clock (deadlines are epoch seconds).
    Returns the chosen option's value, ``TimedOut``, or None to leave the step waiting
    (an empty answer where there is no default, or end of input).
    """

    def __init__(self, stdin: IO[str] | None = None, out: IO[str] | None = None, *,
                 clock: Callable[[], float] = time.time, tick: float = 1.0,
                 wait: Callable[[IO[str], float], bool] | None = None) -> None:
        self.stdin = stdin if stdin is not None else sys.stdin
        self.out = out if out is not None else sys.stderr
        self.clock = clock
        self.tick = tick
        self.wait = wait or _select_wait

    def __call__(self, item: Mapping[str, Any]) -> Any:
        if item.get("kind") == "confirmation":
            return self.confirmation(item)
        if item.get("kind") == "user_task":
            return self.user_task(item)
        return None

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def confirmation(self, item: Mapping[str, Any]) -> Any:
        options = list(item.get("options") or [])
        default = item.get("default")
        takes_default = item.get("on_timeout", "default") == "default" and default is not None
        self._write(f"\n{terminal_text(item.get('message') or item['id'])}\n")
        for n, option in enumerate(options, start=1):
            self._write(f"  {n}. {terminal_text(option.get('label'))}\n")
        deadline: float | None = None
        if item.get("escalated"):
            self._write("  (escalated: nobody answered before the deadline)\n")
        else:
            deadline = float(item["deadline"]) if item.get("deadline") is not None else \
                self.clock() + float(item.get("timeout") or 300)
        on_timeout = f"the default {_show(default)} is taken" if takes_default else "it is escalated"
        if deadline is not None:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deadline))
            self._write(f"  (no answer by {at}: {on_timeout})\n")
        enter = f"[Enter: {_show(default)}] " if default is not None and deadline is not None else \
            "[Enter: leave it waiting] "
        while True:
            if deadline is not None:
                left = deadline - self.clock()
                if left <= 0:
                    self._write(f"\nno answer before the deadline: {on_timeout}\n")
                    return TimedOut(default)
                # \r redraws the countdown in place; short enough not to wrap on a narrow terminal
                self._write(f"\rchoose 1-{len(options)} {enter}{left:4.0f}s left: ")
                if not self.wait(self.stdin, min(self.tick, left)):
                    continue
            else:
                self._write(f"choose 1-{len(options)} {enter}: ")
            line = self.stdin.readline()
            if line == "":  # end of input: nobody is there to answer
                self._write("\n")
                return None
            text = line.strip()
            if not text:
                return default if default is not None and deadline is not None else None
            picked = _pick(options, text)
            if picked is not None:
                return picked["value"]
            self._write(f"please answer with a number from 1 to {len(options)}\n")

    def user_task(self, item: Mapping[str, Any]) -> Any:
        doc = item.get("documentation") or ""
        self._write(f"\nuser task {item.get('task_id')} ({terminal_text(item.get('name') or '')}) {terminal_text(doc)}\n")
        while True:
            self._write("answer as a JSON object (empty: leave it waiting): ")
            line = self.stdin.readline()
            if not line.strip():
                return None
            try:
                value = json.loads(line)
            except ValueError as err:
                self._write(f"not JSON: {err}\n")
                continue
            if isinstance(value, dict):
                return value
            self._write("the answer must be a JSON object\n")


def _pick(options: list[dict[str, Any]], text: str) -> dict[str, Any] | None:
    """The option ``text`` names: its number, its label, or its value (as JSON or plain text)."""
    if text.isdigit():
        n = int(text)
        return options[n - 1] if 1 <= n <= len(options) else None
    for option in options:
        value = option.get("value")
        if text in (option.get("label"), _show(value)) or (isinstance(value, str) and text == value):
            return option
    return None
