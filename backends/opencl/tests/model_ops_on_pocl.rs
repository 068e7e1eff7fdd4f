//! The OpenCL C kernels this plugin's patch series adds (`kernels/leaky_relu.cl`
//! and `kernels/model_ops.cl`, read from the patches themselves) compiled and
//! run on pocl, the CPU OpenCL of this machine, with the arguments the patched
//! host code passes, against the same ops computed by ggml's CPU backend.
//!
//! ggml's OpenCL backend itself cannot run here (it needs `cl_khr_fp16`, which
//! pocl lacks), so this checks the kernels' arithmetic and their reading of
//! ggml's layouts, not the host code's dispatch. The kernels use no `half`
//! arithmetic (F16 weights are read with the core `vload_half`), so pocl
//! compiles all of them.
//!
//! Tolerances, as max |opencl − cpu| / max |cpu|: bit-identical for
//! LEAKY_RELU, ARANGE and PAD_REFLECT_1D; 1e-6 for SIN and COS (two libm implementations);
//! 1e-5 for the convolutions (sums in another order).
//!
//! Skipped (and says so) where no OpenCL platform is installed, unless
//! `TTS_REQUIRE_OPENCL` is set, as CI sets it.

use cl3::types::{cl_command_queue, cl_context, cl_kernel, cl_mem, cl_program};
use engine_core::abi::{BackendHandle, OptionValue};
use engine_core::loader;
use ggml_sys::{Context, Tensor, TYPE_F16, TYPE_F32};
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Mutex, MutexGuard};

/// The kernel files the patch series adds, each with the patch adding it.
const KERNELS: [(&str, &str); 2] = [
    ("patches/0001-native-leaky-relu.patch", "src/ggml-opencl/kernels/leaky_relu.cl"),
    ("patches/0002-model-ops.patch", "src/ggml-opencl/kernels/model_ops.cl"),
];

/// The text of `file` as `patch` adds it (a new file: every line of its hunk
/// is an addition).
fn added_file(patch: &str, file: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(patch)).unwrap();
    let start = text.find(&format!("+++ b/{file}\n")).unwrap_or_else(|| panic!("{patch} adds no {file}"));
    let mut lines = text[start..].lines().skip(1);
    let header = lines.next().unwrap();
    assert!(header.starts_with("@@ -0,0 +1,"), "{file} is a new file in {patch}: {header}");
    let mut source = String::new();
    for line in lines.take_while(|l| l.starts_with('+')) {
        source.push_str(&line[1..]);
        source.push('\n');
    }
    source
}

/// Deterministic values in [-2, 2), exact in F16 (multiples of 1/1024).
fn values(n: usize, seed: u64) -> Vec<f32> {
    engine_core::compare::grid_values(n, seed, 1024)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_from(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn rel_err(ours: &[f32], reference: &[f32]) -> f32 {
    engine_core::compare::max_rel_err(ours, reference).unwrap_or_else(|e| panic!("{e}"))
}

/// The CPU plugin built beside this test, ggml's reference for every op.
fn cpu() -> BackendHandle {
    let dir = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
    let path: PathBuf = dir.join(loader::backend_file_name("cpu"));
    loader::open_backend_device(&path, vec![("threads", OptionValue::Int(1))], 0).unwrap_or_else(|e| panic!("{e} (build the workspace first)"))
}

/// A pocl (or any) OpenCL device with the kernels built; None where OpenCL is
/// absent and not required.
struct Cl {
    /// pocl's first platform query is not thread-safe: one test at a time.
    _serial: MutexGuard<'static, ()>,
    context: cl_context,
    queue: cl_command_queue,
    program: cl_program,
}

impl Cl {
    fn open() -> Option<Cl> {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let required = std::env::var_os("TTS_REQUIRE_OPENCL").is_some();
        let skip = |why: String| {
            assert!(!required, "TTS_REQUIRE_OPENCL is set, but {why}");
            println!("skipped: {why}");
            None
        };
        if let Err(e) = cl3::load_library() {
            return skip(format!("no OpenCL ICD loader ({e:?})"));
        }
        let platforms = cl3::platform::get_platform_ids().unwrap_or_default();
        let Some(device) = platforms.iter().flat_map(|&p| cl3::device::get_device_ids(p, cl3::device::CL_DEVICE_TYPE_ALL).unwrap_or_default()).next() else {
            return skip("no OpenCL device".into());
        };
        let name = cl3::device::get_device_info(device, cl3::device::CL_DEVICE_NAME).map(String::from).unwrap_or_default();
        println!("  OpenCL device: {}", name.trim_end_matches('\0'));
        let context = cl3::context::create_context(&[device], ptr::null(), None, ptr::null_mut()).unwrap();
        let queue = unsafe { cl3::command_queue::create_command_queue(context, device, 0) }.unwrap();
        // One source string: cl3 0.13 passes several as a slice of fat pointers.
        let source: String = KERNELS.iter().map(|(patch, file)| added_file(patch, file)).collect();
        let program = cl3::program::create_program_with_source(context, &[&source]).unwrap();
        if cl3::program::build_program(program, &[device], &CString::new("").unwrap(), None, ptr::null_mut()).is_err() {
            let log = cl3::program::get_program_build_info(program, device, cl3::program::CL_PROGRAM_BUILD_LOG).map(String::from).unwrap_or_default();
            panic!("the patch series' kernels do not compile:\n{log}");
        }
        Some(Cl { _serial: serial, context, queue, program })
    }

    fn buffer(&self, bytes: &[u8]) -> cl_mem {
        let flags = cl3::memory::CL_MEM_READ_WRITE | cl3::memory::CL_MEM_COPY_HOST_PTR;
        unsafe { cl3::memory::create_buffer(self.context, flags, bytes.len().max(4), bytes.as_ptr() as *mut c_void) }.unwrap()
    }

    /// Runs `name` over `global` with `args`; returns the buffer argument `out` afterwards.
    fn run(&self, name: &str, args: &[Arg], global: [usize; 3], out: usize) -> Vec<u8> {
        let kernel: cl_kernel = cl3::kernel::create_kernel(self.program, &CString::new(name).unwrap()).unwrap();
        let mut mems = Vec::new();
        for (i, arg) in args.iter().enumerate() {
            let at = i as u32;
            unsafe {
                match arg {
                    Arg::Buffer(bytes) => {
                        mems.push((i, self.buffer(bytes), bytes.len()));
                        let m = &mems.last().unwrap().1;
                        cl3::kernel::set_kernel_arg(kernel, at, std::mem::size_of::<cl_mem>(), m as *const cl_mem as *const c_void)
                    }
                    Arg::Ulong(v) => cl3::kernel::set_kernel_arg(kernel, at, 8, v as *const u64 as *const c_void),
                    Arg::Int(v) => cl3::kernel::set_kernel_arg(kernel, at, 4, v as *const i32 as *const c_void),
                    Arg::Float(v) => cl3::kernel::set_kernel_arg(kernel, at, 4, v as *const f32 as *const c_void),
                }
                .unwrap_or_else(|e| panic!("{name}: argument {i}: error {e}"));
            }
        }
        let &(_, out_mem, out_len) = mems.iter().find(|(i, ..)| *i == out).unwrap_or_else(|| panic!("{name}: argument {out} is no buffer"));
        let mut bytes = vec![0u8; out_len];
        unsafe {
            cl3::command_queue::enqueue_nd_range_kernel(self.queue, kernel, 3, ptr::null(), global.as_ptr(), ptr::null(), 0, ptr::null()).unwrap();
            cl3::command_queue::enqueue_read_buffer(self.queue, out_mem, 1, 0, out_len, bytes.as_mut_ptr().cast(), 0, ptr::null()).unwrap();
            for (_, m, _) in mems {
                cl3::memory::release_mem_object(m).unwrap();
            }
            cl3::kernel::release_kernel(kernel).unwrap();
        }
        bytes
    }
}

impl Drop for Cl {
    fn drop(&mut self) {
        unsafe {
            let _ = cl3::program::release_program(self.program);
            let _ = cl3::command_queue::release_command_queue(self.queue);
            let _ = cl3::context::release_context(self.context);
        }
    }
}

enum Arg {
    Buffer(Vec<u8>),
    Ulong(u64),
    Int(i32),
    Float(f32),
}

/// Computes `out` on the CPU backend after uploading `inputs`; returns its raw bytes.
fn on_cpu<'a>(handle: &BackendHandle, ctx: &'a Context, out: Tensor<'a>, inputs: &[(Tensor<'a>, Vec<u8>)]) -> Vec<u8> {
    let backend = handle.ggml_backend();
    let mut graph = ctx.new_graph(16).unwrap();
    graph.build_forward(out);
    let _buffer = backend.alloc_ctx_tensors(ctx).unwrap();
    for (t, bytes) in inputs {
        t.set_bytes(bytes).unwrap();
    }
    backend.compute(&graph).unwrap();
    out.get_bytes().unwrap()
}

/// Bit-identical results (copies), naming the first element that differs.
fn assert_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} is {} on OpenCL, {} on the CPU", got[i], want[i]);
    }
    println!("  {what}: {} elements identical", got.len());
}

fn nb(t: Tensor<'_>, i: usize) -> Arg {
    Arg::Ulong(t.nb()[i] as u64)
}

#[test]
fn sin_and_cos_match_the_cpu_backend() {
    let Some(cl) = Cl::open() else { return };
    let handle = cpu();
    let x = values(1000, 1).into_iter().map(|v| v * 3.0).collect::<Vec<_>>();
    for op in ["sin", "cos"] {
        let ctx = Context::new_no_alloc(4, 8).unwrap();
        let a = ctx.new_tensor(TYPE_F32, &[40, 25]).unwrap();
        let y = if op == "sin" { ctx.sin(a) } else { ctx.cos(a) }.unwrap();
        let want = f32_from(&on_cpu(&handle, &ctx, y, &[(a, f32_bytes(&x))]));
        let args = [Arg::Buffer(f32_bytes(&x)), Arg::Ulong(0), Arg::Buffer(vec![0; x.len() * 4]), Arg::Ulong(0)];
        let got = f32_from(&cl.run(&format!("kernel_{op}_f32"), &args, [x.len(), 1, 1], 2));
        let e = rel_err(&got, &want);
        println!("  {op}: rel err {e:.2e} (tolerance 1e-6)");
        assert!(e <= 1e-6, "{op}: {e:e}");
    }
}

#[test]
fn leaky_relu_matches_the_cpu_backend() {
    let Some(cl) = Cl::open() else { return };
    let handle = cpu();
    let x = values(1000, 7);
    let ctx = Context::new_no_alloc(4, 8).unwrap();
    let a = ctx.new_tensor(TYPE_F32, &[40, 25]).unwrap();
    let y = ctx.leaky_relu(a, 0.1).unwrap();
    let want = f32_from(&on_cpu(&handle, &ctx, y, &[(a, f32_bytes(&x))]));
    let args = [Arg::Buffer(f32_bytes(&x)), Arg::Ulong(0), Arg::Buffer(vec![0; x.len() * 4]), Arg::Ulong(0), Arg::Float(0.1)];
    let got = f32_from(&cl.run("kernel_leaky_relu_f32", &args, [x.len(), 1, 1], 2));
    assert_identical("leaky_relu", &got, &want);
}

#[test]
fn arange_matches_the_cpu_backend() {
    let Some(cl) = Cl::open() else { return };
    let handle = cpu();
    let ctx = Context::new_no_alloc(4, 8).unwrap();
    let (start, stop, step) = (0.5f32, 20.0f32, 0.25f32);
    let y = ctx.arange(start, stop, step).unwrap();
    let want = f32_from(&on_cpu(&handle, &ctx, y, &[]));
    let n = want.len();
    assert_eq!(n, 78);
    let args = [Arg::Buffer(vec![0; n * 4]), Arg::Ulong(0), Arg::Float(start), Arg::Float(step)];
    let got = f32_from(&cl.run("kernel_arange_f32", &args, [n, 1, 1], 0));
    assert_identical("arange", &got, &want);
}

#[test]
fn pad_reflect_1d_matches_the_cpu_backend() {
    let Some(cl) = Cl::open() else { return };
    let handle = cpu();
    let ne = [17i64, 3, 2, 2];
    let (p0, p1) = (5, 7);
    let x = values(ne.iter().product::<i64>() as usize, 2);
    let ctx = Context::new_no_alloc(4, 8).unwrap();
    let a = ctx.new_tensor(TYPE_F32, &ne).unwrap();
    let y = ctx.pad_reflect_1d(a, p0, p1).unwrap();
    let want = f32_from(&on_cpu(&handle, &ctx, y, &[(a, f32_bytes(&x))]));
    let d = y.ne();
    let args = [
        Arg::Buffer(f32_bytes(&x)),
        Arg::Ulong(0),
        Arg::Buffer(vec![0; want.len() * 4]),
        Arg::Ulong(0),
        Arg::Int(ne[0] as i32),
        nb(a, 1),
        nb(a, 2),
        nb(a, 3),
        Arg::Int(d[2] as i32),
        nb(y, 0),
        nb(y, 1),
        nb(y, 2),
        nb(y, 3),
        Arg::Int(p0),
    ];
    let got = f32_from(&cl.run("kernel_pad_reflect_1d_f32", &args, [d[0] as usize, d[1] as usize, (d[2] * d[3]) as usize], 2));
    assert_identical("pad_reflect_1d", &got, &want);
}

#[test]
fn conv_transpose_1d_matches_the_cpu_backend() {
    let Some(cl) = Cl::open() else { return };
    let handle = cpu();
    // HiFT's upsampling shape (kernel twice the stride), and a kernel that is
    // no multiple of the stride.
    for (k, cout, cin, t, stride) in [(16usize, 8usize, 12usize, 30usize, 8i32), (7, 5, 3, 11, 3)] {
        for ty in [TYPE_F32, TYPE_F16] {
            let w = values(k * cout * cin, 3);
            let x = values(t * cin, 4);
            let ctx = Context::new_no_alloc(4, 8).unwrap();
            let kernel = ctx.new_tensor(ty, &[k as i64, cout as i64, cin as i64]).unwrap();
            let input = ctx.new_tensor(TYPE_F32, &[t as i64, cin as i64]).unwrap();
            let y = ctx.conv_transpose_1d(kernel, input, stride, 0, 1).unwrap();
            let w_bytes: Vec<u8> = if ty == TYPE_F16 {
                let mut h = vec![0u16; w.len()];
                unsafe { ggml_sys::sys::ggml_fp32_to_fp16_row(w.as_ptr(), h.as_mut_ptr().cast(), w.len() as i64) };
                h.iter().flat_map(|v| v.to_le_bytes()).collect()
            } else {
                f32_bytes(&w)
            };
            let want = f32_from(&on_cpu(&handle, &ctx, y, &[(kernel, w_bytes.clone()), (input, f32_bytes(&x))]));
            let ne0 = y.ne()[0] as usize;
            let args = [
                Arg::Buffer(w_bytes),
                Arg::Ulong(0),
                Arg::Buffer(f32_bytes(&x)),
                Arg::Ulong(0),
                Arg::Buffer(vec![0; want.len() * 4]),
                Arg::Ulong(0),
                Arg::Int(k as i32),
                Arg::Int(cout as i32),
                Arg::Int(cin as i32),
                Arg::Int(t as i32),
                Arg::Int(ne0 as i32),
                Arg::Int(stride),
            ];
            let name = if ty == TYPE_F16 { "kernel_conv_transpose_1d_f16" } else { "kernel_conv_transpose_1d_f32" };
            let got = f32_from(&cl.run(name, &args, [ne0, cout, 1], 4));
            let e = rel_err(&got, &want);
            println!("  {name}, K {k}, stride {stride}: rel err {e:.2e} (tolerance 1e-5)");
            assert!(e <= 1e-5, "{name}: {e:e}");
        }
    }
}

#[test]
fn conv_2d_dw_matches_the_cpu_backend_in_both_layouts() {
    let Some(cl) = Cl::open() else { return };
    let handle = cpu();
    let (w, h, c, n, kw, kh) = (19i64, 6i64, 4i64, 2i64, 5i64, 3i64);
    let cases = [
        ("WHCN, stride 2, padding", [2, 1], [2, 1], [1, 1]),
        ("WHCN, dilation", [1, 1], [0, 1], [2, 1]),
        ("channels fastest, dilation", [1, 1], [0, 0], [3, 1]),
    ];
    for (what, stride, pad, dilation) in cases {
        let channels_fastest = what.starts_with("channels");
        let x = values((w * h * c * n) as usize, 5);
        let k = values((kw * kh * c) as usize, 6);
        let ctx = Context::new_no_alloc(8, 16).unwrap();
        // Channels fastest as the model kit builds it: memory [C, W, H, N]
        // viewed as [W, H, C, N], the kernel's memory [C, 1, KW, KH] as [KW, KH, 1, C].
        let (input_mem, input) = if channels_fastest {
            let m = ctx.new_tensor(TYPE_F32, &[c, w, h, n]).unwrap();
            (m, ctx.permute(m, [2, 0, 1, 3]).unwrap())
        } else {
            let m = ctx.new_tensor(TYPE_F32, &[w, h, c, n]).unwrap();
            (m, m)
        };
        let (kernel_mem, kernel) = if channels_fastest {
            let m = ctx.new_tensor(TYPE_F32, &[c, 1, kw, kh]).unwrap();
            (m, ctx.permute(m, [3, 2, 0, 1]).unwrap())
        } else {
            let m = ctx.new_tensor(TYPE_F32, &[kw, kh, 1, c]).unwrap();
            (m, m)
        };
        let y = ctx.conv_2d_dw_direct(kernel, input, stride, pad, dilation).unwrap();
        let want = f32_from(&on_cpu(&handle, &ctx, y, &[(input_mem, f32_bytes(&x)), (kernel_mem, f32_bytes(&k))]));
        let d = y.ne();
        let mut args = vec![
            Arg::Buffer(f32_bytes(&k)),
            Arg::Ulong(0),
            Arg::Buffer(f32_bytes(&x)),
            Arg::Ulong(0),
            Arg::Buffer(vec![0; want.len() * 4]),
            Arg::Ulong(0),
            Arg::Int(kw as i32),
            Arg::Int(kh as i32),
            nb(kernel, 0),
            nb(kernel, 1),
            nb(kernel, 3),
            Arg::Int(w as i32),
            Arg::Int(h as i32),
            Arg::Int(c as i32),
        ];
        args.extend((0..4).map(|i| nb(input, i)));
        args.extend((0..4).map(|i| nb(y, i)));
        args.extend([stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1]].map(Arg::Int));
        let got = f32_from(&cl.run("kernel_conv_2d_dw_f32", &args, [d[0] as usize, d[1] as usize, (d[2] * d[3]) as usize], 4));
        let e = rel_err(&got, &want);
        println!("  conv_2d_dw, {what}: rel err {e:.2e} (tolerance 1e-5)");
        assert!(e <= 1e-5, "{what}: {e:e}");
    }
}
