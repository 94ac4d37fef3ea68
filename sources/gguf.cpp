#include "sources/gguf.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "core/alloc.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/gguf_dequant.hpp"
#include "sources/gguf_keep_quant.hpp"
#include "sources/source_common.hpp"
#include "sources/source_kinds.hpp"
#include "tokenizer/source_gguf.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr GgufArchitecture kGgufArchitectures[] = {
    // Llama 1-3, Mistral 7B, TinyLlama, SmolLM/SmolLM2: llama.cpp converts all as "llama".
    {"llama", Architecture::llama, true},
    // Qwen2 and Qwen2.5: rotate-half RoPE (LLAMA_ROPE_TYPE_NEOX), q/k/v biases.
    {"qwen2", Architecture::qwen2, false},
    // Qwen3: as qwen2 without biases (unless the file has them), with attn_q_norm / attn_k_norm
    // and attention.key_length giving head_dim (LLM_ARCH_QWEN3).
    {"qwen3", Architecture::qwen3, false},
    // Gemma 2 and 3 (LLM_ARCH_GEMMA2, LLM_ARCH_GEMMA3): rotate-half RoPE, sandwich norms, norm
    // weights stored as 1 + w (convert_hf_to_gguf.py adds the 1), which is our stored form too.
    {"gemma2", Architecture::gemma2, false},
    {"gemma3", Architecture::gemma3, false},
    // Phi-3 (LLM_ARCH_PHI3): rotate-half RoPE, q/k/v fused in attn_qkv and gate/up in ffn_up
    // (formats/architectures.cpp, kFusedParts), split by rows at conversion as from Hugging Face.
    {"phi3", Architecture::phi3, false},
};

// What llama.cpp hard-codes for Gemma instead of reading it from the GGUF (its converter writes
// no key for these), with the Hugging Face config values they stand for. Sources: llama.cpp
// src/llama-model.cpp, llm_load_hparams (LLM_ARCH_GEMMA2: n_swa_pattern = 2, the default n_swa
// 4096, f_attention_scale; LLM_ARCH_GEMMA3: set_swa_pattern(6), rope_freq_base_train_swa =
// 10000, rope_freq_scale_train_swa = 1, f_attention_scale), and transformers' Gemma2Config /
// Gemma3TextConfig defaults (layer_types from (i + 1) % 2 and sliding_window_pattern 6,
// sliding_window 4096, rope_local_base_freq 10000, query_pre_attn_scalar).
struct GemmaGgufDefaults {
    Architecture arch;
    uint64_t window_pattern;  // every P-th layer full, the others sliding
    uint64_t sliding_window;  // when attention.sliding_window is absent (0: required)
    double local_rope_theta;  // the sliding layers' RoPE base, unscaled (0: as the full layers)
    // The query scale is head_dim^-1/2 (query_pre_attn_scalar = head_dim: 2B/9B, gemma3 270M to
    // 12B) except in the 27B models, recognised by their layer count as llama.cpp does, whose
    // query_pre_attn_scalar is hidden_size / num_attention_heads (144; 168).
    uint64_t layers_27b;
};
constexpr GemmaGgufDefaults kGemmaGgufDefaults[] = {
    {Architecture::gemma2, 2, 4096, 0.0, 46},
    {Architecture::gemma3, 6, 0, 10000.0, 62},
};

// llama.cpp's name of one of our tensor kinds (formats/architectures.cpp's table), in layer 0
// for per-layer kinds.
std::string gguf_name(Architecture arch, TensorKind kind) {
    for (const TensorRow& row : tensor_rows(arch))
        if (row.kind == kind) return tensor_name_for_layer(row.gguf_pattern, 0);
    throw std::logic_error("architecture table: no row for a tensor kind");
}

// Dimensions and counts must fit an int32, as for config.json (formats/model_config.cpp).
constexpr uint64_t kMaxDim = (uint64_t{1} << 31) - 1;
constexpr double kDefaultRopeTheta = 10000.0;  // llama.cpp's default rope.freq_base

// GGUF stores float metadata as float32: 1e-05 from a config.json arrives as 9.99999975e-06.
// The shortest decimal that reads back to the same float32 is what the writer started from, so
// the config gets the value a Hugging Face conversion of the same model would hold.
double shortest_decimal(double stored) {
    const auto f = static_cast<float>(stored);
    char buf[32];
    for (int digits = 1; digits <= 9; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
        if (std::strtof(buf, nullptr) == f) break;
    }
    return std::strtod(buf, nullptr);
}

const GgufArchitecture& gguf_architecture(const GgufFile& f) {
    const std::string* name = f.get_string("general.architecture");
    if (!name) throw Error(f.path(), {}, "metadata key 'general.architecture' is absent");
    std::string supported;
    for (const auto& a : kGgufArchitectures) {
        if (a.name == *name) return a;
        supported += (supported.empty() ? "" : ", ") + std::string(a.name);
    }
    throw Error(f.path(), {},
                "GGUF architecture '" + gguf_excerpt(*name) +
                    "' is not supported (supported: " + supported + ")");
}

// Typed metadata of one architecture ("llama.embedding_length", ...), checked against the
// ranges the runtime allows, with the GGUF key in every message.
class ArchKeys {
  public:
    ArchKeys(const GgufFile& f, std::string_view arch) : f_(f), prefix_(std::string(arch) + ".") {}

    std::string key(std::string_view k) const { return prefix_ + std::string(k); }
    std::optional<uint64_t> opt_dim(std::string_view k) const {
        const auto v = f_.get_uint(key(k));
        if (v && (*v < 1 || *v > kMaxDim))
            throw Error(f_.path(), {},
                        "metadata key '" + key(k) + "' is " + std::to_string(*v) +
                            ", expected 1 to " + std::to_string(kMaxDim));
        return v;
    }
    uint64_t dim(std::string_view k) const {
        const auto v = opt_dim(k);
        if (!v) throw Error(f_.path(), {}, "metadata key '" + key(k) + "' is absent");
        return *v;
    }
    std::optional<double> opt_float(std::string_view k) const { return f_.get_float(key(k)); }

  private:
    const GgufFile& f_;
    std::string prefix_;
};

}  // namespace

std::span<const GgufArchitecture> gguf_architectures() { return kGgufArchitectures; }

const GgufArchitecture* gguf_architecture_of(Architecture arch) {
    for (const auto& a : kGgufArchitectures)
        if (a.arch == arch) return &a;
    return nullptr;
}

bool is_gguf_file(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return false;
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {};
    in.read(magic, 4);
    return in.gcount() == 4 && std::memcmp(magic, kGgufMagic, 4) == 0;
}

namespace {
// Gemma's attention and window from the metadata and kGemmaGgufDefaults.
void gemma_config(const GgufFile& f, const ArchKeys& keys, const GemmaGgufDefaults& g,
                  ModelConfig& c) {
    const auto window = keys.opt_dim("attention.sliding_window");
    if (!window && g.sliding_window == 0)
        throw Error(f.path(), {},
                    "metadata key '" + keys.key("attention.sliding_window") + "' is absent");
    c.sliding_window = window.value_or(g.sliding_window);
    c.sliding_window_pattern = c.num_layers >= g.window_pattern ? g.window_pattern : 0;
    c.rope_local_theta = g.local_rope_theta;
    c.query_pre_attn_scalar = c.num_layers == g.layers_27b
                                  ? static_cast<double>(c.hidden_size / c.num_heads)
                                  : static_cast<double>(c.head_dim);
    auto cap = [&](std::string_view key) {
        const auto v = keys.opt_float(key);
        return v ? shortest_decimal(*v) : 0.0;
    };
    // llama.cpp applies attention soft-capping for gemma2 only.
    if (c.arch == Architecture::gemma2) c.attn_logit_softcapping = cap("attn_logit_softcapping");
    c.final_logit_softcapping = cap("final_logit_softcapping");
}
}  // namespace

std::string gguf_gemma_mismatch(const ModelConfig& c) {
    for (const GemmaGgufDefaults& g : kGemmaGgufDefaults) {
        if (g.arch != c.arch) continue;
        const uint64_t pattern = c.num_layers >= g.window_pattern ? g.window_pattern : 0;
        const double scalar = c.num_layers == g.layers_27b
                                  ? static_cast<double>(c.hidden_size / c.num_heads)
                                  : static_cast<double>(c.head_dim);
        if (!c.sliding_window) return "no sliding window (llama.cpp windows every Gemma model)";
        if (c.sliding_window_pattern != pattern)
            return "sliding_window_pattern " + std::to_string(c.sliding_window_pattern) +
                   " (llama.cpp: " + std::to_string(pattern) + ")";
        if (c.rope_local_theta != g.local_rope_theta)
            return "local RoPE base " + std::to_string(c.rope_local_theta) +
                   " (llama.cpp: " + std::to_string(g.local_rope_theta) + ")";
        if (c.query_pre_attn_scalar != scalar)
            return "query_pre_attn_scalar " + std::to_string(c.query_pre_attn_scalar) +
                   " (llama.cpp derives " + std::to_string(scalar) + ")";
        if (c.arch == Architecture::gemma3 && c.attn_logit_softcapping > 0.0)
            return "attention soft-capping (llama.cpp's gemma3 has none)";
    }
    return {};
}

ModelConfig gguf_model_config(const GgufFile& f) {
    const GgufArchitecture& a = gguf_architecture(f);
    const ArchKeys keys(f, a.name);
    const std::string& file = f.path();
    ModelConfig c;
    c.arch = a.arch;
    c.hidden_size = keys.dim("embedding_length");
    c.intermediate_size = keys.dim("feed_forward_length");
    c.num_layers = keys.dim("block_count");
    c.num_heads = keys.dim("attention.head_count");
    c.num_kv_heads = keys.opt_dim("attention.head_count_kv").value_or(c.num_heads);
    c.max_position_embeddings = keys.dim("context_length");
    if (const auto head_dim = keys.opt_dim("attention.key_length")) {
        c.head_dim = *head_dim;
    } else {
        if (c.hidden_size % c.num_heads != 0)
            throw Error(file, {},
                        keys.key("embedding_length") + " (" + std::to_string(c.hidden_size) +
                            ") is not a multiple of " + keys.key("attention.head_count") + " (" +
                            std::to_string(c.num_heads) + ") and attention.key_length is absent");
        c.head_dim = c.hidden_size / c.num_heads;
    }
    if (const auto v = keys.opt_dim("attention.value_length"); v && *v != c.head_dim)
        throw Error(file, {},
                    keys.key("attention.value_length") + " (" + std::to_string(*v) +
                        ") differs from the key length (" + std::to_string(c.head_dim) +
                        "): not supported");
    if (const auto rot = keys.opt_dim("rope.dimension_count"); rot && *rot != c.head_dim)
        throw Error(file, {},
                    keys.key("rope.dimension_count") + " (" + std::to_string(*rot) +
                        ") is not the head dimension (" + std::to_string(c.head_dim) +
                        "): partial rotary embeddings are not supported");
    // gemma3's global layers (the 4B+ models) scale linearly: rope.scaling.type "linear" with
    // rope.scaling.factor (convert_hf_to_gguf.py Gemma3Model).
    const bool linear_ok = a.arch == Architecture::gemma3;
    if (const std::string* scaling = f.get_string(keys.key("rope.scaling.type"));
        scaling && *scaling != "none") {
        const auto factor = keys.opt_float("rope.scaling.factor");
        if (*scaling != "linear" || !linear_ok || !factor)
            throw Error(file, {},
                        "RoPE scaling '" + gguf_excerpt(*scaling) + "' (" +
                            keys.key("rope.scaling.type") + ") is not supported" +
                            (linear_ok ? " (supported: linear with rope.scaling.factor)" : ""));
        c.rope_scaling.type = "linear";
        c.rope_scaling.factor = shortest_decimal(*factor);
    }
    if (const auto factor = keys.opt_float("rope.scale_linear"); factor && *factor != 1.0)
        throw Error(file, {},
                    "linear RoPE scaling (" + keys.key("rope.scale_linear") + ") is not supported");
    if (f.find_tensor("rope_freqs.weight"))  // llama.cpp's name; no tensor of ours
        throw Error(file, "rope_freqs.weight",
                    "per-frequency RoPE factors (Llama 3.1-style scaling as llama.cpp stores it) "
                    "are not supported");
    // Phi-3's 128k models: convert_hf_to_gguf.py writes longrope / su scaling as these.
    for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"})
        if (f.find_tensor(name))
            throw Error(file, name,
                        "Phi-3's longrope / su RoPE scaling (per-frequency long and short "
                        "factors) is not supported");
    const auto eps = keys.opt_float("attention.layer_norm_rms_epsilon");
    if (!eps)
        throw Error(
            file, {},
            "metadata key '" + keys.key("attention.layer_norm_rms_epsilon") + "' is absent");
    c.rms_norm_eps = shortest_decimal(*eps);
    c.rope_theta = shortest_decimal(keys.opt_float("rope.freq_base").value_or(kDefaultRopeTheta));

    // The vocabulary: the embedding's rows, which the metadata must agree with.
    const std::string embed_name = gguf_name(a.arch, TensorKind::embed);
    const GgufTensorInfo* embed = f.find_tensor(embed_name);
    if (!embed || embed->ne.size() != 2) throw Error(file, embed_name, "missing, or not a matrix");
    c.vocab_size = embed->ne[1];
    if (const auto v = keys.opt_dim("vocab_size"); v && *v != c.vocab_size)
        throw Error(file, {},
                    keys.key("vocab_size") + " (" + std::to_string(*v) + ") differs from " +
                        embed_name + "'s " + std::to_string(c.vocab_size) + " rows");
    c.tie_word_embeddings = f.find_tensor(gguf_name(a.arch, TensorKind::lm_head)) == nullptr;
    c.attention_bias = a.arch == Architecture::qwen2 ||
                       f.find_tensor(gguf_name(a.arch, TensorKind::attn_q_bias)) != nullptr;
    if (const auto bos = f.get_uint("tokenizer.ggml.bos_token_id"))
        c.bos_token_id = static_cast<int64_t>(*bos);
    if (const auto eos = f.get_uint("tokenizer.ggml.eos_token_id"))
        c.eos_token_ids = {static_cast<int64_t>(*eos)};
    c.torch_dtype = "";  // GGUF declares no Hugging Face dtype
    for (const GemmaGgufDefaults& g : kGemmaGgufDefaults)
        if (g.arch == c.arch) gemma_config(f, keys, g, c);
    // Phi-3: every layer windowed when attention.sliding_window is above 0 (the converter
    // writes 0 for a config without one: Phi-4), as Phi3Config's sliding_window.
    if (c.arch == Architecture::phi3)
        if (const auto window = f.get_uint(keys.key("attention.sliding_window")); window && *window)
            c.sliding_window = keys.dim("attention.sliding_window");
    // The cross-field checks every config gets (heads, RoPE, eps), through the normalized form.
    return model_config_from_json(model_config_to_json(c), file);
}

namespace {

// A GGUF file as a source: every tensor renamed to ours, dequantized to f32 (or, with
// keep_quant, kept as rows of our q8_g32 / q4s_g32 and as F16/BF16 bits) and, for adjacent-pair
// RoPE architectures, its q and k rows reordered back to the Hugging Face layout.
class GgufSource final : public ModelSource {
  public:
    GgufSource(const std::string& path, const SourceOptions& options)
        : file_(path), arch_(gguf_architecture(file_)), keep_quant_(options.keep_quant) {
        path_ = path;
        format_ = "gguf";
        config_ = gguf_model_config(file_);
        model_json_ = model_config_to_json(config_);
        match_tensors();
        read_tokenizer(options.tokenizer);
        // GGUF input is stored as f32 unless --dtype says otherwise: its weights are not floats.
        // --keep-quant keeps every tensor's stored type (F16/BF16 bits too), so a GGUF export
        // converts back tensor for tensor.
        if (!keep_quant_) default_dtype_ = QType::f32;
        std::map<std::string, uint64_t> source_types;
        for (const GgufTensorInfo& t : file_.tensors())
            ++source_types[std::string(ggml_type_traits(t.type).name)];
        recipe_extra_ = {{"source_format", "gguf"},
                         {"gguf_version", file_.version()},
                         {"gguf_tensor_types", source_types},
                         {"keep_quant", keep_quant_}};
        sources_.push_back(source_entry(path));
        if (!options.tokenizer.empty()) sources_.push_back(source_entry(options.tokenizer));
    }

    std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const override;
    const std::string& file_of(size_t) const override { return path_; }
    void release(size_t i) const override {
        // A fused tensor is released with its last part (the others read it before).
        const Part& p = parts_[i];
        if (p.row0 + tensors_[i].shape[0] == p.of) file_.release(*p.info);
    }
    std::string label(size_t i) const override {
        const Part& p = parts_[i];
        const std::string rows = p.of == tensors_[i].shape[0]
                                     ? ""
                                     : " rows " + std::to_string(p.row0) + ".." +
                                           std::to_string(p.row0 + tensors_[i].shape[0]) + " of " +
                                           std::to_string(p.of);
        return tensors_[i].name + " (GGUF " + p.info->name + rows + ", " +
               std::string(ggml_type_traits(p.info->type).name) + ")";
    }
    uint64_t source_bytes(size_t i) const override {
        return parts_[i].info->bytes / parts_[i].of * tensors_[i].shape[0];
    }

  private:
    // The GGUF tensor that holds tensor i: its rows [row0, row0 + shape[0]) of `of` (all of them
    // unless it is fused, as Phi-3's attn_qkv and ffn_up).
    struct Part {
        const GgufTensorInfo* info;
        const TensorRow* row;
        uint64_t row0 = 0, of = 0;
    };

    void match_tensors();
    // A part of a fused GGUF tensor (TensorSpec::fused_rows), found in `fused` by name.
    Part fused_part_of(const TensorSpec& s,
                       const std::map<std::string, const GgufTensorInfo*>& fused) const;
    // The stored tensor's bytes (as read, converted or kept), then tensor i's rows of them.
    std::span<const uint8_t> stored_bytes(size_t i, std::vector<uint8_t>& scratch) const;
    void read_tokenizer(const std::string& given);
    // The RoPE reordering tensor i needs: its head count, 0 for none.
    uint64_t rope_heads(size_t i) const {
        const RopeRows rope = arch_.adjacent_pair_rope ? parts_[i].row->rope : RopeRows::none;
        if (rope == RopeRows::none) return 0;
        return rope == RopeRows::q_heads ? config_.num_heads : config_.num_kv_heads;
    }

    GgufFile file_;
    const GgufArchitecture& arch_;
    bool keep_quant_;
    std::vector<Part> parts_;  // parallel to tensors_
    mutable std::vector<float> values_;
    mutable std::vector<uint8_t> unpermuted_;
};

// Every GGUF tensor to its row of the name table, and so to one of our tensors; then every
// tensor the metadata's model expects found with its shape and a type qforge can read.
void GgufSource::match_tensors() {
    const std::string& path = path_;
    std::map<std::string, Part> by_name;                 // our name -> GGUF tensor
    std::map<std::string, const GgufTensorInfo*> fused;  // fused GGUF tensors by name
    for (const GgufTensorInfo& t : file_.tensors()) {
        const TensorRow* row = nullptr;
        uint64_t layer = 0;
        bool is_fused = false;
        for (const TensorRow& r : tensor_rows(arch_.arch))
            if (const FusedPart* f = fused_part(arch_.arch, r.kind))
                is_fused = is_fused || match_tensor_pattern(f->gguf_pattern, t.name, &layer);
        if (is_fused) {
            fused.emplace(t.name, &t);
            continue;
        }
        for (const TensorRow& r : tensor_rows(arch_.arch))
            if (match_tensor_pattern(r.gguf_pattern, t.name, &layer)) {
                row = &r;
                break;
            }
        if (!row)
            throw Error(path, t.name,
                        "unexpected tensor for GGUF architecture '" + std::string(arch_.name) +
                            "' (not in qforge's table of llama.cpp tensor names)");
        by_name.emplace(tensor_name_for_layer(row->name_pattern, layer), Part{&t, row, 0, 0});
    }
    check_layers_fit(config_.num_layers, file_.tensors().size(), path,
                     std::string(arch_.name) + ".block_count");
    const std::vector<TensorSpec> specs = expected_tensors(config_);
    std::map<std::string, bool> fused_used;
    uint64_t separate = 0;  // specs stored as tensors of their own
    for (const TensorSpec& s : specs) {
        if (s.fused_rows) {
            const Part p = fused_part_of(s, fused);
            fused_used[p.info->name] = true;
            tensors_.push_back({s.name, QType::f32, s.shape});
            if (keep_quant_)
                tensors_.back().qtype = gguf_kept_qtype(p.info->type, s.shape).value_or(QType::f32);
            parts_.push_back(p);
            continue;
        }
        ++separate;
        const auto it = by_name.find(s.name);
        if (it == by_name.end())
            throw Error(path, {},
                        "tensor for '" + s.name + "' (shape " + shape_to_string(s.shape) +
                            ") is missing from the GGUF file");
        const GgufTensorInfo& t = *it->second.info;
        if (t.shape() != s.shape)
            throw Error(path, t.name,
                        "shape " + shape_to_string(t.shape()) + " but the metadata implies " +
                            shape_to_string(s.shape));
        if (!ggml_type_traits(t.type).to_float)
            throw Error(path, t.name,
                        "ggml type " + std::string(ggml_type_traits(t.type).name) +
                            " cannot be dequantized by qforge (supported: " +
                            gguf_dequantizable_types() + ")");
        const auto kept = keep_quant_ ? gguf_kept_qtype(t.type, s.shape) : std::nullopt;
        tensors_.push_back({s.name, kept.value_or(QType::f32), s.shape});
        parts_.push_back(it->second);
        parts_.back().of = s.shape[0];
    }
    for (const auto& [name, info] : fused)
        if (!fused_used.count(name))
            throw Error(path, name, "is not part of the model the metadata describes");
    if (by_name.size() != separate) {
        for (const auto& [name, part] : by_name) {
            bool expected = false;
            for (const auto& s : specs) expected = expected || s.name == name;
            if (!expected)
                throw Error(path, part.info->name,
                            "is not part of the model the metadata describes (as '" + name + "')");
        }
    }
}

GgufSource::Part GgufSource::fused_part_of(
    const TensorSpec& s, const std::map<std::string, const GgufTensorInfo*>& fused) const {
    const FusedPart* f = fused_part(arch_.arch, s.row->kind);
    const std::string name = tensor_name_for_layer(f->gguf_pattern, s.layer);
    const std::vector<uint64_t> shape = {s.fused_rows, s.shape[1]};
    const auto it = fused.find(name);
    if (it == fused.end())
        throw Error(path_, {},
                    "tensor '" + name + "' (shape " + shape_to_string(shape) + ", holding '" +
                        s.name + "') is missing from the GGUF file");
    const GgufTensorInfo& t = *it->second;
    if (t.shape() != shape)
        throw Error(path_, t.name,
                    "shape " + shape_to_string(t.shape()) + " but the metadata implies " +
                        shape_to_string(shape) + " (the fused rows of " + s.name +
                        " and its siblings)");
    if (!ggml_type_traits(t.type).to_float)
        throw Error(
            path_, t.name,
            "ggml type " + std::string(ggml_type_traits(t.type).name) +
                " cannot be dequantized by qforge (supported: " + gguf_dequantizable_types() + ")");
    return {&t, s.row, s.fused_row0, s.fused_rows};
}

// The tokenizer: given, else the GGUF's own; a file without one converts with a warning.
void GgufSource::read_tokenizer(const std::string& given) {
    const std::string& path = path_;
    if (!given.empty()) {
        tokenizer_ =
            resolve_tokenizer(given, std::nullopt, path, config_, tokenizer_file_, warnings_);
    } else if (const std::string* model = file_.get_string("tokenizer.ggml.model");
               model && *model != "none") {
        tokenizer_ = tokenizer_schema_from_gguf(file_);
        tokenizer_file_ = path;
        // llama.cpp refuses a GGUF whose token list and embedding rows differ.
        if (tokenizer_.at("pieces").size() != config_.vocab_size)
            throw Error(path, {},
                        "the GGUF's tokenizer has " +
                            std::to_string(tokenizer_.at("pieces").size()) +
                            " tokens but its vocabulary (token_embd rows) has " +
                            std::to_string(config_.vocab_size));
    } else {
        // Absent, or llama.cpp's "none" (a model without a vocabulary).
        warnings_.push_back(path +
                            " has no tokenizer metadata; the .qf will have none "
                            "(pass --tokenizer FILE)");
        tokenizer_ = nullptr;
    }
}

std::span<const uint8_t> GgufSource::bytes(size_t i, std::vector<uint8_t>& scratch) const {
    const Part& p = parts_[i];
    const std::span<const uint8_t> stored = stored_bytes(i, scratch);
    if (p.of == tensors_[i].shape[0]) return stored;
    const uint64_t row_bytes = stored.size() / p.of;  // rows are independent in every layout
    return stored.subspan(p.row0 * row_bytes, tensors_[i].shape[0] * row_bytes);
}

std::span<const uint8_t> GgufSource::stored_bytes(size_t i, std::vector<uint8_t>& scratch) const {
    const GgufTensorInfo& t = *parts_[i].info;
    const SourceTensor& s = tensors_[i];
    const uint64_t rows = parts_[i].of;  // the stored tensor's: a fused part's are more
    const uint64_t heads = rope_heads(i);
    if (s.qtype == QType::f16 || s.qtype == QType::bf16) {
        // Kept as stored (--keep-quant): the file's half-precision bits, rows reordered as below.
        const std::span<const uint8_t> raw = file_.tensor_data(t);
        scratch.resize(raw.size());
        if (!heads) {
            std::copy(raw.begin(), raw.end(), scratch.begin());
            return scratch;
        }
        permute_rope_pairs_to_halves(raw, scratch, heads, config_.head_dim, raw.size() / rows);
        return scratch;
    }
    if (s.qtype != QType::f32) {
        // The blocks become rows of the same codes and scales; the RoPE reordering moves
        // whole rows, so it applies to packed rows as to float ones.
        const uint64_t row_bytes = *qtype_row_bytes(s.qtype, s.shape[1]);
        std::vector<uint8_t>& packed = heads ? unpermuted_ : scratch;
        resize_for(packed, rows * row_bytes, path_, t.name);
        repack_gguf_rows(t.type, s.qtype, file_.tensor_data(t), rows, s.shape[1], packed, path_,
                         t.name);
        if (!heads) return scratch;
        scratch.resize(packed.size());
        permute_rope_pairs_to_halves(packed, scratch, heads, config_.head_dim, row_bytes);
        return scratch;
    }
    resize_for(values_, t.elements, path_, t.name);
    gguf_dequantize(t.type, file_.tensor_data(t), values_, path_, t.name);
    const std::span<const uint8_t> dequantized{reinterpret_cast<const uint8_t*>(values_.data()),
                                               values_.size() * sizeof(float)};
    scratch.resize(dequantized.size());
    if (!heads) {
        std::copy(dequantized.begin(), dequantized.end(), scratch.begin());
        return scratch;
    }
    const uint64_t cols = s.shape.size() == 2 ? s.shape[1] : 1;
    permute_rope_pairs_to_halves(dequantized, scratch, heads, config_.head_dim,
                                 cols * sizeof(float));
    return scratch;
}

}  // namespace

std::unique_ptr<ModelSource> open_gguf_source(const std::string& path,
                                              const SourceOptions& options) {
    return std::make_unique<GgufSource>(path, options);
}

}  // namespace qforge
