// A model loaded from a .qf file: the configuration and views of every weight. Matrices are used
// in place from the file's mapping (zero copy; the page cache holds them once); only zstd-encoded
// tensors are decoded into memory the Model owns. Norm weights and biases, a few kB, are
// converted to float32 at load so every backend reads them the same way.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/qtype.hpp"
#include "runtime/transformer.hpp"

namespace qforge {

// A 2-D weight [rows = out, cols = in], row-major in its stored qtype.
struct Matrix {
    std::string name;  // our tensor name, for errors
    QType qtype = QType::f32;
    const uint8_t* data = nullptr;
    uint64_t rows = 0, cols = 0;
    // Stored column j holds input col_perm[j] (an act-order GPTQ import; QfTensorInfo): a
    // product gathers its input by it first. nullptr: columns in input order.
    const uint32_t* col_perm = nullptr;

    uint64_t row_bytes() const { return *qtype_row_bytes(qtype, cols); }
    const uint8_t* row(uint64_t r) const { return data + r * row_bytes(); }
    uint64_t bytes() const { return rows * row_bytes(); }
};

struct LayerWeights {
    std::vector<float> attn_norm, mlp_norm;
    std::vector<float> q_bias, k_bias, v_bias;  // empty unless config.attention_bias
    std::vector<float> q_norm, k_norm;          // [head_dim]; empty unless the arch has QK-norm
    std::vector<float> attn_post_norm, mlp_post_norm;  // empty unless sandwich norms (Gemma)
    Matrix q, k, v, o, gate, up, down;
};

class Model {
  public:
    // Opens the file, which QfFile validates against its config and the architecture table
    // (formats/qf_validate.hpp). Throws qforge::Error naming the file and the tensor.
    explicit Model(const std::string& path);

    const std::string& path() const { return file_.path(); }
    const QfFile& file() const { return file_; }
    const ModelConfig& config() const { return config_; }
    const Matrix& embed() const { return embed_; }
    const Matrix& lm_head() const { return config_.tie_word_embeddings ? embed_ : lm_head_; }
    const std::vector<float>& final_norm() const { return final_norm_; }
    const std::vector<LayerWeights>& layers() const { return layers_; }

    // By role (runtime/transformer.hpp; the layer is ignored for lm_head and the final norm).
    const Matrix& weight(uint64_t layer, Weight w) const;
    const std::vector<float>& norm(uint64_t layer, Norm which) const;
    // The bias of q, k or v: empty unless config.attention_bias (and for every other weight).
    const std::vector<float>& bias(uint64_t layer, Weight w) const;

    // Drops m's pages from this process when they lie in the file's mapping (a backend that
    // keeps its own copy of m, the CPU backend's packed rows, no longer reads them); a later read
    // faults them back in from the page cache. Decoded tensors are left alone.
    void release_pages(const Matrix& m) const;
    // Whether m's bytes lie in the file's mapping (not decoded into memory of their own).
    bool in_file(const Matrix& m) const;

    // Bytes of weights a single-token decode reads: every layer matrix and the LM head (the
    // embedding contributes one row, not counted). For bandwidth ratios.
    uint64_t decode_weight_bytes() const;

  private:
    Matrix load_matrix(const std::string& name);
    std::vector<float> load_vector(const std::string& name);
    std::span<const uint8_t> bytes(const QfTensorInfo& t);

    QfFile file_;
    ModelConfig config_;
    std::deque<std::vector<uint8_t>> decoded_;  // zstd tensors, decoded once
    Matrix embed_, lm_head_;
    std::vector<float> final_norm_;
    std::vector<LayerWeights> layers_;
};

}  // namespace qforge
