//! The GGUF reader on arbitrary bytes: every metadata value read with every
//! typed getter, every tensor descriptor listed. Errors are fine; a crash, an
//! abort (GGML_ASSERT), a hang or an out-of-memory is not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tts_fuzz::quiet;

fuzz_target!(|data: &[u8]| {
    quiet();
    let Ok(gguf) = ggml_sys::gguf::GgufTensors::from_bytes(data, "fuzz.gguf") else { return };
    let file = &gguf.file;
    for key in file.keys() {
        let _ = file.get_str(&key);
        let _ = file.get_u32(&key);
        let _ = file.get_f32(&key);
        let _ = file.get_bool(&key);
        let _ = file.get_u32_array(&key);
        let _ = file.get_str_array(&key);
    }
    for t in file.tensors() {
        let _ = gguf.ctx.get_tensor(&t.name).map(|x| x.ne());
        let _ = gguf.read_bytes(&t.name);
    }
});
