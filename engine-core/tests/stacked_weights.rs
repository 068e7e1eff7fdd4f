//! Stacked weights (`TensorTable::stack`): matrices a file stores apart, kept
//! side by side in one tensor at load so that a graph multiplies by them in
//! one product. The stack must hold exactly the members' values in order,
//! each member must still read as itself, the sizing must be what the load
//! allocates, and a file whose members cannot be stacked is refused by name.

mod common;

use common::{check_close, one_at_a_time, open_device, open_lavapipe, run_graph, through_f16, values};
use engine_core::abi::{BackendHandle, OptionValue, WeightStorage};
use engine_core::model_kit::{Storage, TensorTable, Weights};
use ggml_sys::gguf::{GgufTensors, GgufWriter};
use ggml_sys::{Type, TYPE_F16, TYPE_F32};

const INPUTS: usize = 24;
/// Rows of each member (K and V narrower than Q, as with grouped heads).
const MEMBERS: [(&str, usize); 3] = [("attn.q", 6), ("attn.k", 4), ("attn.v", 4)];
const STACK: &str = "attn.qkv";

fn member_values(i: usize, rows: usize) -> Vec<f32> {
    values(INPUTS * rows, 11 + i as u64)
}

/// A model file with the three members (stored as `types` says) and one
/// unrelated bias, as bytes.
fn model_file(types: [Type; 3]) -> GgufTensors {
    let mut w = GgufWriter::new();
    for (i, ((name, rows), ty)) in MEMBERS.iter().zip(types).enumerate() {
        let v = member_values(i, *rows);
        let data = if ty == TYPE_F16 { half_bytes(&v) } else { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        w.add_tensor(name, ty, &[INPUTS as i64, *rows as i64], data).unwrap();
    }
    w.add_tensor("attn.bias", TYPE_F32, &[6], values(6, 3).iter().flat_map(|x| x.to_le_bytes()).collect()).unwrap();
    GgufTensors::from_bytes(&w.to_bytes().unwrap(), "stack.gguf").unwrap()
}

/// `v` as F16 bytes (ggml's rounding).
fn half_bytes(v: &[f32]) -> Vec<u8> {
    let mut half = vec![0u16; v.len()];
    unsafe { ggml_sys::sys::ggml_fp32_to_fp16_row(v.as_ptr(), half.as_mut_ptr().cast(), v.len() as i64) };
    half.iter().flat_map(|h| h.to_le_bytes()).collect()
}

fn table() -> TensorTable {
    let mut t = TensorTable::new();
    let names: Vec<String> = MEMBERS.iter().map(|(n, _)| n.to_string()).collect();
    for (name, rows) in MEMBERS {
        t.matrix(name, INPUTS, rows);
    }
    t.add("attn.bias", &[6], Storage::F32);
    t.stack(STACK, &names);
    t
}

/// The members' values in stack order, as stored (`f16`: rounded to halves).
fn stacked_values(f16: bool) -> Vec<f32> {
    let all: Vec<f32> = MEMBERS.iter().enumerate().flat_map(|(i, (_, rows))| member_values(i, *rows)).collect();
    if f16 {
        through_f16(&all)
    } else {
        all
    }
}

fn check_on(handle: &BackendHandle) {
    let backend = handle.ggml_backend();
    for (storage, f16) in [(WeightStorage::AsStored, false), (WeightStorage::F16, true)] {
        let what = format!("{} ({storage:?})", backend.name());
        let sized = Weights::for_measuring(model_file([TYPE_F32; 3]), table(), storage).unwrap();
        let weights = Weights::load(model_file([TYPE_F32; 3]), &backend, table(), storage, |_| false).unwrap();
        assert_eq!(weights.buffer_bytes(), sized.size_on(&backend, |_| false), "{what}: the sizing is what the load allocates");
        assert_eq!(weights.ne(STACK).unwrap(), [INPUTS as i64, 14, 1, 1], "{what}");
        let want = stacked_values(f16);

        // The stack reads back as the members one after another...
        let stack = weights.tensor(&ggml_sys::Context::new_no_alloc(1, 0).unwrap(), STACK).unwrap().get_f32().unwrap();
        assert_eq!(stack, want, "{what}: stack values");
        // ...and each member as itself.
        let mut at = 0;
        for (name, rows) in MEMBERS {
            let ctx = ggml_sys::Context::new_no_alloc(1, 0).unwrap();
            let member = weights.tensor(&ctx, name).unwrap();
            assert_eq!(member.get_f32().unwrap(), want[at..at + INPUTS * rows], "{what}: {name}");
            at += INPUTS * rows;
        }
        assert_eq!(weights.host_f32("attn.bias").unwrap(), values(6, 3), "{what}: an unstacked tensor");

        // One product by the stack is the three products, stacked.
        let frames = 5;
        let x = values(INPUTS * frames, 7);
        let got = run_graph(handle, |ctx| {
            let input = ctx.new_tensor(TYPE_F32, &[INPUTS as i64, frames as i64]).unwrap();
            let y = ctx.mul_mat(weights.tensor(ctx, STACK).unwrap(), input).unwrap();
            (vec![(input, x.clone())], y)
        });
        let expected: Vec<f32> = (0..frames)
            .flat_map(|f| {
                let (x, want) = (&x, &want);
                (0..14).map(move |r| (0..INPUTS).map(|i| want[r * INPUTS + i] * x[f * INPUTS + i]).sum::<f32>())
            })
            .collect();
        // F16 weights take F16 activations on some devices.
        check_close(&format!("{what}: stacked product"), &got, &expected, if f16 { 2e-2 } else { 1e-5 });
    }
}

#[test]
fn a_stack_holds_its_members_in_order_on_the_cpu() {
    let _one = one_at_a_time();
    check_on(&open_device("cpu", vec![("threads", OptionValue::Int(1))]));
}

#[test]
fn a_stack_holds_its_members_in_order_on_vulkan() {
    let _one = one_at_a_time();
    check_on(&open_lavapipe());
}

#[test]
fn members_that_differ_in_type_are_refused_by_name() {
    let _one = one_at_a_time();
    let backend = open_device("cpu", vec![("threads", OptionValue::Int(1))]).ggml_backend();
    let file = || model_file([TYPE_F32, TYPE_F16, TYPE_F32]);
    let e = Weights::load(file(), &backend, table(), WeightStorage::AsStored, |_| false).err().expect("mixed types cannot stack");
    assert_eq!(
        e.to_string(),
        "stack.gguf: tensors 'attn.q' (f32 [24, ..]) and 'attn.k' (f16 [24, ..]) cannot be stored as one 'attn.qkv': type or row length differ"
    );
    // The storage policy makes them one type, and then they stack.
    let weights = Weights::load(file(), &backend, table(), WeightStorage::F16, |_| false).unwrap();
    assert_eq!(weights.ne(STACK).unwrap()[1], 14);
}

#[test]
fn a_stack_that_names_what_the_table_lacks_is_a_plugin_bug() {
    let mut t = table();
    t.stack("attn.qk_bias", &["attn.q".to_string(), "attn.bias".to_string()]);
    let e = t.check(&model_file([TYPE_F32; 3])).unwrap_err();
    assert_eq!(e.to_string(), "stack 'attn.qk_bias': 'attn.bias' is not a matrix of the table (a bug in the plugin)");
}

#[test]
fn a_part_load_without_every_member_keeps_no_stack() {
    let _one = one_at_a_time();
    let backend = open_device("cpu", vec![("threads", OptionValue::Int(1))]).ggml_backend();
    let weights = Weights::load_part(model_file([TYPE_F32; 3]), &backend, table(), WeightStorage::AsStored, |_| false, |n| n != "attn.v").unwrap();
    let ctx = ggml_sys::Context::new_no_alloc(2, 0).unwrap();
    assert_eq!(weights.tensor(&ctx, "attn.k").unwrap().get_f32().unwrap(), member_values(1, 4), "a kept member loads on its own");
    let e = weights.tensor(&ctx, STACK).err().expect("the stack is dropped with a member");
    assert_eq!(e.to_string(), "tensor 'attn.qkv' is not in the model's tensor table (a bug in the plugin)");
}
