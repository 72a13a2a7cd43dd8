"""The six context layers and their write rules."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Layer"]


class Layer(IntEnum):
    """L0 SYSTEM .. L5 EPHEMERAL. Reads resolve from L0 to L5: the first hit wins."""

    SYSTEM = 0
    PROCESS = 1
    KNOWLEDGE = 2
    HISTORY = 3
    WORKING = 4
    EPHEMERAL = 5

    def __str__(self) -> str:
        return f"L{int(self)}"

    @classmethod
    def _missing_(cls, value: object) -> "Layer | None":
        """``Layer("L4")`` and ``Layer("WORKING")`` as ``Layer(4)``."""
        if isinstance(value, str):
            text = value.strip()
            if text.upper().startswith("L") and text[1:].isdigit():
                number = int(text[1:])
                return cls(number) if 0 <= number <= 5 else None
            return cls.__members__.get(text.upper())
        return None

    @classmethod
    def parse(cls, value: "Layer | int | str") -> "Layer":
        """Accept ``Layer.WORKING``, ``4``, ``"L4"``, ``"WORKING"`` or ``"working"``."""
        if isinstance(value, Layer):
            return value
        try:
            if isinstance(value, int):
                return cls(value)
            text = str(value).strip()
            if text.upper().startswith("L") and text[1:].isdigit():
                return cls(int(text[1:]))
            return cls[text.upper()]
        except (KeyError, ValueError):
            raise ValueError(f"unknown layer {value!r}; use L0..L5 or SYSTEM, PROCESS, KNOWLEDGE, HISTORY, WORKING, EPHEMERAL") from None
