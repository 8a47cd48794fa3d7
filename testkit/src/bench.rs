//! What the benchmark programs share (`ringlb-bench`'s bins), and the tests
//! that count per-CPU state.

use std::io;

/// Pins the calling thread to the CPU it runs on now; returns that CPU. A
/// benchmark that measures per-packet time pins itself so its numbers do not
/// include a migration; a test of per-CPU state (the conntrack insert
/// budget), so its packets all meet one CPU's.
#[allow(unsafe_code)]
pub fn pin_to_current_cpu() -> io::Result<usize> {
    // SAFETY: sched_getcpu has no arguments; sched_setaffinity gets a
    // zeroed, then filled, cpu_set_t of the right size for this thread (0).
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(cpu as usize)
    }
}
