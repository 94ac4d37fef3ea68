// The quantize pipeline: a model (any input kind, sources/model_source.hpp)
// in, a quantized .qf out. Streams tensor by tensor in canonical order: read the stored rows,
// choose the type (quant/recipe.hpp), quantize (quant/rtn.hpp), write, release the input's
// pages, so peak memory stays near the largest tensor. Nothing appears under the output name
// until the whole file is written (QfWriter), so a failure leaves nothing behind.
//
// The .qf header records what was done, under "provenance" (docs/FORMAT.md):
//   generator      {name, version}, as convert writes it
//   sources        [{file, bytes, hash}] of the input files (the .qf, or config + shards +
//                  tokenizer)
//   recipe         {command: "quantize", source_format: "qf" | "safetensors" | "gguf" | "llama2c"}
//   quantization   {method, qtype, overrides: ["REGEX=TYPE"], classes: [{class, qtype, tensors,
//                  reason}], qtypes: {type: tensors}, version, size_plan (with a target: the
//                  target, candidates, tokens, budget, predicted KLD and each planned tensor's
//                  divergence per candidate; its choices are the overrides' "^name$=type")}
//   input_provenance   the input .qf's own provenance (a .qf input only), so the chain back to
//                  the original checkpoint stays in the file
// Nothing depends on the thread count, so the file is byte-identical whatever --threads is.
#pragma once

#include "quant/layer_sequential.hpp"

#include <cstdint>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "quant/recipe.hpp"
#include "quant/size_plan.hpp"

namespace qforge {

// Mixed precision to a size (quant/size_plan.hpp): the whole file within `bytes`, or within
// bpw bits per weight of the model's parameters. Needs calibration text and a float .qf input.
struct SizeTarget {
    uint64_t bytes = 0;  // > 0: --target-size
    double bpw = 0.0;    // > 0: --target-bpw
    std::vector<QType> qtypes{std::begin(kSizePlanTypes), std::end(kSizePlanTypes)};
    uint64_t tokens = kSizePlanTokens;
    bool set() const { return bytes > 0 || bpw > 0.0; }
};

struct QuantizeOptions {
    std::string input;      // .qf file or Hugging Face checkpoint
    std::string output;     // .qf path
    std::string tokenizer;  // checkpoints only; empty: found beside it
    QuantRecipe recipe;
    CalibratedOptions calibrated;  // calibrated methods (gptq): data and method options
    SizeTarget target;             // unset: every tensor by the recipe
    int threads = 1;
};

// What the command line said about each method option; nullopt: the method's default
// (recipe.hpp, kQuantMethods' MethodDefaults).
struct MethodChoices {
    std::optional<bool> importance, act_order, mse, refit;
    std::optional<double> damp;
    std::optional<uint64_t> nsamples;
};

// Fills `options`' method options from `choices` over the method's defaults. RTN's importance
// default applies only when calibration files are given (plain RTN reads no text). Throws
// qforge::Error for choices that contradict each other or the method: importance and mse both
// asked; importance (asked) without calibration text; RTN with text but without importance.
void resolve_method_options(QuantMethod method, const MethodChoices& choices,
                            CalibratedOptions& options);

// One tensor's decision, known before any tensor is read.
struct TensorPlan {
    std::string name;
    std::vector<uint64_t> shape;
    QType source;  // stored type in the input
    TensorChoice choice;
};

// Tensors that share a class, a type and a reason: how the decisions are reported.
struct PlanGroup {
    TensorClass cls;
    QType qtype;
    std::string reason;
    uint64_t tensors = 0;
};
std::vector<PlanGroup> group_plan(const std::vector<TensorPlan>& plan);

struct QuantizedTensor {
    std::string name;
    TensorClass cls = TensorClass::linear;
    QType source = QType::f32, qtype = QType::f32;
    std::vector<uint64_t> shape;
    uint64_t parameters = 0;
    uint64_t bytes = 0;   // stored bytes: scales, zeros and row padding included
    bool copied = false;  // already stored as the target type: bytes copied as they were
};

struct QuantizeReport {
    std::vector<QuantizedTensor> tensors;
    std::vector<PlanGroup> groups;
    uint64_t parameters = 0;
    uint64_t tensor_bytes = 0;   // sum of the tensors' bytes
    uint64_t bytes_written = 0;  // the whole file
    double seconds = 0.0;
    std::string tokenizer;              // the tokenizer file embedded from a checkpoint
    std::vector<std::string> warnings;  // shown to the user; quantization still succeeded
    std::vector<LinearReport> linears;  // calibrated methods: each quantized linear's error
    nlohmann::json size_plan;           // with a target: the header's size_plan record
};

// Called once the plan is made, before the first tensor is read (the CLI prints it).
using PlanCallback = std::function<void(const std::vector<TensorPlan>&)>;

QuantizeReport quantize_model(const QuantizeOptions& options, const PlanCallback& on_plan = {});

}  // namespace qforge
