#include "runtime/model.hpp"

#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"

namespace qforge {

namespace {

std::string shape_text(const std::vector<uint64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// Structural limits the runtime relies on for memory safety; model_config_from_json already
// checks the values are positive integers.
void check_runnable(const ModelConfig& c, const std::string& path) {
    auto fail = [&](const std::string& what) { throw Error(path, {}, "model config: " + what); };
    if (c.num_kv_heads == 0 || c.num_heads % c.num_kv_heads != 0)
        fail("num_attention_heads (" + std::to_string(c.num_heads) +
             ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) +
             ")");
    if (c.head_dim == 0 || c.head_dim % 2 != 0)
        fail("head_dim must be even for rotary embeddings, found " + std::to_string(c.head_dim));
    if (c.vocab_size == 0 || c.vocab_size > (uint64_t{1} << 31))
        fail("vocab_size " + std::to_string(c.vocab_size) + " is outside 1 .. 2^31");
    if (c.max_position_embeddings == 0) fail("max_position_embeddings is 0");
}

}  // namespace

Model::Model(const std::string& path) : file_(path) {
    config_ = model_config_from_json(file_.model(), path);
    check_runnable(config_, path);

    for (const auto& spec : expected_tensors(config_)) {
        const std::string& name = spec.name;
        const QfTensorInfo& t = file_.at(name);
        if (t.shape != spec.shape)
            throw Error(
                path, name,
                "shape " + shape_text(t.shape) + ", the config needs " + shape_text(spec.shape));
    }

    embed_ = load_matrix("embed");
    if (!config_.tie_word_embeddings) lm_head_ = load_matrix("lm_head");
    final_norm_ = load_vector("final_norm");
    layers_.resize(config_.num_layers);
    for (uint64_t i = 0; i < config_.num_layers; ++i) {
        const std::string p = "layers." + std::to_string(i) + ".";
        LayerWeights& l = layers_[i];
        l.attn_norm = load_vector(p + "attn_norm");
        l.mlp_norm = load_vector(p + "mlp_norm");
        l.q = load_matrix(p + "attn.q");
        l.k = load_matrix(p + "attn.k");
        l.v = load_matrix(p + "attn.v");
        l.o = load_matrix(p + "attn.o");
        if (config_.attention_bias) {
            l.q_bias = load_vector(p + "attn.q_bias");
            l.k_bias = load_vector(p + "attn.k_bias");
            l.v_bias = load_vector(p + "attn.v_bias");
        }
        l.gate = load_matrix(p + "mlp.gate");
        l.up = load_matrix(p + "mlp.up");
        l.down = load_matrix(p + "mlp.down");
    }
}

std::span<const uint8_t> Model::bytes(const QfTensorInfo& t) {
    std::vector<uint8_t> scratch;
    auto b = file_.tensor_bytes(t, scratch);
    if (t.encoding == QfEncoding::raw) return b;
    decoded_.push_back(std::move(scratch));
    return decoded_.back();
}

Matrix Model::load_matrix(const std::string& name) {
    const QfTensorInfo& t = file_.at(name);
    return Matrix{name, t.qtype, bytes(t).data(), t.shape.at(0), t.shape.at(1)};
}

std::vector<float> Model::load_vector(const std::string& name) {
    const QfTensorInfo& t = file_.at(name);
    auto b = bytes(t);
    std::vector<float> v(t.shape.at(0));
    if (qtype_is_quantized(t.qtype))
        throw Error(path(), name, "vectors (norms, biases) must be stored as float, found " +
                                      std::string(qtype_traits(t.qtype).name));
    dequantize_row_ref(t.qtype, b.data(), v.size(), v.data());
    return v;
}

uint64_t Model::decode_weight_bytes() const {
    uint64_t n = lm_head().bytes();
    for (const auto& l : layers_)
        n += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() +
             l.down.bytes();
    return n;
}

}  // namespace qforge
