#!/usr/bin/env bash
# Regenerate the committed Supertonic fixtures (tiny random-weight bundles + reference dumps).
#
#   tools/supertonic/make_fixtures.sh
#
# Bundles go to target/supertonic-bundles/<config>/ (not committed); reference dumps go to
# tests/fixtures/supertonic/<config>/reference/ and the text-frontend cases to
# tests/fixtures/supertonic/text_cases.json.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=target/tools-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r tools/supertonic/requirements.txt
fi
PY="$VENV/bin/python"

for cfg in tiny-v2 tiny-v3; do
    bundle="target/supertonic-bundles/$cfg"
    ref="tests/fixtures/supertonic/$cfg/reference"
    rm -rf "$bundle" "$ref"
    "$PY" tools/supertonic/make_bundle.py --config "$cfg" --seed 0 --out "$bundle"
    "$PY" tools/supertonic/convert.py "$bundle" "tests/fixtures/supertonic/$cfg/model.gguf"
    # The bundle's official-format files: the native converter's byte-identity test reads them.
    rm -rf "tests/fixtures/supertonic/$cfg/official"
    mkdir -p "tests/fixtures/supertonic/$cfg/official"
    cp -r "$bundle/onnx" "$bundle/voice_styles" "tests/fixtures/supertonic/$cfg/official/"
    "$PY" tools/supertonic/dump_reference.py --bundle "$bundle" --out "$ref"
done

# tiny-v1: the official-format bundle only; the native converter's test checks
# its conversion against digests of convert.py's output (models/supertonic/tests/convert.rs).
rm -rf target/supertonic-bundles/tiny-v1 tests/fixtures/supertonic/tiny-v1/official
"$PY" tools/supertonic/make_bundle.py --config tiny-v1 --seed 0 --out target/supertonic-bundles/tiny-v1
mkdir -p tests/fixtures/supertonic/tiny-v1/official
cp -r target/supertonic-bundles/tiny-v1/onnx target/supertonic-bundles/tiny-v1/voice_styles tests/fixtures/supertonic/tiny-v1/official/

"$PY" tools/supertonic/text_cases.py --gguf tests/fixtures/supertonic/tiny-v2/model.gguf --out tests/fixtures/supertonic/text_cases_tiny_v2.json
if [ -f ../shared/data/supertonic-v2/unicode_indexer.json ]; then
    "$PY" tools/supertonic/text_cases.py
fi
