//! Kernel tests for the Vulkan plugin's fusions (`backends/vulkan/patches/`,
//! 0007): each fused chain on the models' shapes, against the CPU plugin on the
//! same inputs and against the unfused dispatches on the same device. They run
//! on lavapipe here and in CI, and on the GPU host's device (`bench/gpu_host.sh
//! parity` and `vk_fusion`, where a GPU is ranked before a software device).
//!
//! A chain is kept from fusing by giving its middle node a second reader (a
//! `concat` with it), which is what ggml's fusion rules refuse; the fused and
//! the unfused graph then compute the same values from the same inputs.
//!
//! Graph replay (patch 0008) is tested as a decode step uses it: one graph
//! with an identity, evaluated again and again on new inputs while it writes
//! into a cache it also reads.

mod common;

use common::{assert_logged, check_close, layer_norm, matvec_gelu, matvec_residual, matvec_swiglu, one_at_a_time, open_device, values, Chain, Gelu};
use engine_core::abi::{BackendHandle, OptionValue};
use ggml_sys::{ComputeGraph, Context, GraphIo, TYPE_F16, TYPE_F32, TYPE_I32};

fn vulkan() -> BackendHandle {
    common::open_lavapipe()
}

fn cpu() -> BackendHandle {
    open_device("cpu", vec![("threads", OptionValue::Int(2))])
}

/// The fused LayerNorm: T3's decode and prefill rows (1024 wide), S3Gen's and
/// Supertonic's 512-wide frames, a width that leaves the last of the 512
/// threads' strides short, and an odd one; with and without the bias.
#[test]
fn fused_layer_norm_matches_the_cpu_and_the_unfused_dispatches() {
    let _serial = one_at_a_time();
    let cpu = cpu();
    let gpu = vulkan();
    for (cols, rows) in [(1024, 1), (1024, 60), (512, 706), (512, 41), (1100, 2), (80, 3)] {
        for bias in [true, false] {
            let want = layer_norm(&cpu, cols, rows, bias, Chain::Fused);
            let fused = layer_norm(&gpu, cols, rows, bias, Chain::Fused);
            let unfused = layer_norm(&gpu, cols, rows, bias, Chain::Unfused);
            check_close(&format!("layer norm [{cols}, {rows}] bias {bias} against the CPU"), &fused, &want, 1e-5);
            check_close(&format!("layer norm [{cols}, {rows}] bias {bias} fused against unfused"), &fused, &unfused, 1e-6);
        }
    }
}

/// The GELU in the matrix-vector epilogue, as T3's feed-forward (1024 → 4096)
/// and an odd shape run it: F32 weights against the CPU, F32 and F16 weights
/// against the unfused dispatches (the same sums, then the same GELU).
#[test]
fn matvec_with_gelu_matches_the_cpu_and_the_unfused_dispatches() {
    let _serial = one_at_a_time();
    let cpu = cpu();
    let gpu = vulkan();
    for (cols, rows) in [(1024, 4096), (80, 33)] {
        let want = matvec_gelu(&cpu, TYPE_F32, cols, rows, Gelu::Composed);
        let got = matvec_gelu(&gpu, TYPE_F32, cols, rows, Gelu::Node);
        check_close(&format!("matvec + bias + gelu F32 [{cols} -> {rows}] against the CPU"), &got, &want, 1e-5);
        for ty in [TYPE_F32, TYPE_F16] {
            let fused = matvec_gelu(&gpu, ty, cols, rows, Gelu::Node);
            let unfused = matvec_gelu(&gpu, ty, cols, rows, Gelu::NodeUnfused);
            let name = ggml_sys::type_name(ty);
            check_close(&format!("matvec + bias + gelu {name} [{cols} -> {rows}] fused against unfused"), &fused, &unfused, 1e-6);
        }
    }
}

/// Set in the child processes that [`run_as_child`] starts.
const CHILD_MARKER: &str = "TTS_TEST_VULKAN_CHILD";

fn in_child() -> bool {
    common::in_child(CHILD_MARKER)
}

/// The patches' switches a child runs at their defaults unless `env` sets them.
const SWITCHES: [&str; 2] = ["GGML_VK_DISABLE_GRAPH_REPLAY", "GGML_VK_DISABLE_FA_FUSED_REDUCE"];

/// Runs `test` again in a child process with `env` set (ggml-vulkan reads its
/// loggers' variables when the device starts) and every other switch of
/// [`SWITCHES`] at its default.
fn run_as_child(test: &str, env: &[(&str, &str)]) -> String {
    let unset: Vec<&str> = SWITCHES.into_iter().filter(|s| !env.iter().any(|(k, _)| k == s)).collect();
    common::run_as_child(CHILD_MARKER, test, env, &unset)
}

/// The products with a residual add that Multilingual's guided decode step
/// runs over its two rows (and the most columns ggml-vulkan's matrix-vector
/// route takes), F32 weights against the CPU, F32 and F16 against the
/// unfused dispatches.
const RESIDUAL_SHAPES: [(usize, usize, usize); 4] = [(1024, 1024, 2), (4096, 1024, 2), (80, 33, 3), (64, 16, 8)];

/// A product of several columns followed by a same-shape add runs as one
/// matrix-vector dispatch with the add in its epilogue (patch 0009; before,
/// only single-column products took the epilogue). The values are checked in
/// a child process with ggml-vulkan's per-op log on, whose lines name the
/// fused dispatches.
#[test]
fn multi_column_matvec_with_residual_is_fused_and_matches_the_cpu_and_the_unfused_dispatches() {
    const TEST: &str = "multi_column_matvec_with_residual_is_fused_and_matches_the_cpu_and_the_unfused_dispatches";
    if !in_child() {
        let stderr = run_as_child(TEST, &[("GGML_VK_PERF_LOGGER", "1")]);
        let fused: Vec<String> = RESIDUAL_SHAPES
            .iter()
            .flat_map(|(cols, rows, n)| ["f32", "f16"].map(|ty| format!("MUL_MAT_ADD MUL_MAT_VEC {ty} m={rows} n={n} k={cols}:")))
            .collect();
        assert_logged(&stderr, &fused);
        return;
    }
    let cpu = cpu();
    let gpu = vulkan();
    for (cols, rows, n) in RESIDUAL_SHAPES {
        let want = matvec_residual(&cpu, TYPE_F32, cols, rows, n, Chain::Fused);
        let got = matvec_residual(&gpu, TYPE_F32, cols, rows, n, Chain::Fused);
        check_close(&format!("matvec + residual F32 [{cols} -> {rows}] x {n} against the CPU"), &got, &want, 1e-5);
        for ty in [TYPE_F32, TYPE_F16] {
            let fused = matvec_residual(&gpu, ty, cols, rows, n, Chain::Fused);
            let unfused = matvec_residual(&gpu, ty, cols, rows, n, Chain::Unfused);
            let name = ggml_sys::type_name(ty);
            check_close(&format!("matvec + residual {name} [{cols} -> {rows}] x {n} fused against unfused"), &fused, &unfused, 1e-6);
        }
    }
}

/// The Llama T3's feed-forward over one and two columns (`[gate | up]` of
/// 2x4096 rows over 1024 inputs), an odd number of output rows, and an odd
/// number of inputs (the unaligned loads).
const SWIGLU_SHAPES: [(usize, usize, usize); 4] = [(1024, 4096, 1), (1024, 4096, 2), (80, 33, 3), (81, 16, 2)];

/// A product by one `[gate | up]` F16 matrix followed by a single-input SWIGLU
/// runs as one matrix-vector dispatch (patch 0010): each workgroup computes
/// gate row r and up row r + F and writes silu(gate)·up. Checked in a child
/// process with the per-op log on, whose lines name the fused dispatches.
#[test]
fn matvec_swiglu_is_fused_and_matches_the_cpu_and_the_unfused_dispatches() {
    const TEST: &str = "matvec_swiglu_is_fused_and_matches_the_cpu_and_the_unfused_dispatches";
    if !in_child() {
        let stderr = run_as_child(TEST, &[("GGML_VK_PERF_LOGGER", "1")]);
        let fused: Vec<String> = SWIGLU_SHAPES.iter().map(|(cols, rows, n)| format!("MUL_MAT_SWIGLU MUL_MAT_VEC f16 m={} n={n} k={cols}:", 2 * rows)).collect();
        assert_logged(&stderr, &fused);
        return;
    }
    let cpu = cpu();
    let gpu = vulkan();
    for (cols, rows, n) in SWIGLU_SHAPES {
        let want = matvec_swiglu(&cpu, TYPE_F32, cols, rows, n, Chain::Fused);
        let fused = matvec_swiglu(&gpu, TYPE_F16, cols, rows, n, Chain::Fused);
        let unfused = matvec_swiglu(&gpu, TYPE_F16, cols, rows, n, Chain::Unfused);
        check_close(&format!("matvec F16 + swiglu [{cols} -> 2x{rows}] x {n} against the CPU"), &fused, &want, 1e-5);
        check_close(&format!("matvec F16 + swiglu [{cols} -> 2x{rows}] x {n} fused against unfused"), &fused, &unfused, 1e-6);
    }
}

const STEP_WIDTH: i64 = 256;
const STEP_ROWS: i64 = 8;

/// A decode step in miniature: `y = W x + b` written into row `pos` of a
/// cache that outlives the graph, then every cached row's product with `x`
/// (the attention scores' shape), so each output depends on every earlier
/// step's input as well as this one's. Evaluated `steps.len()` times through
/// the pinned staging a model uses; after evaluation `invalidate_after` a
/// device buffer is allocated and freed, which must drop the recording.
fn decode_steps(handle: &BackendHandle, steps: &[(Vec<f32>, i32)], invalidate_after: usize) -> Vec<Vec<f32>> {
    let backend = handle.ggml_backend();
    let state = Context::new_no_alloc(4, 0).unwrap();
    let w = state.new_tensor(TYPE_F32, &[STEP_WIDTH, STEP_WIDTH]).unwrap();
    let b = state.new_tensor(TYPE_F32, &[STEP_WIDTH]).unwrap();
    let cache = state.new_tensor(TYPE_F32, &[STEP_WIDTH, STEP_ROWS]).unwrap();
    let buffer = backend.alloc_ctx_tensors(&state).unwrap();
    buffer.clear(0);
    let spread = 2.0 / (STEP_WIDTH as f32).sqrt();
    w.set_f32(&values((STEP_WIDTH * STEP_WIDTH) as usize, 41).iter().map(|v| v * spread).collect::<Vec<_>>()).unwrap();
    b.set_f32(&values(STEP_WIDTH as usize, 42)).unwrap();

    let mut graph = ComputeGraph::build(&backend, 16, |ctx| {
        let (w, b, cache) = unsafe { (w.rebind(ctx), b.rebind(ctx), cache.rebind(ctx)) };
        let mut io = GraphIo::default();
        let x = io.input(ctx, "x", TYPE_F32, &[STEP_WIDTH, 1])?;
        let pos = io.input(ctx, "pos", TYPE_I32, &[1])?;
        let y = ctx.add(ctx.mul_mat(w, x)?, b)?;
        let written = ctx.set_rows(cache, y, pos)?;
        io.outputs.push(("scores", ctx.mul_mat(written, x)?));
        Ok(io)
    })
    .unwrap();
    if let Some(pinned) = backend.device().and_then(|d| d.host_buffer_type()) {
        graph.stage_in(pinned).unwrap();
    }
    let mut out = Vec::new();
    for (i, (x, pos)) in steps.iter().enumerate() {
        graph.set_f32("x", x).unwrap();
        graph.set_i32("pos", &[*pos]).unwrap();
        out.push(graph.compute_and_get_f32(&backend, "scores").unwrap());
        if i + 1 == invalidate_after {
            drop(backend.buffer_type().alloc(4096).unwrap());
        }
    }
    out
}

/// Each evaluation of a replayed graph matches the CPU on its own new inputs
/// and the state earlier ones left. ggml-vulkan records the graph on its
/// second evaluation and resubmits that from the third; a freed device
/// buffer (whose handle a new one could take) drops the recording, and the
/// graph is recorded again. The replays are counted from the sync logger's
/// lines, which need the variable set before the device starts, so the
/// evaluations run in a child process of this test binary.
#[test]
fn replayed_decode_steps_match_the_cpu_and_rerecord_after_a_buffer_is_freed() {
    let steps: Vec<(Vec<f32>, i32)> = (0..8).map(|i| (values(STEP_WIDTH as usize, 100 + i), ((i * 5) % STEP_ROWS as u64) as i32)).collect();
    if in_child() {
        let want = decode_steps(&cpu(), &steps, 4);
        let got = decode_steps(&vulkan(), &steps, 4);
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            check_close(&format!("decode step {} against the CPU", i + 1), got, want, 1e-5);
        }
        return;
    }
    let stderr = run_as_child("replayed_decode_steps_match_the_cpu_and_rerecord_after_a_buffer_is_freed", &[("GGML_VK_SYNC_LOGGER", "1")]);
    // Steps 1 and 2 run and record, 3 and 4 replay; the freed buffer drops the
    // recording, so 5 and 6 run and record again, and 7 and 8 replay.
    let replays = stderr.lines().filter(|l| l.starts_with("replay graph ")).count();
    assert_eq!(replays, 4, "replayed evaluations");
}

/// The guided decode step's attention: two sequences (the conditional and
/// unconditional rows) under one mask row broadcast over both, at both step
/// lengths of the cache, against the f64 reference; a row hiding every key
/// sits right after the mask, where a kernel stepping through the mask per
/// sequence would read (CUDA's did before its patch 0012). On a GPU the
/// keys are split over workgroups and the splits reduced.
#[test]
fn flash_attention_reads_a_broadcast_mask_as_broadcast() {
    let _serial = one_at_a_time();
    let gpu = vulkan();
    for (kv, visible) in [(256, 100), (512, 300), (256, 256)] {
        let (got, want) = common::broadcast_mask_attention(&gpu, 16, 2, kv, visible, false);
        check_close(&format!("flash attention, 16 heads x 2 sequences, {visible} of {kv} keys, broadcast mask"), &got, &want, 5e-3);
    }
}

/// Patch 0011: a decode step's attention splits its keys over workgroups, and
/// the last workgroup to finish a row tile now reduces the splits itself,
/// where a reduce dispatch behind a barrier did. Turbo's step (16 heads, 512
/// keys), the guided step (16 heads × 2 sequences, 256 keys) and shapes that
/// lavapipe also splits (4 heads: 4 or 8 splits), with F32 and with default
/// (F16 on a device that has it) accumulation: against the f64 reference, and
/// the fused reduce against the dispatch (`GGML_VK_DISABLE_FA_FUSED_REDUCE`),
/// which combine the same partials in another order (1e-6). The sync logger's
/// lines say which reduce ran, so both runs are child processes, each writing
/// its outputs to a file of a private directory.
#[test]
fn flash_attention_reduces_its_splits_in_the_last_workgroup() {
    const NAME: &str = "flash_attention_reduces_its_splits_in_the_last_workgroup";
    const OUT: &str = "TTS_TEST_VULKAN_OUT";
    if in_child() {
        let gpu = vulkan();
        let mut outputs = Vec::new();
        for (heads, sequences, kv, visible) in [(16, 1, 512, 300), (16, 2, 256, 100), (4, 1, 256, 200), (4, 2, 512, 512)] {
            for f32_accumulation in [true, false] {
                let (got, want) = common::broadcast_mask_attention(&gpu, heads, sequences, kv, visible, f32_accumulation);
                let what = format!("attention, {heads} heads x {sequences} sequences, {visible} of {kv} keys, F32 accumulation {f32_accumulation}");
                check_close(&what, &got, &want, 5e-3);
                outputs.extend(got);
            }
        }
        let bytes: Vec<u8> = outputs.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(std::env::var_os(OUT).unwrap(), bytes).unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (fused_out, unfused_out) = (dir.path().join("fused"), dir.path().join("unfused"));
    let (fused_at, unfused_at) = (fused_out.to_str().unwrap(), unfused_out.to_str().unwrap());
    let fused = run_as_child(NAME, &[("GGML_VK_SYNC_LOGGER", "1"), (OUT, fused_at)]);
    let unfused = run_as_child(NAME, &[("GGML_VK_SYNC_LOGGER", "1"), ("GGML_VK_DISABLE_FA_FUSED_REDUCE", "1"), (OUT, unfused_at)]);
    let count = |stderr: &str, how: &str| stderr.lines().filter(|l| l.starts_with("flash attention: ") && l.ends_with(how)).count();
    let split = count(&fused, "reduced in the last workgroup");
    assert!(split >= 4, "split attentions reduced in their last workgroup: {split}");
    assert_eq!(count(&fused, "reduced by a dispatch"), 0, "reduce dispatches with the fusion on");
    assert_eq!(count(&unfused, "reduced by a dispatch"), split, "reduce dispatches with the fusion off");
    assert_eq!(count(&unfused, "reduced in the last workgroup"), 0, "fused reduces with the fusion off");
    let read =
        |path: &std::path::Path| -> Vec<f32> { std::fs::read(path).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect() };
    check_close("attention, splits reduced in the last workgroup against a reduce dispatch", &read(&fused_out), &read(&unfused_out), 1e-6);
}
