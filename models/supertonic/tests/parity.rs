//! Stage-by-stage parity on the CPU plugin against the NumPy reference on the
//! committed tiny fixtures (`common/mod.rs` has the checks and tolerances).
//! The Vulkan half is `parity_vulkan.rs`, a separate process.

mod common;

use common::{run_fixture, CPU};

#[test]
fn cpu_tiny_v2() {
    run_fixture("cpu", "tiny-v2", &CPU);
}

#[test]
fn cpu_tiny_v3() {
    run_fixture("cpu", "tiny-v3", &CPU);
}
