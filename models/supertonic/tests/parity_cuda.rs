//! Stage-by-stage parity on the CUDA plugin against the NumPy reference on the
//! committed tiny fixtures (`common/mod.rs`). Runs where a CUDA module and
//! device exist (the GPU host); elsewhere each test says it is skipped.

mod common;

use common::{available, run_fixture, CUDA};

#[test]
fn cuda_tiny_v2() {
    if available("cuda") {
        run_fixture("cuda", "tiny-v2", &CUDA);
    }
}

#[test]
fn cuda_tiny_v3() {
    if available("cuda") {
        run_fixture("cuda", "tiny-v3", &CUDA);
    }
}
