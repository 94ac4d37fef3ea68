// The compressed-tensors half of `qforge export` (convert/hf_export.hpp runs it): each quantized
// linear as "pack-quantized" parts, the exact inverse of sources/compressed_tensors.hpp, which
// documents the layout, and the quantization_config that declares them.
//
// What maps (codes, scales and zeros repacked, never re-quantized):
//   q4s_g32/g64/g128 -> 4-bit symmetric, strategy group;   q4_g32/g64/g128 -> 4-bit asymmetric;
//   q8_g32/q8_g128   -> 8-bit symmetric, strategy group;   q8 -> 8-bit symmetric, channel.
// Every other quantized type (3-bit, ...) is refused by name with the nearest type that maps.
// compressed-tensors groups are whole (k % group_size == 0), while ours may end in a partial
// group (SmolLM2's k = 576 in groups of 128): the export's group_size is then the largest
// multiple of 32 that divides both our group and every quantized k, each of our scales and zeros
// written once per exported group it covers. The import merges such runs back
// (compressed_tensors_target), so export -> import gives back the same rows.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "convert/hf_export_detail.hpp"
#include "formats/qtype.hpp"

namespace qforge {

// Why type t cannot be written as compressed-tensors, naming the nearest type that can; empty
// when it can.
std::string compressed_tensors_refusal(QType t);

// The group_size the export writes for linears of type t whose input widths are `ks`: t's group,
// or the largest multiple of 32 dividing it and every k; 0 for a per-row type (strategy channel).
// An Error naming `file` and `tensor` (the linear whose k allows no such group) otherwise.
uint64_t compressed_tensors_group(QType t, const std::vector<uint64_t>& ks,
                                  const std::vector<std::string>& names, const std::string& file);

// Bytes of one linear's parts.
uint64_t compressed_tensors_linear_bytes(QType t, uint64_t n, uint64_t k, uint64_t group);

// One quantized linear [n, k] of type t (rows in `rows`) as X.weight_packed, X.weight_scale,
// X.weight_zero_point (asymmetric types) and X.weight_shape, X from hf_weight_name (X.weight).
std::vector<hf_export_detail::Packed> pack_compressed_tensors_linear(
    QType t, uint64_t group, const std::string& hf_weight_name, std::span<const uint8_t> rows,
    uint64_t n, uint64_t k);

// config.json's quantization_config: one scheme targeting every Linear, `ignore` the modules
// kept float (lm_head and the float linears of the blocks).
nlohmann::json compressed_tensors_config_json(QType t, uint64_t group,
                                              const std::vector<std::string>& ignore);

}  // namespace qforge
