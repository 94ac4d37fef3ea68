#include "kernels/cuda/cuda_check.hpp"

#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace qforge::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
    throw Error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                cudaGetErrorString(err) + ") in " + expr + " at " + file + ":" +
                std::to_string(line));
}

bool sync_launches() {
    static const bool on = [] {
        const char* v = std::getenv("QFORGE_CUDA_SYNC");
        return v && *v && std::strcmp(v, "0") != 0;
    }();
    return on;
}

}  // namespace qforge::cuda
