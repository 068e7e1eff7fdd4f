//! Supertonic's load-time checks (architecture, hparam ranges, the tensor
//! table, the indexer) on arbitrary GGUF images, without a device.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tts_fuzz::quiet;

fuzz_target!(|data: &[u8]| {
    quiet();
    let _ = tts_model_supertonic::check_model_bytes(data);
});
