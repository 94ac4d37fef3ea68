// kernels/cuda/cublas_loader.cpp: qforge does not link cuBLAS (loading libcublasLt costs about
// 0.2 s at every process start); the first call opens it. Checked against the library itself,
// opened here independently. ctest runs each test case in its own process, so nothing else has
// called cuBLAS before this one; in one run of the whole binary this file's cases come before the
// cuda_* files' (registration follows the sorted file list).
#include <catch2/catch.hpp>

#include "test_support.hpp"

#ifdef QFORGE_HAVE_CUDA
#include <cublas_v2.h>
#include <dlfcn.h>

#include <fstream>
#include <string>

namespace {

bool cublas_mapped() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.find("libcublas.so") != std::string::npos) return true;
    return false;
}

}  // namespace

TEST_CASE("cuBLAS is opened on first use and its entry points reach the library",
          "[cuda_host][cublas]") {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    CHECK_FALSE(cublas_mapped());  // not a dependency of the executable
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) QF_SKIP(name + " cannot be opened here: " + dlerror());
    using StatusString = const char* (*)(cublasStatus_t);
    auto real = reinterpret_cast<StatusString>(dlsym(lib, "cublasGetStatusString"));
    REQUIRE(real);
    for (cublasStatus_t s :
         {CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_INVALID_VALUE, CUBLAS_STATUS_NOT_SUPPORTED})
        CHECK(std::string(cublasGetStatusString(s)) == real(s));
    CHECK(cublas_mapped());
    dlclose(lib);
}
#endif

namespace cublas_loader_test {}  // namespace cublas_loader_test
