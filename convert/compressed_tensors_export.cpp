#include "convert/compressed_tensors_export.hpp"

#include <algorithm>
#include <cstdlib>

#include "core/error.hpp"
#include "sources/compressed_tensors.hpp"

namespace qforge {

using nlohmann::json;
using namespace hf_export_detail;

namespace {

// The types pack-quantized holds exactly: integer codes with one fp16 scale (and, asymmetric,
// one integer zero) per contiguous group. Listed, not derived from the traits, so a new type
// (another scale layout) is refused until its mapping is written.
constexpr QType kMappable[] = {QType::q8,      QType::q8_g32,  QType::q8_g128,
                               QType::q4_g32,  QType::q4_g64,  QType::q4_g128,
                               QType::q4s_g32, QType::q4s_g64, QType::q4s_g128};

bool mappable(QType t) {
    return std::find(std::begin(kMappable), std::end(kMappable), t) != std::end(kMappable);
}

}  // namespace

std::string compressed_tensors_refusal(QType t) {
    const QTypeTraits& tr = qtype_traits(t);
    if (tr.is_float || mappable(t)) return {};
    // Nearest: the same symmetry, then the fewest extra bits, then the closest group.
    auto distance = [&](QType c) {
        const QTypeTraits& o = qtype_traits(c);
        const int64_t bits = static_cast<int64_t>(o.bits) - static_cast<int64_t>(tr.bits);
        const int64_t group = static_cast<int64_t>(o.group ? o.group : 4096) -
                              static_cast<int64_t>(tr.group ? tr.group : 4096);
        return std::tuple{o.symmetric != tr.symmetric, bits < 0, std::llabs(bits),
                          std::llabs(group)};
    };
    QType best = kMappable[0];
    for (QType c : kMappable)
        if (distance(c) < distance(best)) best = c;
    return "type " + std::string(tr.name) +
           " cannot be exported to compressed-tensors (pack-quantized holds 4-bit groups and "
           "symmetric 8-bit groups or rows: q4_g*, q4s_g*, q8, q8_g*); quantize with --qtype " +
           std::string(qtype_traits(best).name) + " instead";
}

uint64_t compressed_tensors_group(QType t, const std::vector<uint64_t>& ks,
                                  const std::vector<std::string>& names, const std::string& file) {
    const uint64_t ours = qtype_traits(t).group;
    if (ours == 0) return 0;
    for (uint64_t g = ours; g >= 32; g -= 32) {
        if (ours % g != 0) continue;
        if (std::all_of(ks.begin(), ks.end(), [&](uint64_t k) { return k % g == 0; })) return g;
    }
    for (size_t i = 0; i < ks.size(); ++i)
        if (ks[i] % 32 != 0)
            throw Error(file, names[i],
                        "k = " + std::to_string(ks[i]) +
                            " is not a multiple of 32: compressed-tensors groups are whole, and "
                            "no group of 32 or more fits it; keep this linear float");
    throw std::logic_error("compressed_tensors_group: 32 divides every k");
}

uint64_t compressed_tensors_linear_bytes(QType t, uint64_t n, uint64_t k, uint64_t group) {
    const QTypeTraits& tr = qtype_traits(t);
    const uint64_t per_word = 32 / tr.bits, groups = group ? k / group : 1;
    const uint64_t zeros = tr.symmetric ? 0 : 4 * ((n + per_word - 1) / per_word) * groups;
    return 4 * n * ((k + per_word - 1) / per_word) + 2 * n * groups + zeros + 16;
}

std::vector<Packed> pack_compressed_tensors_linear(QType t, uint64_t group,
                                                   const std::string& hf_weight_name,
                                                   std::span<const uint8_t> rows, uint64_t n,
                                                   uint64_t k) {
    const QTypeTraits& tr = qtype_traits(t);
    const QRowLayout l = *qtype_row_layout(t, k);
    const uint32_t bits = tr.bits, per_word = 32 / bits;
    // Our 4-bit codes and zeros are the stored unsigned values as they are; our int8 codes are
    // the signed q, stored + 128.
    const int32_t offset = tr.signed_codes ? 1 << (bits - 1) : 0;
    const uint64_t g = group ? group : k, groups = k / g, row_words = (k + per_word - 1) / per_word;
    const std::string base =
        hf_weight_name.substr(0, hf_weight_name.size() - std::string_view(".weight").size());
    Packed packed{base + std::string(kCtPacked),
                  DType::i32,
                  {n, row_words},
                  std::vector<uint8_t>(4 * n * row_words, 0)};
    Packed scales{base + std::string(kCtScale),
                  DType::f16,
                  {n, groups},
                  std::vector<uint8_t>(2 * n * groups, 0)};
    const uint64_t zero_rows = (n + per_word - 1) / per_word;
    Packed zeros{base + std::string(kCtZeroPoint),
                 DType::i32,
                 {zero_rows, groups},
                 std::vector<uint8_t>(tr.symmetric ? 0 : 4 * zero_rows * groups, 0)};
    Packed shape{base + std::string(kCtShape), DType::i64, {2}, std::vector<uint8_t>(16)};
    const int64_t dims[2] = {static_cast<int64_t>(n), static_cast<int64_t>(k)};
    std::memcpy(shape.bytes.data(), dims, sizeof dims);

    for (uint64_t o = 0; o < n; ++o) {
        const uint8_t* row = rows.data() + o * l.row_bytes;
        for (uint64_t i = 0; i < k; ++i)
            or_bits(packed.bytes, o * row_words + i / per_word,
                    static_cast<uint32_t>(row_code(t, row, i) + offset),
                    bits * static_cast<uint32_t>(i % per_word));
        for (uint64_t j = 0; j < groups; ++j) {
            const uint64_t ours = j * g / l.group;  // the group of ours that holds theirs
            std::memcpy(&scales.bytes[2 * (o * groups + j)], row + l.scales_offset + 2 * ours, 2);
            if (!tr.symmetric)
                or_bits(zeros.bytes, o / per_word * groups + j,
                        static_cast<uint32_t>(row_group_zero(t, row, k, ours)),
                        bits * static_cast<uint32_t>(o % per_word));
        }
    }
    std::vector<Packed> parts;
    parts.push_back(std::move(packed));
    parts.push_back(std::move(scales));
    if (!tr.symmetric) parts.push_back(std::move(zeros));
    parts.push_back(std::move(shape));
    return parts;
}

json compressed_tensors_config_json(QType t, uint64_t group,
                                    const std::vector<std::string>& ignore) {
    const QTypeTraits& tr = qtype_traits(t);
    // The keys llm-compressor writes for a weight-only scheme (W4A16 / W8A16), with the observer
    // that matches how our grids are chosen (min-max per group).
    const json weights = {{"num_bits", tr.bits},
                          {"type", "int"},
                          {"symmetric", tr.symmetric},
                          {"group_size", group ? json(group) : json(nullptr)},
                          {"strategy", group ? "group" : "channel"},
                          {"block_structure", nullptr},
                          {"dynamic", false},
                          {"actorder", nullptr},
                          {"observer", "minmax"},
                          {"observer_kwargs", json::object()}};
    return {{"quant_method", "compressed-tensors"},
            {"format", "pack-quantized"},
            {"quantization_status", "compressed"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}},
                {"weights", weights},
                {"input_activations", nullptr},
                {"output_activations", nullptr},
                {"format", "pack-quantized"}}}}},
            {"ignore", ignore},
            {"kv_cache_scheme", nullptr},
            {"global_compression_ratio", nullptr},
            {"sparsity_config", json::object()}};
}

}  // namespace qforge
