// A quantization recipe: the method, the default type, ordered per-tensor overrides, and the
// default policy that picks each tensor's stored type from its class.
//
// The default policy (one row per tensor class in kClassPolicies, recipe.cpp):
//   vector      1-D tensors (norms, biases): f32. Exact for f16/bf16 sources, the form the runtime
//               computes them in, and under 0.1% of a model's weights.
//   embed       an untied embedding: the default type. It is a row lookup, so its size matters on
//               disk, not in the matmuls (llama.cpp quantizes token_embd like the rest).
//   lm_head     the output head, and the tied embedding that serves as it (class tied_embed): at
//               least 8 bits. With a 4-bit default it gets q8_g32, as llama.cpp keeps its output
//               tensor above the rest (Q6_K in Q4 models): its error moves every logit, and it is
//               one tensor (q8_g32: llama.cpp's Q8_0 grouping, 0.4 bits per weight above q8_g128).
//   linear      every other matrix: the default type.
// A matrix whose rows are too short to gain from the chosen quantized type (the packed row, with
// its scales and zeros, counted padded to 64 bytes as format version 1 stored it, takes at least
// as many bits per weight as the source's float row, e.g. k < ~20 for q4 from f32) keeps its
// source float type.
//
// Overrides (--tensor-type REGEX=TYPE) come first, in the order given: the first whose regex is
// found anywhere in the tensor's name (std::regex_search, as llama-quantize's --tensor-type) and
// whose type the tensor can hold wins, and the size rule does not apply to it. Quantized types
// need a matrix, so an override like "attn=q8" leaves the 1-D attn_norm to the policy.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/qtype.hpp"

namespace qforge {

enum class QuantMethod : uint8_t { rtn, gptq, awq, awq_gptq };

// The options a method runs with unless the command line says otherwise: the combination that
// measured best (README, "Defaults"; scripts/quality_sweep.sh). The CLI's --X / --no-X flags
// override each one; quantize_model.hpp's resolve_method_options applies them.
struct MethodDefaults {
    bool importance;    // grids by the diag(H)-weighted search (rtn: whenever --calib is given)
    bool act_order;     // GPTQ: columns by decreasing diag(H), static groups
    double damp;        // GPTQ: fraction of mean(diag H) added to its diagonal
    bool refit;         // GPTQ: each group's grid refitted to its codes (quant/grid_refit.hpp)
    uint64_t nsamples;  // calibration windows of --seqlen tokens
};

struct QuantMethodInfo {
    QuantMethod method;
    std::string_view name;  // as the CLI and the .qf header spell it
    bool implemented;
    bool calibrated;  // needs calibration text (--calib)
    MethodDefaults defaults;
};

// Defaults, measured on stories260K (q4k_g32, 200 chunks of ctx 128; README "Defaults"):
// importance-weighted grids beat the plain ones for every method; act-order loses with
// super-block types (its grids are fixed before the error feedback moves the weights);
// damp between 0.003 and 0.1 changes PPL by less than its noise; the grid refit lowers
// GPTQ's and AWQ+GPTQ's KLD (5 of 6 seed pairs) and AWQ+GPTQ's PPL (all 3 seeds).
inline constexpr QuantMethodInfo kQuantMethods[] = {
    // round to nearest, per group: no calibration data (with --calib: importance-weighted)
    {QuantMethod::rtn, "rtn", true, false, {true, false, 0.01, false, 128}},
    // layer-sequential GPTQ (quant/layer_sequential)
    {QuantMethod::gptq, "gptq", true, true, {true, false, 0.01, true, 128}},
    // activation-aware scales, clipping, RTN (quant/awq)
    {QuantMethod::awq, "awq", true, true, {true, false, 0.01, false, 128}},
    // AWQ's scales and clipping, then GPTQ
    {QuantMethod::awq_gptq, "awq+gptq", true, true, {true, false, 0.01, true, 128}},
};
static_assert(std::size(kQuantMethods) == static_cast<size_t>(QuantMethod::awq_gptq) + 1,
              "every QuantMethod needs a row");

constexpr const QuantMethodInfo& quant_method_info(QuantMethod m) {
    return kQuantMethods[static_cast<size_t>(m)];
}

struct TensorTypeOverride {
    std::string text;  // "REGEX=TYPE" as given: recorded in the header
    std::regex regex;  // ECMAScript
    QType qtype;
};

struct QuantRecipe {
    QuantMethod method = QuantMethod::rtn;
    QType qtype = QType::q4_g128;  // the default type; the CLI requires --qtype
    std::vector<TensorTypeOverride> overrides;
};

// Parsers for the CLI's values; each throws a one-line qforge::Error saying what is valid.
QuantMethod parse_quant_method(std::string_view name);  // refuses the ones not implemented yet
// A type's name, or a family's (its member).
QType parse_qtype_name(std::string_view name, std::string_view what = "--qtype");
TensorTypeOverride parse_tensor_type_override(const std::string& spec);

// "f32, f16, ..., q3_g128": the table's names, for help and error texts.
std::string qtype_names();

// Families: a bit width's name that stands for its default member, wherever a qtype is named
// (--qtype, --tensor-type). A type's own name always means that type, so a family named like a
// type (q8) must have that type as its member (checked below).
struct QTypeFamily {
    std::string_view name;
    QType member;
    std::string_view why;  // for --help
};
inline constexpr QTypeFamily kQTypeFamilies[] = {
    {"q3", QType::q3k_g32, "3.5 bits per weight: groups of 32, 6-bit scales and mins"},
    {"q4", QType::q4k_g32, "4.5 bits per weight: groups of 32, 6-bit scales and mins"},
    {"q8", QType::q8, "8 bits, one scale per row: the type q8 itself"},
};

constexpr bool qtype_families_consistent() {
    for (const auto& f : kQTypeFamilies) {
        const QTypeTraits& m = qtype_traits(f.member);
        // "qN": N is the member's bit width.
        if (f.name.size() != 2 || f.name[0] != 'q' || m.is_float ||
            static_cast<uint32_t>(f.name[1] - '0') != m.bits)
            return false;
        for (const auto& row : kQTypes)
            if (row.name == f.name && row.type != f.member) return false;
    }
    return true;
}
static_assert(qtype_families_consistent(),
              "a family is qN with an N-bit member, and a type's name is never another type's "
              "family");

// "q3 = q3k_g32, q4 = q4k_g32, q8 = q8": the families, for help and error texts.
std::string qtype_family_names();

// What a tensor is, for the default policy.
enum class TensorClass : uint8_t { vector, embed, tied_embed, lm_head, linear };
std::string_view tensor_class_name(TensorClass c);

// Our names of the embedding and output head (formats/architectures.hpp; a test checks every
// architecture has them).
inline constexpr std::string_view kEmbedTensor = "embed";
inline constexpr std::string_view kLmHeadTensor = "lm_head";

// The 8-bit type the output head gets under a default of fewer bits.
inline constexpr QType kOutputHeadQType = QType::q8_g32;

// `tied`: the model ties its embedding to the output head (the embedding then is the lm_head).
TensorClass classify_tensor(std::string_view name, std::span<const uint64_t> shape, bool tied);

struct TensorChoice {
    QType qtype;
    TensorClass cls;
    int override_index = -1;  // the override that decided, -1 for the default policy
    std::string reason;       // why, in words (one line; the same for every tensor of a decision)
};

// The stored type of one tensor: the first applicable override, else the default policy.
// `source` is the tensor's stored type in the input.
TensorChoice choose_tensor_qtype(const QuantRecipe& recipe, std::string_view name,
                                 std::span<const uint64_t> shape, QType source, bool tied);

// {"method", "qtype", "overrides": ["REGEX=TYPE", ...]}.
nlohmann::json recipe_to_json(const QuantRecipe& recipe);

}  // namespace qforge
