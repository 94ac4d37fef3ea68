// compressed-tensors "pack-quantized" checkpoints (llm-compressor's INT4/INT8 weight-only format,
// which vLLM and SGLang load) -> .qf without re-quantizing. The layout, as the PyPI package
// compressed-tensors writes it (compressors/pack_quantized: pack_to_int32 and the quantizer's
// int8 codes):
//
// config.json "quantization_config": quant_method "compressed-tensors", format "pack-quantized",
// quantization_status "compressed", config_groups {name: {targets [...], weights {num_bits b,
// type "int", symmetric, strategy "group" (group_size g) or "channel" (one group per output
// row), actorder null or "static", dynamic false}, input_activations null}}, ignore [modules kept
// float]. Per linear X (X.weight in a float checkpoint) with n outputs and k inputs:
//
//   X.weight_packed      I32 [n, ceil(k b / 32)]  code of (o, i): bits [b i, +b) of row o's
//                                                 little-endian word stream (b = 4: 8 a word,
//                                                 b = 8: 4 a word; neither straddles words)
//   X.weight_scale       F16/BF16/F32 [n, k / g]  (channel: [n, 1])
//   X.weight_zero_point  I32 [ceil(n b / 32), k / g]  asymmetric only: zero of (o, group) at
//                                                 bits [b o, +b) of column `group`'s stream,
//                                                 packed along the output
//   X.weight_shape       I64 (or I32) [2] = [n, k]
//   Codes and zeros are signed b-bit integers q in [-2^(b-1), 2^(b-1)) stored as q + 2^(b-1);
//   W[o][i] = scale[o][i / g] * (q[o][i] - zero[o][i / g]), zero 0 when symmetric.
//
// Types: the stored (offset) codes are ours as they are: 4-bit symmetric -> q4s_g* (implicit
// zero 8 = signed 0), 4-bit asymmetric -> q4_g* (zero z + 8), 8-bit symmetric -> q8 types (our
// int8 code is q itself). A group size the table lacks maps to the largest table group dividing
// it, as for GPTQ (hf_quantized.hpp). Scales must be exact in binary16 (F16 always is; BF16 and
// F32 are checked value by value). Refused by name: other formats (int-quantized, float-quantized,
// marlin-24, nvfp4...), sparsity, activation quantization, actorder "group"/"weight" (a
// weight_g_idx), more than one config group, 8-bit asymmetric.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sources/hf_quantized.hpp"

namespace qforge {

// The parts of a compressed-tensors linear, after its module name X.
inline constexpr std::string_view kCtPacked = ".weight_packed", kCtScale = ".weight_scale",
                                  kCtZeroPoint = ".weight_zero_point", kCtShape = ".weight_shape",
                                  kCtGIdx = ".weight_g_idx";

// The declaration `j` (config.json's quantization_config, quant_method "compressed-tensors") as
// the bits, group size and symmetry of its one weight scheme; an Error naming `file` and the key
// for anything qforge cannot import exactly.
HfQuantConfig parse_compressed_tensors_config(const nlohmann::json& j, const std::string& file);

// The row type every linear of the checkpoint becomes: `base` (hf_quant_target's), or a table
// type of a larger group G when, in every linear, each run of G / group_size exported groups
// (the last run may be short) shares one scale and one zero: what qforge's export writes for a
// type whose groups do not divide k (compressed_tensors_export.hpp). Merging such runs changes
// no weight.
QType compressed_tensors_target(const HfQuantConfig& qc, QType base,
                                const SafetensorsCheckpoint& ckpt);

// As import_hf_quantized_linear (hf_quantized.hpp), for a compressed-tensors checkpoint.
void import_compressed_tensors_linear(const HfQuantConfig& qc, QType target,
                                      const SafetensorsCheckpoint& ckpt,
                                      const std::string& hf_weight_name, uint64_t n, uint64_t k,
                                      std::vector<uint8_t>& out);

}  // namespace qforge
