// The calibration pass's layer-by-layer forward (quant/block_forward.hpp) against the CPU
// backend's full forward pass on stories260K (GQA, tied head): the same logits for several
// independent sequences, each starting at position 0.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "cli_support.hpp"
#include "quant/block_forward.hpp"
#include "runtime/backend.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

using namespace qforge;

TEST_CASE("block forward, layer by layer, equals the CPU backend on stories260K",
          "[quant][calib][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("block-forward");
    Model model(test::convert_stories(data, "hf", dir).string());
    const ModelConfig& c = model.config();
    const uint64_t sequences = 3, seq_len = 40;
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(sequences * seq_len);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);

    ThreadPool pool(2);
    BlockForward f(c, sequences, seq_len, pool);
    std::vector<float> x = embed_tokens(model, tokens);
    for (uint64_t l = 0; l < c.num_layers; ++l) run_layer(f, model, l, x);
    std::vector<float> h(x.size()), logits(tokens.size() * c.vocab_size);
    const uint64_t hidden = c.hidden_size;
    f.view = layer_view(model, 0);  // its final norm and output head
    f.norm(0, Norm::final, {x.data(), hidden}, {h.data(), hidden}, tokens.size());
    const Product head[] = {{Weight::lm_head, {logits.data(), c.vocab_size}}};
    f.products(0, {h.data(), hidden}, head, tokens.size());

    auto cpu = make_cpu_backend(model, pool);
    for (uint64_t s = 0; s < sequences; ++s) {
        auto cache = cpu->new_cache(seq_len);
        std::vector<float> ref(seq_len * c.vocab_size);
        cpu->forward({tokens.data() + s * seq_len, seq_len}, *cache, 0, ref);
        // Both are float32 with different summation orders (sgemm vs fixed-order dot products):
        // a few float32 roundings per activation, ~1e-6 relative; 1e-5 catches any wrong
        // position, mask or head mapping (those move logits by > 1e-2).
        double diff = 0.0, norm = 0.0;
        for (size_t i = 0; i < ref.size(); ++i) {
            const double d = logits[s * seq_len * c.vocab_size + i] - ref[i];
            diff += d * d;
            norm += double(ref[i]) * ref[i];
        }
        INFO("sequence " << s << ": relative L2 " << std::sqrt(diff / norm));
        REQUIRE(std::sqrt(diff / norm) <= 1e-5);
    }
}
