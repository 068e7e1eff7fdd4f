//! Backends opened from many threads at once. Each open loads the plugin's ggml
//! module into ggml's process-wide module list, which has no lock of its own:
//! before the host serialised opening, CPU and Vulkan tests opening side by
//! side crashed the test process now and then (SIGSEGV, heap corruption).

mod common;

use engine_core::abi::OptionValue;
use engine_core::loader;

#[test]
fn backends_open_from_many_threads_at_once() {
    let options = |backend: &str| match backend {
        "vulkan" => vec![("allow_software", OptionValue::Bool(true)), ("pipeline_cache", OptionValue::Bool(false))],
        _ => vec![("threads", OptionValue::Int(1))],
    };
    let mut backends = vec!["cpu"];
    match loader::open_backend_device(&common::artifact_dir().join(loader::backend_file_name("vulkan")), options("vulkan"), 0) {
        Ok(_) => backends.push("vulkan"),
        Err(e) => println!("vulkan: no device here ({e}); CPU alone"),
    }
    let opened: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|i| {
                let (backends, options) = (&backends, &options);
                s.spawn(move || {
                    let mut handles = Vec::new();
                    for round in 0..6 {
                        let backend = backends[(i + round) % backends.len()];
                        let handle = common::open_device(backend, options(backend));
                        assert!(!handle.ggml_backend().name().is_empty(), "{backend}: a backend without a name");
                        handles.push(handle);
                    }
                    handles.len()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("an opening thread panicked")).sum()
    });
    assert_eq!(opened, 48);
}
