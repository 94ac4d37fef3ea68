#include "runtime/backend_factory.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/device_info.hpp"
#include "runtime/backend.hpp"

namespace qforge {

void Backend::run_ops(std::span<const int32_t>, KvCache&, const std::function<void(OpsStep&)>&) {
    throw Error(std::string(name()) + " backend: no op-level access (Backend::run_ops)");
}

std::unique_ptr<KvPool> Backend::new_kv_pool(uint64_t) const {
    throw Error(std::string(name()) + " backend: no paged KV cache pool (Backend::new_kv_pool)");
}

std::optional<BackendKind> backend_kind_from_name(std::string_view name) {
    if (name == "auto") return BackendKind::auto_select;
    if (name == "cpu") return BackendKind::cpu;
    if (name == "cuda") return BackendKind::cuda;
    return std::nullopt;
}

std::string_view backend_kind_name(BackendKind kind) {
    switch (kind) {
        case BackendKind::auto_select:
            return "auto";
        case BackendKind::cpu:
            return "cpu";
        case BackendKind::cuda:
            return "cuda";
    }
    return "?";
}

BackendKind resolve_backend_kind(BackendKind kind, std::string* why) {
    if (kind != BackendKind::auto_select) return kind;
    std::string reason;
    const bool gpu = !list_gpus(&reason).empty();
    if (why) *why = gpu ? "a CUDA device is present" : reason;
    return gpu ? BackendKind::cuda : BackendKind::cpu;
}

std::unique_ptr<Backend> make_backend(BackendKind kind, const Model& model, ThreadPool& pool,
                                      const BackendOptions& options) {
    if (resolve_backend_kind(kind) == BackendKind::cuda) {
        // The CUDA kernels read activations in column order; only the CPU backend gathers them.
        for (uint64_t layer = 0; layer < model.config().num_layers; ++layer)
            for (int w = 0; w < kBlockLinears; ++w)
                if (const Matrix& m = model.weight(layer, Weight(w)); m.col_perm)
                    throw Error(model.path(), m.name,
                                "has a column permutation (an act-order GPTQ import), which the "
                                "CUDA backend does not gather yet: use --backend cpu");
        return make_cuda_backend(model, options.cuda);
    }
    return make_cpu_backend(model, pool, options.cpu);
}

}  // namespace qforge
