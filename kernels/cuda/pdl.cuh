// Programmatic dependent launch (sm_90+): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it on the
// stream still runs, once every block of that one has called pdl_trigger() (or exited); it must
// call pdl_wait() before it touches anything the earlier kernels write, and pdl_wait() returns
// once they have completed and their writes are visible. Only the GEMV is launched that way
// (gemv.cuh): it loads its first weights, which no kernel writes, before it waits, so a decode
// step's weight reads start while the norm, SwiGLU or preparation before it still runs. The
// kernels that come before a GEMV call pdl_trigger() at their start. Both are no-ops below
// sm_90 and for a kernel launched without the attribute.
#pragma once

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
