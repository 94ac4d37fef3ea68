// generate() and `qforge generate` with a repetition penalty, on the tiny Qwen3 checkpoint of
// tests/data/hf_models (no ../shared needed): the tokens equal a float64 reference that applies
// transformers' definition to the model's own logits, step by step, over the prompt and the
// generated tokens; the CLI's llama.cpp-style options map onto it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "runtime/backend.hpp"
#include "runtime/generate.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

using namespace qforge;
namespace fs = std::filesystem;

namespace {

fs::path tiny_qwen3(const test::ScratchDir& dir) {
    ConvertOptions o;
    o.input = test::fixture("hf_models/qwen3_qknorm_window").string();
    o.output = (dir / "qwen3-tiny.qf").string();
    convert_checkpoint(o);
    return o.output;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

}  // namespace

TEST_CASE("generate: the repetition penalty counts the prompt and the generated tokens",
          "[runtime][generate]") {
    test::ScratchDir dir("generate-penalty");
    const Model model(tiny_qwen3(dir).string());
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    const uint64_t vocab = model.config().vocab_size, n = 24;
    std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 32, 72, 101, 108, 108, 111, 33};
    GenerateOptions plain;
    plain.sampling = {0.0f, 0, 1.0f, 1};
    plain.max_new_tokens = n;
    // The prompt ends with the model's own greedy continuation of it, so the tokens it would
    // choose next are the prompt's: a penalty that missed the prompt would choose them.
    const std::vector<int32_t> natural = generate(*cpu, prompt, plain).tokens;
    prompt.insert(prompt.end(), natural.begin(), natural.begin() + 8);
    const std::vector<int32_t> unpenalised = generate(*cpu, prompt, plain).tokens;
    int changed = 0;
    for (auto [p, window] : {std::pair{1.3f, 0}, {1.3f, 5}, {2.0f, 1}, {0.7f, 0}}) {
        INFO("penalty " << p << " window " << window);
        GenerateOptions o = plain;
        o.sampling.repetition_penalty = p;
        o.sampling.repetition_last_n = static_cast<uint64_t>(window);
        const std::vector<int32_t> got = generate(*cpu, prompt, o).tokens;
        // The reference: the model's logits after each token, the penalty in double on the
        // distinct ids among the context's last `window` tokens (0: all), the first maximum.
        auto cache = cpu->new_cache(prompt.size() + n);
        std::vector<float> logits(vocab);
        cpu->forward(prompt, *cache, prompt.size() - 1, logits);
        std::vector<int32_t> context = prompt, want;
        for (uint64_t step = 0; step < n; ++step) {
            std::vector<double> l(logits.begin(), logits.end());
            const size_t from = window && context.size() > size_t(window)
                                    ? context.size() - static_cast<size_t>(window)
                                    : 0;
            for (int32_t id : std::set<int32_t>(context.begin() + static_cast<std::ptrdiff_t>(from),
                                                context.end())) {
                double& v = l[static_cast<size_t>(id)];
                v = v > 0.0 ? v / double{p} : v * double{p};
            }
            std::vector<double> sorted = l;
            std::sort(sorted.rbegin(), sorted.rend());
            // Two adjusted logits within float rounding of each other could be ordered either
            // way by the float adjustment: none here (checked).
            REQUIRE(sorted[0] - sorted[1] > 1e-6 * std::max(1.0, std::fabs(sorted[0])));
            const auto w = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
            want.push_back(w);
            context.push_back(w);
            if (step + 1 < n) cpu->forward({&w, 1}, *cache, 0, logits);
        }
        REQUIRE(got == want);
        changed += got != unpenalised;
    }
    CHECK(changed >= 2);  // the penalty decides tokens here: the comparison can fail
}

TEST_CASE("qforge generate --repeat-penalty and --repeat-last-n, llama.cpp's options",
          "[runtime][generate][cli]") {
    test::ScratchDir dir("generate-penalty-cli");
    const fs::path model = tiny_qwen3(dir);
    const std::string base = "generate " + q(model) + " --raw -p 'Hello Hello' -n 20 --greedy -q";
    auto text = [&](const std::string& extra) {
        const auto r = test::run_qforge(base + extra);
        INFO(base + extra << "\n" << r.output);
        REQUIRE(r.exit_code == 0);
        return r.output;
    };
    const std::string plain = text("");
    // 1 (the default) and a window of 0 penalise nothing; -1 is the whole context, as a window
    // longer than it is; the default window is 64 (longer than this context too).
    CHECK(text(" --repeat-penalty 1") == plain);
    CHECK(text(" --repeat-penalty 1.5 --repeat-last-n 0") == plain);
    const std::string all = text(" --repeat-penalty 1.5 --repeat-last-n -1");
    CHECK(all != plain);
    CHECK(text(" --repeat-penalty 1.5 --repeat-last-n 100000") == all);
    CHECK(text(" --repeat-penalty 1.5") == all);
    CHECK(text(" --repeat-penalty 1.5 --repeat-last-n 2") != all);
    for (const char* bad :
         {" --repeat-penalty 0", " --repeat-penalty -1", " --repeat-penalty nan",
          " --repeat-last-n -2", " --repeat-last-n x", " --repeat-last-n 2147483648"}) {
        const auto r = test::run_qforge(base + bad);
        INFO(bad << "\n" << r.output);
        CHECK(r.exit_code == 2);
        CHECK_THAT(r.output, Catch::Contains(std::string(bad).substr(1, 16)));
    }
}
