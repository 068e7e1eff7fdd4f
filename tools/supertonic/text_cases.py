#!/usr/bin/env python3
"""Write text-frontend golden cases (tests/fixtures/supertonic/text_cases*.json).

For each input: preprocessed + language-wrapped string (v2 rules), ids from an indexer
(the real v2 unicode_indexer.json from ../shared/data/supertonic-v2/, relative to the
repository root, of which only derived ids are written; or, with --gguf, the indexer of a
converted model such as the committed tiny fixture), unsupported characters, and
chunk_text output for max_len 300 and 120 (chunking works on the raw input, as in the
official pipeline).
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import text as textfe  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_INDEXER = "../shared/data/supertonic-v2/unicode_indexer.json"
DEFAULT_OUT = "tests/fixtures/supertonic/text_cases.json"

LONG_EN = (
    "Dr. Smith arrived at 5 p.m. and met Mr. Jones near Main St. in Washington. "
    "They talked about many things, e.g. the budget, the schedule, i.e. the plan for next "
    "year, and the new office on Elm Ave. near the station. Was it a good meeting? "
    "Yes! Prof. Brown from Acme Inc. said it was the best one so far, vs. the last three. "
    "J. R. Tolkien would have liked the story.\n\n"
    "A second paragraph starts here. It is short.\n   \n\n"
    "Third paragraph: the U.S. team, Ph.D. students, and Sr. engineers joined etc. "
    "Everyone left at 9. The end"
)
LONG_KO = (
    "안녕하세요. 오늘은 날씨가 정말 좋습니다. 우리는 공원에 가서 산책을 하고 점심을 먹었습니다. "
    "그 다음에 도서관에 가서 책을 읽었습니다! 정말 즐거운 하루였어요? 네, 그렇습니다. "
    "내일도 좋은 하루가 되기를 바랍니다."
)

CASES = [
    ("emoji", "Hello, world! \U0001F600 How are you? \U0001F680\U0001F1FA\U0001F1F8", "en"),
    ("dingbats_removed", "Sunny \u2600 day \u2702 cut \u2764 love.", "en"),
    ("dashes", "Wait\u2014what? It's 9\u20135, right\u2011now.", "en"),
    ("smart_quotes", "\u201CSmart quotes\u201D and \u2018single\u2019 ones.", "en"),
    ("at_sign", "Email me @ home or at john@example.com", "en"),
    ("eg_ie", "Bring fruit, e.g., apples, i.e., the red ones", "en"),
    ("space_before_punct", "Hello , world ! Really ? Yes ; no : maybe . It 's fine", "en"),
    ("accents_fr", "Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, fran\u00e7ais.", "fr"),
    ("accents_pt", "Ol\u00e1! A can\u00e7\u00e3o \u00e9 \u00f3tima, n\u00e3o \u00e9?", "pt"),
    ("spanish", "\u00a1Hola! \u00bfQu\u00e9 tal? Espa\u00f1ol con \u00f1 y \u00fc.", "es"),
    ("korean", "\uc548\ub155\ud558\uc138\uc694. \ubc18\uac11\uc2b5\ub2c8\ub2e4!", "ko"),
    ("korean_no_punct", "\ub098\ub294 \ud559\uc0dd\uc785\ub2c8\ub2e4", "ko"),
    ("outside_bmp_wraps", "Wrap \U00010041 to A, \U00013000 to ideographic space.", "en"),
    ("unsupported", "Stra\u00dfe \u03a9 \u65e5\u672c and \u00a7 signs.", "en"),
    ("symbols_replaced", "a [b] {c} | d / e # f _ g \u2192 h \u2190 i.", "en"),
    ("deleted_symbols", "I \u2665 it \u2606 \u2661 \u00a9 2024 back\\slash.", "en"),
    ("backtick_acute_macron", "Back`tick, acute\u00b4 and macron\u00af here.", "en"),
    ("whitespace", "  Double  spaces\tand\nnewlines   collapse  ", "en"),
    ("quote_collapse", "He said \"\"hi\"\" and ''bye''.", "en"),
    ("currency", "Prices: \u00a35, \u20ac10, $20 & 50% off!", "en"),
    ("ends_with_quote", "She said 'ok'", "en"),
    ("ends_with_paren", "Ends with a paren (like this)", "en"),
    ("ellipsis", "And then\u2026", "en"),
    ("fullwidth_ligature", "Fullwidth \uff21\uff22\uff23\uff11\uff12\uff13 and \ufb01sh.", "en"),
    ("only_emoji", "\U0001F600\U0001F600", "en"),
    # The official helper's rules where a single pass or Rust's whitespace differ.
    ("quote_runs", "He said \"\"\"hi\"\"\" and ''''bye'''' then ``x``.", "en"),
    ("separators_are_spaces", "one\x1ctwo\x1dthree\x1efour\x1ffive six\x85seven", "en"),
    ("separators_split_chunks", "One two three.\x1fFour five six.\n\x1c\nSeven.", "en"),
    # Characters NFKD leaves behind that an indexer may lack.
    ("emoji_variation_selector", "I \u2764\ufe0f it and \u263a\ufe0f that.", "en"),
    ("non_breaking_hyphen", "A right\u2011now answer.", "en"),
    ("kana_voicing_marks", "\u3067\u3059 \u3071\u3093.", "en"),
    ("nothing_speakable", "\u03a9\u03a9 \u03a9.", "en"),
    ("long_multiparagraph", LONG_EN, "en"),
    ("long_korean", LONG_KO, "ko"),
]


def indexer_from_gguf(path):
    """(indexer table, embedding rows) of a converted model file."""
    import gguf
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    table = [int(v) for v in tensors["text.indexer"].data]
    rows = int(tensors["dp.char_emb"].shape[1])
    return table, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--indexer", default=DEFAULT_INDEXER, help="unicode_indexer.json, relative to the repo root")
    ap.add_argument("--gguf", help="read the indexer from this converted model instead (relative to the repo root)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    a = ap.parse_args()
    if a.gguf:
        indexer, rows = indexer_from_gguf(os.path.join(REPO, a.gguf))
        source = a.gguf
    else:
        with open(os.path.join(REPO, a.indexer)) as f:
            indexer = json.load(f)
        rows = None
        source = a.indexer
    out = []
    for name, inp, lang in CASES:
        prepared = textfe.prepare(inp, lang, "v2")
        ids = [int(i) for i in textfe.text_to_ids(prepared, indexer)]
        uns = textfe.unsupported_chars(prepared, indexer)
        out.append({
            "name": name, "input": inp, "lang": lang, "version": "v2",
            "preprocessed": textfe.preprocess(inp),
            "prepared": prepared,
            "ids": ids,
            "unsupported": uns,
            "unsupported_codepoints": [f"U+{ord(c):04X}" for c in uns],
            "chunks_300": textfe.chunk_text(inp, 300),
            "chunks_120": textfe.chunk_text(inp, 120),
        })
    doc = {
        "description": "Supertonic text frontend cases (v2 rules, the official helper's). ids are the "
                       "official ones: -1 = unsupported, which the ONNX Gather reads as the last "
                       "embedding row (`rows` - 1 when the indexer comes with its model). Code points "
                       "above U+FFFF are wrapped to 16 bits before lookup. Chunks are computed on the "
                       "raw input.",
        "indexer": source,
        "rows": rows,
        "cases": out,
    }
    path = os.path.join(REPO, a.out)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(out)} cases to {a.out}")


if __name__ == "__main__":
    main()
