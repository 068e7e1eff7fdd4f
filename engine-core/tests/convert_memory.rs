//! The converters' memory promises, measured with a counting allocator:
//! reading a checkpoint tensor allocates that tensor (not a copy of its
//! bytes besides), and the GGUF writer holds one tensor's values at a time,
//! not the model. One test function, so no other test's allocations are
//! counted.

use engine_core::model_kit::convert::{Checkpoint, GgmlType, GgufWriter, PlannedTensor, Values};
use ndarray::{ArrayD, IxDyn};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most bytes allocated at once while `f` ran, beyond what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst) - base)
}

const MIB: usize = 1 << 20;

#[test]
fn reading_and_writing_hold_one_tensor_at_a_time() {
    let dir = tempfile::tempdir().unwrap();

    // A safetensors file of an 8 MiB F32 tensor and a 4 MiB F16 one.
    let n = 2 * MIB;
    let header = format!(
        r#"{{"a":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}},"h":{{"dtype":"F16","shape":[{n}],"data_offsets":[{},{}]}}}}"#,
        4 * n,
        4 * n,
        6 * n
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + 6 * n, 0x3c);
    let path = dir.path().join("big.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    let ck = Checkpoint::open(&path).unwrap();
    for name in ["a", "h"] {
        let (values, peak) = peak_during(|| ck.read_f32(name).unwrap());
        assert_eq!(values.len(), n);
        // The f32 result (8 MiB) and small change; no copy of the stored bytes.
        assert!(peak < 4 * n + MIB / 4, "reading '{name}' peaked at {peak} bytes for a {} byte result", 4 * n);
    }

    // A `.pt` state dict: each tensor's f32 values plus a 64 KiB read buffer.
    let pt = Checkpoint::open(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chatterbox/mtl-tiny/official/s3gen.pt")).unwrap();
    let mut largest = 0;
    for name in pt.names().into_iter().filter(|n| pt.is_float(n).unwrap()) {
        let (values, peak) = peak_during(|| pt.read_f32(&name).unwrap());
        let result = 4 * values.len();
        largest = largest.max(result);
        assert!(peak <= result + result.min(64 * 1024) + 4096, "reading '{name}' peaked at {peak} bytes for a {result} byte result");
    }
    assert!(largest > 64 * 1024, "the fixture's largest tensor is {largest} bytes: too small to tell");

    // Eight 4 MiB tensors, produced lazily: the writer holds one (and its
    // encoded chunk and 1 MiB write buffer), never the 32 MiB model.
    let mut w = GgufWriter::new("memory");
    for i in 0..8 {
        let storage = [GgmlType::F32, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q4_0][i % 4];
        w.add_tensor(PlannedTensor::new(format!("t{i}"), vec![1024, 1024], storage, move || {
            Ok(Values::F32(ArrayD::from_shape_vec(IxDyn(&[1024, 1024]), (0..MIB).map(|j| (j % 251) as f32 - 125.0).collect()).unwrap()))
        }));
    }
    let out = dir.path().join("model.gguf");
    let (written, peak) = peak_during(|| w.write_atomically(&out).unwrap());
    assert_eq!(written.tensors, 8);
    assert!(peak < 4 * MIB + 2 * MIB, "writing peaked at {peak} bytes; one tensor is {} bytes, the model {}", 4 * MIB, written.bytes);
}
