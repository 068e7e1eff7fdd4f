#!/usr/bin/env python3
"""Text-frontend cases for the Rust tokenizer test: the reference's `punc_norm` and the
tokenizer the reference loads (`AutoTokenizer.from_pretrained(ckpt_dir)`) on a set of texts.

Usage: text_cases.py CKPT_DIR OUT_JSON
"""

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from chatterbox.tts_turbo import punc_norm

TEXTS = [
    "",
    "hello world",
    "Hello   there,  how are you?",
    "wait… what: “this” — it’s fine",
    "I laughed [laugh] and then [sigh] sighed.",
    "[clear throat] Ahem. Numbers: 3.14, 42 and 1,000!",
    "  leading and trailing spaces  ",
    "Émilie's café — naïve façade",
    "tabs\tand\nnewlines",
    "[cough][cough] twice",
    "ok ,then",
    "Straße über Ärger",
    "say <|endoftext|> now",
]


def main() -> int:
    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    if tok.pad_token is None:  # as ChatterboxTurboTTS.from_local
        tok.pad_token = tok.eos_token
    cases = []
    for text in TEXTS:
        norm = punc_norm(text)
        ids = tok(norm, padding=True, truncation=True).input_ids
        cases.append({"text": text, "normalized": norm, "ids": ids})
    out.write_text("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
