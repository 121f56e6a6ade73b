"""Helpers shared by tests (never by the library or the service): the CUDA compilers' tools
that check the kernel sources without a GPU, and the array code the int8 gating's bound was
proved on."""
