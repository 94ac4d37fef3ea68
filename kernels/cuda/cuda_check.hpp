// Every CUDA runtime call and kernel launch goes through these checks: a failure becomes a
// qforge::Error naming the call, the source line and CUDA's own message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace qforge::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

// QFORGE_CUDA_SYNC set (to anything but "" or "0"), read once: every checked launch then waits
// for its kernel, so a fault inside one (an illegal address, a trap) is reported at that launch,
// whose file and line name the kernel's launcher, instead of at some later call. For debugging
// and the first runs on a new GPU (scripts/gpu_check.sh); slow. The CUDA backend does not
// capture graphs in this mode (a synchronisation inside a capture is not allowed).
bool sync_launches();

}  // namespace qforge::cuda

#define QF_CUDA_CHECK(expr)                                                       \
    do {                                                                          \
        cudaError_t qf_err_ = (expr);                                             \
        if (qf_err_ != cudaSuccess)                                               \
            ::qforge::cuda::throw_cuda_error(qf_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// After a <<<...>>> launch: catches bad launch configurations at once, and with
// QFORGE_CUDA_SYNC (sync_launches()) waits for the kernel and reports its fault here.
#define QF_CUDA_CHECK_LAUNCH()                                                       \
    do {                                                                             \
        QF_CUDA_CHECK(cudaGetLastError());                                           \
        if (::qforge::cuda::sync_launches()) QF_CUDA_CHECK(cudaDeviceSynchronize()); \
    } while (0)
