//! Memory freed in bulk given back to the operating system. glibc's allocator keeps freed
//! chunks for reuse, so once many RLQS buckets are released the process would otherwise
//! keep its peak resident size for good. Called rarely: when a table gave back most of
//! its room.

/// Returns the allocator's whole free pages to the operating system.
pub(crate) fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases pages of the allocator's own
    // free chunks; it is safe to call at any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
