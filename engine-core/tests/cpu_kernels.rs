//! Kernel tests for the CPU plugin's patch series (`backends/cpu/patches/`):
//! each patched op against a plain f64 loop on the host, over the shapes the
//! models use and the edges of the patch's own tiling.

mod common;

use common::{one_at_a_time, open_device, run_graph, values};
use engine_core::abi::OptionValue;
use ggml_sys::TYPE_F32;

/// One 2-D convolution: image `[w, h, c_in, n]`, kernel `[kw, kh, c_in, c_out]`.
#[derive(Debug, Clone, Copy)]
struct Conv2d {
    w: usize,
    h: usize,
    c_in: usize,
    n: usize,
    kw: usize,
    kh: usize,
    c_out: usize,
    stride: [usize; 2],
    pad: [usize; 2],
    dilation: [usize; 2],
}

impl Conv2d {
    fn out_size(&self, axis: usize) -> usize {
        let (size, k) = if axis == 0 { (self.w, self.kw) } else { (self.h, self.kh) };
        (size + 2 * self.pad[axis] - self.dilation[axis] * (k - 1) - 1) / self.stride[axis] + 1
    }

    fn inputs(&self) -> (Vec<f32>, Vec<f32>) {
        let image = values(self.w * self.h * self.c_in * self.n, (self.w * 31 + self.c_in) as u64);
        let kernel = values(self.kw * self.kh * self.c_in * self.c_out, (self.kw * 7 + self.c_out) as u64);
        (image, kernel)
    }

    /// The definition, in f64: `[ow, oh, c_out, n]`.
    fn reference(&self) -> Vec<f32> {
        let (image, kernel) = self.inputs();
        let (ow, oh) = (self.out_size(0), self.out_size(1));
        let mut out = vec![0.0f32; ow * oh * self.c_out * self.n];
        for b in 0..self.n {
            for oc in 0..self.c_out {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut sum = 0.0f64;
                        for ic in 0..self.c_in {
                            for ky in 0..self.kh {
                                for kx in 0..self.kw {
                                    let iy = (oy * self.stride[1] + ky * self.dilation[1]) as isize - self.pad[1] as isize;
                                    let ix = (ox * self.stride[0] + kx * self.dilation[0]) as isize - self.pad[0] as isize;
                                    if iy < 0 || ix < 0 || iy >= self.h as isize || ix >= self.w as isize {
                                        continue;
                                    }
                                    let x = image[((b * self.c_in + ic) * self.h + iy as usize) * self.w + ix as usize];
                                    let k = kernel[((oc * self.c_in + ic) * self.kh + ky) * self.kw + kx];
                                    sum += x as f64 * k as f64;
                                }
                            }
                        }
                        out[((b * self.c_out + oc) * oh + oy) * ow + ox] = sum as f32;
                    }
                }
            }
        }
        out
    }

    /// `CONV_2D` through the plugin on `threads` workers.
    fn run(&self, threads: i64) -> Vec<f32> {
        let cpu = open_device("cpu", vec![("threads", OptionValue::Int(threads))]);
        let (image, kernel) = self.inputs();
        let s = *self;
        run_graph(&cpu, |ctx| {
            let x = ctx.new_tensor(TYPE_F32, &[s.w as i64, s.h as i64, s.c_in as i64, s.n as i64]).unwrap();
            let k = ctx.new_tensor(TYPE_F32, &[s.kw as i64, s.kh as i64, s.c_in as i64, s.c_out as i64]).unwrap();
            let i32s = |a: [usize; 2]| [a[0] as i32, a[1] as i32];
            let y = ctx.conv_2d_direct(k, x, i32s(s.stride), i32s(s.pad), i32s(s.dilation)).unwrap();
            assert_eq!(y.ne(), [s.out_size(0) as i64, s.out_size(1) as i64, s.c_out as i64, s.n as i64]);
            (vec![(x, image), (k, kernel)], y)
        })
    }
}

/// Patch 0005 (`CONV_2D` in strips of 64 output positions): CAMPPlus's head
/// shapes (3×3, 32 channels, stride 2 along frequency; W is time), and the
/// strips' edges: widths around 64, strides and dilation along W (the
/// gathering path without contiguous runs), padding wider than the kernel
/// reach, one input channel, a batch, 1 and 2 workers; and HiFT's 1-D
/// convolutions as images of height 1 (`Builder::conv_1d` on the CPU).
/// Tolerance 1e-5 of the largest output (F32 sums over at most 704 taps).
#[test]
fn conv_2d_matches_the_definition() {
    let _serial = one_at_a_time();
    let base = Conv2d { w: 70, h: 12, c_in: 32, n: 1, kw: 3, kh: 3, c_out: 32, stride: [1, 2], pad: [1, 1], dilation: [1, 1] };
    let cases = [
        ("CAMPPlus head block, stride 2 along H", base),
        ("stride 1", Conv2d { stride: [1, 1], ..base }),
        ("one input channel (the head's first conv)", Conv2d { c_in: 1, ..base }),
        ("1x1 shortcut, no padding", Conv2d { kw: 1, kh: 1, pad: [0, 0], ..base }),
        ("width 64: one whole strip", Conv2d { w: 64, ..base }),
        ("width 129: two strips and a strip of one", Conv2d { w: 129, c_in: 3, ..base }),
        ("width 1", Conv2d { w: 1, c_in: 3, ..base }),
        ("stride 2 along W", Conv2d { stride: [2, 1], c_in: 4, ..base }),
        ("dilation 2 along W and H", Conv2d { dilation: [2, 2], c_in: 4, ..base }),
        ("padding beyond the kernel's reach", Conv2d { pad: [3, 2], c_in: 2, c_out: 5, ..base }),
        ("a batch of 2, 5 output channels", Conv2d { n: 2, c_in: 3, c_out: 5, ..base }),
        ("5x3 kernel", Conv2d { kw: 5, kh: 3, pad: [2, 1], c_in: 4, ..base }),
        (
            "HiFT's resblock: height 1, 11 taps at dilation 5, 64 channels",
            Conv2d { w: 300, h: 1, c_in: 64, kw: 11, kh: 1, c_out: 64, pad: [25, 0], dilation: [5, 1], stride: [1, 1], ..base },
        ),
        (
            "HiFT's source branch: height 1, 30 taps at stride 15",
            Conv2d { w: 600, h: 1, c_in: 18, kw: 30, kh: 1, c_out: 16, pad: [7, 0], stride: [15, 1], ..base },
        ),
    ];
    for (what, conv) in cases {
        let want = conv.reference();
        for threads in [1, 2] {
            let got = conv.run(threads);
            let err = engine_core::compare::max_rel_err(&got, &want).unwrap();
            println!("conv_2d, {what}, {threads} worker(s): rel err {err:.2e} (tolerance 1e-5)");
            assert!(err <= 1e-5, "{what} ({threads} workers): {err:e}, {conv:?}");
        }
    }
}

/// One F32 product `[k, m] x [k, n]` per batch item (both operands batched).
#[derive(Debug, Clone, Copy)]
struct Product {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
}

impl Product {
    fn inputs(&self) -> (Vec<f32>, Vec<f32>) {
        (values(self.k * self.m * self.batch, (self.m * 13 + self.k) as u64), values(self.k * self.n * self.batch, (self.n * 17 + self.k) as u64))
    }

    /// The definition, in f64: `[m, n, batch]`.
    fn reference(&self) -> Vec<f32> {
        let (a, b) = self.inputs();
        let mut out = vec![0f32; self.m * self.n * self.batch];
        for t in 0..self.batch {
            for j in 0..self.n {
                for i in 0..self.m {
                    let row = &a[(t * self.m + i) * self.k..][..self.k];
                    let col = &b[(t * self.n + j) * self.k..][..self.k];
                    out[(t * self.n + j) * self.m + i] = row.iter().zip(col).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>() as f32;
                }
            }
        }
        out
    }

    fn run(&self, threads: i64) -> Vec<f32> {
        let cpu = open_device("cpu", vec![("threads", OptionValue::Int(threads))]);
        let (a, b) = self.inputs();
        let p = *self;
        run_graph(&cpu, |ctx| {
            let x = ctx.new_tensor(TYPE_F32, &[p.k as i64, p.m as i64, p.batch as i64]).unwrap();
            let y = ctx.new_tensor(TYPE_F32, &[p.k as i64, p.n as i64, p.batch as i64]).unwrap();
            (vec![(x, a), (y, b)], ctx.mul_mat(x, y).unwrap())
        })
    }
}

/// Patches 0003 (AVX-512) and 0007 (AVX2): F32 products as outer products
/// over packed panels of A, in the shapes the models use (the encoder's
/// relative-position scores, k = 64 over 8 heads; the decoder's k = 256;
/// HiFT's convolution products, whose m is a frame count) and the kernel's
/// edges: a last panel of one to fifteen rows (AVX2 packs it with zeros and
/// stores under a mask), column counts that leave remainder tiles, k across
/// its 128-value blocks and below one vector, and the products that keep
/// tinyBLAS (fewer than 16 columns; fewer than 8 rows on AVX2, m not a
/// multiple of 16 on AVX-512). 1 and 2 workers; tolerance 1e-5 of the
/// largest output.
#[test]
fn f32_products_match_the_definition() {
    let _serial = one_at_a_time();
    let cases = [
        ("relative-position scores: k = 64, 8 heads, m % 8 = 4", Product { m: 60, n: 262, k: 64, batch: 8 }),
        ("decoder: k = 256, whole panels", Product { m: 256, n: 300, k: 256, batch: 1 }),
        ("k = 704 over six blocks, m % 16 = 4", Product { m: 100, n: 258, k: 704, batch: 1 }),
        ("last panel of 5 rows, k = 300", Product { m: 37, n: 263, k: 300, batch: 1 }),
        ("last panel of one vector exactly", Product { m: 24, n: 256, k: 129, batch: 1 }),
        ("9 rows: a panel of two vectors, one row in the second", Product { m: 9, n: 259, k: 7, batch: 1 }),
        ("15 rows, each column remainder", Product { m: 15, n: 287, k: 33, batch: 2 }),
        ("HiFT-like: 64 columns", Product { m: 100, n: 64, k: 704, batch: 1 }),
        ("fewer than 16 columns: tinyBLAS", Product { m: 64, n: 15, k: 64, batch: 1 }),
        ("fewer than 8 rows: tinyBLAS", Product { m: 5, n: 260, k: 64, batch: 1 }),
    ];
    for (what, product) in cases {
        let want = product.reference();
        for threads in [1, 2] {
            let got = product.run(threads);
            let err = engine_core::compare::max_rel_err(&got, &want).unwrap();
            println!("mul_mat F32, {what}, {threads} worker(s): rel err {err:.2e} (tolerance 1e-5)");
            assert!(err <= 1e-5, "{what} ({threads} workers): {err:e}, {product:?}");
        }
    }
}

const CHILD_MARKER: &str = "TTS_TEST_CPU_CHILD";

/// The graph the per-op log test runs: a 1-D convolution (im2col, then a
/// product), a bias add and a GELU, over 2 workers. Returns its output.
fn logged_graph() -> Vec<f32> {
    let cpu = open_device("cpu", vec![("threads", OptionValue::Int(2))]);
    let (t, c_in, c_out, k) = (50usize, 6usize, 8usize, 3usize);
    run_graph(&cpu, |ctx| {
        let x = ctx.new_tensor(TYPE_F32, &[t as i64, c_in as i64]).unwrap();
        let w = ctx.new_tensor(TYPE_F32, &[k as i64, c_in as i64, c_out as i64]).unwrap();
        let b = ctx.new_tensor(TYPE_F32, &[1, c_out as i64]).unwrap();
        let y = ctx.conv_1d_time_first(w, x, 1, 1, 1).unwrap(); // [t, c_out]
        let y = ctx.gelu(ctx.add(y, b).unwrap()).unwrap();
        (vec![(x, values(t * c_in, 1)), (w, values(k * c_in * c_out, 2)), (b, values(c_out, 3))], y)
    })
}

/// One line of the per-op log: the op's name, its count and its total µs.
type LoggedOp = (String, usize, f64);

/// The per-op lines of each "CPU Timings" block in `stderr`, and the block's total.
fn timing_blocks(stderr: &str) -> Vec<(Vec<LoggedOp>, f64)> {
    let mut blocks = Vec::new();
    for block in stderr.split("----------------\n").skip(1) {
        let mut lines = block.lines();
        assert_eq!(lines.next(), Some("CPU Timings:"), "a log block without its header:\n{block}");
        let mut ops = Vec::new();
        for line in lines {
            if let Some(total) = line.strip_prefix("Total time: ").and_then(|r| r.strip_suffix(" us.")) {
                blocks.push((std::mem::take(&mut ops), total.parse().unwrap()));
                break;
            }
            let (name, rest) = line.rsplit_once(": ").unwrap_or_else(|| panic!("not a per-op line: {line}"));
            let (count, rest) = rest.split_once(" x ").unwrap();
            let total = rest.rsplit_once(" = ").unwrap().1.strip_suffix(" us").unwrap();
            ops.push((name.to_string(), count.parse().unwrap(), total.parse().unwrap()));
        }
    }
    blocks
}

/// Patch 0006: with `GGML_CPU_PERF_LOGGER` set, each graph prints one line per
/// op kind, products named with their type and m, n, k and im2col with its
/// output shape, each node counted once, and the total is the lines' sum;
/// unset, nothing is printed and the values are the same.
#[test]
fn per_op_log_names_every_node_once() {
    const TEST: &str = "per_op_log_names_every_node_once";
    if common::in_child(CHILD_MARKER) {
        let out = logged_graph();
        eprintln!("values {}", out.iter().map(|v| format!("{v:e}")).collect::<Vec<_>>().join(","));
        return;
    }
    let values_of = |stderr: &str| stderr.lines().find(|l| l.starts_with("values ")).map(str::to_string).expect("the child's values");
    let logged = common::run_as_child(CHILD_MARKER, TEST, &[("GGML_CPU_PERF_LOGGER", "1")], &[]);
    let quiet = common::run_as_child(CHILD_MARKER, TEST, &[], &["GGML_CPU_PERF_LOGGER"]);
    assert!(!quiet.contains("CPU Timings"), "a log without GGML_CPU_PERF_LOGGER:\n{quiet}");
    assert_eq!(values_of(&logged), values_of(&quiet), "the log changed the values");
    let blocks = timing_blocks(&logged);
    assert_eq!(blocks.len(), 1, "one graph, one block:\n{logged}");
    let (ops, total) = &blocks[0];
    let names: Vec<&str> = ops.iter().map(|(n, _, _)| n.as_str()).collect();
    // im2col writes [k·c_in, t] patches; the product is [t, c_out] over k·c_in.
    for want in ["IM2COL 18x50x1", "MUL_MAT f32 m=50 n=8 k=18", "ADD", "GELU"] {
        assert!(names.contains(&want), "no `{want}` in the log: {names:?}");
    }
    assert!(ops.iter().all(|(_, count, _)| *count == 1), "a node counted twice: {ops:?}");
    let sum: f64 = ops.iter().map(|(_, _, t)| t).sum();
    assert!((sum - total).abs() <= 1e-3 * ops.len() as f64, "lines sum to {sum} us, the total says {total}");
}

/// Snake's inputs: `x` `[t, c, n]` whose channels span the sine's argument
/// ranges (scaled by 1, 30, 3000, 2·10⁴ and 10⁻³: the last but one beyond the
/// vector sine's 8192, so its rows take `sinf`), and per channel `a` and
/// `inv_b = 1/(a + 1e-9)`.
fn snake_inputs(t: usize, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    const SCALES: [f32; 5] = [1.0, 30.0, 3000.0, 2e4, 1e-3];
    let c = SCALES.len();
    let x: Vec<f32> = values(t * c * n, 11).iter().enumerate().map(|(i, v)| v * SCALES[i / t % c]).collect();
    let a: Vec<f32> = values(c, 12).iter().map(|v| 0.2 + 2.0 * v.abs()).collect();
    let inv_b = a.iter().map(|a| 1.0 / (a + 1e-9)).collect();
    (x, a, inv_b)
}

/// The definition: `x + inv_b · sin²(a·x)`, the product `a·x` rounded to f32
/// as the graph computes it, the rest in f64.
fn snake_reference(t: usize, n: usize) -> Vec<f32> {
    let (x, a, inv_b) = snake_inputs(t, n);
    let c = a.len();
    x.iter()
        .enumerate()
        .map(|(i, &x)| {
            let ch = i / t % c;
            let s = ((x * a[ch]) as f64).sin();
            (x as f64 + inv_b[ch] as f64 * s * s) as f32
        })
        .collect()
}

/// Snake as HiFT builds it (MUL, SIN, SQR, MUL, ADD) on `[t, 5, n]`, over 2
/// workers; with `also_sine`, the SIN node is read outside the chain too
/// (the output adds it), which must keep the five nodes apart.
fn snake_graph(t: usize, n: usize, also_sine: bool) -> Vec<f32> {
    let cpu = open_device("cpu", vec![("threads", OptionValue::Int(2))]);
    let (xs, a_values, inv_b_values) = snake_inputs(t, n);
    let c = a_values.len() as i64;
    run_graph(&cpu, |ctx| {
        let x = ctx.new_tensor(TYPE_F32, &[t as i64, c, n as i64]).unwrap();
        let a = ctx.new_tensor(TYPE_F32, &[1, c]).unwrap();
        let inv_b = ctx.new_tensor(TYPE_F32, &[1, c]).unwrap();
        let sine = ctx.sin(ctx.mul(x, a).unwrap()).unwrap();
        let y = ctx.add(x, ctx.mul(ctx.sqr(sine).unwrap(), inv_b).unwrap()).unwrap();
        let out = if also_sine { ctx.add(y, sine).unwrap() } else { y };
        (vec![(x, xs), (a, a_values), (inv_b, inv_b_values)], out)
    })
}

/// Largest error of `got` against `want` in units of `|x| + inv_b` (the
/// scale of each term), and whether every value is within `tolerance` of it.
fn snake_error(got: &[f32], want: &[f32], t: usize, n: usize) -> f64 {
    let (x, _, inv_b) = snake_inputs(t, n);
    let c = inv_b.len();
    got.iter().zip(want).enumerate().map(|(i, (g, w))| (*g as f64 - *w as f64).abs() / (x[i].abs() as f64 + inv_b[i / t % c] as f64)).fold(0.0, f64::max)
}

/// Patch 0008: Snake's five nodes run as one pass where they can (the log
/// names one `FUSED5 MUL` per chain and no `SIN`), and not where the sine is
/// read elsewhere; fused, unfused (`GGML_CPU_DISABLE_FUSION=1`) and the
/// non-fusable chain all match the definition within 1e-6 of `|x| + inv_b`
/// (f32 rounding; measured ~1e-7). Shapes: a row length that leaves a
/// vector tail, rows longer than the 16 Ki values a worker takes at once,
/// and a batch of two.
#[test]
fn snake_is_one_pass_and_matches_the_definition() {
    const TEST: &str = "snake_is_one_pass_and_matches_the_definition";
    const SHAPES: [(usize, usize); 3] = [(1003, 1), (40_000, 1), (77, 2)];
    if common::in_child(CHILD_MARKER) {
        for (t, n) in SHAPES {
            let want = snake_reference(t, n);
            for also_sine in [false, true] {
                let got = snake_graph(t, n, also_sine);
                let want: Vec<f32> = if also_sine {
                    let (x, a, _) = snake_inputs(t, n);
                    want.iter().enumerate().map(|(i, w)| w + (x[i] * a[i / t % a.len()]).sin()).collect()
                } else {
                    want.clone()
                };
                let err = snake_error(&got, &want, t, n);
                println!("snake [{t}, 5, {n}], sine read elsewhere: {also_sine}: err {err:.2e} (tolerance 1e-6)");
                assert!(err <= 1e-6, "snake [{t}, 5, {n}] (sine read elsewhere: {also_sine}): {err:e}");
            }
        }
        return;
    }
    let blocks = |stderr: &str| {
        timing_blocks(stderr).into_iter().map(|(ops, _)| ops.into_iter().map(|(name, count, _)| (name, count)).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    let fused = blocks(&common::run_as_child(CHILD_MARKER, TEST, &[("GGML_CPU_PERF_LOGGER", "1")], &["GGML_CPU_DISABLE_FUSION"]));
    let unfused = blocks(&common::run_as_child(CHILD_MARKER, TEST, &[("GGML_CPU_PERF_LOGGER", "1"), ("GGML_CPU_DISABLE_FUSION", "1")], &[]));
    assert_eq!(fused.len(), 2 * SHAPES.len(), "one log block per graph: {fused:?}");
    for (i, ops) in fused.iter().enumerate() {
        let has = |name: &str| ops.iter().any(|(n, _)| n == name);
        if i % 2 == 0 {
            assert!(has("FUSED5 MUL") && !has("SIN"), "graph {i}: Snake not fused: {ops:?}");
        } else {
            assert!(has("SIN") && !has("FUSED5 MUL"), "graph {i}: fused although the sine is read elsewhere: {ops:?}");
        }
    }
    assert!(unfused.iter().all(|ops| ops.iter().any(|(n, _)| n == "SIN")), "GGML_CPU_DISABLE_FUSION=1 left a fusion: {unfused:?}");
}

/// Which keys each query of an [`Attention`] sees.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Visible {
    /// Every key, no mask.
    All,
    /// Query i (the last n_q positions) sees keys up to its own position: a
    /// decoding step over a cache, as T3's mask gives it.
    Causal,
    /// Keys beyond the first `n` hidden for every query (a cache's unused
    /// tail), and query 0 sees none.
    FirstAndRowHidden(usize),
}

/// One fused attention: `heads` query heads over `kv_heads` K/V heads
/// (grouped when fewer), K/V in F32 or rounded to F16 inside the graph.
#[derive(Debug, Clone, Copy)]
struct Attention {
    d: usize,
    n_q: usize,
    n_kv: usize,
    heads: usize,
    kv_heads: usize,
    f16_kv: bool,
    visible: Visible,
}

impl Attention {
    fn inputs(&self) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (q, k, v) = (self.d * self.n_q * self.heads, self.d * self.n_kv * self.kv_heads, self.d * self.n_kv * self.kv_heads);
        // K scaled up so that the softmax is peaked, as trained attention is.
        (values(q, 21), values(k, 22).iter().map(|x| 4.0 * x).collect(), values(v, 23))
    }

    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }

    fn sees(&self, i: usize, j: usize) -> bool {
        match self.visible {
            Visible::All => true,
            Visible::Causal => j <= self.n_kv - self.n_q + i,
            Visible::FirstAndRowHidden(n) => i != 0 && j < n,
        }
    }

    /// The mask `[n_kv, n_q]`: 0 where a key is visible, -inf elsewhere.
    fn mask(&self) -> Vec<f32> {
        (0..self.n_q).flat_map(|i| (0..self.n_kv).map(move |j| (i, j))).map(|(i, j)| if self.sees(i, j) { 0.0 } else { f32::NEG_INFINITY }).collect()
    }

    /// The definition in f64 on the values the graph sees (F16-rounded K/V
    /// where it rounds them): `[d, heads, n_q]`.
    fn reference(&self) -> Vec<f32> {
        let (q, k, v) = self.inputs();
        let (k, v) = if self.f16_kv { (common::through_f16(&k), common::through_f16(&v)) } else { (k, v) };
        let (d, group) = (self.d, self.heads / self.kv_heads);
        let mut out = vec![0f32; d * self.heads * self.n_q];
        for h in 0..self.heads {
            let kh = h / group;
            for i in 0..self.n_q {
                let qi = &q[(h * self.n_q + i) * d..][..d];
                let scores: Vec<f64> = (0..self.n_kv)
                    .map(|j| match self.sees(i, j) {
                        true => qi.iter().zip(&k[(kh * self.n_kv + j) * d..][..d]).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * self.scale() as f64,
                        false => f64::NEG_INFINITY,
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue; // no visible key: zeros
                }
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for c in 0..d {
                    let acc: f64 = weights.iter().enumerate().map(|(j, w)| w * v[(kh * self.n_kv + j) * d + c] as f64).sum();
                    out[(i * self.heads + h) * d + c] = (acc / sum) as f32;
                }
            }
        }
        out
    }

    fn run(&self, threads: i64) -> Vec<f32> {
        let cpu = open_device("cpu", vec![("threads", OptionValue::Int(threads))]);
        let (qv, kv, vv) = self.inputs();
        let a = *self;
        run_graph(&cpu, |ctx| {
            let q = ctx.new_tensor(TYPE_F32, &[a.d as i64, a.n_q as i64, a.heads as i64]).unwrap();
            let k = ctx.new_tensor(TYPE_F32, &[a.d as i64, a.n_kv as i64, a.kv_heads as i64]).unwrap();
            let v = ctx.new_tensor(TYPE_F32, &[a.d as i64, a.n_kv as i64, a.kv_heads as i64]).unwrap();
            let (kc, vc) = if a.f16_kv { (ctx.cast(k, ggml_sys::TYPE_F16).unwrap(), ctx.cast(v, ggml_sys::TYPE_F16).unwrap()) } else { (k, v) };
            let mut inputs = vec![(q, qv), (k, kv), (v, vv)];
            let mask = (a.visible != Visible::All).then(|| {
                let m = ctx.new_tensor(TYPE_F32, &[a.n_kv as i64, a.n_q as i64]).unwrap();
                inputs.push((m, a.mask()));
                ctx.cast(m, ggml_sys::TYPE_F16).unwrap()
            });
            let y = ctx.flash_attn_ext(q, kc, vc, mask, a.scale()).unwrap();
            (inputs, y)
        })
    }
}

/// Patches 0009 (unmasked attention of 16 or more queries in blocks of whole
/// score rows) and 0010 (fewer than 16 queries, keys outside and a thread's
/// heads inside): the CFM's heads (d = 64, 8 heads), key counts that leave a
/// remainder of the product's column tiles, enough keys that a job takes
/// fewer query rows (2000: 30 rows a job), grouped K/V heads, F16 K/V; T3's
/// decoding step (one query, 16 heads, F16 cache, a causal mask), a few
/// queries with a hidden cache tail and a row that sees no key; and what
/// stays on ggml's paths (a masked attention of many queries; one head on two
/// workers). 1 and 2 workers; tolerance 1e-5 of the largest output.
#[test]
fn attention_matches_the_definition() {
    let _serial = one_at_a_time();
    let base = Attention { d: 64, n_q: 200, n_kv: 300, heads: 8, kv_heads: 8, f16_kv: false, visible: Visible::All };
    let cases = [
        ("CFM-like: 8 heads of 64, 200 queries over 300 keys", base),
        ("17 queries over 43 keys", Attention { n_q: 17, n_kv: 43, heads: 2, kv_heads: 2, ..base }),
        ("2000 keys: 30 query rows a job, d = 80", Attention { d: 80, n_q: 100, n_kv: 2000, heads: 2, kv_heads: 2, ..base }),
        ("4 query heads over 2 K/V heads", Attention { heads: 4, kv_heads: 2, n_q: 50, ..base }),
        ("F16 K/V", Attention { f16_kv: true, heads: 2, kv_heads: 2, ..base }),
        (
            "T3's step: 1 query, 16 heads, F16 cache, causal",
            Attention { n_q: 1, n_kv: 517, heads: 16, kv_heads: 16, f16_kv: true, visible: Visible::Causal, ..base },
        ),
        ("8 queries, unmasked", Attention { n_q: 8, heads: 2, kv_heads: 2, ..base }),
        (
            "1 query, 1 head, 600 keys: ggml's path (fewer heads than workers)",
            Attention { n_q: 1, n_kv: 600, heads: 1, kv_heads: 1, visible: Visible::Causal, ..base },
        ),
        ("5 queries, cache tail hidden, a row with no key", Attention { n_q: 5, heads: 4, kv_heads: 2, visible: Visible::FirstAndRowHidden(250), ..base }),
        ("40 queries, causal: ggml's tiled path", Attention { n_q: 40, n_kv: 90, heads: 2, kv_heads: 2, visible: Visible::Causal, ..base }),
    ];
    for (what, attention) in cases {
        let want = attention.reference();
        for threads in [1, 2] {
            let got = attention.run(threads);
            let err = engine_core::compare::max_rel_err(&got, &want).unwrap();
            println!("flash_attn_ext, {what}, {threads} worker(s): rel err {err:.2e} (tolerance 1e-5)");
            assert!(err <= 1e-5, "{what} ({threads} workers): {err:e}, {attention:?}");
        }
    }
}
