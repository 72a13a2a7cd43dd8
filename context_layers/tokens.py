"""Token counting with tiktoken, offline.

tiktoken downloads its encoding files on first use. litellm's wheel ships them
(``litellm/litellm_core_utils/tokenizers/``, named by the SHA-1 of their URL), and
tiktoken reads them when ``TIKTOKEN_CACHE_DIR`` points there. The folder is found
with ``importlib.util.find_spec`` so litellm itself is never imported here (it takes
seconds and 200 MB).

A value's token count is ``len(encoding.encode(canonical_json(value)))``; counts are
cached by canonical text, so recounting a context after one write costs that write.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

from .canonical import canonical_json
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


@functools.cache
def encoding(name: str = DEFAULT_ENCODING) -> Any:
    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizer_dir())
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # a missing file surfaces as a network error
        raise LayerflowError(
            f"cannot load tiktoken encoding {name!r} from {os.environ['TIKTOKEN_CACHE_DIR']}: {exc}; "
            "use cl100k_base, o200k_base or p50k_base (shipped with litellm)") from exc


@functools.lru_cache(maxsize=1 << 16)
def _count(text: str, name: str) -> int:
    return len(encoding(name).encode(text, disallowed_special=()))


def count_text(text: str, name: str = DEFAULT_ENCODING) -> int:
    return _count(text, name)


def count_value(value: Any, name: str = DEFAULT_ENCODING) -> int:
    """Tokens of the canonical JSON rendering of a value."""
    return _count(canonical_json(value), name)


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
