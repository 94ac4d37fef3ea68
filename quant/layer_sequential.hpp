// The layer-sequential calibrated pipeline (GPTQ, AWQ, AWQ+GPTQ, importance-weighted RTN): the
// calibration batch runs through the model block by block. In each block the inputs of each linear
// are collected once per shared input (q/k/v share one, gate/up share one), the linears are
// quantized, and the block is re-run with its quantized weights so that o_proj sees the outputs of
// the already-quantized q/k/v and down_proj those of the quantized gate/up ("true sequential"); the
// block's output, computed with every weight quantized, is the next block's input.
//
// AWQ (quant/awq.hpp) first searches each block's scales on the float block: q/k/v (inspected:
// their outputs concatenated), v -> o (only when num_kv_heads == num_heads; inspected: o's
// output), gate/up (inspected: the MLP's output, down in float, on a strided subsample of at
// most 4096 tokens) and down (inspected: its output); folds them into attn_norm, q/k/v columns,
// v rows (and bias), o columns, mlp_norm, gate/up columns, up rows and down columns; then each
// linear gets the clipping search (not q, k) and RTN (awq) or GPTQ (awq+gptq) with the H of the
// inputs it sees after folding. The folded norms and v bias are handed to the writer too. Each
// linear's error is reported against RTN of its unscaled, unclipped weights on the same inputs.
//
// It serves quantize_model's streaming writer: take(i) returns the quantized bytes of source
// tensor i when this method made them, running the next block when the writer reaches it
// (tensors come in canonical order, a block's after the previous block's). So only one block's
// float weights, its quantized tensors and the calibration activations are in memory:
//   hidden states x and x1, and one normalized copy: 3 * N * hidden floats
//   the MLP's activation m: N * intermediate floats
//   one Hessian: k * k doubles (k <= intermediate)
// For a 1.1B Llama (hidden 2048, intermediate 5632) with 128 x 512 calibration tokens (N = 65536):
// 1.6 GB + 1.5 GB + 0.25 GB, plus one block's weights (~90 MB in f32), about 3.4 GB in all.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "quant/calibration.hpp"
#include "quant/gptq.hpp"
#include "quant/recipe.hpp"
#include "quant/resume_state.hpp"
#include "sources/model_source.hpp"

namespace qforge {

class ThreadPool;

struct CalibratedOptions {
    CalibrationOptions calibration;
    QuantMethod method = QuantMethod::gptq;  // gptq, awq or awq_gptq
    double damp = 0.01;                      // GPTQ: fraction of mean(diag H) added to the diagonal
    bool act_order = false;                  // GPTQ: columns by decreasing diag(H), static groups
    bool refit = false;  // GPTQ: grids refitted to the codes (quant/grid_refit.hpp)
    double mse = 0.0;    // GPTQ: > 0, grids searched (GptqOptions::mse)
    // Every method: each group's grid by the diag(H)-weighted search (quant/rtn_importance.hpp);
    // method rtn then runs the pipeline too (one calibration pass, the grids weighted).
    bool importance = false;
    CalibProducts products = CalibProducts::f32;  // the forward's and H's (quant/calibration.hpp)
    std::string resume_dir;  // --resume: per-block state (quant/resume_state.hpp); empty: none
};

// One quantized linear's figures, for the report and the header.
struct LinearReport {
    std::string name;
    std::string qtype;
    double relative_error = 0.0;      // sqrt(trace(E H E^T) / trace(W H W^T)), GPTQ's rows
    double rtn_relative_error = 0.0;  // the same for RTN's rows on the same inputs
    double damp = 0.0;
    int damp_raises = 0;
};

class LayerSequential {
  public:
    // `qtypes[i]`: the type chosen for source tensor i (quantize_model's plan). With `resume`,
    // each finished block is saved there, and blocks already saved are served from it (their
    // tensors loaded when the writer reaches them; the hidden states from the last one).
    LayerSequential(const ModelSource& source, std::vector<QType> qtypes,
                    const CalibrationSet& calibration, const CalibratedOptions& options,
                    ThreadPool& pool, std::unique_ptr<ResumeDir> resume = nullptr);
    ~LayerSequential();

    // The bytes of source tensor i in its chosen type when this method quantized it (the
    // block's linears), else nullopt (the caller quantizes it by RTN or copies it).
    std::optional<std::vector<uint8_t>> take(size_t tensor);

    const std::vector<LinearReport>& linears() const { return linears_; }
    nlohmann::json record() const;  // for the .qf header

  private:
    void run_layer(uint64_t layer);
    void save_layer(uint64_t layer, size_t first_linear, size_t first_clip);
    void restore_layer(uint64_t layer);

    struct State;
    std::unique_ptr<State> s_;
    std::vector<LinearReport> linears_;
};

}  // namespace qforge
