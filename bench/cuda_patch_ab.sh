#!/usr/bin/env bash
# One CUDA patch's win on one GPU host: the module built without the named
# patch (A), then with it (B), incrementally in the same kit, each loaded by
# the same release build and benchmarked (Multilingual guided batched and
# two-pass, Turbo; F16, 100 tokens). Module A carries the whole series' stamp
# so that the plugin loads it: for this comparison only. Needs what
# `bench/gpu_host.sh` needs carried, and the full-size F16 conversions in
# target/chatterbox-full/gguf-f16 and target/chatterbox-mtl-full/gguf-f16
# (`gpu_host.sh t3` and `mtl` make them).
# Usage: bash bench/cuda_patch_ab.sh PATCH_FILE_NAME [ROUNDS]
set -uo pipefail
patch_file=$(pwd)/backends/cuda/patches/$1
rounds=${2:-2}
[ -f "$patch_file" ] || { echo "no patch $patch_file"; exit 1; }
w=/tmp/tts-gpu; rel=target/release; out=${OUT:-$w/out}
mkdir -p "$w" "$out"
rm -rf "$w/kit" && mkdir -p "$w/kit" && tar -xJf target/gpu/cuda-kit.tar.xz -C "$w/kit" || exit 1
if [ ! -x $rel/tts ] || [ target/gpu/release.tar.xz -nt $rel/tts ]; then tar -xJf target/gpu/release.tar.xz -C target || exit 1; fi
printf '[backend]\nprefer = ["cuda"]\nfallback = false\n' > "$w/cuda.toml"
text="The quick brown fox jumps over the lazy dog near the quiet river bank."
m=target/chatterbox-mtl-full/gguf-f16; g=target/chatterbox-full/gguf-f16
for side in A B; do
  # The kit's sources carry the whole series: A takes the patch back out.
  if [ $side = A ]; then patch -R -s -p1 -d "$w/kit/src" < "$patch_file" || exit 1; else patch -s -p1 -d "$w/kit/src" < "$patch_file" || exit 1; fi
  t0=$(date +%s)
  (cd "$w/kit" && bash build.sh test > "$out/build-$side.log" 2>&1) || { tail -30 "$out/build-$side.log"; exit 1; }
  echo "module $side built in $(( $(date +%s) - t0 )) s"
  cp "$w/kit/out/libggml-cuda.so" "$w/kit/out/libggml-cuda.so.stamp.json" $rel/
  for r in $(seq "$rounds"); do
    for mode in batch two-pass; do
      printf "%s round %s mtl guidance=%s: " $side "$r" $mode
      $rel/tts bench --profile "$w/cuda.toml" --plugin-dir $rel --model $m/t3-mtl.gguf --model $m/s3gen.gguf --text "$text" --runs 3 --warmup 1 \
        --set max_new_tokens=100 --set min_new_tokens=100 --set seed=0 --set guidance=$mode | grep -E "ms_per_token|total" | tr -s ' ' | tr '\n' ' '; echo
    done
    printf "%s round %s turbo: " $side "$r"
    $rel/tts bench --profile "$w/cuda.toml" --plugin-dir $rel --model $g/t3-turbo.gguf --model $g/s3gen-meanflow.gguf --text "$text" --runs 5 --warmup 1 \
      --set max_new_tokens=99 --set min_new_tokens=100 --set seed=0 | grep -E "ms_per_token|total" | tr -s ' ' | tr '\n' ' '; echo
  done
done
