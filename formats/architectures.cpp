#include "formats/architectures.hpp"

#include <charconv>

namespace qforge {

namespace {

constexpr std::string_view kLayer = "{i}";

// The Llama layout, shared by every architecture we support. Order is canonical: it is the order
// of tensors in a .qf file. Shapes are torch order [out, in]. GGUF names are llama.cpp's
// (LLM_TENSOR_NAMES, gguf-py's TensorNameMap); llama2.c fields are run.c's TransformerWeights
// (w1 gate, w3 up, w2 down: Meta's names; wcls only in files with an unshared classifier; no
// biases). q and k (and their biases) were reordered to adjacent-pair RoPE by llama.cpp's
// converter (convert_hf_to_gguf.py, LlamaModel.permute) and by llama2.c's export.
namespace llama_rows {
using enum Dim;
using enum Presence;
using enum WeightClass;
using K = TensorKind;
using R = RopeRows;
// clang-format off
constexpr TensorRow kLlamaLayout[] = {
    {K::embed,       "model.embed_tokens.weight",                        "embed",                  "token_embd.weight",          "token_embedding_table", {vocab, hidden},        always,         R::none,     embedding},
    {K::attn_norm,   "model.layers.{i}.input_layernorm.weight",          "layers.{i}.attn_norm",   "blk.{i}.attn_norm.weight",   "rms_att_weight",        {hidden},               always,         R::none,     norm},
    {K::attn_q,      "model.layers.{i}.self_attn.q_proj.weight",         "layers.{i}.attn.q",      "blk.{i}.attn_q.weight",      "wq",                    {q, hidden},            always,         R::q_heads,  attention_linear},
    {K::attn_k,      "model.layers.{i}.self_attn.k_proj.weight",         "layers.{i}.attn.k",      "blk.{i}.attn_k.weight",      "wk",                    {kv, hidden},           always,         R::kv_heads, attention_linear},
    {K::attn_v,      "model.layers.{i}.self_attn.v_proj.weight",         "layers.{i}.attn.v",      "blk.{i}.attn_v.weight",      "wv",                    {kv, hidden},           always,         R::none,     attention_linear},
    {K::attn_o,      "model.layers.{i}.self_attn.o_proj.weight",         "layers.{i}.attn.o",      "blk.{i}.attn_output.weight", "wo",                    {hidden, q},            always,         R::none,     attention_linear},
    {K::attn_q_bias, "model.layers.{i}.self_attn.q_proj.bias",           "layers.{i}.attn.q_bias", "blk.{i}.attn_q.bias",        "",                      {q},                    attention_bias, R::q_heads,  bias},
    {K::attn_k_bias, "model.layers.{i}.self_attn.k_proj.bias",           "layers.{i}.attn.k_bias", "blk.{i}.attn_k.bias",        "",                      {kv},                   attention_bias, R::kv_heads, bias},
    {K::attn_v_bias, "model.layers.{i}.self_attn.v_proj.bias",           "layers.{i}.attn.v_bias", "blk.{i}.attn_v.bias",        "",                      {kv},                   attention_bias, R::none,     bias},
    {K::attn_q_norm, "model.layers.{i}.self_attn.q_norm.weight",         "layers.{i}.attn.q_norm", "blk.{i}.attn_q_norm.weight", "",                      {head_dim},             qk_norm,        R::none,     norm},
    {K::attn_k_norm, "model.layers.{i}.self_attn.k_norm.weight",         "layers.{i}.attn.k_norm", "blk.{i}.attn_k_norm.weight", "",                      {head_dim},             qk_norm,        R::none,     norm},
    {K::mlp_norm,    "model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.mlp_norm",    "blk.{i}.ffn_norm.weight",    "rms_ffn_weight",        {hidden},               always,         R::none,     norm},
    {K::mlp_gate,    "model.layers.{i}.mlp.gate_proj.weight",            "layers.{i}.mlp.gate",    "blk.{i}.ffn_gate.weight",    "w1",                    {intermediate, hidden}, always,         R::none,     mlp_linear},
    {K::mlp_up,      "model.layers.{i}.mlp.up_proj.weight",              "layers.{i}.mlp.up",      "blk.{i}.ffn_up.weight",      "w3",                    {intermediate, hidden}, always,         R::none,     mlp_linear},
    {K::mlp_down,    "model.layers.{i}.mlp.down_proj.weight",            "layers.{i}.mlp.down",    "blk.{i}.ffn_down.weight",    "w2",                    {hidden, intermediate}, always,         R::none,     mlp_linear},
    {K::final_norm,  "model.norm.weight",                                "final_norm",             "output_norm.weight",         "rms_final_weight",      {hidden},               always,         R::none,     norm},
    {K::lm_head,     "lm_head.weight",                                   "lm_head",                "output.weight",              "wcls",                  {vocab, hidden},        untied,         R::none,     output_head},
};
// Gemma 2 and 3 (Gemma2DecoderLayer, Gemma3DecoderLayer): the same projections with four norms
// per layer. Hugging Face's post_attention_layernorm is the attention output's post-norm here,
// pre_feedforward_layernorm the MLP's input norm; llama.cpp calls them post_attention_norm and
// ffn_norm (convert_hf_to_gguf.py Gemma2Model/Gemma3Model, gguf-py's TensorNameMap). Gemma uses
// rotate-half RoPE in llama.cpp too (LLAMA_ROPE_TYPE_NEOX): no q/k reordering.
constexpr TensorRow kGemmaLayout[] = {
    {K::embed,          "model.embed_tokens.weight",                         "embed",                  "token_embd.weight",                  "", {vocab, hidden},        always,         R::none, embedding},
    {K::attn_norm,      "model.layers.{i}.input_layernorm.weight",           "layers.{i}.attn_norm",   "blk.{i}.attn_norm.weight",           "", {hidden},               always,         R::none, norm},
    {K::attn_q,         "model.layers.{i}.self_attn.q_proj.weight",          "layers.{i}.attn.q",      "blk.{i}.attn_q.weight",              "", {q, hidden},            always,         R::none, attention_linear},
    {K::attn_k,         "model.layers.{i}.self_attn.k_proj.weight",          "layers.{i}.attn.k",      "blk.{i}.attn_k.weight",              "", {kv, hidden},           always,         R::none, attention_linear},
    {K::attn_v,         "model.layers.{i}.self_attn.v_proj.weight",          "layers.{i}.attn.v",      "blk.{i}.attn_v.weight",              "", {kv, hidden},           always,         R::none, attention_linear},
    {K::attn_o,         "model.layers.{i}.self_attn.o_proj.weight",          "layers.{i}.attn.o",      "blk.{i}.attn_output.weight",         "", {hidden, q},            always,         R::none, attention_linear},
    {K::attn_q_bias,    "model.layers.{i}.self_attn.q_proj.bias",            "layers.{i}.attn.q_bias", "blk.{i}.attn_q.bias",                "", {q},                    attention_bias, R::none, bias},
    {K::attn_k_bias,    "model.layers.{i}.self_attn.k_proj.bias",            "layers.{i}.attn.k_bias", "blk.{i}.attn_k.bias",                "", {kv},                   attention_bias, R::none, bias},
    {K::attn_v_bias,    "model.layers.{i}.self_attn.v_proj.bias",            "layers.{i}.attn.v_bias", "blk.{i}.attn_v.bias",                "", {kv},                   attention_bias, R::none, bias},
    {K::attn_q_norm,    "model.layers.{i}.self_attn.q_norm.weight",          "layers.{i}.attn.q_norm", "blk.{i}.attn_q_norm.weight",         "", {head_dim},             qk_norm,        R::none, norm},
    {K::attn_k_norm,    "model.layers.{i}.self_attn.k_norm.weight",          "layers.{i}.attn.k_norm", "blk.{i}.attn_k_norm.weight",         "", {head_dim},             qk_norm,        R::none, norm},
    {K::attn_post_norm, "model.layers.{i}.post_attention_layernorm.weight",  "layers.{i}.attn_post_norm", "blk.{i}.post_attention_norm.weight", "", {hidden},            always,         R::none, norm},
    {K::mlp_norm,       "model.layers.{i}.pre_feedforward_layernorm.weight", "layers.{i}.mlp_norm",    "blk.{i}.ffn_norm.weight",            "", {hidden},               always,         R::none, norm},
    {K::mlp_gate,       "model.layers.{i}.mlp.gate_proj.weight",             "layers.{i}.mlp.gate",    "blk.{i}.ffn_gate.weight",            "", {intermediate, hidden}, always,         R::none, mlp_linear},
    {K::mlp_up,         "model.layers.{i}.mlp.up_proj.weight",               "layers.{i}.mlp.up",      "blk.{i}.ffn_up.weight",              "", {intermediate, hidden}, always,         R::none, mlp_linear},
    {K::mlp_down,       "model.layers.{i}.mlp.down_proj.weight",             "layers.{i}.mlp.down",    "blk.{i}.ffn_down.weight",            "", {hidden, intermediate}, always,         R::none, mlp_linear},
    {K::mlp_post_norm,  "model.layers.{i}.post_feedforward_layernorm.weight", "layers.{i}.mlp_post_norm", "blk.{i}.post_ffw_norm.weight",    "", {hidden},               always,         R::none, norm},
    {K::final_norm,     "model.norm.weight",                                 "final_norm",             "output_norm.weight",                 "", {hidden},               always,         R::none, norm},
    {K::lm_head,        "lm_head.weight",                                    "lm_head",                "output.weight",                      "", {vocab, hidden},        untied,         R::none, output_head},
};
// clang-format on
}  // namespace llama_rows
using llama_rows::kGemmaLayout;
using llama_rows::kLlamaLayout;

// Which rows each architecture uses.
struct LayoutRow {
    Architecture arch;
    std::span<const TensorRow> rows;
};
constexpr LayoutRow kLayouts[] = {
    // Llama 2 and 3, TinyLlama, SmolLM: the reference layout.
    {Architecture::llama, kLlamaLayout},
    // Same tensors; the sliding window changes attention, not weights.
    {Architecture::mistral, kLlamaLayout},
    // Same tensors; its config always has attention_bias, which brings in the q/k/v biases.
    {Architecture::qwen2, kLlamaLayout},
    // Same tensors plus the per-head q_norm and k_norm; no biases unless attention_bias.
    {Architecture::qwen3, kLlamaLayout},
    // Sandwich norms; gemma3 adds q_norm and k_norm.
    {Architecture::gemma2, kGemmaLayout},
    {Architecture::gemma3, kGemmaLayout},
    // Same tensors, stored fused in its checkpoints (kFusedParts); no biases.
    {Architecture::phi3, kLlamaLayout},
};

// Tensors stored inside fused ones. Phi3Attention splits qkv_proj's output at q_dim and
// q_dim + kv_dim; Phi3MLP chunks gate_up_proj's in two halves, gate first (modeling_phi3.py).
// llama.cpp's phi3 keeps both fused under its own names, in the same row order: build_phi3
// views attn_qkv's output as q, k, v at 0, n_embd and n_embd + n_embd_gqa, and LLM_FFN_SWIGLU
// takes silu of ffn_up's first half times its second (convert_hf_to_gguf.py Phi3MiniModel
// renames the tensors and reorders nothing).
namespace fused_rows {
using enum Dim;
using K = TensorKind;
constexpr std::string_view kQkv = "model.layers.{i}.self_attn.qkv_proj.weight";
constexpr std::string_view kGateUp = "model.layers.{i}.mlp.gate_up_proj.weight";
constexpr std::string_view kGgufQkv = "blk.{i}.attn_qkv.weight";
constexpr std::string_view kGgufGateUp = "blk.{i}.ffn_up.weight";
constexpr FusedPart kFusedParts[] = {
    {Architecture::phi3, K::attn_q, kQkv, kGgufQkv, {none, none}, {q, kv, kv}},
    {Architecture::phi3, K::attn_k, kQkv, kGgufQkv, {q, none}, {q, kv, kv}},
    {Architecture::phi3, K::attn_v, kQkv, kGgufQkv, {q, kv}, {q, kv, kv}},
    {Architecture::phi3,
     K::mlp_gate,
     kGateUp,
     kGgufGateUp,
     {none, none},
     {intermediate, intermediate, none}},
    {Architecture::phi3,
     K::mlp_up,
     kGateUp,
     kGgufGateUp,
     {intermediate, none},
     {intermediate, intermediate, none}},
};
}  // namespace fused_rows
using fused_rows::kFusedParts;

// HF tensors without a counterpart in the model. Older transformers saved each layer's RoPE
// inverse frequencies; we compute them from rope_theta.
constexpr std::string_view kIgnorableHfPatterns[] = {
    "model.layers.{i}.self_attn.rotary_emb.inv_freq",
    "model.rotary_emb.inv_freq",
};

// clang-format off
constexpr WeightClassInfo kWeightClasses[] = {
    {WeightClass::embedding,        "embedding",        LeastPrecision::any_qtype, "the token embedding, a row lookup"},
    {WeightClass::output_head,      "output_head",      LeastPrecision::any_qtype, "the logits' projection"},
    {WeightClass::attention_linear, "attention_linear", LeastPrecision::any_qtype, "attention projections"},
    {WeightClass::mlp_linear,       "mlp_linear",       LeastPrecision::any_qtype, "MLP projections"},
    {WeightClass::norm,             "norm",             LeastPrecision::float16,   "RMSNorm weights"},
    {WeightClass::bias,             "bias",             LeastPrecision::float16,   "attention biases"},
};
// clang-format on
constexpr bool classes_in_enum_order() {
    for (size_t i = 0; i < std::size(kWeightClasses); ++i)
        if (static_cast<size_t>(kWeightClasses[i].cls) != i) return false;
    return true;
}
static_assert(std::size(kWeightClasses) == static_cast<size_t>(WeightClass::bias) + 1,
              "every WeightClass needs a row");
static_assert(classes_in_enum_order(), "kWeightClasses rows must follow the enum");

// Every TensorKind has exactly one row of a layout, and 1-D rows are exactly the float-only
// classes (a packed row type needs a matrix).
constexpr bool kinds_once_and_shapes_fit(std::span<const TensorRow> rows) {
    for (size_t k = 0; k <= static_cast<size_t>(TensorKind::lm_head); ++k) {
        int n = 0;
        for (const auto& row : rows) n += static_cast<size_t>(row.kind) == k;
        if (n != 1 && !(n == 0 && tensor_kind_optional(TensorKind(k)))) return false;
    }
    for (const auto& row : rows) {
        const bool vector = row.shape[1] == Dim::none;
        const bool float_only =
            kWeightClasses[static_cast<size_t>(row.cls)].least == LeastPrecision::float16;
        if (vector != float_only) return false;
    }
    return true;
}
static_assert(kinds_once_and_shapes_fit(kLlamaLayout),
              "kLlamaLayout: one row per TensorKind; 1-D rows exactly the float-only classes");
static_assert(kinds_once_and_shapes_fit(kGemmaLayout),
              "kGemmaLayout: one row per TensorKind; 1-D rows exactly the float-only classes");

constexpr bool is_per_layer(const TensorRow& row) {
    return row.hf_pattern.find(kLayer) != std::string_view::npos;
}

// Both patterns of a row agree on being per layer, and the per-layer rows form a single run,
// so "global rows, layers, global rows" is the whole order.
constexpr bool well_formed(std::span<const TensorRow> rows) {
    int runs = 0;
    bool previous = false;
    for (const auto& row : rows) {
        const bool layered = is_per_layer(row);
        if (layered != (row.name_pattern.find(kLayer) != std::string_view::npos)) return false;
        if (layered != (row.gguf_pattern.find(kLayer) != std::string_view::npos)) return false;
        if (layered && !previous) ++runs;
        previous = layered;
    }
    return runs == 1;
}
static_assert(well_formed(kLlamaLayout), "kLlamaLayout: per-layer rows must be one run");
static_assert(well_formed(kGemmaLayout), "kGemmaLayout: per-layer rows must be one run");

constexpr bool layouts_in_enum_order() {
    for (size_t i = 0; i < std::size(kLayouts); ++i)
        if (static_cast<size_t>(kLayouts[i].arch) != i) return false;
    return true;
}
static_assert(std::size(kLayouts) == static_cast<size_t>(Architecture::phi3) + 1,
              "every Architecture needs a layout row");
static_assert(layouts_in_enum_order(), "kLayouts rows must follow the enum");

uint64_t resolve(Dim d, const ModelConfig& c) {
    switch (d) {
        case Dim::none:
            break;
        case Dim::vocab:
            return c.vocab_size;
        case Dim::hidden:
            return c.hidden_size;
        case Dim::intermediate:
            return c.intermediate_size;
        case Dim::q:
            return c.q_dim();
        case Dim::kv:
            return c.kv_dim();
        case Dim::head_dim:
            return c.head_dim;
    }
    return 0;
}

bool present(Presence p, const ModelConfig& c) {
    switch (p) {
        case Presence::always:
            return true;
        case Presence::attention_bias:
            return c.attention_bias;
        case Presence::untied:
            return !c.tie_word_embeddings;
        case Presence::qk_norm:
            return architecture_has_qk_norm(c.arch);
    }
    return false;
}

std::string substitute(std::string_view pattern, uint64_t layer) {
    std::string s(pattern);
    if (auto at = s.find(kLayer); at != std::string::npos)
        s.replace(at, kLayer.size(), std::to_string(layer));
    return s;
}

uint64_t sum_dims(std::span<const Dim> dims, const ModelConfig& c) {
    uint64_t n = 0;
    for (Dim d : dims)
        if (d != Dim::none) n += resolve(d, c);
    return n;
}

TensorSpec make_spec(const TensorRow& row, uint64_t layer, const ModelConfig& c) {
    TensorSpec spec;
    spec.hf_name = substitute(row.hf_pattern, layer);
    spec.name = substitute(row.name_pattern, layer);
    spec.shape = tensor_row_shape(row, c);
    spec.is_matrix = spec.shape.size() == 2;
    spec.row = &row;
    spec.layer = is_per_layer(row) ? layer : 0;
    if (const FusedPart* f = fused_part(c.arch, row.kind)) {
        spec.hf_name = substitute(f->hf_pattern, layer);
        spec.fused_row0 = sum_dims(f->offset, c);
        spec.fused_rows = sum_dims(f->total, c);
    }
    return spec;
}

}  // namespace

const FusedPart* fused_part(Architecture arch, TensorKind kind) {
    for (const FusedPart& f : kFusedParts)
        if (f.arch == arch && f.kind == kind) return &f;
    return nullptr;
}

bool architecture_has_fused_tensors(Architecture arch) {
    for (const FusedPart& f : kFusedParts)
        if (f.arch == arch) return true;
    return false;
}

const WeightClassInfo& weight_class_info(WeightClass c) {
    return kWeightClasses[static_cast<size_t>(c)];
}

std::span<const WeightClassInfo> weight_classes() { return kWeightClasses; }

const TensorRow* find_tensor_row(std::string_view name, uint64_t* layer) {
    for (const LayoutRow& layout : kLayouts)
        for (const TensorRow& row : layout.rows)
            if (match_tensor_pattern(row.name_pattern, name, layer)) return &row;
    return nullptr;
}

bool tensor_row_present(const TensorRow& row, const ModelConfig& c) {
    return present(row.presence, c);
}

std::vector<uint64_t> tensor_row_shape(const TensorRow& row, const ModelConfig& c) {
    std::vector<uint64_t> shape;
    for (Dim d : row.shape)
        if (d != Dim::none) shape.push_back(resolve(d, c));
    return shape;
}

bool tensor_row_per_layer(const TensorRow& row) { return is_per_layer(row); }

std::string tensor_name_for_layer(std::string_view pattern, uint64_t layer) {
    return substitute(pattern, layer);
}

std::span<const TensorRow> tensor_rows(Architecture arch) {
    return kLayouts[static_cast<size_t>(arch)].rows;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
    const auto rows = tensor_rows(c.arch);
    std::vector<TensorSpec> specs;
    for (size_t r = 0; r < rows.size();) {
        if (!is_per_layer(rows[r])) {
            if (present(rows[r].presence, c)) specs.push_back(make_spec(rows[r], 0, c));
            ++r;
            continue;
        }
        // The run of per-layer rows, emitted layer by layer.
        size_t end = r;
        while (end < rows.size() && is_per_layer(rows[end])) ++end;
        for (uint64_t layer = 0; layer < c.num_layers; ++layer)
            for (size_t k = r; k < end; ++k)
                if (present(rows[k].presence, c)) specs.push_back(make_spec(rows[k], layer, c));
        r = end;
    }
    return specs;
}

bool match_tensor_pattern(std::string_view pattern, std::string_view name, uint64_t* layer) {
    const auto at = pattern.find(kLayer);
    if (at == std::string_view::npos) return pattern == name;
    const std::string_view prefix = pattern.substr(0, at),
                           suffix = pattern.substr(at + kLayer.size());
    if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) ||
        !name.ends_with(suffix))
        return false;
    const std::string_view digits =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    // "03" or "+3" would alias layer 3: refuse anything but the canonical spelling.
    if (digits.size() > 1 && digits.front() == '0') return false;
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size()) return false;
    if (layer) *layer = value;
    return true;
}

std::string describe_dim(Dim d, const ModelConfig& c) {
    const auto heads = [&](const char* key, uint64_t n) {
        return std::string(key) + " " + std::to_string(n) + " * head_dim " +
               std::to_string(c.head_dim);
    };
    switch (d) {
        case Dim::none:
            break;
        case Dim::vocab:
            return "vocab_size " + std::to_string(c.vocab_size);
        case Dim::hidden:
            return "hidden_size " + std::to_string(c.hidden_size);
        case Dim::intermediate:
            return "intermediate_size " + std::to_string(c.intermediate_size);
        case Dim::q:
            return heads("num_attention_heads", c.num_heads);
        case Dim::kv:
            return heads("num_key_value_heads", c.num_kv_heads);
        case Dim::head_dim:
            return "head_dim " + std::to_string(c.head_dim);
    }
    return {};
}

bool hf_norms_plus_one(Architecture arch) { return architecture_features(arch).norm_plus_one; }

bool is_ignorable_hf_tensor(std::string_view hf_name) {
    for (std::string_view pattern : kIgnorableHfPatterns)
        if (match_tensor_pattern(pattern, hf_name)) return true;
    return false;
}

}  // namespace qforge
