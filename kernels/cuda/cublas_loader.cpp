// cuBLAS, loaded when first used. Linking libcublas.so pulls in libcublasLt.so (540 MB), whose
// static initializers cost about 0.2 s at the start of every process, for every command (every
// test that runs the qforge binary paid it too), though only the CUDA backend calls cuBLAS. So
// qforge does not link it: these definitions of the cuBLAS entry points qforge uses (declared by
// cublas_v2.h, so their signatures are checked against the toolkit's) open the library of the
// toolkit qforge was built with on the first call and forward to it. A machine without it gets
// CUBLAS_STATUS_NOT_INITIALIZED from cublasCreate, and cublasGetStatusString then names the
// library and the loader's reason, which the callers' checks put in their error.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

namespace {

#define QFORGE_STR2(x) #x
#define QFORGE_STR(x) QFORGE_STR2(x)
constexpr const char* kLibrary = "libcublas.so." QFORGE_STR(CUBLAS_VER_MAJOR);

struct Cublas {
    void* handle = nullptr;
    std::string failure;  // why the library or one of its symbols could not be loaded
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
    // Spelled out: cublas_api.h overloads cublasGemmEx for C++ (a cudaDataType compute type).
    using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    GemmEx gemm_ex = nullptr;
    decltype(&cublasGetStatusString) status_string = nullptr;

    template <class F>
    void bind(F& f, const char* name) {
        if (!handle) return;
        f = reinterpret_cast<F>(dlsym(handle, name));
        if (!f && failure.empty()) failure = std::string(kLibrary) + " lacks " + name;
    }
};

const Cublas& cublas() {
    static Cublas lib;
    static std::once_flag once;
    std::call_once(once, [] {
        lib.handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
        if (!lib.handle) {
            const char* why = dlerror();
            lib.failure = std::string("cannot load ") + kLibrary + ": " + (why ? why : "unknown");
            return;
        }
        lib.bind(lib.create, "cublasCreate_v2");
        lib.bind(lib.destroy, "cublasDestroy_v2");
        lib.bind(lib.set_stream, "cublasSetStream_v2");
        lib.bind(lib.set_workspace, "cublasSetWorkspace_v2");
        lib.bind(lib.gemm_ex, "cublasGemmEx");
        lib.bind(lib.status_string, "cublasGetStatusString");
    });
    return lib;
}

bool usable() { return cublas().failure.empty(); }

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
    return usable() ? cublas().create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
    return usable() ? cublas().destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    return usable() ? cublas().set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t bytes) {
    return usable() ? cublas().set_workspace(handle, workspace, bytes)
                    : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb,
                                         const void* beta, void* C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (!usable()) return CUBLAS_STATUS_NOT_INITIALIZED;
    return cublas().gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
                            beta, C, Ctype, ldc, computeType, algo);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
    if (!usable()) return cublas().failure.c_str();
    return cublas().status_string(status);
}

}  // extern "C"
