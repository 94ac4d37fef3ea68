#include "sources/compressed_tensors.hpp"

#include <cstring>
#include <stdexcept>

#include "core/error.hpp"
#include "core/half.hpp"
#include "sources/hf_quantized_detail.hpp"

namespace qforge {

using nlohmann::json;
using namespace hf_detail;

namespace {

constexpr std::string_view kCtx = "compressed-tensors quantization_config:";
constexpr std::string_view kPackQuantized = "pack-quantized";

// A key that must be absent, null, false or empty for a weight-only integer checkpoint.
void require_unset(const json& j, std::string_view key, const std::string& file,
                   std::string_view why) {
    const auto it = j.find(std::string(key));
    if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
        (it->is_object() && it->empty()) || (it->is_array() && it->empty()))
        return;
    throw Error(file, {},
                std::string(kCtx) + " '" + std::string(key) + "' is " + it->dump() +
                    ": not supported (" + std::string(why) + ")");
}

// The one scheme's "weights" object.
const json& weight_args(const json& j, const std::string& file) {
    const auto groups = j.find("config_groups");
    if (groups == j.end() || !groups->is_object() || groups->empty())
        throw Error(file, {}, std::string(kCtx) + " 'config_groups' must be a non-empty object");
    if (groups->size() != 1)
        throw Error(file, {},
                    std::string(kCtx) + " " + std::to_string(groups->size()) +
                        " config_groups: qforge imports one scheme for every quantized linear");
    const json& scheme = groups->begin().value();
    const std::string name = "config_groups." + groups->begin().key();
    if (!scheme.is_object())
        throw Error(file, {}, std::string(kCtx) + " " + name + " not an object");
    const std::string fmt = string_key(scheme, "format", std::string(kPackQuantized), file, kCtx);
    if (fmt != kPackQuantized)
        throw Error(file, {},
                    std::string(kCtx) + " " + name + ".format '" + fmt +
                        "' is not supported (supported: pack-quantized)");
    require_unset(scheme, "input_activations", file, "activation quantization; weight-only only");
    require_unset(scheme, "output_activations", file, "output quantization; weight-only only");
    const auto w = scheme.find("weights");
    if (w == scheme.end() || !w->is_object())
        throw Error(file, {}, std::string(kCtx) + " " + name + ".weights must be an object");
    return *w;
}

}  // namespace

HfQuantConfig parse_compressed_tensors_config(const json& j, const std::string& file) {
    HfQuantConfig qc;
    qc.method = HfQuantMethod::compressed_tensors;
    qc.file = file;
    qc.declared = j;
    const std::string format = string_key(j, "format", "", file, kCtx);
    if (format != kPackQuantized && format != "mixed-precision")
        throw Error(file, {},
                    std::string(kCtx) + " format '" + format +
                        "' is not supported (supported: pack-quantized, INT4/INT8 weight-only)");
    const std::string status = string_key(j, "quantization_status", "", file, kCtx);
    if (status != "compressed")
        throw Error(file, {},
                    std::string(kCtx) + " quantization_status '" + status +
                        "' is not supported (supported: compressed, the packed weights)");
    require_unset(j, "sparsity_config", file, "sparse weights");
    require_unset(j, "transform_config", file, "rotated weights");
    require_unset(j, "kv_cache_scheme", file, "a quantized KV cache");
    const json& w = weight_args(j, file);
    const std::string type = string_key(w, "type", "int", file, kCtx);
    if (type != "int")
        throw Error(
            file, {},
            std::string(kCtx) + " weights.type '" + type + "' is not supported (supported: int)");
    const int64_t bits = int_key(w, {"num_bits"}, 8, file, kCtx);
    if (bits != 4 && bits != 8)
        throw Error(file, {},
                    std::string(kCtx) + " weights.num_bits " + std::to_string(bits) +
                        " is not supported (qforge imports 4- and 8-bit integers)");
    qc.bits = static_cast<uint32_t>(bits);
    qc.sym = bool_key(w, "symmetric", true, file, kCtx);
    if (bool_key(w, "dynamic", false, file, kCtx))
        throw Error(file, {}, std::string(kCtx) + " weights.dynamic true is not supported");
    // "static" reorders GPTQ's columns while it quantizes but stores contiguous groups, so it
    // reads as null; "group" and "weight" store a weight_g_idx, a permuted group assignment.
    if (const json* a = find_key(w, {"actorder"});
        a && !(a->is_boolean() && !a->get<bool>()) && !(a->is_string() && *a == "static"))
        throw Error(file, {},
                    std::string(kCtx) + " weights.actorder " + a->dump() +
                        " is not supported (supported: null, static): its weight_g_idx permutes "
                        "the groups");
    const std::string strategy = string_key(w, "strategy", "", file, kCtx);
    if (strategy == "channel") {
        qc.group_size = -1;
    } else if (strategy == "group") {
        qc.group_size = int_key(w, {"group_size"}, 0, file, kCtx);
        if (qc.group_size <= 0 || qc.group_size % 32 != 0 || qc.group_size > (int64_t{1} << 31))
            throw Error(file, {},
                        std::string(kCtx) + " weights.group_size " + std::to_string(qc.group_size) +
                            " is not supported (supported: a multiple of 32)");
    } else {
        throw Error(file, {},
                    std::string(kCtx) + " weights.strategy '" + strategy +
                        "' is not supported (supported: group, channel)");
    }
    return qc;
}

namespace {

// Whether, in every linear, runs of `run` groups share their scale and zero bytes.
bool runs_share_params(const SafetensorsCheckpoint& ckpt, uint64_t run, bool sym) {
    for (const std::string& name : ckpt.tensor_names()) {
        if (!name.ends_with(kCtPacked)) continue;
        const std::string base = name.substr(0, name.size() - kCtPacked.size());
        const std::string scale_name = base + std::string(kCtScale),
                          zero_name = base + std::string(kCtZeroPoint);
        const SafetensorsTensorInfo* scale = ckpt.find(scale_name);
        const SafetensorsTensorInfo* zero = sym ? nullptr : ckpt.find(zero_name);
        if (!scale || scale->shape.size() != 2 || (!sym && (!zero || zero->shape.size() != 2)))
            return false;  // the import names what is wrong
        // Both are [rows, groups]: compare each element with its run's first, byte for byte.
        auto shares = [&](const std::string& tensor) {
            const TensorView v = ckpt.tensor(tensor);
            const uint64_t groups = v.shape[1], rows = v.shape[0];
            const uint64_t size = dtype_info(v.dtype).size;
            if (v.data.size() != rows * groups * size) return false;
            for (uint64_t r = 0; r < rows; ++r)
                for (uint64_t g = 0; g < groups; ++g) {
                    const uint8_t* at = v.data.data() + (r * groups + g) * size;
                    if (std::memcmp(at, at - (g % run) * size, size) != 0) return false;
                }
            return true;
        };
        if (!shares(scale_name) || (!sym && !shares(zero_name))) return false;
    }
    return true;
}

}  // namespace

QType compressed_tensors_target(const HfQuantConfig& qc, QType base,
                                const SafetensorsCheckpoint& ckpt) {
    if (qc.group_size <= 0) return base;
    const auto g = static_cast<uint64_t>(qc.group_size);
    const QTypeTraits* best = nullptr;
    for (const QTypeTraits& tr : kQTypes) {
        if (tr.is_float || tr.super_block || tr.nonuniform || tr.bits != qc.bits ||
            tr.symmetric != qc.sym || tr.group <= g || tr.group % g != 0 ||
            (best && tr.group <= best->group))
            continue;
        if (runs_share_params(ckpt, tr.group / g, qc.sym)) best = &tr;
    }
    return best ? best->type : base;
}

void import_compressed_tensors_linear(const HfQuantConfig& qc, QType target,
                                      const SafetensorsCheckpoint& ckpt,
                                      const std::string& hf_weight_name, uint64_t n, uint64_t k,
                                      std::vector<uint8_t>& out) {
    const std::string packed_name = hf_qweight_name(hf_weight_name, qc.method);
    if (packed_name.empty())
        throw std::logic_error("import_compressed_tensors_linear: not an X.weight name");
    const std::string base = packed_name.substr(0, packed_name.size() - kCtPacked.size());
    const uint32_t bits = qc.bits, per_word = 32 / bits, mask = (1u << bits) - 1;
    const uint64_t group = qc.group_size == -1 ? k : static_cast<uint64_t>(qc.group_size);
    if (k % group != 0)
        throw Error(ckpt.file_of(packed_name), packed_name,
                    "k = " + std::to_string(k) + " is not a multiple of group_size " +
                        std::to_string(group) + " (compressed-tensors groups are whole)");
    const uint64_t groups = k / group, row_words = (k + per_word - 1) / per_word;
    if (ckpt.contains(base + std::string(kCtGIdx)))
        throw Error(ckpt.file_of(base + std::string(kCtGIdx)), base + std::string(kCtGIdx),
                    "a permuted group assignment (actorder group/weight) is not supported");

    const Part packed = checked_part(ckpt, packed_name, DType::i32, {n, row_words},
                                     "[out, ceil(in * bits / 32)] codes");
    // weight_shape: torch.tensor(weight.shape), int64 (int32 accepted).
    const SafetensorsTensorInfo* shape_info = ckpt.find(base + std::string(kCtShape));
    const DType shape_dtype =
        shape_info && shape_info->dtype == DType::i32 ? DType::i32 : DType::i64;
    const Part shape =
        checked_part(ckpt, base + std::string(kCtShape), shape_dtype, {2}, "[out, in]");
    for (uint64_t d = 0; d < 2; ++d) {
        const uint64_t word = shape_dtype == DType::i32 ? 1 : 2;
        const uint64_t lo = shape.word(d * word),
                       hi = shape_dtype == DType::i32 ? 0 : shape.word(d * word + 1);
        const uint64_t value = lo | (hi << 32), expected = d == 0 ? n : k;
        if (value != expected)
            throw Error(shape.file, shape.name,
                        "holds " + std::to_string(value) + " at dimension " + std::to_string(d) +
                            ", but config.json implies " + std::to_string(expected));
    }
    const SafetensorsTensorInfo* scale_info = ckpt.find(base + std::string(kCtScale));
    const DType scale_dtype = scale_info ? scale_info->dtype : DType::f16;
    if (scale_dtype != DType::f16 && scale_dtype != DType::bf16 && scale_dtype != DType::f32)
        throw Error(ckpt.file_of(base + std::string(kCtScale)), base + std::string(kCtScale),
                    "dtype " + std::string(dtype_info(scale_dtype).safetensors_name) +
                        ", expected F16, BF16 or F32");
    const Part scales =
        checked_part(ckpt, base + std::string(kCtScale), scale_dtype, {n, groups}, "[out, groups]");
    const uint64_t zero_rows = (n * bits + 31) / 32;
    const Part zeros =
        qc.sym ? scales
               : checked_part(ckpt, base + std::string(kCtZeroPoint), DType::i32,
                              {zero_rows, groups}, "[ceil(out * bits / 32), groups] zeros");

    const uint32_t offset = 1u << (bits - 1);  // signed codes are stored + 2^(bits-1)
    auto code_of = [&](uint64_t i, uint64_t o) -> uint32_t {
        return (packed.word(o * row_words + i / per_word) >> (bits * (i % per_word))) & mask;
    };
    auto scale_of = [&](uint64_t g, uint64_t o) -> uint16_t {
        const uint64_t at = o * groups + g;
        if (scale_dtype == DType::f16) return scales.half(at);
        const float v = scale_dtype == DType::bf16 ? bf16_to_f32(scales.half(at))
                                                   : std::bit_cast<float>(scales.word(at));
        const uint16_t h = f32_to_f16(v);
        // NaN compares unequal: it passes here and repack_rows names it.
        if (f16_to_f32(h) != v && !std::isnan(v))
            throw Error(scales.file, scales.name,
                        "scale of output " + std::to_string(o) + ", group " + std::to_string(g) +
                            " (" + std::to_string(v) +
                            ") is not exact in binary16, which qforge's rows store");
        return h;
    };
    auto zero_of = [&](uint64_t g, uint64_t o) -> int32_t {
        if (qc.sym) return static_cast<int32_t>(offset);
        return static_cast<int32_t>(
            (zeros.word(o / per_word * groups + g) >> (bits * (o % per_word))) & mask);
    };
    repack_rows(target, n, k, group, packed, scales, zeros, "", code_of, scale_of, zero_of, out);
    for (std::string_view suffix : {kCtPacked, kCtScale, kCtZeroPoint, kCtShape})
        if (ckpt.contains(base + std::string(suffix))) ckpt.release(base + std::string(suffix));
}

}  // namespace qforge
