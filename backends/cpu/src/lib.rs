//! CPU backend plugin: ggml's CPU module, one device, a thread count option
//! that gives way to other busy processes ([`contention`]).

mod contention;

use abi_stable::std_types::{RResult, RString, RVec};
use engine_core::abi::{BackendOpenRequest, BackendSessionBox, DeviceKind, OptionKind, OptionSpec, OptionValue};
use engine_core::backend_kit::{self, BackendFlavor, GgmlSession};
use ggml_sys::{Backend, Device, Registry};

engine_core::backend_plugin!("cpu", "ggml CPU backend");

extern "C" fn option_specs() -> RVec<OptionSpec> {
    RVec::from(vec![
        backend_kit::spec("threads", OptionKind::Int, OptionValue::Int(0), "worker threads: 0 = one per core; at most the machine's core count"),
        backend_kit::spec(
            "adapt_threads",
            OptionKind::Bool,
            OptionValue::Bool(true),
            "before each graph, leave the cores other busy processes use (ggml's workers spin at barriers)",
        ),
    ])
}

struct Cpu {
    threads: usize,
    adapt_threads: bool,
}

impl BackendFlavor for Cpu {
    fn classify(&self, _registry: &Registry, _index: usize, _device: &Device) -> Option<DeviceKind> {
        Some(DeviceKind::Cpu)
    }

    fn configure(&self, backend: &Backend) -> u32 {
        backend.set_n_threads(self.threads);
        if self.adapt_threads && self.threads > 1 {
            let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
            // Lives as long as the process: a backend may outlive any owner here.
            let free: &'static contention::FreeCores = Box::leak(Box::new(contention::FreeCores::new(self.threads, allowed)));
            let data = free as *const contention::FreeCores as *mut std::ffi::c_void;
            if !unsafe { backend.set_threads_callback(contention::threads_callback, data) } {
                tracing::warn!("the CPU module has no per-graph thread count (patch 0002 missing); threads stay at {}", self.threads);
            }
        }
        self.threads as u32
    }
}

/// The worker count for a `threads` value: 0 means one per core; more than the
/// cores this process may run on is refused, because ggml's workers spin at
/// every barrier and oversubscribed cores make them wait on each other (4
/// threads on 2 cores measured 40 times slower than 2).
fn threads(requested: i64) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match usize::try_from(requested) {
        Ok(0) => Ok(cores),
        Ok(n) if n <= cores => Ok(n),
        _ => Err(backend_kit::option_error(format!("threads = {requested}: this machine has {cores} cores; use 0 (one thread per core) or 1..={cores}"))),
    }
}

extern "C" fn open(req: &BackendOpenRequest) -> RResult<BackendSessionBox, RString> {
    backend_kit::guarded_open(|| {
        let threads = threads(backend_kit::option_int(req, "threads"))?;
        let (registry, facts) = engine_core::load_plugin_module!(req)?;
        let adapt_threads = backend_kit::option_bool(req, "adapt_threads");
        Ok(GgmlSession::new(Cpu { threads, adapt_threads }, registry, facts).into_box())
    })
}
