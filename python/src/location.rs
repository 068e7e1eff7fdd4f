//! Where this extension module's file is, for the plugins the wheel ships
//! beside it (`tts/lib/_tts.abi3.so`, `tts/plugins/`).

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

static MODULE_PATH: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Records the module's path when Python imports it: the dynamic loader may
/// know it relative to the working directory of that moment (an entry `''`
/// on `sys.path`), which a later `chdir` would change.
pub fn remember_module_path() {
    MODULE_PATH.get_or_init(|| {
        let path = loaded_from()?;
        Some(if path.is_absolute() { path } else { std::env::current_dir().ok()?.join(path) })
    });
}

/// The module's file, where the dynamic loader knows it.
pub fn module_path() -> Option<PathBuf> {
    MODULE_PATH.get().cloned().flatten()
}

/// The file the dynamic loader mapped this function from.
fn loaded_from() -> Option<PathBuf> {
    // SAFETY: a zeroed Dl_info is a valid value for dladdr to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let address = loaded_from as *const () as *const libc::c_void;
    // SAFETY: dladdr reads only the address and writes only `info`.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic
    // loader, valid while the module stays loaded (Python never unloads it).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}
