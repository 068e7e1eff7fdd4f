"""The converter's tokenizer rule: every id the tokenizer can produce is < T3's text vocabulary.

Run from the repository root with the chatterbox venv (tools/chatterbox/README.md):
    target/chatterbox-venv/bin/python -m unittest discover -s tools/chatterbox/tests
The converter-level cases need the `gguf` package that `convert.py` imports; without it they skip.
"""

import json
import sys
import tempfile
import unittest
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
REPO = TOOLS.parent.parent
sys.path.insert(0, str(TOOLS))

from tokenizer_check import TokenizerError, check_tokenizer_ids  # noqa: E402

MTL_TOKENIZER = REPO / "tests/fixtures/chatterbox/mtl-text/tokenizer.json"


def with_added_token(text: str) -> str:
    """`text` with one more added token, not in the model's vocabulary: `tokenizers` gives it the
    next free id (516 here, whatever id the JSON states)."""
    value = json.loads(text)
    value["added_tokens"].append({"id": 516, "content": "[xx]", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    return json.dumps(value)


def with_vocab_id(text: str, token: str, token_id: int) -> str:
    value = json.loads(text)
    value["model"]["vocab"][token] = token_id
    return json.dumps(value)


class TokenizerIds(unittest.TestCase):
    def setUp(self):
        self.text = MTL_TOKENIZER.read_text()

    def test_a_tokenizer_smaller_than_the_vocabulary_passes(self):
        # 516 ids (0..515) for the 2,454 rows of the official Multilingual T3.
        self.assertEqual(check_tokenizer_ids(self.text, 2454), 515)
        self.assertEqual(check_tokenizer_ids(self.text, 516), 515)

    def test_a_vocabulary_id_past_the_last_row_is_refused(self):
        with self.assertRaises(TokenizerError) as e:
            check_tokenizer_ids(self.text, 515)
        self.assertEqual(str(e.exception), "the tokenizer can produce id 515 ('es'), beyond T3's text embedding of 515 rows (ids 0..514)")

    def test_an_added_token_past_the_last_row_is_refused(self):
        self.assertEqual(check_tokenizer_ids(with_added_token(self.text), 517), 516)
        with self.assertRaises(TokenizerError) as e:
            check_tokenizer_ids(with_added_token(self.text), 516)
        self.assertIn("can produce id 516 ('[xx]')", str(e.exception))

    def test_a_sparse_vocabulary_is_judged_by_its_largest_id(self):
        # 516 tokens, but the merge "e s" produces id 2454.
        with self.assertRaises(TokenizerError) as e:
            check_tokenizer_ids(with_vocab_id(self.text, "es", 2454), 2454)
        self.assertIn("can produce id 2454 ('es')", str(e.exception))

    def test_json_that_does_not_load_is_refused(self):
        with self.assertRaises(TokenizerError):
            check_tokenizer_ids("{not json", 10)


class Converter(unittest.TestCase):
    """`convert.py`'s own path: a checkpoint's tokenizer.json is checked before anything is written."""

    def setUp(self):
        try:
            import convert  # noqa: F401
        except ImportError as e:
            self.skipTest(f"convert.py needs {e.name}")
        self.convert = convert

    def test_the_converter_refuses_a_tokenizer_with_ids_past_the_embedding(self):
        with tempfile.TemporaryDirectory() as d:
            ckpt = Path(d)
            (ckpt / "tokenizer.json").write_text(with_added_token(MTL_TOKENIZER.read_text()))
            self.assertIn("[xx]", self.convert.tokenizer_json(ckpt, 2454))
            with self.assertRaises(self.convert.ConversionError) as e:
                self.convert.tokenizer_json(ckpt, 516)
            self.assertIn("tokenizer.json: the tokenizer can produce id 516 ('[xx]')", str(e.exception))


if __name__ == "__main__":
    unittest.main()
