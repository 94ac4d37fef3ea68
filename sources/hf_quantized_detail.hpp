// What the quantized-checkpoint importers (sources/hf_quantized.cpp: GPTQ, AWQ;
// sources/compressed_tensors.cpp) share: reading the declaration's keys, reading a part checked
// for dtype and shape, and the one loop they all end in, which packs the checkpoint's codes, fp16
// scales and integer zeros of an [n, k] linear into rows of a qforge type. Nothing is
// re-quantized: a row dequantizes to exactly scale * (code - zero) of the checkpoint.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/alloc.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/qtype.hpp"
#include "formats/safetensors.hpp"

namespace qforge::hf_detail {

// A key of the declaration, one of several spellings (AutoAWQ's quant_config.json says w_bit
// and q_group_size); nullptr when absent or null.
const nlohmann::json* find_key(const nlohmann::json& j,
                               std::initializer_list<std::string_view> names);
// The key's value, `fallback` when absent; a value of another JSON type is an Error naming the
// file, `context` and the key.
int64_t int_key(const nlohmann::json& j, std::initializer_list<std::string_view> names,
                int64_t fallback, const std::string& file, std::string_view context);
bool bool_key(const nlohmann::json& j, std::string_view name, bool fallback,
              const std::string& file, std::string_view context);
std::string string_key(const nlohmann::json& j, std::string_view name, const std::string& fallback,
                       const std::string& file, std::string_view context);
std::string lower(std::string s);

// Reads little-endian words and halves of a tensor checked to have `dtype` and `shape`.
struct Part {
    std::string name, file;
    std::span<const uint8_t> data;
    uint32_t word(uint64_t i) const {
        uint32_t v;
        std::memcpy(&v, data.data() + 4 * i, 4);
        return v;
    }
    uint16_t half(uint64_t i) const {
        uint16_t v;
        std::memcpy(&v, data.data() + 2 * i, 2);
        return v;
    }
};

// Tensor `name` of the checkpoint, an Error naming it when it is missing or its dtype or shape
// differ (`what` says what the shape means).
Part checked_part(const SafetensorsCheckpoint& ckpt, const std::string& name, DType dtype,
                  std::vector<uint64_t> shape, const std::string& what);

// code_of(i, o): the unsigned stored code of input i, output o (0 .. 2^bits - 1).
// scale_of(g, o): the binary16 bits of group g's scale. zero_of(g, o): the group's true zero
// point in the stored unsigned code space (2^(bits-1) for symmetric checkpoints).
// `group` is the checkpoint's group size (k for one group per row); the target's groups must
// each lie inside one of the checkpoint's (hf_quant_target guarantees it). The parts name the
// tensors an Error blames (zeros_part: the scales where zeros are implicit); zero_hint ends the
// message of a zero the target cannot hold.
template <class CodeOf, class ScaleOf, class ZeroOf>
void repack_rows(QType target, uint64_t n, uint64_t k, uint64_t group, const Part& codes_part,
                 const Part& scales_part, const Part& zeros_part, std::string_view zero_hint,
                 CodeOf code_of, ScaleOf scale_of, ZeroOf zero_of, std::vector<uint8_t>& out) {
    const QTypeTraits& tr = qtype_traits(target);
    const QRowLayout l = *qtype_row_layout(target, k);
    out.clear();
    resize_for(out, n * l.row_bytes, codes_part.file, codes_part.name);
    std::vector<int32_t> codes(k);
    std::vector<QGroupParams> params(l.groups);
    const int32_t code_offset = tr.bits == 8 ? (1 << (tr.bits - 1)) : 0;  // q8 codes are signed
    for (uint64_t o = 0; o < n; ++o) {
        for (uint64_t j = 0; j < l.groups; ++j) {
            const uint64_t g = j * l.group / group;  // our group lies inside one of theirs
            QGroupParams& p = params[j];
            p.scale_bits = scale_of(g, o);
            p.scale = f16_to_f32(p.scale_bits);
            if (!std::isfinite(p.scale))
                throw Error(scales_part.file, scales_part.name,
                            "scale of group " + std::to_string(g) + ", output " +
                                std::to_string(o) + " is NaN or infinite");
            const int32_t z = zero_of(g, o);
            if (tr.symmetric) {
                const int32_t expected = tr.implicit_zero + code_offset;
                if (z != expected)
                    throw Error(zeros_part.file, zeros_part.name,
                                "group " + std::to_string(g) + ", output " + std::to_string(o) +
                                    ": zero " + std::to_string(z) + " but sym=true means " +
                                    std::to_string(expected));
                p.zero = tr.implicit_zero;
            } else {
                if (z > qtype_max_code(target))
                    throw Error(
                        zeros_part.file, zeros_part.name,
                        "group " + std::to_string(g) + ", output " + std::to_string(o) + ": zero " +
                            std::to_string(z) + " is outside " + std::string(tr.name) + "'s 0.." +
                            std::to_string(qtype_max_code(target)) + std::string(zero_hint));
                p.zero = z;
            }
        }
        for (uint64_t i = 0; i < k; ++i)
            codes[i] = static_cast<int32_t>(code_of(i, o)) - code_offset;
        pack_row(target, codes.data(), params.data(), k, out.data() + o * l.row_bytes);
    }
}

}  // namespace qforge::hf_detail
