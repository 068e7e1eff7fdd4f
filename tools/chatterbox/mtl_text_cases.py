#!/usr/bin/env python3
"""Reference ids for the Multilingual text frontend, on a synthetic tokenizer.

The official grapheme tokenizer (`grapheme_mtl_merged_expanded_v1.json`) cannot
be downloaded here, so this writes a `tokenizers` BPE JSON of the same kind:
`[STOP]` = 0 and `[START]` = 255 as the official one numbers them, `[UNK]`,
`[SPACE]`, the 23 language tags, single graphemes of the scripts the cases use
(lowercase Latin, Greek, Cyrillic, Arabic, Devanagari, Hangul Jamo, combining
marks) and a few merges. It then runs the reference package's own code on a
list of texts: `punc_norm` from `chatterbox/mtl_tts.py` and
`MTLTokenizer.encode` from `chatterbox/models/tokenizers/tokenizer.py`, read
from the installed `chatterbox-tts==0.1.7` (or its wheel) and executed with
stand-ins for `torch` and `huggingface_hub`, which those functions never call.

    python3 tools/chatterbox/mtl_text_cases.py --wheel .whl/chatterbox_tts-0.1.7-py3-none-any.whl \\
        --out tests/fixtures/chatterbox/mtl-text

Needs only the `tokenizers` Python package. Writes `tokenizer.json` and
`cases.json` (text, language, normalised text, token ids; or the language the
engine refuses, with the reference's own output for it recorded anyway).
"""
import argparse
import ast
import json
import os
import sys
import types
import zipfile

LANGUAGES = ["ar", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "it", "ja", "ko", "ms", "nl", "no",
             "pl", "pt", "ru", "sv", "sw", "tr", "zh"]

# Languages whose reference step needs a library the engine does not reproduce.
REFUSED = {"ja", "zh", "he", "ru"}

CASES = [
    ("Hello world, this is a test.", "en"),
    ("hello   world", "en"),
    ("Wait... what: “this” — it’s fine; ok - really", "en"),
    ("ÇA VA? Très bien, merci!", "fr"),
    ("Ñandú, pingüino y cigüeña.", "es"),
    ("Straße und Größe", "de"),
    ("ΟΔΥΣΣΕΥΣ ΚΑΙ ΣΟΦΙΑ", "el"),
    ("İstanbul'da ılık bir gün", "tr"),
    ("مرحبا بالعالم", "ar"),
    ("नमस्ते दुनिया", "hi"),
    ("안녕하세요 세계", "ko"),
    ("  한국어  ", "ko"),
    ("Ｆｕｌｌｗｉｄｔｈ ﬁ ligature ½", "en"),
    ("Hyvää päivää", "fi"),
    ("Cześć, jak się masz?", "pl"),
    ("Olá, São Paulo", "pt"),
    ("Hej då", "sv"),
    ("Habari za asubuhi", "sw"),
    ("Selamat pagi", "ms"),
    ("Goedemorgen", "nl"),
    ("God morgen", "no"),
    ("Buongiorno a tutti", "it"),
    ("Godmorgen", "da"),
    ("Привет, мир", "ru"),
    ("こんにちは世界", "ja"),
    ("你好世界", "zh"),
    ("שלום עולם", "he"),
    ("", "en"),
]


def build_tokenizer():
    from tokenizers import Tokenizer, models

    vocab = {"[STOP]": 0}
    specials = ["[UNK]", "[SPACE]", "[PAD]", "[SEP]", "[CLS]", "[MASK]"] + [f"[{l}]" for l in LANGUAGES]
    chars = []
    chars += [chr(c) for c in range(0x21, 0x7F) if not chr(c).isupper()]         # ASCII, lowercase letters
    chars += [chr(c) for c in range(0x300, 0x370)]                                 # combining diacritics
    chars += [chr(c) for c in range(0x3B1, 0x3CA)]                                 # Greek lowercase, final sigma
    chars += [chr(c) for c in range(0x430, 0x450)]                                 # Cyrillic lowercase
    chars += [chr(c) for c in range(0x621, 0x64B)]                                 # Arabic letters
    chars += [chr(c) for c in range(0x900, 0x97F)]                                 # Devanagari
    chars += [chr(c) for c in range(0x1100, 0x1113)] + [chr(c) for c in range(0x1161, 0x1176)] \
        + [chr(c) for c in range(0x11A8, 0x11C3)]                                   # conjoining Jamo
    chars += ["ı", "ß", "⁄", "¿", "¡"]
    merges = [("t", "h"), ("th", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("e", "s")]
    vocab, next_id = {}, 0
    for item in ["[STOP]"] + specials + chars + [x + y for x, y in merges]:
        if next_id == 255:
            vocab["[START]"], next_id = 255, 256
        if item not in vocab:
            vocab[item], next_id = next_id, next_id + 1
    assert vocab["[START]"] == 255 and vocab["[STOP]"] == 0
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="[UNK]"))
    tok.add_special_tokens(["[STOP]", "[START]"] + specials)
    return tok


def reference_functions(wheel):
    """`punc_norm` and `MTLTokenizer` from the reference package's sources."""
    if wheel:
        z = zipfile.ZipFile(wheel)
        read = lambda p: z.read(p).decode()
    else:
        import importlib.util
        root = os.path.dirname(importlib.util.find_spec("chatterbox").origin)
        read = lambda p: open(os.path.join(os.path.dirname(root), p), encoding="utf-8").read()
    # Stand-ins: the tokenizer module imports these at the top but encode() uses neither.
    for name in ("torch", "huggingface_hub"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.hf_hub_download = None
            sys.modules[name] = stub
    tok_ns = {"__name__": "reference_tokenizer"}
    exec(compile(read("chatterbox/models/tokenizers/tokenizer.py"), "tokenizer.py", "exec"), tok_ns)
    # punc_norm alone: mtl_tts.py imports the whole model stack.
    tree = ast.parse(read("chatterbox/mtl_tts.py"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "punc_norm")
    punc_ns = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "mtl_tts.py", "exec"), punc_ns)
    return punc_ns["punc_norm"], tok_ns["MTLTokenizer"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", help="the chatterbox-tts wheel (default: the installed package)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tok_path = os.path.join(a.out, "tokenizer.json")
    build_tokenizer().save(tok_path)
    punc_norm, MTLTokenizer = reference_functions(a.wheel)
    mtl = MTLTokenizer(tok_path)
    cases = []
    for text, lang in CASES:
        normalised = punc_norm(text)
        ids = [int(i) for i in mtl.encode(normalised, language_id=lang)]
        case = {"text": text, "language": lang, "normalised": normalised, "ids": ids}
        if lang in REFUSED:
            case["refused"] = True
        cases.append(case)
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"languages": LANGUAGES, "sot": 255, "eot": 0, "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(cases)} cases and a tokenizer of {mtl.tokenizer.get_vocab_size()} tokens to {a.out}")


if __name__ == "__main__":
    main()
