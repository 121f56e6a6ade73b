// A chunk's copy to the device held back, on the copy stream, until the host has staged the
// rows it copies (gln.kernels.uploads.LAUNCH_WHILE_STAGING): so the copy can be issued, and the
// chunk's work launched behind it, while the host's threads are still staging the rows.
//
// The staging thread of a piece writes the chunk's serial number into the piece's `mark`, in
// pinned host memory, once the piece is staged. Under unified addressing pinned memory is
// mapped into the device's address space at the address the host sees, so the device reads the
// mark in place; a volatile load is a relaxed load at system scope, which sees the host's write.
// The copy that follows this launch on the same stream starts once it returns.
extern "C" __global__ void __launch_bounds__(32)
gln_wait_for_host(const volatile int* mark, int serial) {
    if (threadIdx.x != 0) return;
    while (*mark < serial) __nanosleep(1000);
}
