//! The same small graph (matmul, flash attention with F16 K/V, conv_transpose_1d)
//! computed through the CPU plugin and the Vulkan plugin (lavapipe on CI), each
//! checked against a naive Rust reference, and the two against each other.
//!
//! Tolerances (max |a - b| / max |reference|):
//! - matmul f32: 1e-5 on CPU, 1e-3 on Vulkan (its f32 path may round through f16).
//! - flash attention, F16 K/V (inputs exact in f16): 4e-3 on CPU, 1e-2 on Vulkan
//!   (both accumulate in F16 inside the kernels; measured 1.6e-3 and 1.0e-3).
//! - conv_transpose_1d f32: 1e-5 on both.

mod common;

use common::{one_at_a_time, open_device};
use engine_core::abi::{BackendHandle, OptionValue};
use ggml_sys::{Context, TYPE_F16, TYPE_F32};

/// Deterministic values that are exact in f16 (multiples of 1/64 in [-2, 2)).
fn values(n: usize, seed: u64) -> Vec<f32> {
    engine_core::compare::grid_values(n, seed, 64)
}

const K: usize = 64;
const M: usize = 48;
const N: usize = 20;
const D: usize = 64;
const NQ: usize = 10;
const NKV: usize = 32;
const H: usize = 4;
const KW: usize = 16;
const COUT: usize = 8;
const CIN: usize = 12;
const L: usize = 30;
const STRIDE: usize = 8;

struct Outputs {
    matmul: Vec<f32>,
    attention: Vec<f32>,
    conv: Vec<f32>,
}

fn compute(handle: &BackendHandle) -> Outputs {
    let backend = handle.ggml_backend();
    let ctx = Context::new_no_alloc(32, 64).unwrap();
    let a = ctx.new_tensor(TYPE_F32, &[K as i64, M as i64]).unwrap();
    let b = ctx.new_tensor(TYPE_F32, &[K as i64, N as i64]).unwrap();
    let q = ctx.new_tensor(TYPE_F32, &[D as i64, NQ as i64, H as i64]).unwrap();
    let k = ctx.new_tensor(TYPE_F16, &[D as i64, NKV as i64, H as i64]).unwrap();
    let v = ctx.new_tensor(TYPE_F16, &[D as i64, NKV as i64, H as i64]).unwrap();
    let mask = ctx.new_tensor(TYPE_F16, &[NKV as i64, NQ as i64]).unwrap();
    let kernel = ctx.new_tensor(TYPE_F32, &[KW as i64, COUT as i64, CIN as i64]).unwrap();
    let input = ctx.new_tensor(TYPE_F32, &[L as i64, CIN as i64]).unwrap();
    let mm = ctx.mul_mat(a, b).unwrap();
    let att = ctx.flash_attn_ext(q, k, v, Some(mask), 0.125).unwrap();
    let conv = ctx.conv_transpose_1d(kernel, input, STRIDE as i32, 0, 1).unwrap();
    let mut graph = ctx.new_graph(64).unwrap();
    graph.build_forward(mm);
    graph.build_forward(att);
    graph.build_forward(conv);
    let _buffer = backend.alloc_ctx_tensors(&ctx).unwrap();
    let inputs = inputs();
    for (t, data) in
        [(a, &inputs.a), (b, &inputs.b), (q, &inputs.q), (k, &inputs.k), (v, &inputs.v), (mask, &inputs.mask), (kernel, &inputs.kernel), (input, &inputs.input)]
    {
        t.set_f32(data).unwrap();
    }
    backend.compute(&graph).unwrap();
    Outputs { matmul: mm.get_f32().unwrap(), attention: att.get_f32().unwrap(), conv: conv.get_f32().unwrap() }
}

struct Inputs {
    a: Vec<f32>,
    b: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    mask: Vec<f32>,
    kernel: Vec<f32>,
    input: Vec<f32>,
}

fn inputs() -> Inputs {
    // Causal-style mask: query i sees the first NKV - NQ + i + 1 keys.
    let mask = (0..NQ).flat_map(|i| (0..NKV).map(move |j| if j <= NKV - NQ + i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Inputs {
        a: values(K * M, 1),
        b: values(K * N, 2),
        q: values(D * NQ * H, 3).iter().map(|x| x / 4.0).collect(),
        k: values(D * NKV * H, 4).iter().map(|x| x / 4.0).collect(),
        v: values(D * NKV * H, 5),
        mask,
        kernel: values(KW * COUT * CIN, 6),
        input: values(L * CIN, 7),
    }
}

fn reference() -> Outputs {
    let i = inputs();
    let mut matmul = vec![0f32; M * N];
    for n in 0..N {
        for m in 0..M {
            matmul[n * M + m] = (0..K).map(|k| i.a[m * K + k] as f64 * i.b[n * K + k] as f64).sum::<f64>() as f32;
        }
    }
    let mut attention = vec![0f32; D * H * NQ];
    for qi in 0..NQ {
        for h in 0..H {
            let q = &i.q[(h * NQ + qi) * D..][..D];
            let scores: Vec<f64> = (0..NKV)
                .map(|j| {
                    let k = &i.k[(h * NKV + j) * D..][..D];
                    0.125 * q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() + i.mask[qi * NKV + j] as f64
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = w.iter().sum();
            for d in 0..D {
                let acc: f64 = (0..NKV).map(|j| w[j] * i.v[(h * NKV + j) * D + d] as f64).sum();
                attention[(qi * H + h) * D + d] = (acc / total) as f32;
            }
        }
    }
    let lout = (L - 1) * STRIDE + KW;
    let mut conv = vec![0f32; lout * COUT];
    for co in 0..COUT {
        for ci in 0..CIN {
            for l in 0..L {
                for k in 0..KW {
                    conv[co * lout + l * STRIDE + k] += i.input[ci * L + l] * i.kernel[(ci * COUT + co) * KW + k];
                }
            }
        }
    }
    Outputs { matmul, attention, conv }
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    engine_core::compare::max_rel_err(got, want).unwrap_or_else(|e| panic!("{e}")) as f64
}

fn check(label: &str, got: &Outputs, want: &Outputs, tol: [f64; 3]) {
    let errs = [rel_err(&got.matmul, &want.matmul), rel_err(&got.attention, &want.attention), rel_err(&got.conv, &want.conv)];
    eprintln!("{label}: matmul {:.2e}, flash-attn {:.2e}, conv_transpose_1d {:.2e}", errs[0], errs[1], errs[2]);
    for ((name, e), t) in ["matmul", "flash-attn", "conv_transpose_1d"].iter().zip(errs).zip(tol) {
        assert!(e <= t, "{label} {name}: relative error {e:.3e} > {t:.0e}");
    }
}

#[test]
fn cpu_and_vulkan_agree_with_reference_and_each_other() {
    let _serial = one_at_a_time();
    let want = reference();
    let cpu = compute(&open_device("cpu", vec![("threads", OptionValue::Int(2))]));
    check("cpu vs reference", &cpu, &want, [1e-5, 4e-3, 1e-5]);
    let vulkan = compute(&common::open_lavapipe());
    check("vulkan vs reference", &vulkan, &want, [1e-3, 1e-2, 1e-5]);
    check("vulkan vs cpu", &vulkan, &cpu, [1e-3, 1e-2, 1e-5]);
}

/// A graph with F32, F16 and I32 inputs and F32/F16 outputs, computed with
/// uploads and downloads direct and through host staging (`pinned_host`):
/// the results must be bit-identical, and bad uploads fail alike.
fn staged_vs_direct(handle: &BackendHandle, buft: ggml_sys::BufferType) {
    use ggml_sys::{ComputeGraph, GraphIo, TYPE_I32};
    let backend = handle.ggml_backend();
    let build = || {
        ComputeGraph::build(&backend, 32, |ctx| {
            let table = ctx.new_tensor(TYPE_F32, &[K as i64, M as i64])?;
            let rows = ctx.new_tensor(TYPE_I32, &[N as i64])?;
            let x = ctx.new_tensor(TYPE_F16, &[K as i64, N as i64])?;
            let picked = ctx.get_rows(table, rows)?;
            let product = ctx.mul_mat(table, ctx.add(picked, ctx.cast(x, TYPE_F32)?)?)?;
            let half = ctx.cast(product, TYPE_F16)?;
            Ok(GraphIo { inputs: vec![("table", table), ("rows", rows), ("x", x)], outputs: vec![("product", product), ("half", half)] })
        })
        .unwrap()
    };
    let rows: Vec<i32> = (0..N as i32).map(|i| (i * 7) % M as i32).collect();
    let run = |g: &ComputeGraph| {
        g.set_f32("table", &values(K * M, 11)).unwrap();
        g.set_i32("rows", &rows).unwrap();
        g.set_f32("x", &values(K * N, 12)).unwrap();
        g.compute(&backend).unwrap();
        (g.get_f32("product").unwrap(), g.get_f32("half").unwrap())
    };
    let direct = build();
    let mut staged = build();
    staged.stage_in(buft).unwrap();
    assert!(staged.is_staged() && !direct.is_staged());
    let (a, b) = (run(&direct), run(&staged));
    assert!(a.0.iter().zip(&b.0).all(|(x, y)| x.to_bits() == y.to_bits()), "staged product differs");
    assert!(a.1.iter().zip(&b.1).all(|(x, y)| x.to_bits() == y.to_bits()), "staged f16 output differs");
    assert!(a.0.iter().any(|v| *v != 0.0));
    // A second round through the same staging slots.
    assert_eq!(run(&staged).0, b.0);
    // Uploads, graph and download queued together, with new inputs each round:
    // every round must see its own inputs (the staged copies are deferred to
    // the compute), and agree with computing and downloading apart.
    for (g, seed) in [(&direct, 21), (&staged, 21), (&staged, 22), (&direct, 22)] {
        g.set_f32("table", &values(K * M, seed)).unwrap();
        g.set_i32("rows", &rows).unwrap();
        g.set_f32("x", &values(K * N, seed + 1)).unwrap();
        let together = g.compute_and_get_f32(&backend, "product").unwrap();
        g.set_f32("table", &values(K * M, seed)).unwrap();
        g.set_i32("rows", &rows).unwrap();
        g.set_f32("x", &values(K * N, seed + 1)).unwrap();
        g.compute(&backend).unwrap();
        assert_eq!(together, g.get_f32("product").unwrap(), "compute_and_get_f32 differs (seed {seed})");
        assert_ne!(together, b.0, "seed {seed} computed the earlier inputs");
    }
    for g in [&direct, &staged] {
        assert_eq!(g.set_f32("x", &[1.0; 3]).unwrap_err().to_string(), format!("tensor 'x' has {} elements, got 3", K * N));
        assert_eq!(g.set_i32("table", &[1; 3]).unwrap_err().to_string(), "tensor 'table' is not I32 or I64");
        assert_eq!(g.set_f32("nope", &[]).unwrap_err().to_string(), "graph has no input 'nope'");
    }
}

#[test]
fn host_staging_changes_no_bit() {
    let _serial = one_at_a_time();
    let cpu = open_device("cpu", vec![("threads", OptionValue::Int(2))]);
    // The CPU device offers no pinned memory; its own buffer type is host memory.
    staged_vs_direct(&cpu, cpu.ggml_backend().buffer_type());
    let vulkan = common::open_lavapipe();
    let pinned = vulkan.ggml_backend().device().and_then(|d| d.host_buffer_type()).expect("Vulkan offers pinned host memory");
    staged_vs_direct(&vulkan, pinned);
}
