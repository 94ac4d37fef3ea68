// One place that turns a backend choice (the CLI's --backend) into a Backend: cpu, cuda, or auto
// (cuda when this build has CUDA and a device is visible, else cpu).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/backend.hpp"
#include "runtime/cuda_backend.hpp"

namespace qforge {

enum class BackendKind : uint8_t { auto_select, cpu, cuda };

// "auto", "cpu", "cuda"; nullopt for anything else.
std::optional<BackendKind> backend_kind_from_name(std::string_view name);
std::string_view backend_kind_name(BackendKind kind);

// What `auto` resolves to on this machine, and why (for messages): cuda when built with CUDA and
// a device is visible.
BackendKind resolve_backend_kind(BackendKind kind, std::string* why = nullptr);

struct BackendOptions {
    CpuBackendOptions cpu;
    CudaBackendOptions cuda;
};

// The backend of `kind` for `model`; `pool` serves the CPU backend. kind cuda throws qforge::Error
// when CUDA is unavailable (built without it, or no device) and cuda::UnsupportedOnCuda for a
// model the kernels cannot run; auto falls back to the CPU only when no device is present.
std::unique_ptr<Backend> make_backend(BackendKind kind, const Model& model, ThreadPool& pool,
                                      const BackendOptions& options = {});

}  // namespace qforge
