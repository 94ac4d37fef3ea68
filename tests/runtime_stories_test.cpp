// The runtime on the real stories260K model against references nobody here wrote: run.c's
// logits for "Once upon a time" (../shared/data/stories260K/reference), for the FP32 and the FP16
// checkpoints, and the float64 reference forward on a longer sequence.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/reference_forward.hpp"
#include "runtime/sampling.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace runtime_stories_test {

using namespace qforge;
namespace fs = std::filesystem;
using test::convert_stories;

namespace {

struct RunCLogits {
    std::vector<int32_t> ids;
    std::vector<std::vector<float>> logits;
};

RunCLogits read_reference(const fs::path& data) {
    std::ifstream f(data / "stories260K" / "reference" / "logits_once_upon_a_time.json");
    const auto j = nlohmann::json::parse(f);
    return {j.at("ids").get<std::vector<int32_t>>(),
            j.at("logits").get<std::vector<std::vector<float>>>()};
}

std::vector<float> prefill(Backend& b, std::span<const int32_t> ids) {
    auto cache = b.new_cache(ids.size());
    std::vector<float> out(ids.size() * b.model().config().vocab_size);
    b.forward(ids, *cache, 0, out);
    return out;
}

std::vector<float> decode_one_by_one(Backend& b, std::span<const int32_t> ids) {
    const uint64_t v = b.model().config().vocab_size;
    auto cache = b.new_cache(ids.size());
    std::vector<float> out(ids.size() * v);
    for (size_t t = 0; t < ids.size(); ++t)
        b.forward(ids.subspan(t, 1), *cache, 0, std::span(out).subspan(t * v, v));
    return out;
}

double max_abs_diff(const std::vector<float>& got, const std::vector<std::vector<float>>& ref) {
    double worst = 0.0;
    for (size_t t = 0; t < ref.size(); ++t)
        for (size_t i = 0; i < ref[t].size(); ++i)
            worst = std::max(
                worst, std::fabs(static_cast<double>(got[t * ref[t].size() + i]) - ref[t][i]));
    return worst;
}

}  // namespace

TEST_CASE("stories260K FP32: logits match run.c (prefill and decode)", "[runtime][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("runtime-stories");
    Model model(convert_stories(data, "hf", dir).string());
    const RunCLogits ref = read_reference(data);
    REQUIRE(ref.ids == std::vector<int32_t>{1, 403, 407, 261, 378});
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    for (const auto& logits : {prefill(*cpu, ref.ids), decode_one_by_one(*cpu, ref.ids)}) {
        // run.c computes in float32 too, in another order: differences are float32 rounding
        // (README: a float64 forward agrees with run.c to 1.6e-5). 1e-4 allows six times that
        // distance for our own float32 rounding in another order, while a wrong formula (RoPE
        // layout, norm, head mapping) moves these logits by more than 1e-2.
        REQUIRE(max_abs_diff(logits, ref.logits) <= 1e-4);
        REQUIRE(argmax(std::span(logits).subspan(4 * 512, 512)) == 432);  // README
    }
}

TEST_CASE("stories260K from the llama2.c file: the same logits as from the HF checkpoint",
          "[runtime][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("runtime-stories-bin");
    ConvertOptions o;
    o.input = (data / "stories260K" / "stories260K.bin").string();
    o.output = (dir / "bin.qf").string();
    o.tokenizer = (data / "stories260K" / "tok512.bin").string();
    convert_checkpoint(o);
    Model from_bin(o.output);
    Model from_hf(convert_stories(data, "hf", dir).string());
    const RunCLogits ref = read_reference(data);
    ThreadPool pool(2);
    auto a = make_cpu_backend(from_bin, pool);
    auto b = make_cpu_backend(from_hf, pool);
    const auto logits = prefill(*a, ref.ids);
    REQUIRE(max_abs_diff(logits, ref.logits) <= 1e-4);
    REQUIRE(logits == prefill(*b, ref.ids));  // the q/k row permutation makes identical tensors
}

TEST_CASE("stories260K FP16: logits near run.c's FP32 ones, and equal to the float64 forward",
          "[runtime][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("runtime-stories-f16");
    Model model(convert_stories(data, "hf-fp16", dir).string());
    REQUIRE(model.layers()[0].q.qtype == QType::f16);
    const RunCLogits ref = read_reference(data);
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    const auto logits = prefill(*cpu, ref.ids);
    // Against run.c's FP32 logits the difference is the effect of rounding the weights to f16,
    // not an error of ours. Its size: the README's float64 measurement on a 512-token window puts
    // the largest logit shift from f16 weights at 0.017; on these 5 positions we measure 0.0166.
    // We allow 0.02: the README's worst case plus our 1e-4 compute bound, rounded up. A wrong
    // f16 conversion (say, bf16 read as f16) moves logits by whole units.
    const double vs_runc = max_abs_diff(logits, ref.logits);
    INFO("max |f16 logits - run.c fp32 logits| = " << vs_runc);
    REQUIRE(vs_runc <= 0.02);
    REQUIRE(vs_runc > 1e-4);  // really the f16 weights
    // The tight check: the same f16 weights in float64 (1e-4, as for FP32).
    const auto exact = reference_forward(model, ref.ids);
    double worst = 0.0;
    for (size_t t = 0; t < exact.size(); ++t)
        for (size_t i = 0; i < 512; ++i)
            worst = std::max(worst, std::fabs(logits[t * 512 + i] - exact[t][i]));
    REQUIRE(worst <= 1e-4);
}

TEST_CASE("stories260K: CPU backend vs float64 forward on 64 tokens, any thread count",
          "[runtime][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("runtime-stories-ref");
    Model model(convert_stories(data, "hf", dir).string());
    // The first 64 ids of the greedy sample's prompt region: BOS and ordinary text tokens.
    std::vector<int32_t> ids = {1};
    for (int i = 1; i < 64; ++i) ids.push_back(static_cast<int32_t>(259 + (i * 37) % 253));
    const auto exact = reference_forward(model, ids);
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        auto cpu = make_cpu_backend(model, pool, {.min_parallel_work = 0});  // split every region
        const auto logits = prefill(*cpu, ids);
        if (first.empty()) first = logits;
        REQUIRE(logits == first);
        if (threads == 2) REQUIRE(decode_one_by_one(*cpu, ids) == first);
    }
    double worst = 0.0;
    for (size_t t = 0; t < ids.size(); ++t)
        for (size_t i = 0; i < 512; ++i)
            worst = std::max(worst, std::fabs(first[t * 512 + i] - exact[t][i]));
    INFO("max abs diff vs float64: " << worst);
    REQUIRE(worst <= 1e-4);
}

}  // namespace runtime_stories_test
