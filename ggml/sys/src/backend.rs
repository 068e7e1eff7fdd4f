//! Backend registries (DL modules), devices, backends and buffers.

use crate::context::{Context, Graph, Tensor};
use crate::{cstr_to_string, err, sys, Result};
use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

/// A backend registry: one loaded ggml backend module (`libggml-cpu.so`, ...).
/// Registries are never unloaded; the handle is `'static`.
#[derive(Clone, Copy)]
pub struct Registry(NonNull<sys::ggml_backend_reg>);

unsafe impl Send for Registry {}
unsafe impl Sync for Registry {}

/// Loads a ggml DL backend module through the shared `libggml` loader, which also
/// checks the module's backend API version against the shared base.
pub fn load_backend_module(path: &Path) -> Result<Registry> {
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| crate::Error::Msg(e.to_string()))?;
    match NonNull::new(unsafe { sys::ggml_backend_load(c.as_ptr()) }) {
        Some(reg) => Ok(Registry(reg)),
        None => err(format!(
            "ggml could not load backend module {} (not a ggml module, a backend API version mismatch, or missing dependencies; ggml's log says which)",
            path.display()
        )),
    }
}

impl Registry {
    pub fn as_ptr(&self) -> sys::ggml_backend_reg_t {
        self.0.as_ptr()
    }

    pub fn name(&self) -> String {
        unsafe { cstr_to_string(sys::ggml_backend_reg_name(self.as_ptr())) }
    }

    pub fn devices(&self) -> Vec<Device> {
        let n = unsafe { sys::ggml_backend_reg_dev_count(self.as_ptr()) };
        (0..n).filter_map(|i| NonNull::new(unsafe { sys::ggml_backend_reg_dev_get(self.as_ptr(), i) }).map(Device)).collect()
    }

    /// A function the module exports by name (`ggml_backend_set_n_threads`, ...).
    pub fn proc_address(&self, name: &str) -> Option<NonNull<std::ffi::c_void>> {
        let c = CString::new(name).ok()?;
        NonNull::new(unsafe { sys::ggml_backend_reg_get_proc_address(self.as_ptr(), c.as_ptr()) })
    }

    /// `name=value` build features the module reports (CPU ISA, CUDA archs, ...).
    pub fn features(&self) -> Vec<(String, String)> {
        type GetFeatures = unsafe extern "C" fn(sys::ggml_backend_reg_t) -> *const sys::ggml_backend_feature;
        let Some(f) = self.proc_address("ggml_backend_get_features") else {
            return Vec::new();
        };
        let f: GetFeatures = unsafe { std::mem::transmute(f.as_ptr()) };
        let mut out = Vec::new();
        unsafe {
            let mut p = f(self.as_ptr());
            while !p.is_null() && !(*p).name.is_null() {
                out.push((cstr_to_string((*p).name), cstr_to_string((*p).value)));
                p = p.add(1);
            }
        }
        out
    }
}

/// `(data, n_threads) -> threads for this graph`, see [`Backend::set_threads_callback`].
pub type ThreadsCallback = unsafe extern "C" fn(*mut std::ffi::c_void, std::os::raw::c_int) -> std::os::raw::c_int;

/// Device kinds as ggml reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accelerator,
    Other,
}

/// A device of a loaded registry. Devices live as long as the process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Device(NonNull<sys::ggml_backend_device>);

unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    pub fn as_ptr(&self) -> sys::ggml_backend_dev_t {
        self.0.as_ptr()
    }

    pub unsafe fn from_raw(p: sys::ggml_backend_dev_t) -> Option<Device> {
        NonNull::new(p).map(Device)
    }

    pub fn name(&self) -> String {
        unsafe { cstr_to_string(sys::ggml_backend_dev_name(self.as_ptr())) }
    }

    pub fn description(&self) -> String {
        unsafe { cstr_to_string(sys::ggml_backend_dev_description(self.as_ptr())) }
    }

    /// A GPU, discrete or integrated.
    pub fn is_gpu(&self) -> bool {
        matches!(self.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu)
    }

    pub fn kind(&self) -> DeviceKind {
        match unsafe { sys::ggml_backend_dev_type(self.as_ptr()) } {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            _ => DeviceKind::Other,
        }
    }

    /// The device's bus id ("0000:01:00.0" for a PCI GPU), where the backend reports one.
    pub fn bus_id(&self) -> Option<String> {
        let mut props: sys::ggml_backend_dev_props = unsafe { std::mem::zeroed() };
        unsafe { sys::ggml_backend_dev_get_props(self.as_ptr(), &mut props) };
        let id = unsafe { cstr_to_string(props.device_id) };
        (!id.is_empty()).then_some(id)
    }

    /// (free, total) bytes.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        unsafe { sys::ggml_backend_dev_memory(self.as_ptr(), &mut free, &mut total) };
        (free, total)
    }

    pub fn registry(&self) -> Option<Registry> {
        NonNull::new(unsafe { sys::ggml_backend_dev_backend_reg(self.as_ptr()) }).map(Registry)
    }

    /// Whether the device can run `node` as built (a synthetic node is enough:
    /// nothing is allocated or computed).
    pub fn supports_op(&self, node: Tensor<'_>) -> bool {
        unsafe { sys::ggml_backend_dev_supports_op(self.as_ptr(), node.as_ptr()) }
    }

    /// Extra buffer types of the device (CPU: repacked and AMX layouts for
    /// quantized matrices), through the registry's optional proc.
    pub(crate) fn extra_buffer_types(&self) -> Vec<sys::ggml_backend_buffer_type_t> {
        type GetExtra = unsafe extern "C" fn(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type_t;
        let Some(f) = self.registry().and_then(|r| r.proc_address("ggml_backend_dev_get_extra_bufts")) else {
            return Vec::new();
        };
        let f: GetExtra = unsafe { std::mem::transmute(f.as_ptr()) };
        let mut out = Vec::new();
        let mut p = unsafe { f(self.as_ptr()) };
        while !p.is_null() && !unsafe { *p }.is_null() {
            out.push(unsafe { *p });
            p = unsafe { p.add(1) };
        }
        out
    }

    /// Whether a matrix product with `weight` (type and shape) as its first
    /// operand, stored in a buffer of `buft`, runs on this device.
    pub(crate) fn supports_weight_in(&self, buft: sys::ggml_backend_buffer_type_t, weight: Tensor<'_>) -> bool {
        let Ok(ctx) = Context::new_no_alloc(4, 0) else {
            return false;
        };
        let ne = weight.ne();
        let (Ok(w), Ok(x)) = (ctx.new_tensor(weight.ty(), &ne), ctx.new_tensor(sys::GGML_TYPE_F32, &[ne[0], 64, ne[2], ne[3]])) else {
            return false;
        };
        let Ok(op) = ctx.mul_mat(w, x) else {
            return false;
        };
        let dummy = unsafe { sys::ggml_backend_buft_alloc_buffer(buft, 0) };
        if dummy.is_null() {
            return false;
        }
        unsafe { (*w.as_ptr()).buffer = dummy };
        let ok = self.supports_op(op);
        unsafe {
            (*w.as_ptr()).buffer = std::ptr::null_mut();
            sys::ggml_backend_buffer_free(dummy);
        }
        ok
    }

    /// The pinned host buffer type, if the device offers one.
    pub fn host_buffer_type(&self) -> Option<BufferType> {
        NonNull::new(unsafe { sys::ggml_backend_dev_host_buffer_type(self.as_ptr()) }).map(BufferType)
    }

    pub fn init(&self, params: Option<&str>) -> Result<Backend> {
        let c = params.map(|p| CString::new(p).unwrap_or_default());
        let p = unsafe { sys::ggml_backend_dev_init(self.as_ptr(), c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())) };
        match NonNull::new(p) {
            Some(ptr) => Ok(Backend { ptr, owned: true }),
            None => err(format!("device {} failed to initialise", self.name())),
        }
    }
}

/// A backend (an initialised device stream). Freed on drop when owned.
pub struct Backend {
    ptr: NonNull<sys::ggml_backend>,
    owned: bool,
}

unsafe impl Send for Backend {}

impl Backend {
    pub fn as_ptr(&self) -> sys::ggml_backend_t {
        self.ptr.as_ptr()
    }

    /// Borrows a backend created elsewhere in the process (another plugin).
    /// The returned value does not free it.
    pub unsafe fn from_raw(p: sys::ggml_backend_t) -> Option<Backend> {
        NonNull::new(p).map(|ptr| Backend { ptr, owned: false })
    }

    /// Gives up ownership; the caller frees the raw pointer with [`Backend::free_raw`].
    pub fn into_raw(self) -> sys::ggml_backend_t {
        let p = self.as_ptr();
        std::mem::forget(self);
        p
    }

    pub unsafe fn free_raw(p: sys::ggml_backend_t) {
        if !p.is_null() {
            unsafe { sys::ggml_backend_free(p) }
        }
    }

    pub fn name(&self) -> String {
        unsafe { cstr_to_string(sys::ggml_backend_name(self.as_ptr())) }
    }

    /// Another backend on this one's device with a stream (CUDA) or command
    /// pool (Vulkan) of its own, so that a second thread may compute on the
    /// device while this backend does; the buffers of either serve both. None
    /// on the host, whose backends share the cores rather than add any.
    pub fn second_stream(&self) -> Result<Option<Backend>> {
        match self.device() {
            Some(device) if device.is_gpu() => device.init(None).map(Some),
            _ => Ok(None),
        }
    }

    pub fn device(&self) -> Option<Device> {
        unsafe { Device::from_raw(sys::ggml_backend_get_device(self.as_ptr())) }
    }

    /// Sets the worker thread count where the backend has one (CPU). Returns
    /// whether the backend took it.
    pub fn set_n_threads(&self, n: usize) -> bool {
        type SetThreads = unsafe extern "C" fn(sys::ggml_backend_t, std::os::raw::c_int);
        let Some(f) = self.device().and_then(|d| d.registry()).and_then(|r| r.proc_address("ggml_backend_set_n_threads")) else {
            return false;
        };
        let f: SetThreads = unsafe { std::mem::transmute(f.as_ptr()) };
        unsafe { f(self.as_ptr(), n as std::os::raw::c_int) };
        true
    }

    /// Registers `callback`, asked before each graph how many of the backend's
    /// threads to use (CPU module with the plugin's patch 0002). The caller keeps
    /// `data` alive as long as the backend. Returns whether the module took it.
    ///
    /// # Safety
    /// `data` must stay valid, and `callback` safe to call from any thread, for
    /// the backend's lifetime.
    pub unsafe fn set_threads_callback(&self, callback: ThreadsCallback, data: *mut std::ffi::c_void) -> bool {
        type SetCallback = unsafe extern "C" fn(sys::ggml_backend_t, ThreadsCallback, *mut std::ffi::c_void);
        let Some(f) = self.device().and_then(|d| d.registry()).and_then(|r| r.proc_address("ggml_backend_cpu_set_threads_callback")) else {
            return false;
        };
        let f: SetCallback = unsafe { std::mem::transmute(f.as_ptr()) };
        unsafe { f(self.as_ptr(), callback, data) };
        true
    }

    /// Allocates every tensor of `ctx` in one buffer of this backend.
    pub fn alloc_ctx_tensors(&self, ctx: &Context) -> Result<Buffer> {
        match NonNull::new(unsafe { sys::ggml_backend_alloc_ctx_tensors(ctx.as_ptr(), self.as_ptr()) }) {
            Some(ptr) => Ok(Buffer { ptr }),
            None => err(format!("{}: could not allocate tensor buffer", self.name())),
        }
    }

    /// The backend's default buffer type.
    pub fn buffer_type(&self) -> BufferType {
        let p = unsafe { sys::ggml_backend_get_default_buffer_type(self.as_ptr()) };
        BufferType(NonNull::new(p).expect("every backend has a default buffer type"))
    }

    pub fn compute(&self, graph: &Graph<'_>) -> Result<()> {
        self.check_status(unsafe { sys::ggml_backend_graph_compute(self.as_ptr(), graph.as_ptr()) })
    }

    /// Queues `graph` on the backend's stream and returns; [`synchronize`](Self::synchronize) waits.
    pub fn compute_async(&self, graph: &Graph<'_>) -> Result<()> {
        self.check_status(unsafe { sys::ggml_backend_graph_compute_async(self.as_ptr(), graph.as_ptr()) })
    }

    fn check_status(&self, status: sys::ggml_status) -> Result<()> {
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            err(format!("{}: graph compute failed (status {status})", self.name()))
        }
    }

    /// Waits for everything queued on the backend's stream.
    pub fn synchronize(&self) {
        unsafe { sys::ggml_backend_synchronize(self.as_ptr()) }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if self.owned {
            unsafe { sys::ggml_backend_free(self.ptr.as_ptr()) }
        }
    }
}

/// A kind of backend memory: a device's own, host memory, or pinned host
/// memory a device copies from directly. Buffer types are static in ggml.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferType(NonNull<sys::ggml_backend_buffer_type>);

unsafe impl Send for BufferType {}
unsafe impl Sync for BufferType {}

impl BufferType {
    pub fn as_ptr(&self) -> sys::ggml_backend_buffer_type_t {
        self.0.as_ptr()
    }

    /// Whether the host can address its buffers.
    pub fn is_host(&self) -> bool {
        unsafe { sys::ggml_backend_buft_is_host(self.as_ptr()) }
    }

    pub fn alignment(&self) -> usize {
        unsafe { sys::ggml_backend_buft_get_alignment(self.as_ptr()) }
    }

    /// The bytes one buffer of this type needs for every tensor of `ctx` that
    /// has no memory yet, as [`Backend::alloc_ctx_tensors`] would place them
    /// (alignment and the type's per-tensor padding included); nothing is
    /// allocated.
    pub fn size_for(&self, ctx: &Context) -> usize {
        unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft_size(ctx.as_ptr(), self.as_ptr()) }
    }

    /// A buffer of `size` bytes.
    pub fn alloc(&self, size: usize) -> Result<Buffer> {
        match NonNull::new(unsafe { sys::ggml_backend_buft_alloc_buffer(self.as_ptr(), size) }) {
            Some(p) => Ok(Buffer::from_raw(p)),
            None => err(format!("could not allocate {size} bytes of {}", unsafe { crate::cstr_to_string(sys::ggml_backend_buft_name(self.as_ptr())) })),
        }
    }
}

/// A backend buffer holding tensor data.
pub struct Buffer {
    ptr: NonNull<sys::ggml_backend_buffer>,
}

unsafe impl Send for Buffer {}

impl Buffer {
    pub(crate) fn from_raw(ptr: NonNull<sys::ggml_backend_buffer>) -> Self {
        Buffer { ptr }
    }

    pub fn size(&self) -> usize {
        unsafe { sys::ggml_backend_buffer_get_size(self.ptr.as_ptr()) }
    }

    /// Host address of the buffer's memory (null for device memory).
    pub(crate) fn base(&self) -> *mut u8 {
        unsafe { sys::ggml_backend_buffer_get_base(self.ptr.as_ptr()) }.cast()
    }

    /// Sets every byte of the buffer to `value`.
    pub fn clear(&self, value: u8) {
        unsafe { sys::ggml_backend_buffer_clear(self.ptr.as_ptr(), value) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        unsafe { sys::ggml_backend_buffer_free(self.ptr.as_ptr()) }
    }
}

/// A graph allocator: places a graph's intermediate tensors in one reusable
/// backend buffer, sharing memory between tensors whose lifetimes do not overlap.
/// Re-allocating a graph of the same shape reuses the buffer.
pub struct GraphAllocator {
    ptr: NonNull<sys::ggml_gallocr>,
}

unsafe impl Send for GraphAllocator {}

impl GraphAllocator {
    pub fn new(backend: &Backend) -> Result<Self> {
        Self::for_type(backend.buffer_type())
    }

    /// An allocator placing intermediates in buffers of `buft`.
    pub fn for_type(buft: BufferType) -> Result<Self> {
        match NonNull::new(unsafe { sys::ggml_gallocr_new(buft.as_ptr()) }) {
            Some(ptr) => Ok(GraphAllocator { ptr }),
            None => err("ggml_gallocr_new failed"),
        }
    }

    /// The bytes [`alloc`](Self::alloc) would give `graph`'s intermediates
    /// (ggml's measure-only reservation); nothing is allocated. Tensors that
    /// already have memory (weights, caches) are not counted.
    pub fn measure(&mut self, graph: &Graph<'_>) -> usize {
        let mut size = 0usize;
        unsafe { sys::ggml_gallocr_reserve_n_size(self.ptr.as_ptr(), graph.as_ptr(), std::ptr::null(), std::ptr::null(), &mut size) };
        size
    }

    /// The size of the buffer the last allocation left in place.
    pub fn buffer_size(&self) -> usize {
        unsafe { sys::ggml_gallocr_get_buffer_size(self.ptr.as_ptr(), 0) }
    }

    /// Assigns memory to every tensor of `graph` that has none.
    pub fn alloc(&mut self, graph: &Graph<'_>) -> Result<()> {
        if unsafe { sys::ggml_gallocr_alloc_graph(self.ptr.as_ptr(), graph.as_ptr()) } {
            Ok(())
        } else {
            err("could not allocate the compute graph's buffer")
        }
    }
}

impl Drop for GraphAllocator {
    fn drop(&mut self) {
        unsafe { sys::ggml_gallocr_free(self.ptr.as_ptr()) }
    }
}
