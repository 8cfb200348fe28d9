"""Native CPU kernels (cpu_ops.cpp), built on first use and called through ctypes.

`loader.get_native_lib()` builds or loads the library (None when unavailable);
`cpu_ops` holds the tensor-level wrappers the layers call.
"""
