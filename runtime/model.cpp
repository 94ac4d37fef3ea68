#include "runtime/model.hpp"

#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/architectures.hpp"

namespace qforge {

namespace {

// Where each kind of tensor goes: a matrix or a float vector of one layer, or of the model.
struct Slot {
    Matrix LayerWeights::*layer_matrix = nullptr;
    std::vector<float> LayerWeights::*layer_vector = nullptr;
};

Slot layer_slot(TensorKind kind) {
    switch (kind) {
        case TensorKind::attn_norm:
            return {nullptr, &LayerWeights::attn_norm};
        case TensorKind::attn_q:
            return {&LayerWeights::q, nullptr};
        case TensorKind::attn_k:
            return {&LayerWeights::k, nullptr};
        case TensorKind::attn_v:
            return {&LayerWeights::v, nullptr};
        case TensorKind::attn_o:
            return {&LayerWeights::o, nullptr};
        case TensorKind::attn_q_bias:
            return {nullptr, &LayerWeights::q_bias};
        case TensorKind::attn_k_bias:
            return {nullptr, &LayerWeights::k_bias};
        case TensorKind::attn_v_bias:
            return {nullptr, &LayerWeights::v_bias};
        case TensorKind::attn_q_norm:
            return {nullptr, &LayerWeights::q_norm};
        case TensorKind::attn_k_norm:
            return {nullptr, &LayerWeights::k_norm};
        case TensorKind::mlp_norm:
            return {nullptr, &LayerWeights::mlp_norm};
        case TensorKind::attn_post_norm:
            return {nullptr, &LayerWeights::attn_post_norm};
        case TensorKind::mlp_post_norm:
            return {nullptr, &LayerWeights::mlp_post_norm};
        case TensorKind::mlp_gate:
            return {&LayerWeights::gate, nullptr};
        case TensorKind::mlp_up:
            return {&LayerWeights::up, nullptr};
        case TensorKind::mlp_down:
            return {&LayerWeights::down, nullptr};
        case TensorKind::embed:
        case TensorKind::final_norm:
        case TensorKind::lm_head:
            break;
    }
    return {};
}

}  // namespace

// The file was validated at open (formats/qf_validate.hpp): every tensor the architecture table
// expects for this config exists with its shape and a qtype its class allows, so loading only
// takes views, each to the field its row's kind names.
Model::Model(const std::string& path) : file_(path), config_(file_.config()) {
    layers_.resize(config_.num_layers);
    for (const TensorSpec& spec : expected_tensors(config_)) {
        switch (spec.row->kind) {
            case TensorKind::embed:
                embed_ = load_matrix(spec.name);
                continue;
            case TensorKind::lm_head:
                lm_head_ = load_matrix(spec.name);
                continue;
            case TensorKind::final_norm:
                final_norm_ = load_vector(spec.name);
                continue;
            default:
                break;
        }
        const Slot slot = layer_slot(spec.row->kind);
        LayerWeights& layer = layers_.at(spec.layer);
        if (slot.layer_matrix)
            layer.*slot.layer_matrix = load_matrix(spec.name);
        else
            layer.*slot.layer_vector = load_vector(spec.name);
    }
}

std::span<const uint8_t> Model::bytes(const QfTensorInfo& t) {
    std::vector<uint8_t> scratch;
    auto b = file_.tensor_bytes(t, scratch);
    if (scratch.empty()) return b;  // in the mapping (not decoded nor repacked)
    decoded_.push_back(std::move(scratch));
    return decoded_.back();
}

bool Model::in_file(const Matrix& m) const {
    for (const auto& d : decoded_)
        if (m.data >= d.data() && m.data < d.data() + d.size()) return false;
    return true;
}

void Model::release_pages(const Matrix& m) const {
    if (!in_file(m)) return;
    if (const QfTensorInfo* t = file_.find(m.name)) file_.release(*t);
}

Matrix Model::load_matrix(const std::string& name) {
    const QfTensorInfo& t = file_.at(name);
    return Matrix{name,          t.qtype,       bytes(t).data(),
                  t.shape.at(0), t.shape.at(1), t.col_perm.empty() ? nullptr : t.col_perm.data()};
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
    const LayerWeights& l = layers_.at(layer);
    switch (which) {
        case Norm::q:
            return l.q_norm;
        case Norm::k:
            return l.k_norm;
        case Norm::mlp:
            return l.mlp_norm;
        case Norm::attn_post:
            return l.attn_post_norm;
        case Norm::mlp_post:
            return l.mlp_post_norm;
        default:
            return l.attn_norm;
    }
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
