//! Stage-by-stage parity on the Vulkan plugin (lavapipe on CI) against the
//! NumPy reference on the committed tiny fixtures (`common/mod.rs`). Kept out
//! of the CPU test process: lavapipe and the CPU module in one process with
//! tests on parallel threads corrupted the heap now and then (see the notes).

mod common;

use common::{run_fixture, VULKAN};

#[test]
fn vulkan_tiny_v2() {
    run_fixture("vulkan", "tiny-v2", &VULKAN);
}

#[test]
fn vulkan_tiny_v3() {
    run_fixture("vulkan", "tiny-v3", &VULKAN);
}
