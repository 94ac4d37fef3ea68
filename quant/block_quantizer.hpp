// One decoder block of the layer-sequential pipeline (quant/layer_sequential.hpp): the block runs
// through the calibration forward (quant/block_forward.hpp, the transformer of
// runtime/transformer.hpp), and this hook quantizes each group of linears when the forward
// reaches its input, then swaps their quantized weights into the view, so o sees the outputs of
// the quantized q/k/v and down those of the quantized gate/up ("true sequential").
//
// GPTQ: before q/k/v, o, gate/up and down, the H of the input they share; GPTQ on each linear.
// AWQ (quant/awq.hpp): before each norm, the scale searches on the float block: q/k/v and v -> o
// before the attention norm, gate/up and down before the MLP norm; the scales are folded into
// the block's float weights (the norm then runs with its folded weight), and each linear gets the
// clipping search (not q, k) and RTN (awq) or GPTQ (awq+gptq) on the inputs it sees after
// folding. The folded norms and v bias are handed to the writer too.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/awq.hpp"
#include "quant/block_forward.hpp"
#include "quant/hessian.hpp"
#include "quant/layer_sequential.hpp"

namespace qforge {

// AWQ: tokens (a strided subsample) on which the gate/up scale search runs the MLP per alpha.
inline constexpr uint64_t kAwqSearchTokens = 4096;

// What the pipeline lends one block: its inputs, and where the results go.
struct BlockQuantContext {
    const ModelSource& src;
    const std::vector<QType>& qtypes;  // planned type per source tensor
    const CalibratedOptions& options;
    ThreadPool& pool;
    const std::map<std::string, size_t>& index;     // source tensor by name
    std::map<size_t, std::vector<uint8_t>>& ready;  // out: the block's quantized tensors
    std::vector<LinearReport>& linears;             // out: one report per quantized linear
    nlohmann::json& awq_clips;                      // out (AWQ): per linear, groups clipped
};

class BlockQuantizer final : public ProductHook {
  public:
    BlockQuantizer(const BlockQuantContext& ctx, BlockForward& f, uint64_t layer);

    // Runs the block on x ([tokens][hidden], in place: the next block's input, computed with
    // every weight quantized) and quantizes its linears. Returns the AWQ record of the block's
    // scale searches (null for GPTQ).
    // `buffers`: the forward's activations (BlockForward::activations), kept by the caller from
    // block to block.
    nlohmann::json run(std::vector<float>& x, BlockForward::Buffers& buffers);

  private:
    void before_products(Weight first, Rows in, uint64_t n) override;
    void before_norm(Norm which, Rows in, uint64_t n) override;

    size_t at(Weight w) const;
    size_t at(const std::string& suffix) const;
    bool float_source(Weight w) const;
    bool all_float(std::initializer_list<Weight> ws) const;
    std::vector<float> load_vector(const std::string& suffix) const;
    void load_block();
    void set_view();
    // H of n rows of k inputs; their mean |x| too where mean_abs (the AWQ searches read it).
    HessianStats hessian(Rows in, uint64_t k, uint64_t n, bool mean_abs = false) const;
    void store_float(const std::string& suffix, const std::vector<float>& v);
    void quantize(Weight w, const std::vector<double>& h, const std::vector<float>& s_in,
                  bool clip);
    void quantize_rtn(Weight w, const std::vector<float>& wf, const std::vector<double>& h);
    void quantize_awq(Weight w, const std::vector<float>& wf, const std::vector<double>& h,
                      const std::vector<float>& s_in, bool clip);
    std::vector<float> search(const char* what, const std::vector<double>& x_mean,
                              const std::vector<AwqLinear>& linears, uint64_t k,
                              const AwqEvaluate& evaluate);
    void search_attention(Rows x, uint64_t n);
    void search_mlp(Rows x, uint64_t n);

    const BlockQuantContext& ctx_;
    BlockForward& f_;
    const ModelConfig& c_;
    uint64_t layer_;
    std::string prefix_;  // "layers.N."
    bool awq_, use_gptq_;

    AwqBlock b_;  // float weights (AWQ folds into them)
    std::vector<float> q_bias_, k_bias_;
    std::vector<float> q_norm_, k_norm_;  // QK-norm weights, unchanged by AWQ (after q/k)
    // Gemma's post-norms, unchanged by AWQ: they normalize o's and down's outputs, whose scale
    // the folding keeps.
    std::vector<float> attn_post_norm_, mlp_post_norm_;
    std::array<std::vector<float>, kBlockLinears> quantized_;  // dequantized; empty: use b_
    AwqBlockScales scales_;
    HessianStats searched_;  // AWQ: the H a search computed, of the norm output after the fold
    bool have_searched_ = false;
    nlohmann::json groups_ = nlohmann::json::object();
    BlockActivations a_;
};

}  // namespace qforge
