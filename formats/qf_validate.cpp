#include "formats/qf_validate.hpp"

#include <cstring>
#include <map>

#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/qf.hpp"

namespace qforge {

namespace {

using nlohmann::json;

// Why a tensor kind exists, for "missing" and "not expected" messages.
std::string presence_reason(Presence p, const ModelConfig& c) {
    switch (p) {
        case Presence::always:
            return "the architecture '" + std::string(architecture_name(c.arch)) + "' requires it";
        case Presence::attention_bias:
            return "the config has attention_bias true";
        case Presence::untied:
            return "the config has tie_word_embeddings false";
        case Presence::qk_norm:
            return "the architecture '" + std::string(architecture_name(c.arch)) +
                   "' normalizes q and k per head";
    }
    return {};
}

// The message for a tensor the config does not call for: which rule excludes it.
std::string unexpected_reason(const std::string& name, const ModelConfig& c) {
    for (const TensorRow& row : tensor_rows(c.arch)) {
        uint64_t layer = 0;
        if (!match_tensor_pattern(row.name_pattern, name, &layer)) continue;
        if (row.name_pattern.find("{i}") != std::string_view::npos && layer >= c.num_layers)
            return "layer " + std::to_string(layer) + " but the config has num_hidden_layers " +
                   std::to_string(c.num_layers);
        if (row.presence == Presence::untied)
            return "present but the config has tie_word_embeddings true (lm_head reuses embed)";
        if (row.presence == Presence::attention_bias)
            return "present but the config has attention_bias false";
        if (row.presence == Presence::qk_norm)
            return "present but the architecture '" + std::string(architecture_name(c.arch)) +
                   "' has no q/k norms";
    }
    return "unknown tensor for architecture '" + std::string(architecture_name(c.arch)) +
           "' (not in the architecture table)";
}

// "the config's vocab_size 512 and hidden_size 64 require [512, 64]"
std::string required_shape(const TensorSpec& spec, const ModelConfig& c) {
    std::string dims;
    for (Dim d : spec.row->shape) {
        if (d == Dim::none) continue;
        dims += (dims.empty() ? "" : " and ") + describe_dim(d, c);
    }
    return "the config's " + dims + " require " + shape_to_string(spec.shape);
}

void check_tensor(const std::string& path, const TensorSpec& spec, const QfTensorInfo& t,
                  const ModelConfig& c) {
    if (t.shape != spec.shape)
        throw Error(path, t.name,
                    "shape " + shape_to_string(t.shape) + " but " + required_shape(spec, c));
    if (weight_class_info(spec.row->cls).least == LeastPrecision::float16 &&
        qtype_is_quantized(t.qtype))
        throw Error(path, t.name,
                    "stored as " + std::string(qtype_traits(t.qtype).name) +
                        ", but norms and biases must be float (f32, f16 or bf16)");
}

// An id field of the tokenizer schema, when it is an integer (its type is the schema check's).
std::optional<int64_t> id_of(const json& v) {
    if (!v.is_number_integer()) return std::nullopt;
    return v.get<int64_t>();
}

bool is_non_finite_f32(uint32_t bits) { return (bits & 0x7F800000u) == 0x7F800000u; }
bool is_non_finite_f16(uint16_t bits) { return (bits & 0x7C00u) == 0x7C00u; }
bool is_non_finite_bf16(uint16_t bits) { return (bits & 0x7F80u) == 0x7F80u; }

std::string nan_or_inf(bool nan) { return nan ? "nan" : "inf"; }

uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

}  // namespace

uint64_t check_tokenizer_fits_model(const json& tok, const ModelConfig& c,
                                    const std::string& tokenizer_file,
                                    const std::string& model_file) {
    if (!tok.is_object()) return 0;
    const bool embedded = tokenizer_file == model_file;
    const std::string tokenizer = embedded ? "the embedded tokenizer" : "the tokenizer";
    const std::string vocab =
        embedded ? "the model's vocab_size " + std::to_string(c.vocab_size)
                 : "the vocab_size " + std::to_string(c.vocab_size) + " of " + model_file;
    uint64_t pieces = 0;
    if (auto it = tok.find("pieces"); it != tok.end() && it->is_array()) pieces = it->size();
    if (pieces > c.vocab_size)
        throw Error(tokenizer_file, {},
                    tokenizer + " has " + std::to_string(pieces) + " tokens, more than " + vocab +
                        ": ids from " + std::to_string(c.vocab_size) +
                        " on have no embedding row (a tokenizer of another model?)");
    auto check = [&](const json& v, const std::string& what) {
        const auto id = id_of(v);
        if (id && (*id < 0 || static_cast<uint64_t>(*id) >= c.vocab_size))
            throw Error(
                tokenizer_file, {},
                tokenizer + "'s " + what + " " + std::to_string(*id) + " is not below " + vocab);
    };
    for (const char* key : {"bos_id", "eos_id", "unk_id"})
        if (auto it = tok.find(key); it != tok.end()) check(*it, key);
    if (auto it = tok.find("stop_ids"); it != tok.end() && it->is_array())
        for (const json& id : *it) check(id, "stop id");
    if (auto it = tok.find("added_tokens"); it != tok.end() && it->is_array())
        for (const json& a : *it)
            if (a.is_object())
                if (auto id = a.find("id"); id != a.end()) check(*id, "added token id");
    return c.vocab_size - pieces;
}

ModelConfig validate_qf_model(const std::string& path, const json& model, const json& tokenizer,
                              std::span<const QfTensorInfo> tensors) {
    const ModelConfig c = model_config_from_json(model, path);
    const std::vector<TensorSpec> specs = expected_tensors(c);
    std::map<std::string_view, const TensorSpec*> by_name;
    for (const TensorSpec& s : specs) by_name[s.name] = &s;
    std::map<std::string_view, const QfTensorInfo*> present;
    for (const QfTensorInfo& t : tensors) {
        if (!by_name.count(t.name)) throw Error(path, t.name, unexpected_reason(t.name, c));
        present[t.name] = &t;
    }
    for (const TensorSpec& s : specs) {
        auto it = present.find(s.name);
        if (it == present.end())
            throw Error(path, s.name,
                        "missing: " + presence_reason(s.row->presence, c) + ", with shape " +
                            shape_to_string(s.shape));
        check_tensor(path, s, *it->second, c);
    }
    check_tokenizer_fits_model(tokenizer, c, path, path);
    return c;
}

std::optional<std::string> find_non_finite(const QfTensorInfo& t, std::span<const uint8_t> bytes) {
    const QTypeTraits& tr = qtype_traits(t.qtype);
    const uint64_t cols = t.shape.empty() ? 1 : t.shape.back();
    if (tr.is_float) {
        const uint64_t size = dtype_info(tr.dtype).size, n = bytes.size() / size;
        for (uint64_t i = 0; i < n; ++i) {
            const uint8_t* p = bytes.data() + i * size;
            bool bad = false, nan = false;
            if (tr.dtype == DType::f32) {
                uint32_t v;
                std::memcpy(&v, p, sizeof v);
                bad = is_non_finite_f32(v);
                nan = (v & 0x007FFFFFu) != 0;
            } else if (tr.dtype == DType::f16) {
                bad = is_non_finite_f16(load_u16(p));
                nan = (load_u16(p) & 0x03FFu) != 0;
            } else {
                bad = is_non_finite_bf16(load_u16(p));
                nan = (load_u16(p) & 0x007Fu) != 0;
            }
            if (!bad) continue;
            std::string where = "element " + std::to_string(i);
            if (t.shape.size() == 2)
                where += " (row " + std::to_string(i / cols) + ", column " +
                         std::to_string(i % cols) + ")";
            return where + " is " + nan_or_inf(nan);
        }
        return std::nullopt;
    }
    // Packed rows: the codes are integers; only the fp16 scales can be non-finite.
    const auto layout = qtype_row_layout(t.qtype, cols);
    if (!layout || t.shape.size() != 2) return std::nullopt;
    for (uint64_t r = 0; r < t.shape[0]; ++r) {
        const uint8_t* scales = bytes.data() + r * layout->row_bytes + layout->scales_offset;
        // Super-block types: each record's fp16 d and dmin (the 6-bit values are integers).
        for (uint64_t g = 0; qtype_has_super_blocks(t.qtype) && g < layout->groups; g += 8) {
            for (uint64_t which = 0; which < 2; ++which) {
                const uint16_t s = load_u16(scales + sizeof(QSuperRecord) * (g / 8) + 2 * which);
                if (is_non_finite_f16(s))
                    return "row " + std::to_string(r) + ", super-block " + std::to_string(g / 8) +
                           ": " + (which ? "dmin" : "d") + " is " + nan_or_inf((s & 0x03FFu) != 0);
            }
        }
        for (uint64_t g = 0; !qtype_has_super_blocks(t.qtype) && g < layout->groups; ++g) {
            const uint16_t s = load_u16(scales + 2 * g);
            if (is_non_finite_f16(s))
                return "row " + std::to_string(r) + ", group " + std::to_string(g) +
                       ": the scale is " + nan_or_inf((s & 0x03FFu) != 0);
        }
    }
    return std::nullopt;
}

}  // namespace qforge
