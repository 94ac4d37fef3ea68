// Every CUDA runtime call and kernel launch goes through these checks: a failure becomes a
// qforge::Error naming the call, the source line and CUDA's own message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace qforge::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace qforge::cuda

#define QF_CUDA_CHECK(expr)                                                       \
    do {                                                                          \
        cudaError_t qf_err_ = (expr);                                             \
        if (qf_err_ != cudaSuccess)                                               \
            ::qforge::cuda::throw_cuda_error(qf_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// After a <<<...>>> launch: catches bad launch configurations at once.
#define QF_CUDA_CHECK_LAUNCH() QF_CUDA_CHECK(cudaGetLastError())
