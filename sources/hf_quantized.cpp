#include "sources/hf_quantized.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/alloc.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/json_io.hpp"
#include "sources/compressed_tensors.hpp"
#include "sources/hf_quantized_detail.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace hf_detail {

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

const json* find_key(const json& j, std::initializer_list<std::string_view> names) {
    for (std::string_view n : names)
        if (auto it = j.find(std::string(n)); it != j.end() && !it->is_null()) return &*it;
    return nullptr;
}

int64_t int_key(const json& j, std::initializer_list<std::string_view> names, int64_t fallback,
                const std::string& file, std::string_view context) {
    const json* v = find_key(j, names);
    if (!v) return fallback;
    // get<int64_t> of an unsigned value past INT64_MAX would wrap (2^64 - 1 reads as -1).
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}))
        throw Error(file, {},
                    std::string(context) + " '" + std::string(*names.begin()) +
                        "' must be an integer, found " + v->dump());
    return v->get<int64_t>();
}

bool bool_key(const json& j, std::string_view name, bool fallback, const std::string& file,
              std::string_view context) {
    const json* v = find_key(j, {name});
    if (!v) return fallback;
    if (!v->is_boolean())
        throw Error(file, {},
                    std::string(context) + " '" + std::string(name) +
                        "' must be true or false, found " + v->dump());
    return v->get<bool>();
}

std::string string_key(const json& j, std::string_view name, const std::string& fallback,
                       const std::string& file, std::string_view context) {
    const json* v = find_key(j, {name});
    if (!v) return fallback;
    if (!v->is_string())
        throw Error(file, {},
                    std::string(context) + " '" + std::string(name) + "' must be a string, found " +
                        v->dump());
    return v->get<std::string>();
}

Part checked_part(const SafetensorsCheckpoint& ckpt, const std::string& name, DType dtype,
                  std::vector<uint64_t> shape, const std::string& what) {
    const SafetensorsTensorInfo* info = ckpt.find(name);
    if (!info)
        throw Error(ckpt.files().front(), name,
                    "missing: a quantized linear needs it (" +
                        std::string(dtype_info(dtype).safetensors_name) + " " +
                        shape_to_string(shape) + ", " + what + ")");
    const std::string& file = ckpt.file_of(name);
    if (info->dtype != dtype)
        throw Error(file, name,
                    "dtype " + std::string(dtype_info(info->dtype).safetensors_name) +
                        ", expected " + std::string(dtype_info(dtype).safetensors_name));
    if (info->shape != shape)
        throw Error(file, name,
                    "shape " + shape_to_string(info->shape) + ", expected " +
                        shape_to_string(shape) + " (" + what + ")");
    return {name, file, ckpt.tensor(name).data};
}

}  // namespace hf_detail

namespace {

using namespace hf_detail;

constexpr std::string_view kQweight = ".qweight", kQzeros = ".qzeros", kScales = ".scales",
                           kGIdx = ".g_idx";
constexpr std::string_view kQuantizedParts[] = {kQweight, kQzeros, kScales, kGIdx};

// AWQ's GEMM packing: nibble p of a word holds output 8 w + kAwqOrder[p]; kAwqNibble
// (hf_quantized.hpp) inverts it.
constexpr std::array<uint32_t, 8> kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7};
constexpr bool awq_orders_inverse() {
    for (uint32_t p = 0; p < 8; ++p)
        if (kAwqNibble[kAwqOrder[p]] != p) return false;
    return true;
}
static_assert(awq_orders_inverse(), "kAwqNibble must invert kAwqOrder");
constexpr uint32_t kAwqBits = 4;

HfQuantConfig parse_quant_config(const json& j, const std::string& file,
                                 std::string_view default_method) {
    constexpr std::string_view ctx = "quantization config:";
    if (!j.is_object()) throw Error(file, {}, "quantization config must be a JSON object");
    const std::string method =
        lower(string_key(j, "quant_method", std::string(default_method), file, ctx));
    HfQuantConfig qc;
    qc.file = file;
    qc.declared = j;
    if (method == "gptq") {
        qc.method = HfQuantMethod::gptq;
        const int64_t bits = int_key(j, {"bits"}, 0, file, ctx);
        if (bits != 4 && bits != 8)
            throw Error(file, {},
                        "GPTQ bits " +
                            (bits == 0 ? std::string("(missing)") : std::to_string(bits)) +
                            " is not supported (qforge imports 4- and 8-bit GPTQ)");
        qc.bits = static_cast<uint32_t>(bits);
        qc.sym = bool_key(j, "sym", true, file, ctx);
        const std::string format = string_key(j, "checkpoint_format", "gptq", file, ctx);
        if (format != "gptq" && format != "gptq_v2")
            throw Error(file, {},
                        "GPTQ checkpoint_format '" + format +
                            "' is not supported (supported: gptq and gptq_v2, whose zeros "
                            "qforge tells apart)");
        qc.gptq_v2 = format == "gptq_v2";
        if (bool_key(j, "is_marlin_format", false, file, ctx))
            throw Error(file, {}, "GPTQ is_marlin_format checkpoints are not supported");
    } else if (method == "awq") {
        qc.method = HfQuantMethod::awq;
        const int64_t bits = int_key(j, {"bits", "w_bit"}, 0, file, ctx);
        if (bits != kAwqBits)
            throw Error(file, {},
                        "AWQ bits " +
                            (bits == 0 ? std::string("(missing)") : std::to_string(bits)) +
                            " is not supported (qforge imports 4-bit AWQ)");
        qc.bits = kAwqBits;
        const std::string version = lower(string_key(j, "version", "gemm", file, ctx));
        if (version != "gemm")
            throw Error(file, {},
                        "AWQ version '" + version + "' is not supported (supported: gemm)");
        if (!bool_key(j, "zero_point", true, file, ctx))
            throw Error(file, {},
                        "AWQ zero_point false is not supported (qforge imports zero_point true)");
        qc.sym = false;
    } else if (method == "compressed-tensors") {
        return parse_compressed_tensors_config(j, file);
    } else {
        throw Error(file, {},
                    "quant_method '" + method +
                        "' is not supported (supported: gptq, awq, compressed-tensors)");
    }
    qc.group_size = int_key(j, {"group_size", "q_group_size"}, -1, file, ctx);
    if (qc.group_size != -1 &&
        (qc.group_size <= 0 || qc.group_size % 32 != 0 || qc.group_size > (int64_t{1} << 31)))
        throw Error(file, {},
                    "group_size " + std::to_string(qc.group_size) +
                        " is not supported (supported: -1 or a multiple of 32)");
    return qc;
}

}  // namespace

std::string_view hf_quant_method_name(HfQuantMethod m) {
    switch (m) {
        case HfQuantMethod::gptq:
            return "gptq";
        case HfQuantMethod::awq:
            return "awq";
        case HfQuantMethod::compressed_tensors:
            return "compressed-tensors";
    }
    throw std::logic_error("hf_quant_method_name: not a method");
}

std::optional<HfQuantConfig> read_hf_quant_config(const std::string& config_path) {
    const json cfg = read_json_file(config_path);
    if (cfg.is_object())
        if (auto it = cfg.find("quantization_config"); it != cfg.end() && !it->is_null())
            return parse_quant_config(*it, config_path, "");
    const fs::path dir = fs::path(config_path).parent_path();
    // AutoGPTQ writes quantize_config.json, AutoAWQ quant_config.json; older ones omit
    // quant_method, so the file name says which.
    for (const auto& [name, method] :
         {std::pair{"quantize_config.json", "gptq"}, std::pair{"quant_config.json", "awq"}}) {
        const fs::path p = dir / name;
        if (fs::is_regular_file(p))
            return parse_quant_config(read_json_file(p.string()), p.string(), method);
    }
    return std::nullopt;
}

std::optional<std::string> resolve_gptq_zeros(HfQuantConfig& qc,
                                              const SafetensorsCheckpoint& ckpt) {
    if (qc.method != HfQuantMethod::gptq || !qc.sym) return std::nullopt;
    const uint32_t bits = qc.bits, per_word = 32 / bits, mask = (1u << bits) - 1;
    const uint32_t v1 = (1u << (bits - 1)) - 1, v2 = 1u << (bits - 1);
    auto kind = [](bool is_v2) { return std::string(is_v2 ? "v2" : "v1"); };
    std::optional<bool> found_v2;
    std::string first;  // the tensor that settled it
    for (const std::string& name : ckpt.tensor_names()) {
        const SafetensorsTensorInfo* info = ckpt.find(name);
        // A qzeros of the wrong dtype or shape is named by the import.
        if (!name.ends_with(kQzeros) || info->dtype != DType::i32 || info->shape.size() != 2 ||
            info->shape[1] == 0)
            continue;
        const Part zeros{name, ckpt.file_of(name), ckpt.tensor(name).data};
        const uint64_t words = zeros.data.size() / 4, row = info->shape[1];
        std::optional<bool> is_v2;
        for (uint64_t w = 0; w < words; ++w)
            for (uint32_t j = 0; j < per_word; ++j) {
                const uint32_t z = (zeros.word(w) >> (bits * j)) & mask;
                const bool known = z == v1 || z == v2;
                if (!known || (is_v2 && *is_v2 != (z == v2)))
                    throw Error(zeros.file, zeros.name,
                                "group " + std::to_string(w / row) + ", output " +
                                    std::to_string(w % row * per_word + j) + " stores zero " +
                                    std::to_string(z) +
                                    ": the zeros of a sym=true checkpoint are " + "all " +
                                    std::to_string(v1) + " (GPTQ v1, zero - 1) or all " +
                                    std::to_string(v2) + " (v2), so they fit neither" +
                                    (is_v2 ? " (the tensor's first zero is " + kind(*is_v2) + ")"
                                           : std::string()));
                is_v2 = z == v2;
            }
        if (!is_v2) continue;
        if (found_v2 && *found_v2 != *is_v2)
            throw Error(zeros.file, zeros.name,
                        "stores GPTQ " + kind(*is_v2) + " zeros, but " + first + " stores " +
                            kind(*found_v2) + " zeros: a checkpoint holds one kind");
        if (!found_v2) first = name;
        found_v2 = is_v2;
    }
    if (!found_v2 || *found_v2 == qc.gptq_v2) return std::nullopt;
    const bool label_v2 = qc.gptq_v2;
    qc.gptq_v2 = *found_v2;
    return qc.file + ": checkpoint_format says " + (label_v2 ? "gptq_v2" : "gptq") +
           " but the zeros (" + first + ": all " + std::to_string(*found_v2 ? v2 : v1) +
           ") are GPTQ " + kind(*found_v2) + ": read as " + kind(*found_v2);
}

QType hf_quant_target(const HfQuantConfig& qc) {
    if (qc.bits == 8 && !qc.sym)
        throw Error(qc.file, {},
                    "8-bit asymmetric GPTQ (sym false) is not supported: qforge has no asymmetric "
                    "8-bit type to hold its zeros exactly");
    // The table's row of these bits and symmetry with the largest group that divides the
    // checkpoint's; group_size -1 (one group per row) prefers a per-row type.
    const QTypeTraits* best = nullptr;
    for (const QTypeTraits& tr : kQTypes) {
        // Super-block types quantize their group scales and level types index a table: no
        // GPTQ/AWQ group (fp16 scale, integer codes) fits them.
        if (tr.is_float || tr.super_block || tr.nonuniform || tr.bits != qc.bits ||
            tr.symmetric != qc.sym)
            continue;
        const uint64_t g = tr.group;
        const bool fits =
            qc.group_size == -1 ? true : g != 0 && qc.group_size % static_cast<int64_t>(g) == 0;
        if (!fits) continue;
        const auto rank = [&](const QTypeTraits& t) { return t.group == 0 ? UINT64_MAX : t.group; };
        if (!best || rank(tr) > rank(*best)) best = &tr;
    }
    if (!best)
        throw Error(qc.file, {},
                    "no qforge type holds " + std::to_string(qc.bits) + "-bit " +
                        (qc.sym ? "symmetric" : "asymmetric") + " groups of " +
                        std::to_string(qc.group_size));
    return best->type;
}

std::optional<std::string> hf_quantized_part_of(std::string_view name) {
    for (std::string_view suffix : kQuantizedParts)
        if (name.size() > suffix.size() && name.ends_with(suffix))
            return std::string(name.substr(0, name.size() - suffix.size())) + ".weight";
    for (std::string_view suffix : {kCtPacked, kCtScale, kCtZeroPoint, kCtShape, kCtGIdx})
        if (name.size() > suffix.size() && name.ends_with(suffix))
            return std::string(name.substr(0, name.size() - suffix.size())) + ".weight";
    return std::nullopt;
}

std::string hf_qweight_name(std::string_view hf_weight_name, HfQuantMethod method) {
    constexpr std::string_view weight = ".weight";
    if (!hf_weight_name.ends_with(weight)) return {};
    return std::string(hf_weight_name.substr(0, hf_weight_name.size() - weight.size())) +
           std::string(method == HfQuantMethod::compressed_tensors ? kCtPacked : kQweight);
}

std::vector<uint32_t> hf_quantized_col_perm(const HfQuantConfig& qc,
                                            const SafetensorsCheckpoint& ckpt,
                                            const std::string& hf_weight_name, uint64_t n,
                                            uint64_t k) {
    (void)n;
    const std::string qweight = hf_qweight_name(hf_weight_name, qc.method);
    const std::string name =
        qweight.substr(0, qweight.size() - kQweight.size()) + std::string(kGIdx);
    if (qc.method != HfQuantMethod::gptq || !ckpt.contains(name)) return {};
    const uint64_t group = qc.group_size == -1 ? k : static_cast<uint64_t>(qc.group_size);
    const uint64_t groups = (k + group - 1) / group;
    const Part g_idx = checked_part(ckpt, name, DType::i32, {k}, "[in] group per input");
    std::vector<uint64_t> count(groups, 0);
    bool contiguous = true;
    for (uint64_t i = 0; i < k; ++i) {
        const auto g = static_cast<int32_t>(g_idx.word(i));
        if (g < 0 || static_cast<uint64_t>(g) >= groups)
            throw Error(g_idx.file, g_idx.name,
                        "g_idx[" + std::to_string(i) + "] is " + std::to_string(g) +
                            ", outside the " + std::to_string(groups) + " groups");
        ++count[static_cast<uint64_t>(g)];
        contiguous &= static_cast<uint64_t>(g) == i / group;
    }
    if (contiguous) return {};
    for (uint64_t g = 0; g < groups; ++g)
        if (count[g] != std::min(group, k - g * group))
            throw Error(g_idx.file, g_idx.name,
                        "act-order checkpoint: group " + std::to_string(g) + " holds " +
                            std::to_string(count[g]) + " inputs, not " +
                            std::to_string(std::min(group, k - g * group)) +
                            ", so its inputs cannot be stored as one contiguous group");
    // Inputs sorted by group, stably: a counting sort.
    std::vector<uint64_t> next(groups);
    for (uint64_t g = 0; g < groups; ++g) next[g] = g * group;
    std::vector<uint32_t> perm(k);
    for (uint64_t i = 0; i < k; ++i) perm[next[g_idx.word(i)]++] = static_cast<uint32_t>(i);
    return perm;
}

void import_hf_quantized_linear(const HfQuantConfig& qc, QType target,
                                const SafetensorsCheckpoint& ckpt,
                                const std::string& hf_weight_name, uint64_t n, uint64_t k,
                                std::vector<uint8_t>& out) {
    if (qc.method == HfQuantMethod::compressed_tensors)
        return import_compressed_tensors_linear(qc, target, ckpt, hf_weight_name, n, k, out);
    const std::string qweight_name = hf_qweight_name(hf_weight_name);
    if (qweight_name.empty())
        throw std::logic_error("import_hf_quantized_linear: not an X.weight name");
    const std::string base = qweight_name.substr(0, qweight_name.size() - kQweight.size());
    const uint32_t bits = qc.bits, per_word = 32 / bits, mask = (1u << bits) - 1;
    const bool gptq = qc.method == HfQuantMethod::gptq;
    const uint64_t group = qc.group_size == -1 ? k : static_cast<uint64_t>(qc.group_size);
    const uint64_t groups = (k + group - 1) / group;

    // Codes pack along the input (GPTQ) or the output (AWQ), zeros along the output: those
    // dimensions must hold whole words.
    const uint64_t in_words = gptq ? per_word : 1, out_words = per_word;
    if (k % in_words != 0 || n % out_words != 0)
        throw Error(ckpt.contains(qweight_name) ? ckpt.file_of(qweight_name) : qc.file,
                    qweight_name,
                    "the linear's shape [" + std::to_string(n) + ", " + std::to_string(k) +
                        "] does not pack into whole " + std::to_string(per_word) + "-code words (" +
                        std::string(hf_quant_method_name(qc.method)) + ")");
    const Part qweight = gptq ? checked_part(ckpt, qweight_name, DType::i32, {k / per_word, n},
                                             "[in / " + std::to_string(per_word) + ", out] codes")
                              : checked_part(ckpt, qweight_name, DType::i32, {k, n / per_word},
                                             "[in, out / 8] codes");
    const Part qzeros =
        checked_part(ckpt, base + std::string(kQzeros), DType::i32, {groups, n / per_word},
                     "[groups, out / " + std::to_string(per_word) + "] zeros");
    const Part scales =
        checked_part(ckpt, base + std::string(kScales), DType::f16, {groups, n}, "[groups, out]");
    // Stored column j holds input perm[j] (act-order), or input j.
    const std::vector<uint32_t> perm = hf_quantized_col_perm(qc, ckpt, hf_weight_name, n, k);

    auto input_code = [&](uint64_t i, uint64_t o) -> uint32_t {
        if (gptq) return (qweight.word(i / per_word * n + o) >> (bits * (i % per_word))) & mask;
        return (qweight.word(i * (n / 8) + o / 8) >> (4 * kAwqNibble[o % 8])) & mask;
    };
    auto code_of = [&](uint64_t j, uint64_t o) {
        return input_code(perm.empty() ? j : perm[j], o);
    };
    auto zero_of = [&](uint64_t g, uint64_t o) -> int32_t {
        const uint64_t words = n / per_word;
        if (gptq)
            return static_cast<int32_t>(
                       (qzeros.word(g * words + o / per_word) >> (bits * (o % per_word))) & mask) +
                   (qc.gptq_v2 ? 0 : 1);  // v1 stores zero - 1
        return static_cast<int32_t>((qzeros.word(g * words + o / 8) >> (4 * kAwqNibble[o % 8])) &
                                    mask);
    };

    repack_rows(
        target, n, k, group, qweight, scales, qzeros,
        gptq && !qc.gptq_v2
            ? " (GPTQ v1 stores zero - 1, so a zero of 0 wraps to 16; a v2 checkpoint stores the "
              "zero itself: declare checkpoint_format gptq_v2)"
            : "",
        code_of, [&](uint64_t g, uint64_t o) { return scales.half(g * n + o); }, zero_of, out);
    for (std::string_view suffix : kQuantizedParts)
        if (ckpt.contains(base + std::string(suffix))) ckpt.release(base + std::string(suffix));
}

}  // namespace qforge
