#!/usr/bin/env bash
# The CUDA plugin's checks and benchmarks on a GPU host without Rust or network
# (docs/performance.md, "CUDA and Vulkan on the H100"). Run from the repository
# root with what `bench/gpu_pack.sh` made here carried along:
#   target/gpu/release.tar.xz   tts, plugins, ggml modules, test binaries (release)
#   target/gpu/cuda-kit.tar.xz  `cargo xtask module-kit cuda`
#   .whl/                       the Python wheels the reference needs (gpu-reference notes)
#   .gl/                        the Vulkan loader (Debian libvulkan1 and glvnd)
# Usage: bash bench/gpu_host.sh STAGE...  with stages
#   parity      the parity suites on Vulkan and CUDA, and CPU/CUDA/Vulkan compared on the tiny fixtures
#   chatterbox  full-size random Turbo checkpoints, converted; tts (cuda, vulkan) vs PyTorch on the GPU
#   nano        the same for Nano, tts only (the reference package predates Nano)
#   mtl         Multilingual: CPU/CUDA/Vulkan compared on the tiny fixture; a full-size random
#               checkpoint, converted; tts (cuda, vulkan; guidance batched and two-pass) vs PyTorch
#   supertonic  full-size random v2/v3 bundles, converted; tts (cuda, vulkan) vs onnxruntime (CPU),
#               a ~10 s utterance and a two-chunk text
#   soak        50 syntheses of each family in one process on CUDA
#   hift        Turbo with the transposed convolution native or decomposed, CUDA graphs on or off
#   perf        every graph of a Turbo and a Supertonic synthesis, timed per op (patch 0003)
#   stream      time to first audio, streaming on Vulkan (and CUDA if its module was brought or
#               built first): full-size Turbo against PyTorch one-shot on the GPU, Supertonic v2
#               against ORT (needs no CUDA module)
#   stream_cost streamed against one-shot synthesis of the same 150 tokens (full-size Turbo F16) on
#               CUDA and Vulkan: first audio, totals and their ratio, likeness (bench/stream_vs_oneshot.py),
#               S3Gen's blocks beside T3 and between its steps, and each stage's time per run; two
#               warm-up runs, since ggml-cuda captures a graph on its second run and replays it after
#   t3          T3's decode step on CUDA (full-size Turbo F16): graph identities (TTS_GRAPH_UID) and
#               PDL launches (GGML_CUDA_PDL) on and off, with the kernel tests and the CUDA parity suite
#   vk_fusion   the Vulkan fusions of patch 0007 (LayerNorm, GELU in the matrix-vector epilogue): kernel
#               tests, Vulkan parity, full-size Turbo F16 and Supertonic v2/v3 (10 s) with each fusion on
#               and off, CUDA in the same call, and launches per graph from GGML_VK_PERF_LOGGER
#   vk_replay   Vulkan patch 0008's graph replay: kernel tests, Vulkan parity, and full-size Turbo F16,
#               Multilingual F16 (guidance batch) and Supertonic v2/v3 (10 s) with replay on and off,
#               CUDA in the same call (three rounds); Turbo with ggml-vulkan's transposed convolution in HiFT
#   decode_fusion  the decode-step work (Vulkan 0009-0011, CUDA 0010-0012, the Llama T3's shared
#               rotation and K|V write): kernel tests and parity on both (Multilingual's included), then
#               full-size Turbo, Multilingual (guidance batch) and Supertonic v2/v3, four rounds, beside
#               Vulkan's attention reduce as a dispatch (0011 off) and CUDA's mask scan back (0012 off),
#               in alternating order; per-op logs of both backends
#   fa_ab       Vulkan 0011 on and off in alternating order, with environments of one size
#   module      only the CUDA module (every other stage but stream builds it first too)
# Work that takes long (the module, checkpoints) stays in /tmp/tts-gpu while
# the machine does. Results go to $OUT (or /tmp/tts-gpu/out).
set -uo pipefail
root=$(pwd)
work=/tmp/tts-gpu
out=${OUT:-$work/out}
mkdir -p "$work" "$out"
rel=$root/target/release

# Test binaries read their fixtures where they were built.
built_at=$(cat "$root/target/gpu/built_at" 2>/dev/null || echo "$root")
if [ "$built_at" != "$root" ] && [ ! -e "$built_at" ]; then mkdir -p "$(dirname "$built_at")" && ln -s "$root" "$built_at"; fi

# Vulkan loader and the NVIDIA ICD.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

# Python: the reference package and gguf, with a stand-in for the watermarker.
# The wheels may come in a later call than the rest (the carried tree has a size
# limit); the stages that need them fail on the import.
if [ ! -d /tmp/site/chatterbox ] && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  mkdir -p /tmp/site/perth
  printf 'class PerthImplicitWatermarker:\n    def apply_watermark(self, wav, sample_rate):\n        return wav\n' > /tmp/site/perth/__init__.py
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1

# The Rust side.
if [ ! -x "$rel/tts" ] || [ "$root/target/gpu/release.tar.xz" -nt "$rel/tts" ]; then
  mkdir -p "$root/target" && tar -xJf "$root/target/gpu/release.tar.xz" -C "$root/target" || exit 1
fi

# The CUDA module, built once per machine, for the stages that use it.
cuda_module() {
  # A module brought back from an earlier run ($OUT/cuda-module.part-*, joined
  # into target/gpu/cuda-module.tar.xz) skips the build; the plugin still checks
  # its stamp at load and refuses one built from other sources or patches.
  if [ -f "$root/target/gpu/cuda-module.tar.xz" ] && [ ! -f "$work/kit/out/libggml-cuda.so" ]; then
    mkdir -p "$work/kit/out" && tar -xJf "$root/target/gpu/cuda-module.tar.xz" -C "$work/kit/out"
    touch "$work/kit/out/libggml-cuda.so"
  fi
  if [ ! -f "$work/kit/out/libggml-cuda.so" ]; then
    rm -rf "$work/kit" && mkdir -p "$work/kit" && tar -xJf "$root/target/gpu/cuda-kit.tar.xz" -C "$work/kit" || return 1
    local t0=$(date +%s)
    (cd "$work/kit" && bash build.sh test > "$out/cuda-build.log" 2>&1) || { tail -30 "$out/cuda-build.log"; return 1; }
    echo "cuda module built in $(( $(date +%s) - t0 )) s"
    # Files come back from the host in pieces of at most 16 MiB.
    tar -cJf "$work/cuda-module.tar.xz" -C "$work/kit/out" libggml-cuda.so libggml-cuda.so.stamp.json
    split -b 15M "$work/cuda-module.tar.xz" "$out/cuda-module.part-"
  fi
  cp "$work/kit/out/libggml-cuda.so" "$work/kit/out/libggml-cuda.so.stamp.json" "$rel/"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

profile() { # name backend [extra toml]
  printf '[backend]\nprefer = ["%s"]\nfallback = false\n[backends.cpu]\nthreads = 16\n%s' "$2" "${3:-}" > "$work/$1.toml"
}

# Every test binary named $1 (a glob), on backend $2, its output appended to
# $out/$3 and the lines matching $4 shown.
suite() {
  local t
  for t in "$rel"/deps/$1-*; do
    [ -x "$t" ] && LD_LIBRARY_PATH=$rel TTS_REQUIRE_BACKEND=$2 "$t" --nocapture --test-threads 1 2>&1 | tee -a "$out/$3" | grep -E "$4"
  done
}

stage_parity() {
  echo "== devices"
  profile cuda cuda
  "$rel/tts" devices --profile "$work/cuda.toml" --plugin-dir "$rel" 2>&1 | sed -n '/backend cuda/,/backend /p'
  echo "== devices (Vulkan)"
  profile vulkan vulkan
  "$rel/tts" devices --profile "$work/vulkan.toml" --plugin-dir "$rel" 2>&1 | sed -n '/backend vulkan/,/backend /p' | grep -v "^backend [^v]"
  echo "== parity suites on Vulkan"
  suite parity_vulkan vulkan parity-vulkan.log "rel err|agree|test result|panicked|FAILED|skipped"
  echo "== kernel tests on Vulkan"
  suite vulkan_kernels vulkan vk-kernels.log "err|test result|panicked"
  echo "== parity suites on CUDA"
  suite parity_cuda cuda parity.log "rel err|agree|test result|panicked|FAILED|skipped"
  echo "== every Chatterbox stage on CUDA, reported"
  for t in "$rel"/deps/parity-*; do
    [ -x "$t" ] && LD_LIBRARY_PATH=$rel TTS_BACKEND=cuda "$t" report_on_another_conversion --ignored --nocapture 2>&1 | tee -a "$out/parity.log" | grep -E "rel err|agree|test result|panicked"
  done
  echo "== kernel tests on CUDA"
  suite cuda_kernels cuda kernels.log "err|test result|panicked|skipped"
  echo "== tts compare on the tiny fixtures"
  local t3=$root/tests/fixtures/chatterbox/turbo-tiny/t3-turbo.gguf s3=$root/tests/fixtures/chatterbox/turbo-tiny/s3gen-meanflow.gguf
  local st=$root/tests/fixtures/supertonic/tiny-v2/model.gguf text="The quick brown fox jumps over the lazy dog."
  for b in cpu cuda vulkan; do profile "$b" "$b"; done
  for pair in "cpu cuda" "cuda vulkan"; do
    set -- $pair
    "$rel/tts" compare --plugin-dir "$rel" --profile "$work/$1.toml" --profile "$work/$2.toml" --model "$t3" --model "$s3" \
      --set max_new_tokens=40 --text "$text" --runs 3 --json "$out/compare-chatterbox-$1-$2.json" 2>&1 | tail -4
    "$rel/tts" compare --plugin-dir "$rel" --profile "$work/$1.toml" --profile "$work/$2.toml" --model "$st" \
      --text "$text" --runs 3 --json "$out/compare-supertonic-$1-$2.json" 2>&1 | tail -3
  done
  echo "== bad input"
  printf '[backend]\nprefer = ["cuda"]\ndevice = 7\nfallback = false\n' > "$work/dev7.toml"
  "$rel/tts" --profile "$work/dev7.toml" --plugin-dir "$rel" --model "$st" --text "Hi." --out "$work/dev7.wav"; echo "device 7: exit $?"
  printf '[backend]\nprefer = ["cuda"]\nfallback = false\n[policies]\nkv_bf16 = "on"\n' > "$work/bf16.toml"
  "$rel/tts" --profile "$work/bf16.toml" --plugin-dir "$rel" --model "$t3" --model "$s3" --text "Hi." --out "$work/bf16.wav"; echo "forced kv_bf16: exit $?"
}

chatterbox_ckpt() { # dir variant
  [ -f "$1/done" ] && return 0
  python3 tools/chatterbox/make_fixtures.py --size full --variant "$2" --no-dumps --threads 16 --out "$1" > "$out/make-$2.log" 2>&1 || { tail -20 "$out/make-$2.log"; return 1; }
  python3 tools/chatterbox/make_tokenizer.py "$1" --vocab 50276 >> "$out/make-$2.log" 2>&1 || { tail -20 "$out/make-$2.log"; return 1; }
  touch "$1/done"
}

mtl_ckpt() { # dir
  [ -f "$1/done" ] && return 0
  python3 tools/chatterbox/make_mtl_fixtures.py --size full --no-dumps --threads 16 \
    --tokenizer tests/fixtures/chatterbox/mtl-text/tokenizer.json --out "$1" > "$out/make-mtl.log" 2>&1 || { tail -20 "$out/make-mtl.log"; return 1; }
  touch "$1/done"
}

stage_chatterbox() {
  chatterbox_ckpt "$root/target/chatterbox-full" turbo || return 1
  python3 bench/chatterbox_vs_torch.py --device cuda --backends cuda vulkan --threads 16 --weights f16 f32 q8_0 q4_0 \
    --tokens 100 --runs 3 --rounds 2 --markdown "$out/chatterbox.md" 2> "$out/chatterbox.log"
  cat "$out/chatterbox.md" || tail -20 "$out/chatterbox.log"
}

stage_nano() {
  local dir=$root/target/chatterbox-nano
  chatterbox_ckpt "$dir" nano || return 1
  [ -f "$dir/gguf-f32/t3-nano.gguf" ] || python3 tools/chatterbox/convert.py "$dir" "$dir/gguf-f32" --variant nano --weights f32 > /dev/null || return 1
  for b in cuda vulkan; do
    profile "$b" "$b"
    "$rel/tts" bench --profile "$work/$b.toml" --plugin-dir "$rel" --model "$dir"/gguf-f32/t3-*.gguf --model "$dir/gguf-f32/s3gen-meanflow.gguf" \
      --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 3 --warmup 1 \
      --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | tee "$out/nano-$b.txt"
  done
}

stage_mtl() {
  echo "== tts compare on the tiny Multilingual fixture (greedy)"
  local tiny=$root/tests/fixtures/chatterbox/mtl-tiny text="The quick brown fox jumps over the lazy dog."
  for b in cpu cuda vulkan; do profile "$b" "$b"; done
  for pair in "cpu cuda" "cuda vulkan"; do
    set -- $pair
    "$rel/tts" compare --plugin-dir "$rel" --profile "$work/$1.toml" --profile "$work/$2.toml" --model "$tiny/t3-mtl.gguf" \
      --model "$tiny/s3gen.gguf" --set max_new_tokens=40 --set temperature=0 --text "$text" --runs 2 \
      --json "$out/compare-mtl-$1-$2.json" 2>&1 | tail -4
  done
  mtl_ckpt "$root/target/chatterbox-mtl-full" || return 1
  python3 bench/chatterbox_vs_torch.py --variant mtl --device cuda --backends cuda vulkan --threads 16 --weights f16 q4_0 \
    --guidance batch two-pass --tokens 100 --runs 2 --rounds 2 --markdown "$out/mtl.md" 2> "$out/mtl.log"
  cat "$out/mtl.md" || tail -20 "$out/mtl.log"
}

stage_hift() { # the transposed convolution native or decomposed, CUDA graphs on or off
  chatterbox_ckpt "$root/target/chatterbox-full" turbo || return 1
  local g=$root/target/chatterbox-full/gguf-f32
  [ -f "$g/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$root/target/chatterbox-full" "$g" --weights f32 > /dev/null || return 1
  profile native cuda
  profile decomposed cuda $'[policies]\nconv_transpose_1d = "off"\n'
  for graphs in on off; do
    for p in native decomposed; do
      echo "== conv_transpose_1d $p, CUDA graphs $graphs"
      ( [ $graphs = off ] && export GGML_CUDA_DISABLE_GRAPHS=1
        "$rel/tts" bench --profile "$work/$p.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
          --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 3 --warmup 1 \
          --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | grep -E "ms_per_token|s3gen|hift|total" )
    done
  done
}

stage_perf() { # the per-op timing log (patch 0003): every graph of a Turbo and a Supertonic synthesis, grouped
  chatterbox_ckpt "$root/target/chatterbox-full" turbo || return 1
  local g=$root/target/chatterbox-full/gguf-f16
  [ -f "$g/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$root/target/chatterbox-full" "$g" --weights f16 > /dev/null || return 1
  profile cuda cuda
  echo "== Turbo, 100 tokens, graphs on (wall) then logged"
  "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
    --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 3 --warmup 1 \
    --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | grep -vE "^\s*$"
  GGML_CUDA_PERF_LOGGER=1 "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
    --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 2 --warmup 1 \
    --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 > "$out/perf-chatterbox.txt" 2> "$out/perf-chatterbox.log"
  python3 bench/perf_summary.py "$out/perf-chatterbox.log" --top 10
  echo "== Supertonic v2, the 10 s utterance, graphs on (wall) then logged"
  local st=$root/target/supertonic-models/v2-d10.5-f32.gguf
  [ -f "$st" ] || python3 bench/supertonic_vs_ort.py --versions v2 --backends cuda --runs 1 --rounds 1 --threads 16 --duration 10.5 > /dev/null 2>&1
  local text10="$(cat bench/utterance_10s.txt)"
  "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$st" --text "$text10" --runs 3 --warmup 1 | grep -vE "^\s*$"
  GGML_CUDA_PERF_LOGGER=1 "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$st" --text "$text10" \
    --runs 2 --warmup 1 > "$out/perf-supertonic.txt" 2> "$out/perf-supertonic.log"
  python3 bench/perf_summary.py "$out/perf-supertonic.log" --top 10
}

stage_supertonic() {
  # The targets' case: one ~10 s utterance (one chunk; the random duration
  # predictor set to say 10.5 s, 10 s at speed 1.05), then the two-chunk long text.
  python3 bench/supertonic_vs_ort.py --versions v2 v3 --threads 16 --backends cuda vulkan --runs 5 --rounds 2 \
    --text "$(cat bench/utterance_10s.txt)" --duration 10.5 --markdown "$out/supertonic-10s.md" 2> "$out/supertonic-10s.log"
  cat "$out/supertonic-10s.md" || tail -20 "$out/supertonic-10s.log"
  python3 bench/supertonic_vs_ort.py --versions v2 v3 --threads 16 --backends cuda vulkan --runs 5 --rounds 2 \
    --text "$(cat bench/long_text.txt)" --markdown "$out/supertonic.md" 2> "$out/supertonic.log"
  cat "$out/supertonic.md" || tail -20 "$out/supertonic.log"
}

stage_soak() {
  chatterbox_ckpt "$root/target/chatterbox-full" turbo || return 1
  [ -f "$root/target/supertonic-models/v2-f32.gguf" ] || python3 bench/supertonic_vs_ort.py --versions v2 --backends cuda --runs 1 --rounds 1 --threads 16 > /dev/null 2>&1
  profile cuda cuda
  local g=$root/target/chatterbox-full/gguf-f32
  [ -f "$g/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$root/target/chatterbox-full" "$g" --weights f32 > /dev/null || return 1
  "$rel/tts" soak --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
    --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 50 --warmup 5 --set seed=0 \
    --set max_new_tokens=300 | tee "$out/soak-chatterbox.txt"
  "$rel/tts" soak --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$root/target/supertonic-models/v2-f32.gguf" \
    --text "$(cat bench/long_text.txt)" --runs 50 --warmup 5 | tee "$out/soak-supertonic.txt"
}

stage_module() { :; }

stage_t3() { # T3's decode step on CUDA: graph identities and PDL launches on and off, kernel and parity checks
  echo "== kernel tests and parity on CUDA"
  for name in cuda_kernels parity_cuda; do
    suite $name cuda t3-checks.log "test result|panicked|FAILED|skipped"
  done
  chatterbox_ckpt "$root/target/chatterbox-full" turbo || return 1
  local g=$root/target/chatterbox-full/gguf-f16
  [ -f "$g/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$root/target/chatterbox-full" "$g" --weights f16 > /dev/null || return 1
  profile cuda cuda
  for round in 1 2; do
    for v in "uid=1 pdl=1" "uid=0 pdl=1" "uid=1 pdl=0" "uid=0 pdl=0"; do
      set -- $v
      echo "== round $round: graph $1, $2"
      ( export TTS_GRAPH_UID=${1#uid=} GGML_CUDA_PDL=${2#pdl=}
        "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
          --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 5 --warmup 1 \
          --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | grep -E "ms_per_token|t3\.|s3gen|hift|total" )
    done
  done
  echo "== launches per op (graphs off while logging)"
  GGML_CUDA_PERF_LOGGER=1 "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
    --text "The quick brown fox jumps over the lazy dog near the quiet river bank." --runs 1 --warmup 0 \
    --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 > "$out/perf-t3.txt" 2> "$out/perf-t3.log"
  python3 bench/perf_summary.py "$out/perf-t3.log" --top 12
}

stage_stream() {
  chatterbox_ckpt "$root/target/chatterbox-full" turbo || return 1
  local backends=vulkan
  if [ -f "$root/target/gpu/cuda-module.tar.xz" ] || [ -f "$work/kit/out/libggml-cuda.so" ]; then
    cuda_module && backends="cuda vulkan"
  fi
  local text="The quick brown fox jumps over the lazy dog near the quiet river bank while the sun sets behind hills."
  python3 bench/chatterbox_vs_torch.py --device cuda --backends $backends --threads 16 --weights q4_0 --tokens 150 --stream \
    --runs 3 --rounds 2 --text "$text" --markdown "$out/stream-chatterbox.md" 2> "$out/stream-chatterbox.log"
  cat "$out/stream-chatterbox.md" || tail -20 "$out/stream-chatterbox.log"
  python3 bench/supertonic_stream.py --backends $backends --threads 16 --runs 5 --rounds 3 \
    --markdown "$out/stream-supertonic.md" 2> "$out/stream-supertonic.log"
  cat "$out/stream-supertonic.md" || tail -20 "$out/stream-supertonic.log"
}

stage_vk_fusion() { # Vulkan patch 0007's fusions: kernel tests, parity, launches and wall time with each on and off
  echo "== kernel tests on Vulkan"
  suite vulkan_kernels vulkan vk-kernels.log "err|test result|panicked"
  echo "== parity suites on Vulkan"
  suite parity_vulkan vulkan parity-vulkan.log "rel err|agree|test result|panicked|FAILED|skipped"
  local dir=$root/target/chatterbox-full
  chatterbox_ckpt "$dir" turbo || return 1
  local g=$dir/gguf-f16
  [ -f "$g/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$dir" "$g" --weights f16 > /dev/null || return 1
  [ -f "$root/target/supertonic-models/v3-d10.5-f32.gguf" ] ||
    python3 bench/supertonic_vs_ort.py --versions v2 v3 --backends vulkan --runs 1 --rounds 1 --threads 16 --duration 10.5 > "$out/st-make.log" 2>&1
  profile cuda cuda
  profile vulkan vulkan
  local text="The quick brown fox jumps over the lazy dog near the quiet river bank." text10="$(cat bench/utterance_10s.txt)"
  # fusions: "norm gelu", each on or off (GGML_VK_DISABLE_NORM_FUSION, GGML_VK_DISABLE_MAT_VEC_GELU_FUSION)
  fused() { [ "$1" = off ] && export GGML_VK_DISABLE_NORM_FUSION=1; [ "$2" = off ] && export GGML_VK_DISABLE_MAT_VEC_GELU_FUSION=1; }
  for round in 1 2; do
    for v in "on on" "off off" "on off" "off on"; do
      echo "== round $round: Vulkan, LayerNorm fusion / GELU epilogue: $v"
      ( fused $v
        "$rel/tts" bench --profile "$work/vulkan.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
          --text "$text" --runs 5 --warmup 1 --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | grep -E "ms_per_token|s3gen|hift|total"
        for v3 in v2 v3; do
          "$rel/tts" bench --profile "$work/vulkan.toml" --plugin-dir "$rel" --model "$root/target/supertonic-models/$v3-d10.5-f32.gguf" \
            --text "$text10" --runs 5 --warmup 1 | grep -E "total" | sed "s/^/supertonic $v3 /"
        done )
    done
    echo "== round $round: CUDA"
    "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
      --text "$text" --runs 5 --warmup 1 --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | grep -E "ms_per_token|s3gen|hift|total"
    for v3 in v2 v3; do
      "$rel/tts" bench --profile "$work/cuda.toml" --plugin-dir "$rel" --model "$root/target/supertonic-models/$v3-d10.5-f32.gguf" \
        --text "$text10" --runs 5 --warmup 1 | grep -E "total" | sed "s/^/supertonic $v3 /"
    done
  done
  for v in "on on" "off off"; do
    echo "== Vulkan launches per graph, fusions $v (GGML_VK_PERF_LOGGER: a timestamp and a barrier around each dispatch)"
    ( fused $v
      GGML_VK_PERF_LOGGER=1 "$rel/tts" bench --profile "$work/vulkan.toml" --plugin-dir "$rel" --model "$g/t3-turbo.gguf" --model "$g/s3gen-meanflow.gguf" \
        --text "$text" --runs 1 --warmup 0 --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 > /dev/null 2> "$out/vk-perf-${v// /-}.log" )
    python3 bench/perf_summary.py "$out/vk-perf-${v// /-}.log" --top 6
  done
}

# Full-size Turbo and Multilingual (F16) and Supertonic v2/v3 (10 s), made
# once per machine, and the profiles and bench commands the decode-step
# stages share.
decode_bench_prepare() {
  turbo=$root/target/chatterbox-full mtl=$root/target/chatterbox-mtl-full
  chatterbox_ckpt "$turbo" turbo || return 1
  [ -f "$turbo/gguf-f16/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$turbo" "$turbo/gguf-f16" --weights f16 > /dev/null || return 1
  mtl_ckpt "$mtl" || return 1
  [ -f "$mtl/gguf-f16/t3-mtl.gguf" ] || python3 tools/chatterbox/convert.py "$mtl" "$mtl/gguf-f16" --variant mtl --weights f16 > /dev/null || return 1
  [ -f "$root/target/supertonic-models/v3-d10.5-f32.gguf" ] ||
    python3 bench/supertonic_vs_ort.py --versions v2 v3 --backends vulkan --runs 1 --rounds 1 --threads 16 --duration 10.5 > "$out/st-make.log" 2>&1
  profile cuda cuda
  profile vulkan vulkan
  text="The quick brown fox jumps over the lazy dog near the quiet river bank." text10="$(cat bench/utterance_10s.txt)"
}
bench_turbo() { # profile runs warmup
  "$rel/tts" bench --profile "$work/$1.toml" --plugin-dir "$rel" --model "$turbo/gguf-f16/t3-turbo.gguf" --model "$turbo/gguf-f16/s3gen-meanflow.gguf" \
    --text "$text" --runs "$2" --warmup "$3" --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0
}
bench_mtl() { # profile runs warmup
  "$rel/tts" bench --profile "$work/$1.toml" --plugin-dir "$rel" --model "$mtl/gguf-f16/t3-mtl.gguf" --model "$mtl/gguf-f16/s3gen.gguf" \
    --text "$text" --runs "$2" --warmup "$3" --set max_new_tokens=100 --set min_new_tokens=100 --set seed=0 --set guidance=batch
}
stages() { grep -E "ms_per_token|s3gen|hift|total" | sed "s/^/$1 /"; }
bench_all() { # profile: Turbo, Multilingual, Supertonic v2 and v3
  bench_turbo "$1" 5 1 | stages turbo
  bench_mtl "$1" 4 1 | stages mtl
  for v in v2 v3; do
    "$rel/tts" bench --profile "$work/$1.toml" --plugin-dir "$rel" --model "$root/target/supertonic-models/$v-d10.5-f32.gguf" \
      --text "$text10" --runs 5 --warmup 1 | grep -E "total" | sed "s/^/supertonic $v /"
  done
}

stage_vk_replay() { # Vulkan patch 0008: recorded graphs resubmitted, on and off (GGML_VK_DISABLE_GRAPH_REPLAY), CUDA beside
  echo "== kernel tests on Vulkan"
  suite vulkan_kernels vulkan vk-kernels.log "err|test result|panicked"
  echo "== parity suites on Vulkan"
  suite parity_vulkan vulkan parity-vulkan.log "rel err|agree|test result|panicked|FAILED|skipped"
  decode_bench_prepare || return 1
  profile vulkan-native-ct vulkan $'[policies]\nconv_transpose_1d = "on"\n'
  for round in 1 2 3; do
    echo "== round $round: Vulkan, graph replay on"
    bench_all vulkan
    echo "== round $round: Vulkan, graph replay on, ggml-vulkan's CONV_TRANSPOSE_1D in HiFT (auto decomposes it)"
    bench_turbo vulkan-native-ct 5 1 | stages turbo
    echo "== round $round: Vulkan, graph replay off"
    ( export GGML_VK_DISABLE_GRAPH_REPLAY=1; bench_all vulkan )
    echo "== round $round: CUDA"
    bench_all cuda
  done
  echo "== Vulkan per-op times (GGML_VK_PERF_LOGGER: a timestamp and a barrier around each dispatch, no replay)"
  for model in turbo mtl; do
    GGML_VK_PERF_LOGGER=1 "bench_$model" vulkan 1 0 > /dev/null 2> "$out/vk-perf-$model.log"
    python3 bench/perf_summary.py "$out/vk-perf-$model.log" --top 10
  done
}

stage_decode_fusion() { # fewer decode-step launches on both backends, CUDA beside
  echo "== kernel tests on Vulkan and CUDA"
  suite vulkan_kernels vulkan vk-kernels.log "err|test result|panicked"
  suite cuda_kernels cuda kernels.log "err|test result|panicked|skipped"
  echo "== parity suites on Vulkan and CUDA"
  suite parity_vulkan vulkan parity-vulkan.log "rel err|agree|test result|panicked|FAILED|skipped"
  suite parity_cuda cuda parity.log "rel err|agree|test result|panicked|FAILED|skipped"
  echo "== Multilingual parity on the CPU, Vulkan and CUDA"
  suite mtl_parity cuda mtl-parity.log "rel err|test result|panicked|FAILED|skipped"
  decode_bench_prepare || return 1
  # Each patch's "off" run goes before its "on" run in even rounds and after it
  # in odd ones, so that the order of the runs does not pass for the patch.
  vk_on() { echo "== round $round: Vulkan"; bench_all vulkan; }
  vk_off() {
    echo "== round $round: Vulkan, attention splits reduced by a dispatch (patch 0011 off)"
    ( export GGML_VK_DISABLE_FA_FUSED_REDUCE=1; bench_turbo vulkan 5 1 | stages turbo; bench_mtl vulkan 4 1 | stages mtl )
  }
  cuda_on() { echo "== round $round: CUDA"; bench_all cuda; }
  cuda_off() {
    echo "== round $round: CUDA, Multilingual with the broadcast mask scanned (patch 0012 off)"
    ( export GGML_CUDA_FA_SCAN_BROADCAST_MASK=1; bench_mtl cuda 4 1 | stages mtl )
  }
  for round in 1 2 3 4; do
    if (( round % 2 )); then vk_on; vk_off; cuda_on; cuda_off; else vk_off; vk_on; cuda_off; cuda_on; fi
  done
  echo "== per-op times, Vulkan (GGML_VK_PERF_LOGGER) and CUDA (GGML_CUDA_PERF_LOGGER)"
  local model
  for model in turbo mtl; do
    GGML_VK_PERF_LOGGER=1 "bench_$model" vulkan 1 0 > /dev/null 2> "$out/vk-perf-$model.log"
    python3 bench/perf_summary.py "$out/vk-perf-$model.log" --top 12
    GGML_CUDA_PERF_LOGGER=1 "bench_$model" cuda 1 0 > /dev/null 2> "$out/cuda-perf-$model.log"
    python3 bench/perf_summary.py "$out/cuda-perf-$model.log" --top 12
  done
}

stage_fa_ab() { # Vulkan 0011 on and off, each run's environment of one size, alternating
  # Exporting the switch alone slowed HiFT, which no patch touches, by up to
  # 9 % in decode_fusion's "off" runs: here the "on" runs carry a placebo
  # variable as long as the switch, so the environments differ only in name.
  decode_bench_prepare || return 1
  local round v
  for round in 1 2 3 4; do
    for v in $( (( round % 2 )) && echo "on off" || echo "off on" ); do
      echo "== round $round: Vulkan, attention splits reduced in the last workgroup (0011) $v"
      if [ $v = on ]; then
        ( export GGML_VK_PLACEBO_ENV_OF_THE_SAME=1; bench_turbo vulkan 5 1 | stages turbo; bench_mtl vulkan 4 1 | stages mtl )
      else
        ( export GGML_VK_DISABLE_FA_FUSED_REDUCE=1; bench_turbo vulkan 5 1 | stages turbo; bench_mtl vulkan 4 1 | stages mtl )
      fi
    done
  done
}

stage_stream_cost() {
  local dir=$root/target/chatterbox-full
  chatterbox_ckpt "$dir" turbo || return 1
  [ -f "$dir/gguf-f16/t3-turbo.gguf" ] || python3 tools/chatterbox/convert.py "$dir" "$dir/gguf-f16" --weights f16 > /dev/null || return 1
  for b in cuda vulkan; do
    echo "== $b"
    python3 bench/stream_vs_oneshot.py --model "$dir/gguf-f16/t3-turbo.gguf" --model "$dir/gguf-f16/s3gen-meanflow.gguf" --backend $b --threads 16 \
      --set min_new_tokens=150 --set max_new_tokens=149 --set seed=0 --warmup 2 --runs 3 \
      --config "" --config "stream_beside_t3=false" --config "stream_cfm_steps=2" --config "stream_first_tokens=5" \
      --markdown "$out/stream-cost-$b.md" 2> "$out/stream-cost-$b.log"
    cat "$out/stream-cost-$b.md" || tail -20 "$out/stream-cost-$b.log"
  done
}

for s in "$@"; do
  echo "=== $s"
  start=$(date +%s)
  case $s in stream|fa_ab) ;; *) cuda_module || exit 1 ;; esac
  "stage_$s"
  echo "=== $s: $(( $(date +%s) - start )) s"
done
