"""Keys are compared exactly, so a key may not be spelt two ways (Unicode NFC only) and may not pass
for the engine's own records and bookkeeping (``activity:``, ``event:``, ``compaction:``, ``summary:``,
``tool:``, ``kb:``, ``_``) while not being one. Refused before anything is written, naming the key and
the character."""

from __future__ import annotations

import unicodedata

import pytest

from context_layers import ContextValueError, Layer, LayeredContext
from context_layers.canonical import key_problem

LOOKALIKES = {
    "\u0430ctivity:risk": "U+0430 CYRILLIC SMALL LETTER A",          # Cyrillic a
    "activ\u200bity:risk": "U+200B ZERO WIDTH SPACE",                  # invisible inside the prefix
    "\uff41ctivity:risk": "U+FF41 FULLWIDTH LATIN SMALL LETTER A",     # full-width
    "\uff3fmergedConflicts": "U+FF3F FULLWIDTH LOW LINE",
    "\u200b_branch_id": "U+200B ZERO WIDTH SPACE",                     # invisible before the low line
    "kb\uff1arisk_rules/x.md#1": "U+FF1A FULLWIDTH COLON",
    "\u0435vent:reply": "U+0435 CYRILLIC SMALL LETTER IE",
    "compacti\u03bfn:3": "U+03BF GREEK SMALL LETTER OMICRON",
    "t\u043e\u043el:lookup": "U+043E CYRILLIC SMALL LETTER O",
    "summary\u02d0x": "U+02D0 MODIFIER LETTER TRIANGULAR COLON",
}


@pytest.mark.parametrize("key", sorted(LOOKALIKES))
def test_a_key_that_passes_for_an_engine_record_is_refused_and_nothing_written(key: str) -> None:
    ctx = LayeredContext(name="main")
    before = len(ctx.tape)
    with pytest.raises(ContextValueError) as refused:
        ctx.write(Layer.WORKING, key, "forged")
    message = str(refused.value)
    assert refused.value.key == key and repr(key) in message and LOOKALIKES[key] in message
    assert "cannot name a context entry" in message and "plain letters" in message
    assert len(ctx.tape) == before and key not in ctx
    with pytest.raises(ContextValueError):  # the privileged path refuses it too: no engine writes such a key
        ctx.apply_changes([(Layer.WORKING, key, 1)], kind="test", actor="engine")
    with pytest.raises(ContextValueError):
        LayeredContext(name="main", process={key: 1})


def test_a_key_in_a_decomposed_spelling_is_refused_with_the_way_to_compose_it() -> None:
    nfd = unicodedata.normalize("NFD", "caf\u00e9_score")
    ctx = LayeredContext(name="main")
    with pytest.raises(ContextValueError) as refused:
        ctx.write(Layer.WORKING, nfd, 1)
    assert "NFC" in str(refused.value) and "U+0301 COMBINING ACUTE ACCENT" in str(refused.value)
    assert nfd not in ctx and len(ctx.tape) == 1  # the init event only
    ctx.write(Layer.WORKING, "caf\u00e9_score", 1)  # the composed spelling is the key
    assert ctx.get("caf\u00e9_score") == 1


@pytest.mark.parametrize("key", ["gr\u00f6\u00dfe", "r\u00e9sum\u00e9_score", "\u00fcber_limit", "\u5ba1\u6279\u72b6\u6001",
                                 "\u0441\u0443\u043c\u043c\u0430", "risk_\u2713", "\u0430ctivity_count", "kb_notes",
                                 "activity_log", "\u03b1lpha:beta", "\U0001f600"])
def test_keys_of_any_script_that_do_not_pass_for_engine_records_are_kept(key: str) -> None:
    """Cyrillic, Greek, CJK or emoji keys are data like any other; a Cyrillic word that only looks
    like a data key (`аctivity_count`) stays allowed: it poses as no record."""
    assert key_problem(key) is None
    ctx = LayeredContext(name="main")
    ctx.write(Layer.WORKING, key, 1)
    assert ctx.get(key) == 1
