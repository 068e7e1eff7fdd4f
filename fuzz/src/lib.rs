//! What the fuzz targets share.

/// ggml logs every input it refuses; without this the fuzzer would mostly
/// print that. Idempotent.
pub fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(ggml_sys::silence_log);
}
