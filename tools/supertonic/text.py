"""Supertonic text frontend (normalisation, language wrap, indexing, chunking).

Written from the behaviour description in the project notes (docs of the
official helper): NFKD -> emoji removal -> symbol replacement -> deletions ->
expansions -> no space before punctuation -> quote collapsing -> whitespace
collapse -> trailing '.' rule -> language wrap -> indexer lookup.
"""
import re
import unicodedata

import numpy as np

from configs import V2_LANGS, V3_LANGS

_EMOJI_RE = re.compile(
    "["
    "\U0001F600-\U0001F64F"
    "\U0001F300-\U0001F5FF"
    "\U0001F680-\U0001F6FF"
    "\U0001F700-\U0001F77F"
    "\U0001F780-\U0001F7FF"
    "\U0001F800-\U0001F8FF"
    "\U0001F900-\U0001F9FF"
    "\U0001FA00-\U0001FA6F"
    "\U0001FA70-\U0001FAFF"
    "\u2600-\u26FF"
    "\u2700-\u27BF"
    "\U0001F1E6-\U0001F1FF"
    "]+",
    flags=re.UNICODE,
)

# symbol -> replacement (applied character by character, in this order)
_REPLACE = [
    ("\u2013", "-"), ("\u2011", "-"), ("\u2014", "-"),
    ("_", " "), ("[", " "), ("]", " "), ("|", " "), ("/", " "), ("#", " "),
    ("\u2192", " "), ("\u2190", " "),
    ("\u201C", '"'), ("\u201D", '"'),
    ("\u2018", "'"), ("\u2019", "'"), ("\u00B4", "'"), ("`", "'"),
    ("\u00AF", " "),
]
_DELETE = ["\u2665", "\u2606", "\u2661", "\u00A9", "\\"]
_EXPAND = [("@", " at "), ("e.g.,", "for example, "), ("i.e.,", "that is, ")]
_NO_SPACE_BEFORE = [",", ".", "!", "?", ";", ":", "'"]
_END_CHARS = ".!?;:,'\")]}\u2026\u3002\u300D\u300F\u3011\u3009\u300B\u203A\u00BB"


def preprocess(text):
    """Normalise raw text (no language wrap)."""
    text = unicodedata.normalize("NFKD", text)
    text = _EMOJI_RE.sub("", text)
    for a, b in _REPLACE:
        text = text.replace(a, b)
    for a in _DELETE:
        text = text.replace(a, "")
    for a, b in _EXPAND:
        text = text.replace(a, b)
    for p in _NO_SPACE_BEFORE:
        text = text.replace(" " + p, p)
    # The official loops: a run of any length collapses to one.
    for pair, single in (('""', '"'), ("''", "'"), ("``", "`")):
        while pair in text:
            text = text.replace(pair, single)
    text = re.sub(r"\s+", " ", text).strip()
    if not text or text[-1] not in _END_CHARS:
        text += "."
    return text


def languages(version):
    if version == "v1":
        return ["en"]
    return list(V3_LANGS if version == "v3" else V2_LANGS)


def wrap_lang(text, lang, version):
    if version == "v1":
        return text
    if lang not in languages(version):
        raise ValueError(f"language {lang!r} not supported by {version}: {languages(version)}")
    return f"<{lang}>{text}</{lang}>"


def prepare(text, lang, version):
    """preprocess + language wrap."""
    return wrap_lang(preprocess(text), lang, version)


def codepoints_u16(text):
    """ord() of every character, wrapped to uint16 like the official cast."""
    return np.array([ord(c) & 0xFFFF for c in text], dtype=np.uint16)


def text_to_ids(text, indexer):
    """Index an already prepared string. indexer: list/array of 65536 ints."""
    ix = np.asarray(indexer, dtype=np.int64)
    return ix[codepoints_u16(text).astype(np.int64)]


def batch_ids(texts, indexer):
    """Zero-padded int64 [B,T] ids and float32 [B,1,T] mask."""
    ids = [text_to_ids(t, indexer) for t in texts]
    T = max(len(i) for i in ids)
    out = np.zeros((len(ids), T), dtype=np.int64)
    mask = np.zeros((len(ids), 1, T), dtype=np.float32)
    for b, i in enumerate(ids):
        out[b, :len(i)] = i
        mask[b, 0, :len(i)] = 1.0
    return out, mask


def unsupported_chars(text, indexer):
    """Distinct characters of `text` whose (uint16-wrapped) code point maps to -1, in order."""
    seen = []
    for c in text:
        if indexer[ord(c) & 0xFFFF] < 0 and c not in seen:
            seen.append(c)
    return seen


_ABBREV = ["Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "Sr.", "Jr.", "Ph.D.", "etc.", "e.g.",
           "i.e.", "vs.", "Inc.", "Ltd.", "Co.", "Corp.", "St.", "Ave.", "Blvd."]
_SENT_RE = re.compile(
    "".join(f"(?<!{re.escape(a)})" for a in _ABBREV) + r"(?<!\b[A-Z]\.)(?<=[.!?])\s+"
)


def chunk_text(text, max_len=300):
    """Paragraph split, sentence split (abbreviation aware), greedy packing."""
    chunks = []
    for para in re.split(r"\n\s*\n+", text.strip()):
        para = para.strip()
        if not para:
            continue
        current = ""
        for sent in _SENT_RE.split(para):
            sent = sent.strip()
            if not sent:
                continue
            if not current:
                current = sent
            elif len(current) + 1 + len(sent) <= max_len:
                current = current + " " + sent
            else:
                chunks.append(current)
                current = sent
        if current:
            chunks.append(current)
    return chunks


def chunk_len(lang, version):
    if lang == "ko" or (version == "v3" and lang == "ja"):
        return 120
    return 300
