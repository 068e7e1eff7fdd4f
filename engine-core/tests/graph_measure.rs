//! Measure-only sizing (what a memory-fit preflight is built on): the bytes
//! ggml's allocators would take, computed without allocating, must be the
//! bytes they then take, on the CPU plugin and on the Vulkan plugin (lavapipe
//! on CI), whose buffer types align and pad differently.

mod common;

use common::{one_at_a_time, open_device, open_lavapipe};
use engine_core::abi::{BackendHandle, OptionValue};
use ggml_sys::{ComputeGraph, Context, GraphIo, TYPE_F16, TYPE_F32};

const D: i64 = 96;
const HIDDEN: i64 = 200;
const FRAMES: i64 = 37;

/// Two dense layers with a norm between (weights in a context of their own),
/// and the graph over them, built with `frames` input frames.
fn weights_context() -> Context {
    let ctx = Context::new_no_alloc(8, 0).unwrap();
    ctx.new_tensor(TYPE_F16, &[D, HIDDEN]).unwrap().set_name("up.weight");
    ctx.new_tensor(TYPE_F32, &[HIDDEN]).unwrap().set_name("up.bias");
    ctx.new_tensor(TYPE_F16, &[HIDDEN, D]).unwrap().set_name("down.weight");
    ctx.new_tensor(TYPE_F32, &[D]).unwrap().set_name("down.bias");
    ctx
}

fn mlp<'c>(ctx: &'c Context, weights: &Context, frames: i64) -> ggml_sys::Result<GraphIo<'c>> {
    let w = |name: &str| unsafe { weights.get_tensor(name).unwrap().rebind(ctx) };
    let mut io = GraphIo::default();
    let x = io.input(ctx, "x", TYPE_F32, &[D, frames])?;
    let h = ctx.gelu(ctx.add(ctx.mul_mat(w("up.weight"), x)?, w("up.bias"))?)?;
    let y = ctx.add(ctx.mul_mat(w("down.weight"), h)?, w("down.bias"))?;
    let y = ctx.norm(ctx.add(y, x)?, 1e-5)?;
    io.outputs.push(("y", y));
    Ok(io)
}

fn check(handle: &BackendHandle) {
    let backend = handle.ggml_backend();
    let buft = backend.buffer_type();
    let weights = weights_context();

    // Weights: the size asked of the buffer type is the buffer then allocated.
    let predicted = buft.size_for(&weights);
    assert!(predicted > 0);
    // Intermediates can be measured before the weights have memory (from a
    // file's metadata alone): weights never count among them.
    let before = ComputeGraph::measure(buft, 64, |ctx| mlp(ctx, &weights, FRAMES)).unwrap();
    assert!(weights.tensors().iter().all(|t| !t.has_memory()), "the measure left an address in a weight without memory");
    let buffer = backend.alloc_ctx_tensors(&weights).unwrap();
    assert_eq!(buffer.size(), predicted, "{}: weight buffer", backend.name());
    // Nothing left to place: the measure is 0, as the allocation would be.
    assert_eq!(buft.size_for(&weights), 0);

    // Intermediates, for a few lengths: measured equals what the graph gets.
    for frames in [1, FRAMES, 3 * FRAMES + 5] {
        let measured = ComputeGraph::measure(buft, 64, |ctx| mlp(ctx, &weights, frames)).unwrap();
        let built = ComputeGraph::build(&backend, 64, |ctx| mlp(ctx, &weights, frames)).unwrap();
        assert_eq!(measured, built.buffer_size(), "{}: {frames} frames", backend.name());
        assert!(measured >= (frames * HIDDEN * 4) as usize, "{}: {measured} bytes cannot hold the hidden layer", backend.name());
    }
    let after = ComputeGraph::measure(buft, 64, |ctx| mlp(ctx, &weights, FRAMES)).unwrap();
    assert_eq!(before, after, "{}: measured before and after the weights had memory", backend.name());
}

#[test]
fn measured_sizes_are_the_sizes_allocated_on_the_cpu() {
    let _one = one_at_a_time();
    check(&open_device("cpu", vec![("threads", OptionValue::Int(1))]));
}

#[test]
fn measured_sizes_are_the_sizes_allocated_on_vulkan() {
    let _one = one_at_a_time();
    check(&open_lavapipe());
}
