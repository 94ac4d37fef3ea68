#include "convert/hf_export.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "convert/compressed_tensors_export.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/output_path.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "tokenizer/hf_writer.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Tensors of a block start with this prefix in our naming (formats/architectures.cpp).
constexpr std::string_view kBlockPrefix = "layers.";

using namespace hf_export_detail;

std::string hf_base(const std::string& hf_weight_name) {
    return hf_weight_name.substr(0, hf_weight_name.size() - std::string_view(".weight").size());
}

// One quantized linear [n, k] of type t (rows in `rows`) as GPTQ v1 or AWQ GEMM parts.
std::vector<Packed> pack_linear(HfQuantMethod format, bool v2, QType t, const std::string& file,
                                const std::string& tensor, const std::string& hf_weight_name,
                                std::span<const uint8_t> rows, uint64_t n, uint64_t k,
                                const std::vector<uint32_t>& perm) {
    // Stored column j holds input perm[j] (act-order); g_idx says so below.
    auto input = [&](uint64_t j) -> uint64_t { return perm.empty() ? j : perm[j]; };
    const QTypeTraits& tr = qtype_traits(t);
    const QRowLayout l = *qtype_row_layout(t, k);
    const bool gptq = format == HfQuantMethod::gptq;
    const uint32_t bits = tr.bits, per_word = 32 / bits, mask = (1u << bits) - 1;
    const int32_t code_offset = tr.signed_codes ? 1 << (bits - 1) : 0;  // int8 -> 0 .. 255
    const uint64_t in_words = gptq ? per_word : 1;
    if (k % in_words != 0 || n % per_word != 0)
        throw Error(file, tensor,
                    "shape [" + std::to_string(n) + ", " + std::to_string(k) +
                        "] does not pack into whole " + std::to_string(per_word) + "-code words (" +
                        std::string(hf_quant_method_name(format)) + " packs codes along " +
                        (gptq ? "the input and zeros along the output" : "the output") + ")");
    const std::string base = hf_base(hf_weight_name);
    const uint64_t groups = l.groups, zero_words = n / per_word;
    Packed qweight{
        base + ".qweight", DType::i32,
        gptq ? std::vector<uint64_t>{k / per_word, n} : std::vector<uint64_t>{k, n / per_word},
        std::vector<uint8_t>(4 * k * n / per_word, 0)};
    Packed qzeros{base + ".qzeros",
                  DType::i32,
                  {groups, zero_words},
                  std::vector<uint8_t>(4 * groups * zero_words, 0)};
    Packed scales{
        base + ".scales", DType::f16, {groups, n}, std::vector<uint8_t>(2 * groups * n, 0)};

    for (uint64_t o = 0; o < n; ++o) {
        const uint8_t* row = rows.data() + o * l.row_bytes;
        for (uint64_t j = 0; j < k; ++j) {
            const auto code = static_cast<uint32_t>(row_code(t, row, j) + code_offset);
            const uint64_t i = input(j);
            if (gptq)
                or_bits(qweight.bytes, i / per_word * n + o, code,
                        bits * static_cast<uint32_t>(i % per_word));
            else
                or_bits(qweight.bytes, i * (n / 8) + o / 8, code, 4 * kAwqNibble[o % 8]);
        }
        for (uint64_t g = 0; g < groups; ++g) {
            std::memcpy(&scales.bytes[2 * (g * n + o)], row + l.scales_offset + 2 * g, 2);
            const int32_t zero = row_group_zero(t, row, k, g) + code_offset;
            if (gptq && v2) {
                or_bits(qzeros.bytes, g * zero_words + o / per_word, static_cast<uint32_t>(zero),
                        bits * static_cast<uint32_t>(o % per_word));
            } else if (gptq) {
                // v1 stores zero - 1; a zero of 0 would wrap to 2^bits - 1 and read back as 2^bits.
                if (zero == 0)
                    throw Error(file, tensor,
                                "row " + std::to_string(o) + ", group " + std::to_string(g) +
                                    ": zero point 0 cannot be written to GPTQ v1 (it stores "
                                    "zero - 1, so 0 reads back as " +
                                    std::to_string(1 << bits) +
                                    "); export --format gptq_v2 or awq instead");
                or_bits(qzeros.bytes, g * zero_words + o / per_word,
                        static_cast<uint32_t>(zero - 1) & mask,
                        bits * static_cast<uint32_t>(o % per_word));
            } else {
                or_bits(qzeros.bytes, g * zero_words + o / 8, static_cast<uint32_t>(zero),
                        4 * kAwqNibble[o % 8]);
            }
        }
    }
    std::vector<Packed> parts;
    parts.push_back(std::move(qweight));
    parts.push_back(std::move(qzeros));
    parts.push_back(std::move(scales));
    if (gptq) {
        Packed g_idx{base + ".g_idx", DType::i32, {k}, std::vector<uint8_t>(4 * k)};
        for (uint64_t j = 0; j < k; ++j)
            put_word(g_idx.bytes, input(j), static_cast<uint32_t>(j / l.group));
        parts.push_back(std::move(g_idx));
    }
    return parts;
}

// A float tensor as stored, or a quantized one dequantized to F32 (exact).
Packed float_tensor(const QfTensorInfo& t, const std::string& hf_name,
                    std::span<const uint8_t> bytes) {
    const QTypeTraits& tr = qtype_traits(t.qtype);
    if (tr.is_float) return {hf_name, tr.dtype, t.shape, {bytes.begin(), bytes.end()}};
    const uint64_t n = t.shape[0], k = t.shape[1];
    const uint64_t row_bytes = *qtype_row_bytes(t.qtype, k);
    Packed p{hf_name, DType::f32, t.shape, std::vector<uint8_t>(4 * n * k)};
    std::vector<float> row(k);
    for (uint64_t o = 0; o < n; ++o) {
        dequantize_row_ref(t.qtype, bytes.data() + o * row_bytes, k, row.data());
        std::memcpy(&p.bytes[4 * o * k], row.data(), 4 * k);
    }
    return p;
}

// Gemma's stored norm multiplier 1 + w back to the w its checkpoints hold, in float32.
Packed norm_minus_one(const QfTensorInfo& t, const std::string& hf_name,
                      std::span<const uint8_t> bytes) {
    std::vector<float> w(t.shape.at(0));
    dequantize_row_ref(t.qtype, bytes.data(), w.size(), w.data());
    Packed p{hf_name, DType::f32, t.shape, std::vector<uint8_t>(4 * w.size())};
    for (float& v : w) v -= 1.0f;
    std::memcpy(p.bytes.data(), w.data(), p.bytes.size());
    return p;
}

// config.json as transformers writes it for this family; parse_model_config reads it back to
// the same ModelConfig.
json hf_config_json(const ModelConfig& c) {
    json j = model_dims_to_json(c);
    j.update(
        json{{"architectures", {architecture_hf_class(c.arch)}},
             {"hidden_act", architecture_features(c.arch).gelu_tanh ? "gelu_pytorch_tanh" : "silu"},
             {"use_cache", true},
             {"torch_dtype", c.torch_dtype.empty() ? "float16" : c.torch_dtype}});
    const RopeScaling& s = c.rope_scaling;
    if (s.type == "none")
        j["rope_scaling"] = nullptr;
    else
        j["rope_scaling"] = {
            {"rope_type", s.type},
            {"factor", s.factor},
            {"low_freq_factor", s.low_freq_factor},
            {"high_freq_factor", s.high_freq_factor},
            {"original_max_position_embeddings", s.original_max_position_embeddings}};
    j.update(hf_architecture_keys(c));
    j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
    if (c.eos_token_ids.size() == 1)
        j["eos_token_id"] = c.eos_token_ids.front();
    else
        j["eos_token_id"] = c.eos_token_ids;
    return j;
}

json quantization_config_json(HfQuantMethod format, bool v2, QType t,
                              const std::vector<std::string>& not_converted) {
    const QTypeTraits& tr = qtype_traits(t);
    const int64_t group = tr.group == 0 ? -1 : static_cast<int64_t>(tr.group);
    if (format == HfQuantMethod::gptq)
        // desc_act false and g_idx = i / group: our groups are contiguous. damp_percent and
        // true_sequential describe how GPTQ quantizes; loaders read them but do not use them.
        return {{"quant_method", "gptq"}, {"bits", tr.bits},
                {"group_size", group},    {"desc_act", false},
                {"sym", tr.symmetric},    {"checkpoint_format", v2 ? "gptq_v2" : "gptq"},
                {"static_groups", false}, {"true_sequential", true},
                {"damp_percent", 0.01}};
    return {
        {"quant_method", "awq"},
        {"bits", tr.bits},
        {"group_size", group},
        {"zero_point", true},
        {"version", "gemm"},
        {"modules_to_not_convert", not_converted.empty() ? json(nullptr) : json(not_converted)}};
}

void write_json(const fs::path& p, const json& j) {
    AtomicFile f(p.string());
    const std::string text = j.dump(2) + "\n";
    f.write(text.data(), text.size());
    f.commit();
}

// The single type every quantized linear of the blocks shares, checked against what `format`
// can express.
QType common_linear_type(const QfFile& qf, HfQuantMethod format) {
    std::optional<QType> common;
    std::string first;
    for (const QfTensorInfo& t : qf.tensors()) {
        if (!t.name.starts_with(kBlockPrefix) || !qtype_is_quantized(t.qtype)) continue;
        const QTypeTraits& tr = qtype_traits(t.qtype);
        const std::string what = "type " + std::string(tr.name) + " cannot be exported to " +
                                 std::string(hf_quant_method_name(format)) + ": ";
        if (format == HfQuantMethod::compressed_tensors) {
            if (const std::string why = compressed_tensors_refusal(t.qtype); !why.empty())
                throw Error(qf.path(), t.name, why);
        } else if (tr.super_block) {
            throw Error(qf.path(), t.name,
                        what +
                            "GPTQ and AWQ store an fp16 scale and an integer zero per group, "
                            "not 6-bit scales and mins against a super-scale");
        } else if (tr.nonuniform) {
            throw Error(qf.path(), t.name,
                        what +
                            "GPTQ and AWQ codes are uniform integers, not indices into a "
                            "non-uniform table of levels");
        } else if (tr.bits == 3) {
            throw Error(qf.path(), t.name,
                        what + "GPTQ and AWQ loaders have no 3-bit layout qforge can write");
        }
        if (!t.col_perm.empty() && format != HfQuantMethod::gptq)
            throw Error(qf.path(), t.name,
                        "has a column permutation (an act-order GPTQ import): only GPTQ stores "
                        "one (as g_idx); export --format gptq");
        if (format == HfQuantMethod::awq && (tr.bits != 4 || tr.symmetric))
            throw Error(qf.path(), t.name,
                        what + "AWQ holds 4-bit asymmetric groups (q4_g32/g64/g128) only");
        if (!common) {
            common = t.qtype;
            first = t.name;
        } else if (*common != t.qtype) {
            const QTypeTraits& c = qtype_traits(*common);
            const std::string why = c.bits != tr.bits     ? "bits"
                                    : c.group != tr.group ? "group sizes"
                                                          : "sym/asym";
            throw Error(qf.path(), t.name,
                        "type " + std::string(tr.name) + " differs from '" + first + "' (" +
                            std::string(c.name) + "): mixed " + why +
                            " cannot be exported, since one quantization_config holds one "
                            "bits, group_size and sym");
        }
    }
    if (!common)
        throw Error(qf.path(), {}, "no quantized linear to export: quantize the model first");
    return *common;
}

}  // namespace

ExportReport export_hf_quantized(const ExportOptions& o) {
    // Checked before any work: the directory is new or empty, its parent exists (export never
    // creates parents, so a failure has none of its own to remove), and it is not the input.
    check_output_path(o.output_dir, {o.input}, OutputKind::directory);
    const QfFile qf(o.input);
    const ModelConfig& config = qf.config();
    if (architecture_has_fused_tensors(config.arch))
        throw Error(qf.path(), {},
                    "export of a " + std::string(architecture_name(config.arch)) +
                        " model is not supported: its checkpoints fuse q/k/v and gate/up "
                        "(qkv_proj, gate_up_proj), which the GPTQ/AWQ writers do not pack yet");
    if (qf.has_tokenizer()) validate_tokenizer_schema(qf.tokenizer(), qf.path());
    const QType qtype = common_linear_type(qf, o.format);
    const bool ct = o.format == HfQuantMethod::compressed_tensors;
    ExportReport report;
    report.quant_type = std::string(qtype_traits(qtype).name);

    // Every file goes into a temporary directory beside the output that only commit() turns into
    // it; on an error or a signal it is removed with its contents.
    AtomicDirectory tmp(o.output_dir);
    const fs::path tmp_dir = tmp.temp_path();
    // A write error names the file under the output directory, never the temporary one.
    auto write_in_tmp = [&](const std::string& name, const auto& write) {
        try {
            write((tmp_dir / name).string());
        } catch (const Error& e) {
            if (e.file() != (tmp_dir / name).string()) throw;
            throw e.with_file((fs::path(tmp.final_path()) / name).string());
        }
    };

    std::map<std::string, std::string> hf_of;  // our name -> HF name
    for (const TensorSpec& s : expected_tensors(config)) hf_of[s.name] = s.hf_name;

    // Plan: every output tensor's source and size, then shards by cumulative size.
    struct Item {
        const QfTensorInfo* t;
        bool quantized_linear;
        uint64_t bytes;
    };
    std::vector<Item> items;
    std::vector<std::string> not_converted;
    std::map<std::string, std::set<std::string>> quantized_in_block;  // "layers.3." -> names
    for (const QfTensorInfo& t : qf.tensors()) {
        auto it = hf_of.find(t.name);
        if (it == hf_of.end()) throw Error(qf.path(), t.name, "not a tensor of this architecture");
        const bool block = t.name.starts_with(kBlockPrefix);
        const bool linear = block && t.shape.size() == 2;
        const bool quantized = qtype_is_quantized(t.qtype);
        if (linear && !quantized) not_converted.push_back(hf_base(it->second));
        if (linear) {
            // "layers.3.attn.q" -> "layers.3."; its HF name
            // "model.layers.3.self_attn.q_proj.weight"
            // -> "self_attn.q_proj". A block whose linears are all float gets an empty set.
            const size_t dot = t.name.find('.', kBlockPrefix.size());
            const std::string layer = t.name.substr(0, dot + 1);
            const std::string base = hf_base(it->second);
            auto& names = quantized_in_block[layer];
            if (quantized) names.insert(base.substr(base.find(layer) + layer.size()));
        }
        if (!block && t.shape.size() == 2 && quantized)
            report.warnings.push_back(t.name + " (" + std::string(qtype_traits(t.qtype).name) +
                                      ") is written dequantized as F32 (exact): Hugging Face " +
                                      std::string(hf_quant_method_name(o.format)) +
                                      " keeps it float");
        uint64_t bytes = 0;
        if (linear && quantized && ct) {
            bytes = 0;  // sized below, once the exported group is known
        } else if (linear && quantized) {
            const uint64_t n = t.shape[0], k = t.shape[1],
                           groups = qtype_row_layout(t.qtype, k)->groups;
            const uint32_t per_word = 32 / qtype_traits(t.qtype).bits;
            bytes = k * n / per_word * 4 + groups * (n / per_word) * 4 + groups * n * 2 +
                    (o.format == HfQuantMethod::gptq ? 4 * k : 0);
        } else {
            bytes = quantized ? 4 * t.shape[0] * t.shape[1] : t.length;
        }
        items.push_back({&t, linear && quantized, bytes});
    }

    // compressed-tensors: one group size for every linear, whole within each k.
    uint64_t ct_group = 0;
    if (ct) {
        std::vector<uint64_t> ks;
        std::vector<std::string> names;
        for (const Item& item : items)
            if (item.quantized_linear) {
                ks.push_back(item.t->shape[1]);
                names.push_back(item.t->name);
            }
        ct_group = compressed_tensors_group(qtype, ks, names, qf.path());
        for (Item& item : items)
            if (item.quantized_linear)
                item.bytes = compressed_tensors_linear_bytes(qtype, item.t->shape[0],
                                                             item.t->shape[1], ct_group);
    }

    // GPTQ names the quantized linears of a block (the same in every block) instead of the float
    // ones: modules_in_block_to_quantize.
    json in_block = nullptr;
    if (o.format == HfQuantMethod::gptq && !not_converted.empty()) {
        const auto& [first_layer, names] = *quantized_in_block.begin();
        for (const auto& [layer, other] : quantized_in_block)
            if (other != names)
                throw Error(qf.path(), layer + "*",
                            "quantizes other linears than " + first_layer +
                                "*: GPTQ's modules_in_block_to_quantize is one list for every "
                                "block; export --format awq (modules_to_not_convert) instead");
        in_block = json::array({json(std::vector<std::string>(names.begin(), names.end()))});
    }

    std::vector<std::vector<const Item*>> shards(1);
    uint64_t in_shard = 0;
    for (const Item& item : items) {
        if (in_shard > 0 && in_shard + item.bytes > o.max_shard_bytes) {
            shards.emplace_back();
            in_shard = 0;
        }
        shards.back().push_back(&item);
        in_shard += item.bytes;
    }
    const bool sharded = shards.size() > 1;
    json weight_map = json::object();
    std::vector<uint8_t> scratch;
    for (size_t s = 0; s < shards.size(); ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
        const std::string file = sharded ? name : "model.safetensors";
        std::vector<Packed> packed;
        for (const Item* item : shards[s]) {
            const QfTensorInfo& t = *item->t;
            const std::span<const uint8_t> bytes = qf.tensor_bytes(t, scratch, true);
            const std::string& hf_name = hf_of.at(t.name);
            if (item->quantized_linear && ct) {
                for (Packed& p : pack_compressed_tensors_linear(t.qtype, ct_group, hf_name, bytes,
                                                                t.shape[0], t.shape[1]))
                    packed.push_back(std::move(p));
            } else if (item->quantized_linear) {
                for (Packed& p : pack_linear(o.format, o.gptq_v2, t.qtype, qf.path(), t.name,
                                             hf_name, bytes, t.shape[0], t.shape[1], t.col_perm))
                    packed.push_back(std::move(p));
            } else {
                packed.push_back(float_tensor(t, hf_name, bytes));
                const TensorRow* row = find_tensor_row(t.name);
                if (hf_norms_plus_one(qf.config().arch) && row && row->cls == WeightClass::norm)
                    packed.back() = norm_minus_one(t, hf_name, bytes);
            }
            qf.release(t);
        }
        std::vector<TensorView> views;
        for (const Packed& p : packed) {
            views.push_back({p.name, p.dtype, p.shape, p.bytes});
            weight_map[p.name] = file;
            report.bytes += p.bytes.size();
        }
        report.tensors += packed.size();
        write_in_tmp(file, [&](const std::string& path) {
            write_safetensors(path, views, {{"format", "pt"}});
        });
        report.files.push_back(file);
    }
    if (sharded) {
        write_in_tmp("model.safetensors.index.json", [&](const std::string& path) {
            write_json(path,
                       {{"metadata", {{"total_size", report.bytes}}}, {"weight_map", weight_map}});
        });
        report.files.push_back("model.safetensors.index.json");
    }

    json cfg = hf_config_json(config);
    if (ct) {
        // lm_head is a Linear the scheme would target: it is written float, so it is ignored
        // with the blocks' float linears. The scales are binary16: a bfloat16 model would round
        // them on load (vLLM copies them into parameters of the model's dtype), so the model is
        // declared float16.
        not_converted.insert(not_converted.begin(), "lm_head");
        cfg["torch_dtype"] = "float16";
        cfg["quantization_config"] = compressed_tensors_config_json(qtype, ct_group, not_converted);
    } else {
        cfg["quantization_config"] =
            quantization_config_json(o.format, o.gptq_v2, qtype, not_converted);
    }
    if (!in_block.is_null()) cfg["quantization_config"]["modules_in_block_to_quantize"] = in_block;
    write_in_tmp("config.json", [&](const std::string& path) { write_json(path, cfg); });
    report.files.push_back("config.json");
    if (!qf.has_tokenizer()) {
        report.warnings.push_back("the .qf has no tokenizer: no tokenizer files written");
    } else if (qf.tokenizer().value("model", nlohmann::json()) == "llama2c") {
        report.warnings.push_back(
            "the llama2.c tokenizer (run.c's score-ordered merges) has no tokenizer.json form: no "
            "tokenizer files written");
    } else {
        const HfTokenizerFiles tok = hf_tokenizer_files(qf.tokenizer(), qf.path());
        for (const auto& [name, j] :
             {std::pair{"tokenizer.json", &tok.tokenizer},
              std::pair{"tokenizer_config.json", &tok.tokenizer_config},
              std::pair{"generation_config.json", &tok.generation_config}}) {
            const nlohmann::json* value = j;  // clang before 16 cannot capture a structured binding
            write_in_tmp(name, [&](const std::string& path) { write_json(path, *value); });
            report.files.push_back(name);
        }
    }

    tmp.commit();
    std::sort(report.files.begin(), report.files.end());
    return report;
}

}  // namespace qforge
