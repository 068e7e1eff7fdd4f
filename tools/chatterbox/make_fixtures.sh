#!/usr/bin/env bash
# Regenerate the committed Chatterbox fixture (tiny random-weight Turbo + reference dumps).
#
#   tools/chatterbox/make_fixtures.sh
#
# The official-format checkpoint directory goes to target/chatterbox-fixtures/turbo-tiny/ (not
# committed); the converted GGUF files and the reference dumps go to
# tests/fixtures/chatterbox/turbo-tiny/{*.gguf,reference/}. Deterministic: a rerun gives the
# same bytes. Needs the venv described in tools/chatterbox/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=target/chatterbox-venv/bin/python
if [ ! -x "$PY" ]; then
    echo "make_fixtures.sh: $PY is missing; create the venv as tools/chatterbox/README.md shows" >&2
    exit 1
fi

ckpt=target/chatterbox-fixtures/turbo-tiny
out=tests/fixtures/chatterbox/turbo-tiny
rm -rf "$ckpt" "$out"
"$PY" tools/chatterbox/make_fixtures.py --size tiny --out "$ckpt"
"$PY" tools/chatterbox/make_tokenizer.py "$ckpt" --vocab 384
"$PY" tools/chatterbox/convert.py "$ckpt" "$out" --t3-heads 2 --cfm-heads 2
"$PY" tools/chatterbox/check_conversion.py "$ckpt" "$out"
# The official-format files themselves: the native converter's byte-identity test reads them.
mkdir -p "$out/official"
cp "$ckpt"/{added_tokens.json,conds.pt,merges.txt,s3gen_meanflow.safetensors,special_tokens_map.json} "$out/official/"
cp "$ckpt"/{t3_turbo_v1.safetensors,tokenizer_config.json,ve.safetensors,vocab.json} "$out/official/"
mkdir -p "$out/reference"
cp "$ckpt"/*.npy "$ckpt/stages.json" "$out/reference/"
"$PY" tools/chatterbox/text_cases.py "$ckpt" "$out/reference/text_cases.json"
"$PY" tools/chatterbox/pipeline_case.py "$ckpt" "$out/reference/pipeline"
# Voice cloning: the feature extractors, the three encoders and the conditionals, then a
# cloned synthesis end to end.
"$PY" tools/chatterbox/make_cloning_fixtures.py tests/fixtures/chatterbox/cloning/features "$ckpt"
"$PY" tools/chatterbox/cloned_case.py "$ckpt" tests/fixtures/chatterbox/cloning/pipeline

# Multilingual: tiny random-weight Llama T3 + standard S3Gen, with the synthetic grapheme tokenizer
# of tests/fixtures/chatterbox/mtl-text (the official one cannot be downloaded here).
ckpt=target/chatterbox-fixtures/mtl-tiny
out=tests/fixtures/chatterbox/mtl-tiny
rm -rf "$ckpt" "$out"
"$PY" tools/chatterbox/make_mtl_fixtures.py --size tiny --tokenizer tests/fixtures/chatterbox/mtl-text/tokenizer.json --out "$ckpt"
"$PY" tools/chatterbox/convert.py "$ckpt" "$out" --variant mtl --t3-heads 4 --cfm-heads 2 --aligned-heads 2:3,3:1,1:2
# The same S3Gen with its decoder in BF16 (the drift test).
"$PY" tools/chatterbox/convert.py "$ckpt" "$ckpt/bf16-decoder" --variant mtl --t3-heads 4 --cfm-heads 2 --aligned-heads 2:3,3:1,1:2 --decoder-weights bf16
cp "$ckpt/bf16-decoder/s3gen.gguf" "$out/s3gen-bf16-decoder.gguf"
mkdir -p "$out/official"
cp "$ckpt"/{conds.pt,grapheme_mtl_merged_expanded_v1.json,s3gen.pt,t3_mtl23ls_v2.safetensors,ve.pt} "$out/official/"
mkdir -p "$out/reference"
cp "$ckpt"/*.npy "$ckpt/stages.json" "$out/reference/"
cp -r "$ckpt/pipeline" "$out/reference/"

# Cloning from a 44.1 kHz stereo recording (WAV, FLAC, MP3), both variants, then end to end.
"$PY" tools/chatterbox/cloning_parity_case.py tests/fixtures/chatterbox/cloning/recording44k \
    --turbo target/chatterbox-fixtures/turbo-tiny --mtl target/chatterbox-fixtures/mtl-tiny

# Block-causal streaming of S3Gen's flow over the reference tokens (reference/stream/), both variants.
"$PY" tools/chatterbox/stream_reference.py --fixture tests/fixtures/chatterbox/turbo-tiny --variant turbo --first 3 --hop 3
"$PY" tools/chatterbox/stream_reference.py --fixture tests/fixtures/chatterbox/mtl-tiny --variant mtl
# The same with the CFM decoder's attention cut to the prompt's frames plus 6 frames before each block
# (reference/stream-window/).
"$PY" tools/chatterbox/stream_reference.py --fixture tests/fixtures/chatterbox/turbo-tiny --variant turbo --first 3 --hop 3 --window 6
"$PY" tools/chatterbox/stream_reference.py --fixture tests/fixtures/chatterbox/mtl-tiny --variant mtl --first 3 --hop 3 --window 6

"$PY" tools/chatterbox/bad_inputs.py tests/fixtures/chatterbox/turbo-tiny tests/fixtures/chatterbox/mtl-tiny
