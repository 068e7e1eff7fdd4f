#!/usr/bin/env python3
"""A small GPT-2-style tokenizer for the random-weight fixtures.

The official Turbo tokenizer files (`vocab.json`, `merges.txt`,
`added_tokens.json`) cannot be downloaded here. This writes files of the same
format and kind: a byte-level BPE trained on a fixed text to `--base` tokens,
ending, as GPT-2's does, with `<|endoftext|>` (GPT-2's BOS/EOS/UNK, which the
reference also uses as the pad token), plus paralinguistic tags as added tokens
after it, so that the total equals the fixture T3's text vocabulary.

    make_tokenizer.py OUT_DIR --vocab 384
"""
import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TAGS = ["[clear throat]", "[sigh]", "[shush]", "[cough]", "[groan]", "[sniff]", "[gasp]", "[chuckle]", "[laugh]",
        "[whisper]", "[breath]", "[cry]", "[yawn]", "[hum]", "[scream]", "[singing]", "[music]", "[pause]", "[silence]"]
EOT = "<|endoftext|>"
CORPUS = [
    "Hello, this is a test. The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore; the shells she sells are sea shells, I'm sure.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Peter Piper picked a peck of pickled peppers. Where's the peck of pickled peppers Peter Piper picked?",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
] * 20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, required=True, help="total tokens (BPE + added tags)")
    a = ap.parse_args()
    base = a.vocab - len(TAGS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=base - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    a.out.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(a.out))  # vocab.json, merges.txt
    vocab = json.loads((a.out / "vocab.json").read_text())
    merges = (a.out / "merges.txt").read_text().splitlines()
    # The corpus cannot fill GPT-2's 50257 tokens: extend with two-character merges,
    # at lower priority than the trained ones (a valid BPE, of no linguistic value).
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    pairs = ((x, y) for x in alphabet for y in alphabet)
    while len(vocab) < base - 1:
        x, y = next(pairs)
        if x + y not in vocab:
            merges.append(f"{x} {y}")
            vocab[x + y] = len(vocab)
    vocab[EOT] = base - 1
    (a.out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (a.out / "merges.txt").write_text("\n".join(merges) + "\n")
    (a.out / "added_tokens.json").write_text(json.dumps({t: base + i for i, t in enumerate(TAGS)}, indent=1) + "\n")
    # What AutoTokenizer.from_pretrained reads to pick the class (as in the official directory).
    (a.out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024}, indent=1) + "\n")
    (a.out / "special_tokens_map.json").write_text(json.dumps({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, indent=1) + "\n")
    print(f"{a.out}: {base} BPE tokens (the last {EOT}) + {len(TAGS)} tags")


if __name__ == "__main__":
    main()
