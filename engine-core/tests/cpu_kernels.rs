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
/// reach, one input channel, a batch, 1 and 2 workers. Tolerance 1e-5 of the
/// largest output (F32 sums over at most 288 taps).
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
