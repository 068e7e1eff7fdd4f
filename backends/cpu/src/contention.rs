//! How many workers a graph gets while other processes keep cores busy.
//!
//! ggml's CPU workers spin at every barrier (this module is built without
//! OpenMP), so a worker that shares its core with another busy process holds up
//! every other worker at every node: Turbo's decode on 2 cores with one
//! competing process measured 60 times slower with 2 workers than with 1.
//! Before each graph (through patch 0002's callback) the plugin reads the
//! kernel's count of runnable threads and leaves the cores other processes use.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Mutex;

/// Readings kept; the smallest wins, so a thread that is runnable for a moment
/// (a shell command, a logger) does not cost a worker.
const WINDOW: usize = 4;

/// The workers one graph should use: `configured` at most, at least 1, fewer
/// by the busy threads expected on the `allowed` cores of an `online`-core
/// machine when `others` threads besides the caller are runnable (spread evenly,
/// which is what the kernel's balancer aims for).
pub fn workers(configured: usize, allowed: usize, online: usize, others: usize) -> usize {
    let online = online.max(allowed).max(1);
    // Rounded to the nearest whole thread.
    let expected_here = (others * allowed * 2 + online) / (2 * online);
    allowed.saturating_sub(expected_here).clamp(1, configured.max(1))
}

/// The runnable count in `/proc/loadavg` (fourth field, `running/total`).
pub fn runnable_in_loadavg(text: &str) -> Option<usize> {
    text.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

pub struct FreeCores {
    configured: usize,
    allowed: usize,
    online: usize,
    state: Mutex<State>,
}

struct State {
    loadavg: Option<File>,
    recent: [usize; WINDOW],
    next: usize,
}

impl FreeCores {
    pub fn new(configured: usize, allowed: usize) -> Self {
        let online = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(allowed);
        let loadavg = File::open("/proc/loadavg").ok();
        FreeCores { configured, allowed, online, state: Mutex::new(State { loadavg, recent: [0; WINDOW], next: 0 }) }
    }

    /// The worker count for the next graph. Without `/proc/loadavg` (not
    /// Linux, or no procfs), the configured count.
    pub fn next_graph(&self) -> usize {
        let Ok(mut state) = self.state.lock() else {
            return self.configured;
        };
        let Some(running) = state.loadavg.as_mut().and_then(read_runnable) else {
            return self.configured;
        };
        // The count includes the thread reading it.
        let others = running.saturating_sub(1);
        let slot = state.next;
        state.recent[slot] = others;
        state.next = (slot + 1) % WINDOW;
        let others = state.recent.iter().copied().min().unwrap_or(0);
        workers(self.configured, self.allowed, self.online, others)
    }
}

fn read_runnable(file: &mut File) -> Option<usize> {
    let mut buf = [0u8; 128];
    file.seek(SeekFrom::Start(0)).ok()?;
    let n = file.read(&mut buf).ok()?;
    runnable_in_loadavg(std::str::from_utf8(&buf[..n]).ok()?)
}

/// Patch 0002's callback; `data` is a `FreeCores` the plugin keeps for the
/// backend's lifetime.
pub unsafe extern "C" fn threads_callback(data: *mut std::ffi::c_void, n_threads: std::os::raw::c_int) -> std::os::raw::c_int {
    let free = unsafe { &*(data as *const FreeCores) };
    // Never unwind into C.
    std::panic::catch_unwind(|| free.next_graph().min(n_threads.max(1) as usize) as std::os::raw::c_int).unwrap_or(n_threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_machine_keeps_every_worker() {
        assert_eq!(workers(2, 2, 2, 0), 2);
        assert_eq!(workers(16, 16, 16, 0), 16);
    }

    #[test]
    fn each_busy_thread_takes_a_core() {
        assert_eq!(workers(2, 2, 2, 1), 1);
        assert_eq!(workers(8, 8, 8, 3), 5);
        // Never below one worker, never above the configured count.
        assert_eq!(workers(2, 2, 2, 5), 1);
        assert_eq!(workers(4, 16, 16, 2), 4);
    }

    #[test]
    fn busy_threads_spread_over_a_larger_machine() {
        // 2 allowed cores of 64: 30 busy threads elsewhere put about one here.
        assert_eq!(workers(2, 2, 64, 30), 1);
        assert_eq!(workers(2, 2, 64, 10), 2);
    }

    #[test]
    fn loadavg_runnable_field() {
        assert_eq!(runnable_in_loadavg("1.26 1.88 2.30 3/79 17956\n"), Some(3));
        assert_eq!(runnable_in_loadavg("1.26 1.88 2.30"), None);
        assert_eq!(runnable_in_loadavg("a b c x/1 2"), None);
    }

    #[test]
    fn reads_this_machine() {
        if let Ok(text) = std::fs::read_to_string("/proc/loadavg") {
            assert!(runnable_in_loadavg(&text).is_some_and(|n| n >= 1), "{text}");
        }
    }
}
