"""Named Supertonic model configurations used by the random-weight bundle generator
and the NumPy reference.

Five configs:
  tiny-v2, tiny-v3 : small random models with the official latent geometry and
                     style shapes (real voice JSONs load with them).
  tiny-v1          : tiny-v2's layout as the English-only first release
                     (tts_version v1.5.0, split opensource-en): v1 and v2 differ
                     only in the text wrapping and the released sizes.
  v2, v3           : full-size dimensions (v2 = the published tts.json; v3 = v2
                     plus the v3 changes: dilated text-encoder ConvNeXt, VE
                     ConvNeXt inner width 2048, 8x64 text attention, 8322-row
                     vocabulary, CFG inside the vector estimator).

All dimensions used by make_bundle.py and reference.py come from here.
"""
import copy
import math

V2_LANGS = ["en", "ko", "es", "pt", "fr"]
V3_LANGS = ["en", "ko", "ja", "ar", "bg", "cs", "da", "de", "el", "es", "et", "fi", "fr",
            "hi", "hr", "hu", "id", "it", "lt", "lv", "nl", "pl", "pt", "ro", "ru", "sk",
            "sl", "sv", "tr", "uk", "vi", "na"]


def _common():
    return {
        # official geometry (never shrunk)
        "latent_dim": 24,
        "chunk_compress_factor": 6,
        "base_chunk_size": 512,
        "sample_rate": 44100,
        "normalizer_scale": 0.25,
        "n_style": 50,          # style_ttl [1,50,256]
        "style_dim": 256,
        "dp_n_style": 8,        # style_dp [1,8,16]
        "dp_style_dim": 16,
        "split": "opensource-multilingual",
        "ln_eps": 1e-6,
        "bn_eps": 1e-5,
        "rel_window": 4,
        "rotary_base": 10000,
        "rotary_scale": 10,
        "rope_max_positions": 1000,
        "silence_s": 0.3,
    }


def _full_v2():
    c = _common()
    c.update({
        "name": "v2",
        "version": "v2",
        "tts_version": "v1.6.0",
        "te": {"char_dim": 256, "k": 5, "inner": 1024, "dilations": [1] * 6,
               "attn_layers": 4, "attn_heads": 4, "attn_filter": 1024},
        "spte": {"units": 256, "heads": 2},
        "dp": {"char_dim": 64, "k": 5, "inner": 256, "dilations": [1] * 6,
               "attn_layers": 2, "attn_heads": 2, "attn_filter": 256,
               "hidden": 128, "duration_s": 2.0},
        "ve": {"hidden": 512, "time_dim": 64, "time_hidden": 256, "n_blocks": 4,
               "k": 5, "inner": 1024,
               "convnext_0": [1, 2, 4, 8], "convnext_1": [1], "convnext_2": [1],
               "last_convnext": [1, 1, 1, 1],
               "text_heads": 4, "text_units": 256,
               "style_heads": 2, "style_units": 256,
               "cfg": None},
        "voc": {"hidden": 512, "inner": 2048, "dilations": [1, 2, 4, 1, 2, 4, 1, 1, 1, 1],
                "k_init": 7, "k": 7, "head_hidden": 2048, "head_k": 3, "head_out": 512},
        "vocab": {"tiny": False, "hiragana": False, "rows": 163},
        # first number of the anonymous onnx::<Op>_<n> counters, per graph
        "anon": {"te": 3678, "ve": 3095, "voc_conv": 1440, "voc_prelu": 1505},
    })
    return c


def _full_v3():
    c = _full_v2()
    c.update({"name": "v3", "version": "v3", "tts_version": "v1.7.3"})
    c["te"]["dilations"] = [1, 1, 2, 2, 4, 4]
    c["ve"]["inner"] = 2048
    c["ve"]["text_heads"] = 8
    c["ve"]["text_units"] = 512
    c["ve"]["cfg"] = [4.0, 3.0]
    c["vocab"] = {"tiny": False, "hiragana": True, "rows": 8322}
    c["anon"] = {"te": 3680, "ve": 3384, "voc_conv": 1441, "voc_prelu": 1506}
    return c


def _tiny(v3):
    c = _common()
    c.update({
        "name": "tiny-v3" if v3 else "tiny-v2",
        "version": "v3" if v3 else "v2",
        "tts_version": "v1.7.3" if v3 else "v1.6.0",
        "te": {"char_dim": 32, "k": 5, "inner": 64, "dilations": [1, 2] if v3 else [1, 1],
               "attn_layers": 2, "attn_heads": 2, "attn_filter": 64},
        "spte": {"units": 32, "heads": 2},
        # duration_s: exp(predictor bias); kept short for tiny so fixtures stay small
        "dp": {"char_dim": 16, "k": 5, "inner": 32, "dilations": [1, 1],
               "attn_layers": 1, "attn_heads": 2, "attn_filter": 32,
               "hidden": 16, "duration_s": 0.5},
        "ve": {"hidden": 32, "time_dim": 16, "time_hidden": 32, "n_blocks": 2,
               "k": 5, "inner": 64,
               "convnext_0": [1, 2], "convnext_1": [1], "convnext_2": [1],
               "last_convnext": [1, 1],
               "text_heads": 4 if v3 else 2, "text_units": 64 if v3 else 32,
               "style_heads": 2, "style_units": 32,
               "cfg": [4.0, 3.0] if v3 else None},
        "voc": {"hidden": 32, "inner": 64, "dilations": [1, 2, 1, 1],
                "k_init": 7, "k": 7, "head_hidden": 64, "head_k": 3, "head_out": 512},
        "vocab": {"tiny": True, "hiragana": v3, "rows": None},
        "anon": ({"te": 3680, "ve": 3384, "voc_conv": 1441, "voc_prelu": 1506} if v3 else
                 {"te": 3678, "ve": 3095, "voc_conv": 1440, "voc_prelu": 1505}),
    })
    return c


def _tiny_v1():
    c = _tiny(False)
    c.update({"name": "tiny-v1", "version": "v1", "tts_version": "v1.5.0", "split": "opensource-en"})
    return c


_BUILDERS = {
    "tiny-v1": _tiny_v1,
    "tiny-v2": lambda: _tiny(False),
    "tiny-v3": lambda: _tiny(True),
    "v2": _full_v2,
    "v3": _full_v3,
}

CONFIG_NAMES = list(_BUILDERS)


def get_config(name):
    if name not in _BUILDERS:
        raise KeyError(f"unknown config {name!r}; choose one of {CONFIG_NAMES}")
    c = copy.deepcopy(_BUILDERS[name]())
    c["latent_channels"] = c["latent_dim"] * c["chunk_compress_factor"]
    c["frame_samples"] = c["base_chunk_size"] * c["chunk_compress_factor"]
    c["langs"] = {"v1": ["en"], "v3": V3_LANGS}.get(c["version"], V2_LANGS)
    return c


# ---------------------------------------------------------------------------
# synthetic unicode indexer

# characters the text frontend always replaces or removes, plus braces and '~',
# dropped from the full-v2 table so that it has exactly the official 163 rows
# ('/' stays: the closing language tag needs it).
_FULL_DROP = set("#~@[\\]_`|{}")


def indexer_codepoints(cfg):
    """Ordered list of supported code points; code point i of the list gets id i."""
    cps = list(range(0x20, 0x7F))
    cps += list(range(0x300, 0x309)) + [0x327]
    cps += list(range(0x1100, 0x1113)) + list(range(0x1161, 0x1176)) + list(range(0x11A8, 0x11C3))
    cps += [0x20AC]
    if cfg["vocab"]["hiragana"]:
        cps += list(range(0x3041, 0x3097)) + [0x3001, 0x3002]  # hiragana, 、 。
    if not cfg["vocab"]["tiny"]:
        cps = [c for c in cps if chr(c) not in _FULL_DROP]
        want = cfg["vocab"]["rows"] - 1
        cp = 0x4E00  # CJK unified ideographs fill the rest (v3)
        while len(cps) < want:
            cps.append(cp)
            cp += 1
        cps = cps[:want]
    return cps


def build_indexer(cfg):
    table = [-1] * 65536
    for i, cp in enumerate(indexer_codepoints(cfg)):
        table[cp] = i
    return table


def vocab_size(cfg):
    return len(indexer_codepoints(cfg)) + 1


def time_frequencies(time_dim):
    half = time_dim // 2
    return [math.exp(-i * math.log(10000.0) / (half - 1)) for i in range(half)]
