#!/usr/bin/env bash
# Packs what bench/gpu_host.sh needs on a GPU host without Rust into target/gpu/
# (about 30 MiB compressed): the release build with its test binaries, and the
# CUDA module kit. The wheels (.whl/) and the Vulkan loader (.gl/) are fetched
# once, as ../shared/notes/gpu-reference.md and the device notes describe.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build --release --workspace
tests=$(cargo test --release --no-run --message-format=json -p tts-model-chatterbox -p tts-model-supertonic -p engine-core 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("parity", "parity_cuda", "parity_vulkan", "mtl_parity", "cuda_kernels", "vulkan_kernels") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
# A CUDA module brought back earlier stays (gpu_host.sh uses it; the plugin
# checks its stamp); delete target/gpu/cuda-module.tar.xz after changing patches.
find target/gpu -mindepth 1 -maxdepth 1 ! -name cuda-module.tar.xz -exec rm -rf {} + 2>/dev/null || true
mkdir -p target/gpu/stage/release/deps
cp -P target/release/tts target/release/*.so target/release/*.so.* target/gpu/stage/release/
# Shared libraries a bare GPU host lacks (the release archive ships them in lib/
# the same way): the cloning resampler, the MP3 encoder and OpenMP.
for lib in libsoxr.so.0 libmp3lame.so.0 libgomp.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" target/gpu/stage/release/
done
# What gpu_host.sh never loads stays behind: the carried tree has a size limit.
rm -f target/gpu/stage/release/libtts_test_*.so target/gpu/stage/release/*opencl*.so target/gpu/stage/release/*metal*.so \
  target/gpu/stage/release/libtts.so target/gpu/stage/release/lib_tts.so
for t in $tests; do cp "$t" target/gpu/stage/release/deps/; done
strip --strip-unneeded target/gpu/stage/release/deps/* 2>/dev/null || true
# A 64 MiB dictionary (-9) finds the test binaries' shared code: about a third smaller.
XZ_OPT=-9 tar -cJf target/gpu/release.tar.xz -C target/gpu/stage release
cargo xtask module-kit cuda --out target/gpu/stage/cuda-kit >/dev/null
# The kit needs ggml's root and the CUDA backend's sources, not the other backends'.
find target/gpu/stage/cuda-kit/src/src -maxdepth 1 -type d -name 'ggml-*' ! -name ggml-cuda ! -name ggml-cpu -exec rm -rf {} +
tar -cJf target/gpu/cuda-kit.tar.xz -C target/gpu/stage/cuda-kit .
echo "$root" > target/gpu/built_at
rm -rf target/gpu/stage
du -sh target/gpu/*
