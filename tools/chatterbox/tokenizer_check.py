"""The tokenizer rule `convert.py` applies before it writes a T3 file (docs/gguf.md): every id
the tokenizer can produce, through its model's vocabulary or an added token, must be a row of
T3's text embedding. A tokenizer smaller than the embedding is fine (the official package runs
a Multilingual one that is); one with an id past the last row would read outside it. The engine
checks the same rule when it loads the file.
"""

from __future__ import annotations


class TokenizerError(Exception):
    pass


def check_tokenizer_ids(tokenizer_json: str, text_vocab: int) -> int:
    """Returns the largest id `tokenizer_json` (a `tokenizers` JSON) can produce; raises
    TokenizerError when it is not below `text_vocab`, naming the token."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # the tokenizers library raises a plain Exception
        raise TokenizerError(f"the tokenizer JSON does not load: {e}") from e
    ids = tok.get_vocab(with_added_tokens=True)
    if not ids:
        raise TokenizerError("the tokenizer has no tokens")
    token, top = max(ids.items(), key=lambda kv: kv[1])
    if top >= text_vocab:
        raise TokenizerError(f"the tokenizer can produce id {top} ({token!r}), beyond T3's text embedding of "
                             f"{text_vocab} rows (ids 0..{text_vocab - 1})")
    return top
