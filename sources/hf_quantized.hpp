// Hugging Face GPTQ and AWQ checkpoints -> .qf without re-quantizing: each quantized linear's
// integer codes, fp16 scales and integer zeros are unpacked and repacked into one of our row
// types (formats/qtype.hpp), so dequantize_row_ref gives exactly the checkpoint's own
// dequantization, scale * (code - zero), evaluated in float32 (where it is exact).
//
// Per linear X (X.weight in a float checkpoint) with n outputs and k inputs, g = group_size:
//
//   GPTQ (checkpoint_format "gptq", AutoGPTQ's v1; "gptq_v2" stores the zeros themselves, see
//   resolve_gptq_zeros), bits b in {4, 8}, p = 32 / b codes a word:
//     X.qweight  I32 [k / p, n]            code of (input i, output o): bits [b (i % p), +b) of
//                                          word [i / p][o] (packed along the input)
//     X.qzeros   I32 [ceil(k / g), n / p]  zero - 1 of (group, o): bits [b (o % p), +b) of word
//                                          [group][o / p] (packed along the output)
//     X.scales   F16 [ceil(k / g), n]
//     X.g_idx    I32 [k]                   group of input i: i / g, or a permutation of the
//                                          groups (act-order, below)
//     W[o][i] = scales[g_idx[i]][o] * (q[i][o] - (qzeros[g_idx[i]][o] + 1))
//   AWQ (version "gemm"), 4 bits:
//     X.qweight  I32 [k, n / 8]            code of (i, o): nibble inv[o % 8] of word [i][o / 8],
//                                          where the nibbles hold outputs [0, 2, 4, 6, 1, 3, 5, 7]
//     X.qzeros   I32 [ceil(k / g), n / 8]  true zeros, same packing
//     X.scales   F16 [ceil(k / g), n]
//     W[o][i] = scales[i / g][o] * (q[i][o] - z[i / g][o])
//
// Types: 4-bit sym -> q4s_g*, 4-bit asym (and AWQ) -> q4_g*, 8-bit sym -> q8 types with
// code - 128 as int8 (-128 .. 127; the int8 kernels take |code| as an unsigned byte, so -128
// runs exactly); 8-bit asym is refused (no asymmetric 8-bit type). A group the table lacks maps
// to the largest table group that divides it, its scale and zero repeated (group_size -1: one
// per output row -> q8, or the largest 4-bit group). A zero of 16 (GPTQ v1 stores zero - 1 in 4
// bits, so an all-positive group's zero 0 wraps to 15 + 1) cannot be a q4 zero (0 .. 15) and
// is refused by name.
//
// compressed-tensors "pack-quantized" checkpoints take the same path
// (sources/compressed_tensors.hpp has their layout): quant_method "compressed-tensors" here, their
// parts' reader there.
//
// Act-order checkpoints (desc_act: g_idx not i / g) import losslessly: our groups are contiguous
// ranges of a row, so the columns are stored sorted by group, with the permutation beside them
// (hf_quantized_col_perm, QfTensorInfo::col_perm), and the CPU backend gathers activations by it.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/qtype.hpp"
#include "formats/safetensors.hpp"

namespace qforge {

// AWQ's GEMM packing: output o of a group of 8 sits in nibble kAwqNibble[o % 8] of its int32
// word (AutoAWQ's order [0, 2, 4, 6, 1, 3, 5, 7] inverted).
inline constexpr std::array<uint32_t, 8> kAwqNibble = {0, 4, 1, 5, 2, 6, 3, 7};

// compressed_tensors: llm-compressor's "pack-quantized" checkpoints (sources/compressed_tensors.hpp
// has the layout).
enum class HfQuantMethod : uint8_t { gptq, awq, compressed_tensors };

struct HfQuantConfig {
    HfQuantMethod method;
    std::string file;         // where it was declared (config.json or a file beside it)
    uint32_t bits = 4;        // 4 or 8 (AWQ: 4)
    int64_t group_size = 0;   // -1: one group per output row; else a positive multiple of 32
    bool sym = false;         // GPTQ: zeros are 2^(bits-1); AWQ: always false
    nlohmann::json declared;  // the object as written, for provenance
    // GPTQ: qzeros hold the true zeros (v2) rather than zero - 1 (v1). Parsed from
    // checkpoint_format ("gptq_v2"), then settled by the zeros themselves (resolve_gptq_zeros).
    bool gptq_v2 = false;
};

// The quantization the checkpoint beside config.json declares: config.json's
// "quantization_config", else quantize_config.json (GPTQ) or quant_config.json (AWQ) in the same
// folder; nullopt for a float checkpoint. An unsupported method, bit width, group size,
// checkpoint_format or AWQ version is an Error naming the file and the key.
std::optional<HfQuantConfig> read_hf_quant_config(const std::string& config_path);

// GPTQ v1 stores zero - 1, v2 the zero: told apart by the stored zeros, not the label. A
// symmetric checkpoint's zeros are all 2^(b-1) - 1 (v1) or all 2^(b-1) (v2), in every tensor; any
// other value, or tensors of both kinds, is an Error naming the tensor. An asymmetric one's zeros
// fit both (any stored value is a zero of either), so checkpoint_format decides; a v1 tensor
// whose stored zero reads as 2^b is refused by the import, naming it. Sets qc.gptq_v2; returns a
// warning when the zeros contradict the label. No-op for AWQ and compressed-tensors.
std::optional<std::string> resolve_gptq_zeros(HfQuantConfig& qc, const SafetensorsCheckpoint& ckpt);

// The row type a linear of this checkpoint becomes (see the header comment); an Error naming
// the config file when there is none.
QType hf_quant_target(const HfQuantConfig& qc);

// "gptq", "awq" or "compressed-tensors" (the quant_method each declares).
std::string_view hf_quant_method_name(HfQuantMethod m);

// Whether `name` is one of a quantized linear's parts (X.qweight, X.qzeros, X.scales, X.g_idx;
// compressed-tensors' X.weight_packed, X.weight_scale, X.weight_zero_point, X.weight_shape), and
// then X.weight, the float name it replaces.
std::optional<std::string> hf_quantized_part_of(std::string_view name);

// The part whose presence marks X.weight as quantized by `method` (X.qweight; compressed-tensors:
// X.weight_packed); empty for a name that does not end in ".weight".
std::string hf_qweight_name(std::string_view hf_weight_name,
                            HfQuantMethod method = HfQuantMethod::gptq);

// An act-order GPTQ linear's column permutation: empty when its X.g_idx is absent or i / g;
// otherwise perm, the inputs sorted by group (stably), so stored column j holds input perm[j]
// and lies in group j / g as our rows need. A g_idx whose groups do not hold g inputs each
// (the last one k - g (groups - 1)) cannot be a permutation of contiguous groups: an Error
// naming it. Only GPTQ has a g_idx.
std::vector<uint32_t> hf_quantized_col_perm(const HfQuantConfig& qc,
                                            const SafetensorsCheckpoint& ckpt,
                                            const std::string& hf_weight_name, uint64_t n,
                                            uint64_t k);

// The linear whose float name is `hf_weight_name` (X.weight), [n, k], repacked into rows of
// `target` (n * row_bytes bytes in `out`). Every part's dtype and shape is checked; a wrong one,
// an act-order g_idx, a non-finite scale or a zero the target cannot hold is an Error naming the
// shard file and the tensor.
void import_hf_quantized_linear(const HfQuantConfig& qc, QType target,
                                const SafetensorsCheckpoint& ckpt,
                                const std::string& hf_weight_name, uint64_t n, uint64_t k,
                                std::vector<uint8_t>& out);

}  // namespace qforge
