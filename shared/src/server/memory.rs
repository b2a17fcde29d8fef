//! Handing freed heap back to the system after a burst. glibc's allocator keeps what a burst
//! freed in its arenas for the process to reuse: 2,000 waiting acquires left lease-service
//! 46 MB larger after every one of them had gone, and it stayed so. `malloc_trim` gives back
//! what is free (28 of those 46 MB; the rest stays in use or in fragments, and later bursts
//! reuse it rather than grow); it walks the arenas under their locks, so it runs after bursts
//! only, never per request.

use std::time::Duration;

/// How long after a burst ends the heap is trimmed: its connections close after their last
/// answers, and their buffers are freed only then.
const AFTER_A_BURST: Duration = Duration::from_secs(2);

/// Gives the heap's free memory back to the system now (glibc only; other allocators and
/// platforms decide for themselves).
pub fn give_back_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` has no preconditions: it takes glibc's own arena locks, and any
    // thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// [`give_back_freed_heap`] once a burst's connections have closed, on the current runtime (none:
/// now).
pub fn give_back_after_a_burst() {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async {
                tokio::time::sleep(AFTER_A_BURST).await;
                give_back_freed_heap();
            });
        }
        Err(_) => give_back_freed_heap(),
    }
}
