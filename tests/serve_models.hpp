// Models for the paged-cache, batched-forward and scheduler tests (tests/paged_kv_cache_test.cpp,
// batch_forward_test.cpp, serve_scheduler_test.cpp): stories260K as converted (f32) and
// quantized to q4_g128 (int8 activations through the quantized kernels), and the tiny Hugging
// Face checkpoints of tests/data/hf_models (GQA, qkv biases, sliding windows, QK-norm), each
// converted once into a scratch folder.
#pragma once

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "quant/quantize_model.hpp"
#include "runtime/backend.hpp"
#include "serve_check.hpp"
#include "test_support.hpp"

namespace qforge::test {

struct ServeModel {
    std::string name, path;
};

// stories260K f32 and q4_g128 when ../shared/data is there (else none), then every
// tests/data/hf_models fixture (or only those named in `only`, to keep a test short).
inline std::vector<ServeModel> serve_models(const ScratchDir& dir,
                                            const std::vector<std::string>& only = {}) {
    std::vector<ServeModel> all;
    if (auto data = shared_data_dir()) {
        const std::string f32 = convert_stories(*data, "hf", dir).string();
        all.push_back({"stories260K f32", f32});
        QuantizeOptions q;
        q.input = f32;
        q.output = (dir / "stories-q4.qf").string();
        q.recipe.qtype = QType::q4_g128;
        quantize_model(q);
        all.push_back({"stories260K q4_g128", q.output});
    }
    for (const auto& entry : std::filesystem::directory_iterator(fixture("hf_models"))) {
        if (!std::filesystem::exists(entry.path() / "reference.json")) continue;
        const std::string name = entry.path().filename().string();
        if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
        ConvertOptions o;
        o.input = entry.path().string();
        o.output = (dir / (entry.path().filename().string() + ".qf")).string();
        convert_checkpoint(o);
        all.push_back({entry.path().filename().string(), o.output});
    }
    return all;
}

// A backend that is `inner` but for its batched step: `before_step` sees each batch first (and
// may delay, to make a generation last, or throw, to fail a step); then the step runs on inner's
// forward_batch, or with `per_sequence` on Backend's default (each sequence through forward(), as
// a backend without a batched step runs: the CUDA backend's serving path).
class HookedBackend final : public Backend {
  public:
    using Hook = std::function<void(std::span<const BatchSequence>)>;
    HookedBackend(std::unique_ptr<Backend> inner, Hook before_step, bool per_sequence = false)
        : inner_(std::move(inner)),
          before_step_(std::move(before_step)),
          per_sequence_(per_sequence) {}
    std::string_view name() const override { return inner_->name(); }
    const Model& model() const override { return inner_->model(); }
    std::unique_ptr<KvCache> new_cache(uint64_t capacity) const override {
        return inner_->new_cache(capacity);
    }
    void forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                 std::span<float> logits) override {
        inner_->forward(tokens, cache, logits_from, logits);
    }
    void forward_batch(std::span<const BatchSequence> batch, std::span<float> logits) override {
        if (before_step_) before_step_(batch);
        if (per_sequence_)
            Backend::forward_batch(batch, logits);
        else
            inner_->forward_batch(batch, logits);
        if (after_step_) after_step_(batch, logits);
    }
    // Called with each step's logits rows once computed (to alter them).
    using After = std::function<void(std::span<const BatchSequence>, std::span<float>)>;
    void set_after_step(After after) { after_step_ = std::move(after); }

  private:
    std::unique_ptr<Backend> inner_;
    Hook before_step_;
    After after_step_;
    bool per_sequence_;
};

}  // namespace qforge::test
