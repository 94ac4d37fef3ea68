#include "runtime/model.hpp"

#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace qforge {

// The file was validated at open (formats/qf_validate.hpp): every tensor below exists with the
// shape the config gives and a qtype its kind allows, so loading only takes views.
Model::Model(const std::string& path) : file_(path), config_(file_.config()) {
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
    dequantize_row_ref(t.qtype, b.data(), v.size(), v.data());
    return v;
}

const Matrix& Model::weight(uint64_t layer, Weight w) const {
    if (w == Weight::lm_head) return lm_head();
    const LayerWeights& l = layers_.at(layer);
    const Matrix* m[kBlockLinears] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
    return *m[static_cast<int>(w)];
}

const std::vector<float>& Model::norm(uint64_t layer, Norm which) const {
    if (which == Norm::final) return final_norm_;
    return which == Norm::attn ? layers_.at(layer).attn_norm : layers_.at(layer).mlp_norm;
}

const std::vector<float>& Model::bias(uint64_t layer, Weight w) const {
    static const std::vector<float> none;
    if (w != Weight::q && w != Weight::k && w != Weight::v) return none;
    const LayerWeights& l = layers_.at(layer);
    return w == Weight::q ? l.q_bias : w == Weight::k ? l.k_bias : l.v_bias;
}

uint64_t Model::decode_weight_bytes() const {
    uint64_t n = lm_head().bytes();
    for (const auto& l : layers_)
        n += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() +
             l.down.bytes();
    return n;
}

}  // namespace qforge
