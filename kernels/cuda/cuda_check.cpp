#include "kernels/cuda/cuda_check.hpp"

#include "core/error.hpp"

namespace qforge::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
    throw Error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                cudaGetErrorString(err) + ") in " + expr + " at " + file + ":" +
                std::to_string(line));
}

}  // namespace qforge::cuda
