// Mixed precision to a size (`quantize --target-size BYTES`, `--target-bpw B`): each tensor the
// plan may change gets the type that minimises the model's total expected KL divergence under a
// byte budget for the whole file.
//
// 1. Sensitivity (measure_sensitivity): for every such tensor and every candidate type, the mean
//    KL divergence of the next-token distributions from the float model's, over the first
//    windows of the calibration set, when that one tensor alone is stored in that type (RTN,
//    plain grids) and every other weight stays float. One float forward caches each block's
//    input; each (tensor, type) then reruns the forward from the tensor's block (the embedding:
//    from the start; the output head: the head alone). Float32, OpenBLAS on one thread per
//    product and fixed panels (quant/block_forward.hpp), so the figures, and hence the plan, are
//    the same bits for any --threads.
// 2. Allocation (allocate_budget): the choice per tensor minimising the sum of the divergences
//    (first order: the divergences of small independent perturbations add; the closing figures
//    in the README compare the sum with the measured KLD of the written file) with the sum of
//    the bytes at most the budget. Exact for bytes counted in units of budget / 2^18 rounded up
//    per tensor, so a plan never exceeds the budget and wastes at most one unit per tensor.
//
// Ties go to the earlier candidate, so the plan is a function of its inputs only. The plan
// becomes per-tensor overrides ("^name$=type", quant/recipe.hpp) recorded in the header with the
// target, the candidates and each tensor's figures, so the recipe reproduces the file byte for
// byte without measuring again.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "formats/qtype.hpp"
#include "quant/calibration.hpp"

namespace qforge {

class Model;
class ThreadPool;

// The candidates unless --plan-types says otherwise: 3.5, 4.5 and 8 bits per weight with the
// CPU's fastest kernels at each width (q8: one scale per row, 0.5 bit below q8_g32).
inline constexpr QType kSizePlanTypes[] = {QType::q3k_g32, QType::q4k_g32, QType::q8};
// Calibration tokens the sensitivity forward runs on unless --plan-tokens says otherwise: whole
// windows, at least one.
inline constexpr uint64_t kSizePlanTokens = 512;

struct SizeCandidate {
    QType qtype = QType::f32;
    uint64_t bytes = 0;  // the tensor's stored bytes in this type (file alignment included)
    double kld = 0.0;    // mean KL divergence (nats per token) with this tensor alone quantized
};

struct SizeItem {
    std::string name;
    std::vector<SizeCandidate> candidates;  // at least one
};

// The index of the chosen candidate of every item, minimising the sum of kld with the sum of
// bytes <= budget (see above); nullopt when even the smallest choices exceed it.
std::optional<std::vector<size_t>> allocate_budget(const std::vector<SizeItem>& items,
                                                   uint64_t budget);

// One tensor to measure: its name in the model, and the types to try.
struct SensitivityRequest {
    std::string name;
    std::vector<QType> qtypes;
};

// Progress: called after each (tensor, type) with the count done and the total.
using SensitivityProgress = std::function<void(uint64_t done, uint64_t total)>;

// The divergence of every requested (tensor, type), in the request's order, on the first
// max(1, floor(tokens / seqlen)) windows of `calib`. `model` holds float weights (a tensor
// stored quantized is refused by name). Throws qforge::Error naming the tensor for a name that
// is not one of the model's matrices or a type it cannot be stored in.
std::vector<SizeItem> measure_sensitivity(const Model& model, const CalibrationSet& calib,
                                          uint64_t tokens,
                                          const std::vector<SensitivityRequest>& requests,
                                          ThreadPool& pool,
                                          const SensitivityProgress& progress = {});

}  // namespace qforge
