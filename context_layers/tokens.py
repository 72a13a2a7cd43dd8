"""Token counting with tiktoken, offline.

tiktoken downloads its encoding files on first use. litellm's wheel ships them
(``litellm/litellm_core_utils/tokenizers/``, named by the SHA-1 of their URL), and
tiktoken reads them when ``TIKTOKEN_CACHE_DIR`` points there (set to that folder unless
the user set it; a user's own folder that lacks one of them has it read from litellm's
folder, never downloaded). The folder is found
with ``importlib.util.find_spec`` so litellm itself is never imported here (it takes
seconds and 200 MB).

A value's token count is ``len(encoding.encode(canonical_json(value)))``; counts are
cached by canonical text, so recounting a context after one write costs that write.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

from .canonical import MEMO_CHARS, Memo, canonical_text
from .errors import LayerflowError

__all__ = ["DEFAULT_ENCODING", "count_text", "count_value", "encoding", "tokenizer_dir", "truncate_to_tokens"]

DEFAULT_ENCODING = "cl100k_base"


def tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise LayerflowError(
            "tiktoken's encoding files are taken from the litellm package, which is not installed; "
            "run `pip install -e .` (litellm is a dependency) or set TIKTOKEN_CACHE_DIR to a folder holding them")
    folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    if not folder.is_dir():
        raise LayerflowError(f"tiktoken encoding folder {folder} is missing from the litellm package; "
                             "reinstall litellm or set TIKTOKEN_CACHE_DIR")
    return folder


# tiktoken caches a download under the SHA-1 of its URL; these are the files litellm's wheel ships
_SHIPPED_FILES = {"cl100k_base": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
                 "o200k_base": "fb374d419588a4632f3f557e76b4b70aebbca790",
                 "p50k_base": "ec7223a39ce59f226a68acc30dc1af2788490e15"}
_ENV_LOCK = threading.Lock()


def _shipped_copy(folder: str, name: str) -> Path | None:
    """litellm's folder, when ``folder`` (the user's own tiktoken cache) lacks encoding ``name``
    and litellm ships it: tiktoken would go to the network for it otherwise."""
    file = _SHIPPED_FILES.get(name)
    if file is None or (Path(folder) / file).is_file():
        return None
    try:
        shipped = tokenizer_dir()
    except LayerflowError:
        return None
    return shipped if (shipped / file).is_file() else None


@functools.cache
def encoding(name: str = DEFAULT_ENCODING) -> Any:
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizer_dir())
    import tiktoken

    folder = os.environ["TIKTOKEN_CACHE_DIR"]
    shipped = _shipped_copy(folder, name)
    try:
        if shipped is None:
            return tiktoken.get_encoding(name)
        # the user's TIKTOKEN_CACHE_DIR stays theirs: litellm's copy is read for this one load,
        # and tiktoken writes nothing into either folder (the file is found, not downloaded)
        with _ENV_LOCK:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(shipped)
            try:
                return tiktoken.get_encoding(name)
            finally:
                os.environ["TIKTOKEN_CACHE_DIR"] = folder
    except Exception as exc:  # a missing file surfaces as a network error
        hint = (f"TIKTOKEN_CACHE_DIR={folder} lacks its file {_SHIPPED_FILES[name]} and litellm's copy cannot be "
                "read; unset TIKTOKEN_CACHE_DIR or copy the file there from litellm/litellm_core_utils/tokenizers/"
                if name in _SHIPPED_FILES else "use cl100k_base, o200k_base or p50k_base (shipped with litellm)")
        raise LayerflowError(f"cannot load tiktoken encoding {name!r} from {folder}: {exc}; {hint}") from exc


# Token counts by text: every instance of a process renders the same system prompt and the same
# records again. Bounded by the characters of its texts as well as by their number, since a worker
# meets new texts (applications, model answers) with every instance it runs.
_COUNTS: Memo[tuple[str, str], int] = Memo(1 << 16, chars=MEMO_CHARS)


def _count(text: str, name: str) -> int:
    slot = (text, name)
    found = _COUNTS.get(slot)
    if found is None:
        found = _COUNTS.put(slot, len(encoding(name).encode(text, disallowed_special=())), chars=len(text))
    return found


def count_text(text: str, name: str = DEFAULT_ENCODING) -> int:
    return _count(text, name)


def count_value(value: Any, name: str = DEFAULT_ENCODING) -> int:
    """Tokens of the canonical JSON rendering of a value (``canonical_text``: a frozen value's text
    is made once)."""
    return _count(canonical_text(value), name)


def truncate_to_tokens(text: str, max_tokens: int, name: str = DEFAULT_ENCODING) -> str:
    """The longest prefix of ``text`` (cut at a token boundary) that has at most ``max_tokens`` tokens."""
    enc = encoding(name)
    ids = enc.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text
    cut: str = enc.decode(ids[:max_tokens])
    # decoding a prefix may re-encode longer (merges across the cut); shrink until it fits
    while cut and len(enc.encode(cut, disallowed_special=())) > max_tokens:
        cut = cut[:-1]
    return cut
