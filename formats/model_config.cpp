#include "formats/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "formats/json_io.hpp"

namespace qforge {

using nlohmann::json;

namespace {

// Dimensions, counts and token ids must fit an int32: kernels index with 32-bit integers, and a
// larger value in a config.json is corruption, not a model.
constexpr uint64_t kMaxDim = (uint64_t{1} << 31) - 1;

// Defaults shared by LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config (transformers 4.x
// and 5.x).
constexpr double kDefaultRmsNormEps = 1e-6;
constexpr double kDefaultRopeTheta = 10000.0;     // RotaryEmbeddingConfigMixin.default_theta
constexpr uint64_t kDefaultSlidingWindow = 4096;  // MistralConfig, Qwen2Config, Qwen3Config
constexpr uint64_t kDefaultMaxWindowLayers = 28;  // Qwen2Config, Qwen3Config

// Where an architecture's q/k/v biases come from (the modeling code, not the config class).
enum class BiasRule : uint8_t {
    config_key,  // LlamaAttention: bias=config.attention_bias
    always,      // Qwen2Attention: bias=True
    never,       // MistralAttention: bias=False
};

// Whether the architecture records a sliding attention window.
enum class WindowRule : uint8_t {
    none,                // LlamaConfig has no sliding_window
    declared,            // MistralConfig: sliding_window (absent: 4096, null: off)
    use_sliding_window,  // Qwen2/3Config: sliding_window only when use_sliding_window is true,
                         // in layers from max_window_layers on
    layer_types,         // Gemma2/3: sliding_window (absent: 4096, null: off) in the layers
                         // layer_types (or the older sliding_window_pattern) marks sliding
    optional,            // Phi3Config: sliding_window (absent or null: off), every layer
};

// How transformers reads a config.json for each architecture: the one place that maps
// model_type to Architecture, and the defaults that differ between the config classes.
struct ArchitectureTraits {
    Architecture arch;
    std::string_view model_type;
    std::string_view hf_class;                    // transformers' *ForCausalLM
    std::optional<uint64_t> absent_num_kv_heads;  // key absent; nullopt: num_attention_heads
    uint64_t default_max_position_embeddings;
    std::optional<int64_t> default_bos_token_id, default_eos_token_id;
    BiasRule attention_bias;
    WindowRule sliding_window;
    std::optional<uint64_t> absent_head_dim;  // key absent; nullopt: hidden / heads
    ArchitectureFeatures features;
    bool default_tie_word_embeddings = false;
    uint64_t default_window_pattern = 0;  // layer_types rule: sliding_window_pattern's default
    // Gemma: query_pre_attn_scalar's default and the soft-capping defaults (0: none).
    double default_query_pre_attn_scalar = 0.0, default_attn_softcap = 0.0,
           default_final_softcap = 0.0;
};

constexpr ArchitectureFeatures kLlamaFeatures{};
constexpr ArchitectureFeatures kQwen3Features{.qk_norm = true};
// GemmaRMSNorm (1 + w), Gemma*ScaledWordEmbedding, the four norms of Gemma2DecoderLayer,
// hidden_activation gelu_pytorch_tanh.
constexpr ArchitectureFeatures kGemma2Features{
    .gelu_tanh = true, .scaled_embedding = true, .sandwich_norms = true, .norm_plus_one = true};
constexpr ArchitectureFeatures kGemma3Features{.qk_norm = true,
                                               .gelu_tanh = true,
                                               .scaled_embedding = true,
                                               .sandwich_norms = true,
                                               .norm_plus_one = true};

constexpr ArchitectureTraits kArchitectureTraits[] = {
    {Architecture::llama, "llama", "LlamaForCausalLM", std::nullopt, 2048, 1, 2,
     BiasRule::config_key, WindowRule::none, std::nullopt, kLlamaFeatures},
    // MistralConfig's num_key_value_heads defaults to 8, not to the head count.
    {Architecture::mistral, "mistral", "MistralForCausalLM", 8, 4096 * 32, 1, 2, BiasRule::never,
     WindowRule::declared, std::nullopt, kLlamaFeatures},
    // Qwen2Config's num_key_value_heads defaults to 32; it has no BOS/EOS defaults.
    {Architecture::qwen2, "qwen2", "Qwen2ForCausalLM", 32, 32768, std::nullopt, std::nullopt,
     BiasRule::always, WindowRule::use_sliding_window, std::nullopt, kLlamaFeatures},
    // Qwen3Config: as Qwen2Config, but head_dim defaults to 128 (not hidden / heads), biases
    // follow attention_bias (Qwen3Attention), and q_norm / k_norm normalize each head.
    {Architecture::qwen3, "qwen3", "Qwen3ForCausalLM", 32, 32768, std::nullopt, std::nullopt,
     BiasRule::config_key, WindowRule::use_sliding_window, 128, kQwen3Features},
    // Gemma2Config (transformers 5.x): 4 KV heads, head_dim 256, tied, BOS 2, EOS 1, every other
    // layer sliding (layer_types), query_pre_attn_scalar 256, soft-capping 50 and 30.
    {Architecture::gemma2, "gemma2", "Gemma2ForCausalLM", 4, 8192, 2, 1, BiasRule::config_key,
     WindowRule::layer_types, 256, kGemma2Features, true, 2, 256.0, 50.0, 30.0},
    // Gemma3TextConfig: as Gemma2Config with QK-norm, no soft-capping, 5 sliding : 1 full
    // (sliding_window_pattern 6) and rope_local_base_freq for the sliding layers.
    {Architecture::gemma3, "gemma3_text", "Gemma3ForCausalLM", 4, 131072, 2, 1,
     BiasRule::config_key, WindowRule::layer_types, 256, kGemma3Features, true, 6, 256.0, 0.0, 0.0},
    // Phi3Config (Phi-3, Phi-3.5 mini): the Llama block with q/k/v and gate/up fused in the
    // checkpoint (split at conversion, formats/architectures.cpp), no biases, EOS 32000.
    {Architecture::phi3, "phi3", "Phi3ForCausalLM", std::nullopt, 4096, 1, 32000, BiasRule::never,
     WindowRule::optional, std::nullopt, kLlamaFeatures},
};

constexpr bool traits_rows_in_enum_order() {
    for (size_t i = 0; i < std::size(kArchitectureTraits); ++i)
        if (static_cast<size_t>(kArchitectureTraits[i].arch) != i) return false;
    return true;
}
static_assert(std::size(kArchitectureTraits) == static_cast<size_t>(Architecture::phi3) + 1,
              "every Architecture needs a row");
static_assert(traits_rows_in_enum_order(), "kArchitectureTraits rows must follow the enum");

const ArchitectureTraits& traits(Architecture arch) {
    return kArchitectureTraits[static_cast<size_t>(arch)];
}

// A JSON value for a message: its type and a bounded excerpt of its text.
std::string describe(const json& v) {
    std::string text = v.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return std::string(v.type_name()) + " " + text;
}

// Typed, checked access to the keys of one JSON object. `prefix` names a nested object in
// messages ("rope_scaling."), so every error says exactly which key is wrong.
class Keys {
  public:
    Keys(const json& obj, const std::string& source, std::string prefix = {})
        : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

    [[noreturn]] void fail(const std::string& detail) const { throw Error(source_, {}, detail); }
    std::string name(std::string_view key) const { return prefix_ + std::string(key); }

    // The value at `key`, or nullptr when the key is absent (JSON null is a value here).
    const json* find(std::string_view key) const {
        auto it = obj_.find(key);
        return it == obj_.end() ? nullptr : &*it;
    }
    // The value at `key`; nullptr when absent or null (transformers treats null as unset).
    const json* find_set(std::string_view key) const {
        const json* v = find(key);
        return v && !v->is_null() ? v : nullptr;
    }
    const json& required(std::string_view key) const {
        const json* v = find_set(key);
        if (!v) fail("missing required key '" + name(key) + "'");
        return *v;
    }

    // An integer in [lo, kMaxDim].
    uint64_t integer(const json& v, std::string_view key, uint64_t lo = 1) const {
        if (!v.is_number_integer())
            fail("'" + name(key) + "' must be an integer, found " + describe(v));
        // nlohmann keeps non-negative literals as signed or unsigned depending on their origin.
        const bool negative = !v.is_number_unsigned() && v.get<int64_t>() < 0;
        if (!negative) {
            const auto u = v.get<uint64_t>();
            if (u >= lo && u <= kMaxDim) return u;
        }
        fail("'" + name(key) + "' must be between " + std::to_string(lo) + " and " +
             std::to_string(kMaxDim) + ", found " + v.dump());
    }
    uint64_t dim(std::string_view key) const { return integer(required(key), key); }
    std::optional<uint64_t> opt_dim(std::string_view key) const {
        const json* v = find_set(key);
        return v ? std::optional(integer(*v, key)) : std::nullopt;
    }

    double number(const json& v, std::string_view key) const {
        if (!v.is_number()) fail("'" + name(key) + "' must be a number, found " + describe(v));
        return v.get<double>();
    }
    double number(std::string_view key) const { return number(required(key), key); }
    double number_or(std::string_view key, double fallback) const {
        const json* v = find_set(key);
        return v ? number(*v, key) : fallback;
    }

    bool boolean(std::string_view key) const {
        const json& v = required(key);
        if (!v.is_boolean())
            fail("'" + name(key) + "' must be true or false, found " + describe(v));
        return v.get<bool>();
    }
    bool boolean_or(std::string_view key, bool fallback) const {
        return find_set(key) ? boolean(key) : fallback;
    }

    std::string string(std::string_view key) const {
        const json& v = required(key);
        if (!v.is_string()) fail("'" + name(key) + "' must be a string, found " + describe(v));
        return v.get<std::string>();
    }
    std::string string_or(std::string_view key, std::string fallback) const {
        return find_set(key) ? string(key) : std::move(fallback);
    }

    // A token id; null means "none", an absent key gives `absent`.
    std::optional<int64_t> token_id(std::string_view key, std::optional<int64_t> absent) const {
        const json* v = find(key);
        if (!v) return absent;
        if (v->is_null()) return std::nullopt;
        return static_cast<int64_t>(integer(*v, key, 0));
    }
    // EOS: an id, a list of ids (the model stops at any of them) or null.
    std::vector<int64_t> token_ids(std::string_view key, std::optional<int64_t> absent) const {
        const json* v = find(key);
        if (!v) return absent ? std::vector<int64_t>{*absent} : std::vector<int64_t>{};
        if (v->is_null()) return {};
        if (!v->is_array()) return {static_cast<int64_t>(integer(*v, key, 0))};
        std::vector<int64_t> ids;
        for (const json& id : *v) ids.push_back(static_cast<int64_t>(integer(id, key, 0)));
        return ids;
    }

  private:
    const json& obj_;
    const std::string& source_;
    std::string prefix_;
};

void require_object(const json& j, const std::string& what, const std::string& source) {
    if (!j.is_object())
        throw Error(source, {}, what + " must be a JSON object, found " + describe(j));
}

// Linear scaling only where a model family uses it (gemma3's global layers).
bool linear_rope_allowed(Architecture arch) { return arch == Architecture::gemma3; }

std::string unsupported_rope(const std::string& type, const std::string& key, Architecture arch) {
    return "unsupported RoPE scaling type '" + type + "' (" + key + "); supported: none, " +
           (linear_rope_allowed(arch) ? "linear, " : "") + "llama3";
}

// Phi-4-mini, StableLM and GPT-NeoX rotate only part of each head (partial_rotary_factor < 1):
// refused by name rather than run with every dimension rotated.
void refuse_partial_rotary(const Keys& keys) {
    const json* v = keys.find_set("partial_rotary_factor");
    if (!v) return;
    const double f = keys.number(*v, "partial_rotary_factor");
    if (f != 1.0)
        keys.fail("'" + keys.name("partial_rotary_factor") + "' is " + describe(*v) +
                  ": partial rotary embeddings are not supported (only 1.0)");
}

// One RoPE parameter object ({"rope_type" or older "type", "rope_theta", scaling fields}) into
// c.rope_theta (when it holds one) and c.rope_scaling.
void read_rope_object(const Keys& r, uint64_t max_positions, ModelConfig& c) {
    refuse_partial_rotary(r);
    c.rope_theta = r.number_or("rope_theta", c.rope_theta);
    const char* type_key = r.find_set("rope_type") ? "rope_type" : "type";
    const std::string type = r.string_or(type_key, "default");
    if (type == "default") return;
    if (type == "linear" && linear_rope_allowed(c.arch)) {
        c.rope_scaling.type = type;
        c.rope_scaling.factor = r.number("factor");
        return;
    }
    if (type != "llama3") r.fail(unsupported_rope(type, r.name(type_key), c.arch));
    c.rope_scaling.type = type;
    c.rope_scaling.factor = r.number("factor");
    c.rope_scaling.low_freq_factor = r.number("low_freq_factor");
    c.rope_scaling.high_freq_factor = r.number("high_freq_factor");
    // transformers defaults the pre-scaling context to max_position_embeddings.
    c.rope_scaling.original_max_position_embeddings =
        r.opt_dim("original_max_position_embeddings").value_or(max_positions);
}

// transformers 4.x writes `rope_theta` and `rope_scaling` ({"rope_type" or older "type": ...});
// 5.x writes one `rope_parameters` object holding rope_theta too. Like transformers, prefer a
// non-empty rope_scaling, take rope_theta from inside the object, else the top-level key.
void read_rope(const Keys& keys, const std::string& source, uint64_t max_positions,
               ModelConfig& c) {
    refuse_partial_rotary(keys);
    const json* rope = nullptr;
    std::string rope_key;
    for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
        const json* v = keys.find_set(key);
        if (!v) continue;
        if (!v->is_object())
            keys.fail("'" + std::string(key) + "' must be an object or null, found " +
                      describe(*v));
        if (!v->empty()) {
            rope = v;
            rope_key = key;
            break;
        }
    }
    c.rope_theta = keys.number_or("rope_theta", kDefaultRopeTheta);
    c.rope_scaling = RopeScaling{};
    if (!rope) return;

    // Per-layer-type RoPE (a nested object per attention kind) is a different model family.
    for (const auto& [name, value] : rope->items())
        if (value.is_object())
            keys.fail("'" + rope_key + "." + name +
                      "': RoPE parameters per layer type are not "
                      "supported");
    read_rope_object(Keys(*rope, source, rope_key + "."), max_positions, c);
}

// The first layer with a sliding window (Qwen2/3: layers below max_window_layers attend fully),
// at most num_layers. transformers 4.53+ also writes the per-layer list layer_types, which then
// decides; we run the one pattern it derives from max_window_layers (full, then sliding).
uint64_t read_window_layers(const Keys& keys, uint64_t num_layers) {
    const json* types = keys.find_set("layer_types");
    if (!types) {
        const json* v = keys.find_set("max_window_layers");
        const uint64_t m = v ? keys.integer(*v, "max_window_layers", 0) : kDefaultMaxWindowLayers;
        return std::min(m, num_layers);
    }
    if (!types->is_array() || types->size() != num_layers)
        keys.fail("'layer_types' must be a list of num_hidden_layers (" +
                  std::to_string(num_layers) + ") strings, found " + describe(*types));
    uint64_t first_sliding = num_layers;
    for (uint64_t i = 0; i < num_layers; ++i) {
        const json& t = (*types)[i];
        const bool sliding = t == "sliding_attention";
        if (!sliding && t != "full_attention")
            keys.fail("'layer_types[" + std::to_string(i) +
                      "]' must be \"full_attention\" or "
                      "\"sliding_attention\", found " +
                      describe(t));
        if (sliding && first_sliding == num_layers) first_sliding = i;
        if (!sliding && first_sliding < num_layers)
            keys.fail("'layer_types': a full-attention layer " + std::to_string(i) +
                      " after the sliding layer " + std::to_string(first_sliding) +
                      " is not supported (only full layers, then sliding ones)");
    }
    return first_sliding;
}

// Gemma3TextConfig.convert_rope_params_to_dict: rope_parameters {"full_attention": {...},
// "sliding_attention": {...}} (5.x), or rope_theta (default 1e6), rope_local_base_freq (default
// 1e4) and rope_scaling, which then applies to the full-attention layers only (4.x).
void read_gemma3_rope(const Keys& keys, const std::string& source, uint64_t max_positions,
                      ModelConfig& c) {
    c.rope_theta = keys.number_or("rope_theta", 1e6);
    c.rope_local_theta = keys.number_or("rope_local_base_freq", 1e4);
    c.rope_scaling = RopeScaling{};
    if (const json* s = keys.find_set("rope_scaling")) {
        if (!s->is_object())
            keys.fail("'rope_scaling' must be an object or null, found " + describe(*s));
        if (!s->empty()) read_rope_object(Keys(*s, source, "rope_scaling."), max_positions, c);
    }
    const json* p = keys.find_set("rope_parameters");
    if (!p) return;
    if (!p->is_object())
        keys.fail("'rope_parameters' must be an object or null, found " + describe(*p));
    for (const auto& [name, value] : p->items())
        if ((name != "full_attention" && name != "sliding_attention") || !value.is_object())
            keys.fail("'rope_parameters." + name +
                      "': expected one object for each of full_attention and sliding_attention");
    if (const auto full = p->find("full_attention"); full != p->end())
        read_rope_object(Keys(*full, source, "rope_parameters.full_attention."), max_positions, c);
    if (const auto sliding = p->find("sliding_attention"); sliding != p->end()) {
        ModelConfig local;
        local.arch = c.arch;
        local.rope_theta = c.rope_local_theta;
        read_rope_object(Keys(*sliding, source, "rope_parameters.sliding_attention."),
                         max_positions, local);
        if (local.rope_scaling.type != "none")
            keys.fail("'rope_parameters.sliding_attention': RoPE scaling '" +
                      local.rope_scaling.type + "' on the sliding layers is not supported");
        c.rope_local_theta = local.rope_theta;
    }
}

// Gemma's sliding window: sliding_window (absent: 4096, null: off) on the layers layer_types
// marks "sliding_attention" (absent: all but every sliding_window_pattern-th, as the config
// classes derive it). We run a periodic pattern: every P-th layer full (ModelConfig).
void read_layer_pattern(const Keys& keys, const ArchitectureTraits& t, ModelConfig& c) {
    c.sliding_window = keys.find("sliding_window") ? keys.opt_dim("sliding_window")
                                                   : std::optional(kDefaultSlidingWindow);
    const uint64_t n = c.num_layers;
    std::vector<bool> sliding(n);
    if (const json* types = keys.find_set("layer_types")) {
        if (!types->is_array() || types->size() != n)
            keys.fail("'layer_types' must be a list of num_hidden_layers (" + std::to_string(n) +
                      ") strings, found " + describe(*types));
        for (uint64_t i = 0; i < n; ++i) {
            const json& v = (*types)[i];
            sliding[i] = v == "sliding_attention";
            if (!sliding[i] && v != "full_attention")
                keys.fail("'layer_types[" + std::to_string(i) +
                          "]' must be \"full_attention\" or \"sliding_attention\", found " +
                          describe(v));
        }
    } else {
        const json* v = keys.find_set("sliding_window_pattern");
        const uint64_t p =
            v ? keys.integer(*v, "sliding_window_pattern") : t.default_window_pattern;
        for (uint64_t i = 0; i < n; ++i) sliding[i] = (i + 1) % p != 0;
    }
    const auto windowed = std::count(sliding.begin(), sliding.end(), true);
    if (!c.sliding_window || windowed == 0) {
        c.sliding_window.reset();
        return;
    }
    if (static_cast<uint64_t>(windowed) == n) return;  // every layer windowed: pattern 0
    for (uint64_t p = 2; p <= n; ++p) {
        bool fits = true;
        for (uint64_t i = 0; i < n && fits; ++i) fits = sliding[i] == ((i + 1) % p != 0);
        if (fits) {
            c.sliding_window_pattern = p;
            return;
        }
    }
    keys.fail(
        "'layer_types': the full-attention layers are not every P-th layer (layers P-1, "
        "2P-1, ...): not supported");
}

// What Gemma's config adds (Gemma2Config, Gemma3TextConfig).
void read_gemma(const Keys& keys, const ArchitectureTraits& t, ModelConfig& c) {
    // transformers' Gemma 2/3 read hidden_activation; older configs also carry hidden_act,
    // which they ignore.
    const std::string act = keys.string_or("hidden_activation", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh")
        keys.fail("unsupported hidden_activation '" + act + "'; supported: gelu_pytorch_tanh");
    if (keys.boolean_or("use_bidirectional_attention", false))
        keys.fail(
            "use_bidirectional_attention = true (EmbeddingGemma) is not supported: qforge "
            "runs causal language models");
    c.query_pre_attn_scalar =
        keys.number_or("query_pre_attn_scalar", t.default_query_pre_attn_scalar);
    // Absent: the class default; null: no soft-capping.
    auto softcap = [&](std::string_view key, double absent) {
        const json* v = keys.find(key);
        if (!v) return absent;
        return v->is_null() ? 0.0 : keys.number(*v, key);
    };
    c.attn_logit_softcapping = softcap("attn_logit_softcapping", t.default_attn_softcap);
    c.final_logit_softcapping = softcap("final_logit_softcapping", t.default_final_softcap);
    read_layer_pattern(keys, t, c);
}

// Checks between fields, shared by the config.json reader and the .qf header reader. Messages
// use config.json's key names, which the normalized form shares.
void validate(const ModelConfig& c, const std::string& source) {
    auto fail = [&](const std::string& detail) { throw Error(source, {}, detail); };
    // The readers give every dimension >= 1; a zero here would divide by zero below.
    for (auto [key, value] : {std::pair{"vocab_size", c.vocab_size},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"num_hidden_layers", c.num_layers},
                              {"num_attention_heads", c.num_heads},
                              {"num_key_value_heads", c.num_kv_heads},
                              {"head_dim", c.head_dim},
                              {"max_position_embeddings", c.max_position_embeddings}})
        if (value == 0) fail("'" + std::string(key) + "' must be at least 1, found 0");
    if (c.num_heads % c.num_kv_heads != 0)
        fail("num_attention_heads (" + std::to_string(c.num_heads) +
             ") is not a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");
    if (c.head_dim % 2 != 0)
        fail("head_dim (" + std::to_string(c.head_dim) + ") must be even: RoPE rotates pairs");
    // Both factors are below 2^31, so the product cannot overflow 64 bits.
    if (c.q_dim() > kMaxDim)
        fail("num_attention_heads * head_dim = " + std::to_string(c.q_dim()) + " exceeds " +
             std::to_string(kMaxDim));
    if (!std::isfinite(c.rms_norm_eps) || c.rms_norm_eps <= 0.0 || c.rms_norm_eps >= 1.0)
        fail("'rms_norm_eps' must be in (0, 1), found " + std::to_string(c.rms_norm_eps));
    if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0.0)
        fail("'rope_theta' must be a positive number, found " + std::to_string(c.rope_theta));

    // Special ids index the embedding: one past it cannot be looked up or predicted.
    auto check_id = [&](const char* key, int64_t id) {
        if (id < 0 || static_cast<uint64_t>(id) >= c.vocab_size)
            fail("'" + std::string(key) + "' " + std::to_string(id) + " is not below vocab_size " +
                 std::to_string(c.vocab_size));
    };
    if (c.bos_token_id) check_id("bos_token_id", *c.bos_token_id);
    for (int64_t id : c.eos_token_ids) check_id("eos_token_id", id);

    const RopeScaling& s = c.rope_scaling;
    if (s.type == "none") {
        if (s != RopeScaling{}) fail("rope_scaling of type 'none' must carry neutral values");
    } else if (s.type == "llama3") {
        // Llama 3 RoPE divides by low_freq_factor and by (high - low): both must be positive.
        if (!std::isfinite(s.factor) || s.factor <= 0.0)
            fail("'rope_scaling.factor' must be a positive number, found " +
                 std::to_string(s.factor));
        if (!std::isfinite(s.low_freq_factor) || s.low_freq_factor <= 0.0 ||
            !std::isfinite(s.high_freq_factor) || s.high_freq_factor <= s.low_freq_factor)
            fail("llama3 RoPE needs 0 < low_freq_factor < high_freq_factor, found " +
                 std::to_string(s.low_freq_factor) + " and " + std::to_string(s.high_freq_factor));
        if (s.original_max_position_embeddings == 0 || s.original_max_position_embeddings > kMaxDim)
            fail("'rope_scaling.original_max_position_embeddings' must be between 1 and " +
                 std::to_string(kMaxDim));
    } else if (s.type == "linear" && linear_rope_allowed(c.arch)) {
        if (!std::isfinite(s.factor) || s.factor <= 0.0)
            fail("'rope_scaling.factor' must be a positive number, found " +
                 std::to_string(s.factor));
    } else {
        fail(unsupported_rope(s.type, "rope_scaling.type", c.arch));
    }
    for (auto [key, value] : {std::pair{"query_pre_attn_scalar", c.query_pre_attn_scalar},
                              {"attn_logit_softcapping", c.attn_logit_softcapping},
                              {"final_logit_softcapping", c.final_logit_softcapping},
                              {"rope_local_theta", c.rope_local_theta}})
        if (!std::isfinite(value) || value < 0.0)
            fail("'" + std::string(key) + "' must be a positive number (or 0: unset), found " +
                 std::to_string(value));
    if (c.sliding_window_pattern == 1 || (c.sliding_window_pattern && !c.sliding_window))
        fail("'sliding_window_pattern' " + std::to_string(c.sliding_window_pattern) +
             " needs a sliding_window and at least 2");
}

}  // namespace

std::string_view architecture_name(Architecture arch) { return traits(arch).model_type; }

bool architecture_has_qk_norm(Architecture arch) { return traits(arch).features.qk_norm; }

const ArchitectureFeatures& architecture_features(Architecture arch) {
    return traits(arch).features;
}

double ModelConfig::query_scale() const {
    const double s =
        query_pre_attn_scalar > 0.0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
    return 1.0 / std::sqrt(s);
}

std::string_view architecture_hf_class(Architecture arch) { return traits(arch).hf_class; }

json hf_architecture_keys(const ModelConfig& c) {
    const ArchitectureTraits& t = traits(c.arch);
    json j = json::object();
    if (t.attention_bias == BiasRule::config_key) {
        j["attention_bias"] = c.attention_bias;
        // LlamaConfig's MLP bias flag; the Llama layout has none (parse refuses true).
        if (c.arch == Architecture::llama) j["mlp_bias"] = false;
    }
    switch (t.sliding_window) {
        case WindowRule::none:
            break;
        case WindowRule::declared:
        case WindowRule::optional:
            j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
            break;
        case WindowRule::use_sliding_window:
            j["use_sliding_window"] = c.sliding_window.has_value();
            if (c.sliding_window) {
                j["sliding_window"] = *c.sliding_window;
                j["max_window_layers"] = c.max_window_layers;
            }
            break;
        case WindowRule::layer_types: {
            j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
            json types = json::array();
            for (uint64_t i = 0; i < c.num_layers; ++i)
                types.push_back(c.attention_window(i) ? "sliding_attention" : "full_attention");
            j["layer_types"] = types;
            j["hidden_activation"] = "gelu_pytorch_tanh";
            j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
            auto cap = [](double v) { return v > 0.0 ? json(v) : json(nullptr); };
            j["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
            j["final_logit_softcapping"] = cap(c.final_logit_softcapping);
            if (c.rope_local_theta > 0.0) j["rope_local_base_freq"] = c.rope_local_theta;
            break;
        }
    }
    return j;
}

std::optional<Architecture> architecture_from_model_type(std::string_view model_type) {
    for (const auto& row : kArchitectureTraits)
        if (row.model_type == model_type) return row.arch;
    return std::nullopt;
}

std::string supported_architectures() {
    std::string s;
    for (const auto& row : kArchitectureTraits)
        s += (s.empty() ? "" : ", ") + std::string(row.model_type);
    return s;
}

// The model_type key, mapped through the one table of architectures.
static Architecture require_architecture(const Keys& keys) {
    const std::string model_type = keys.string("model_type");
    const auto arch = architecture_from_model_type(model_type);
    if (model_type == "gemma3")
        keys.fail(
            "model_type 'gemma3' is Gemma3ForConditionalGeneration (text_config with a "
            "vision tower, language_model.* tensors), which is not supported; supported: "
            "its text model as model_type 'gemma3_text' (Gemma3ForCausalLM)");
    if (!arch)
        keys.fail("unsupported architecture '" + model_type +
                  "' (model_type); supported: " + supported_architectures());
    return *arch;
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
    require_object(j, "config.json", source);
    const Keys keys(j, source);
    ModelConfig c;

    c.arch = require_architecture(keys);
    const ArchitectureTraits& t = traits(c.arch);

    // Only what the runtime implements: SiLU-gated MLP without biases (Gemma: GeGLU, read_gemma).
    const std::string act = keys.string_or("hidden_act", "silu");
    if (act != "silu" && !t.features.gelu_tanh)
        keys.fail("unsupported hidden_act '" + act + "'; supported: silu");
    if (keys.boolean_or("mlp_bias", false))
        keys.fail("mlp_bias = true is not supported: the Llama layout has no MLP biases");

    c.vocab_size = keys.dim("vocab_size");
    c.hidden_size = keys.dim("hidden_size");
    c.intermediate_size = keys.dim("intermediate_size");
    c.num_layers = keys.dim("num_hidden_layers");
    c.num_heads = keys.dim("num_attention_heads");

    // An absent key takes the class default; an explicit null means "one per query head".
    if (keys.find("num_key_value_heads") == nullptr)
        c.num_kv_heads = t.absent_num_kv_heads.value_or(c.num_heads);
    else
        c.num_kv_heads = keys.opt_dim("num_key_value_heads").value_or(c.num_heads);

    if (auto head_dim = keys.opt_dim("head_dim")) {
        c.head_dim = *head_dim;
    } else if (!keys.find("head_dim") && t.absent_head_dim) {
        c.head_dim = *t.absent_head_dim;
    } else {
        if (c.hidden_size % c.num_heads != 0)
            keys.fail("hidden_size (" + std::to_string(c.hidden_size) +
                      ") is not a multiple of num_attention_heads (" + std::to_string(c.num_heads) +
                      ") and head_dim is not given");
        c.head_dim = c.hidden_size / c.num_heads;
    }

    c.max_position_embeddings =
        keys.opt_dim("max_position_embeddings").value_or(t.default_max_position_embeddings);
    c.rms_norm_eps = keys.number_or("rms_norm_eps", kDefaultRmsNormEps);
    if (c.arch == Architecture::gemma3)
        read_gemma3_rope(keys, source, c.max_position_embeddings, c);
    else
        read_rope(keys, source, c.max_position_embeddings, c);
    c.tie_word_embeddings = keys.boolean_or("tie_word_embeddings", t.default_tie_word_embeddings);

    switch (t.attention_bias) {
        case BiasRule::config_key:
            c.attention_bias = keys.boolean_or("attention_bias", false);
            break;
        case BiasRule::always:
            c.attention_bias = true;
            break;
        case BiasRule::never:
            c.attention_bias = false;
            break;
    }

    c.bos_token_id = keys.token_id("bos_token_id", t.default_bos_token_id);
    c.eos_token_ids = keys.token_ids("eos_token_id", t.default_eos_token_id);

    const bool has_window = t.sliding_window == WindowRule::declared ||
                            (t.sliding_window == WindowRule::use_sliding_window &&
                             keys.boolean_or("use_sliding_window", false));
    if (has_window)
        c.sliding_window = keys.find("sliding_window") ? keys.opt_dim("sliding_window")
                                                       : std::optional(kDefaultSlidingWindow);
    if (t.sliding_window == WindowRule::optional) c.sliding_window = keys.opt_dim("sliding_window");
    if (c.sliding_window && t.sliding_window == WindowRule::use_sliding_window)
        c.max_window_layers = read_window_layers(keys, c.num_layers);
    if (t.sliding_window == WindowRule::layer_types) read_gemma(keys, t, c);

    // transformers 5.x renamed torch_dtype to dtype.
    c.torch_dtype = keys.string_or(keys.find_set("torch_dtype") ? "torch_dtype" : "dtype", "");

    validate(c, source);
    return c;
}

ModelConfig read_model_config(const std::string& path) {
    return parse_model_config(read_json_file(path), path);
}

json model_dims_to_json(const ModelConfig& c) {
    return json{{"model_type", architecture_name(c.arch)},
                {"vocab_size", c.vocab_size},
                {"hidden_size", c.hidden_size},
                {"intermediate_size", c.intermediate_size},
                {"num_hidden_layers", c.num_layers},
                {"num_attention_heads", c.num_heads},
                {"num_key_value_heads", c.num_kv_heads},
                {"head_dim", c.head_dim},
                {"max_position_embeddings", c.max_position_embeddings},
                {"rms_norm_eps", c.rms_norm_eps},
                {"rope_theta", c.rope_theta},
                {"tie_word_embeddings", c.tie_word_embeddings}};
}

json model_config_to_json(const ModelConfig& c) {
    const RopeScaling& s = c.rope_scaling;
    json eos = json::array();
    for (int64_t id : c.eos_token_ids) eos.push_back(id);
    json j = model_dims_to_json(c);
    j.update(json{
        {"rope_scaling",
         {{"type", s.type},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_max_position_embeddings}}},
        {"attention_bias", c.attention_bias},
        {"bos_token_id", c.bos_token_id ? json(*c.bos_token_id) : json(nullptr)},
        {"eos_token_ids", eos},
        {"sliding_window", c.sliding_window ? json(*c.sliding_window) : json(nullptr)},
        {"torch_dtype", c.torch_dtype},
    });
    // Only where some layers attend fully, so files of every other model keep their bytes.
    if (c.sliding_window && c.max_window_layers > 0) j["max_window_layers"] = c.max_window_layers;
    // Gemma's (docs/FORMAT.md): written for its architectures only, for the same reason.
    if (traits(c.arch).sliding_window == WindowRule::layer_types)
        j.update(json{{"sliding_window_pattern", c.sliding_window_pattern},
                      {"query_pre_attn_scalar", c.query_pre_attn_scalar},
                      {"attn_logit_softcapping", c.attn_logit_softcapping},
                      {"final_logit_softcapping", c.final_logit_softcapping},
                      {"rope_local_theta", c.rope_local_theta}});
    return j;
}

ModelConfig model_config_from_json(const json& j, const std::string& source) {
    require_object(j, "model config", source);
    const Keys keys(j, source);
    ModelConfig c;

    c.arch = require_architecture(keys);
    c.vocab_size = keys.dim("vocab_size");
    c.hidden_size = keys.dim("hidden_size");
    c.intermediate_size = keys.dim("intermediate_size");
    c.num_layers = keys.dim("num_hidden_layers");
    c.num_heads = keys.dim("num_attention_heads");
    c.num_kv_heads = keys.dim("num_key_value_heads");
    c.head_dim = keys.dim("head_dim");
    c.max_position_embeddings = keys.dim("max_position_embeddings");
    c.rms_norm_eps = keys.number("rms_norm_eps");
    c.rope_theta = keys.number("rope_theta");

    const json& rope = keys.required("rope_scaling");
    require_object(rope, "'rope_scaling'", source);
    const Keys r(rope, source, "rope_scaling.");
    c.rope_scaling.type = r.string("type");
    c.rope_scaling.factor = r.number("factor");
    c.rope_scaling.low_freq_factor = r.number("low_freq_factor");
    c.rope_scaling.high_freq_factor = r.number("high_freq_factor");
    c.rope_scaling.original_max_position_embeddings = r.integer(
        r.required("original_max_position_embeddings"), "original_max_position_embeddings", 0);

    c.tie_word_embeddings = keys.boolean("tie_word_embeddings");
    c.attention_bias = keys.boolean("attention_bias");
    // Nullable keys must still be present: the normalized form spells out every field.
    for (std::string_view key : {"bos_token_id", "sliding_window"})
        if (!keys.find(key)) keys.fail("missing required key '" + std::string(key) + "'");
    c.bos_token_id = keys.token_id("bos_token_id", std::nullopt);
    const json& eos = keys.required("eos_token_ids");
    if (!eos.is_array())
        keys.fail("'eos_token_ids' must be a list of integers, found " + describe(eos));
    c.eos_token_ids = keys.token_ids("eos_token_ids", std::nullopt);
    c.sliding_window = keys.opt_dim("sliding_window");
    // Absent: every layer is windowed (written only when some are not).
    if (keys.find("max_window_layers")) {
        if (!c.sliding_window) keys.fail("'max_window_layers' without a sliding_window");
        c.max_window_layers = keys.integer(keys.required("max_window_layers"), "max_window_layers");
    }
    if (!keys.find("torch_dtype")) keys.fail("missing required key 'torch_dtype'");
    c.torch_dtype = keys.string_or("torch_dtype", "");
    // Gemma's keys, required for its architectures (and refused for others: their files have
    // none).
    const bool gemma = traits(c.arch).sliding_window == WindowRule::layer_types;
    for (std::string_view key :
         {"sliding_window_pattern", "query_pre_attn_scalar", "attn_logit_softcapping",
          "final_logit_softcapping", "rope_local_theta"})
        if (gemma != (keys.find(key) != nullptr))
            keys.fail(std::string(gemma ? "missing required key '" : "unexpected key '") +
                      std::string(key) + "' for model_type '" +
                      std::string(architecture_name(c.arch)) + "'");
    if (gemma) {
        c.sliding_window_pattern =
            keys.integer(keys.required("sliding_window_pattern"), "sliding_window_pattern", 0);
        c.query_pre_attn_scalar = keys.number("query_pre_attn_scalar");
        c.attn_logit_softcapping = keys.number("attn_logit_softcapping");
        c.final_logit_softcapping = keys.number("final_logit_softcapping");
        c.rope_local_theta = keys.number("rope_local_theta");
    }

    validate(c, source);
    return c;
}

}  // namespace qforge
