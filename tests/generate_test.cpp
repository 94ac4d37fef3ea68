// generate() and `qforge generate` with a repetition penalty, on the tiny Qwen3 checkpoint of
// tests/data/hf_models (no ../shared needed): the tokens equal a float64 reference that applies
// transformers' definition to the model's own logits, step by step, over the prompt and the
// generated tokens; the CLI's llama.cpp-style options map onto it. And constrained generation:
// a JSON schema's documents, checked by nlohmann's parser and a validator of the test's own.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "json_schema_check.hpp"
#include "runtime/backend.hpp"
#include "runtime/generate.hpp"
#include "runtime/json_grammar.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "runtime/token_constraint.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace generate_test {

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

using qforge::test::q;

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
         {" --repeat-penalty 0", " --repeat-penalty 0.001", " --repeat-penalty nan",
          " --repeat-last-n -2", " --repeat-last-n x", " --repeat-last-n 2147483648"}) {
        const auto r = test::run_qforge(base + bad);
        INFO(bad << "\n" << r.output);
        CHECK(r.exit_code == 2);
        CHECK_THAT(r.output, Catch::Contains(std::string(bad).substr(1, 16)));
    }
}

TEST_CASE("generate: a JSON schema's document, each token the most likely the grammar allows",
          "[runtime][generate][json_grammar]") {
    test::ScratchDir dir("generate-json");
    std::vector<fs::path> models = {tiny_qwen3(dir)};
    if (auto data = test::shared_data_dir())
        models.push_back(test::convert_stories(*data, "hf", dir));
    const char* schemas[] = {
        R"({"type": "object"})",
        R"({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
            "required": ["name", "n", "tags"]})",
        R"({"type": "array", "items": {"type": ["number", "boolean"]}, "minItems": 1,
            "maxItems": 3})"};
    int whole = 0;
    for (const fs::path& path : models) {
        const Model model(path.string());
        const Tokenizer tok = Tokenizer::from_schema(model.file().tokenizer(), path.string());
        ThreadPool pool(2);
        auto cpu = make_cpu_backend(model, pool);
        const auto texts = std::make_shared<const TokenTexts>(tok);
        const std::vector<int32_t> prompt = tok.encode("The answer as JSON:", true);
        for (const char* text : schemas)
            for (const float temperature : {0.0f, 0.9f}) {
                const auto schema = nlohmann::ordered_json::parse(text);
                INFO(path.filename() << " " << schema.dump() << " temperature " << temperature);
                GenerateOptions o;
                o.sampling = {temperature, 0, 1.0f, 17};
                o.max_new_tokens = 100;
                o.stop_ids = tok.stop_ids();
                o.token_count = tok.vocab_size();
                o.sampling.grammar = std::make_shared<const TokenGrammar>(
                    TokenGrammar{JsonGrammar::from_schema(schema, "schema"), texts, o.stop_ids});
                const GenerateResult r = generate(*cpu, prompt, o);
                std::string out;
                for (int32_t id : r.tokens) out += texts->text[static_cast<size_t>(id)];
                INFO(out);
                // The byte matcher (tested against nlohmann) takes the text; stopped, whole.
                const JsonGrammar g = JsonGrammar::from_schema(schema, "schema");
                JsonMatcher m(g);
                REQUIRE(m.feed(out));
                if (r.stop == GenerateResult::Stop::stop_id ||
                    r.stop == GenerateResult::Stop::document) {
                    REQUIRE(m.complete());
                    REQUIRE(nlohmann::json::accept(out));
                    CHECK(test::schema_valid(nlohmann::ordered_json::parse(out), schema));
                    ++whole;
                }
                if (temperature > 0.0f) continue;
                // Greedy: at every step each token more likely than the chosen one would have
                // left a text no document begins with (each checked alone on the bytes).
                auto cache = cpu->new_cache(prompt.size() + o.max_new_tokens);
                std::vector<float> logits(model.config().vocab_size);
                cpu->forward(prompt, *cache, prompt.size() - 1, logits);
                JsonMatcher so_far(g);
                for (size_t step = 0; step < r.tokens.size(); ++step) {
                    const int32_t chosen = r.tokens[step];
                    for (size_t id = 0; id < tok.vocab_size(); ++id) {
                        if (!(logits[id] > logits[static_cast<size_t>(chosen)])) continue;
                        const bool stop = std::count(o.stop_ids.begin(), o.stop_ids.end(),
                                                     static_cast<int32_t>(id)) > 0;
                        JsonMatcher t = so_far;
                        const bool fits = stop
                                              ? t.complete()
                                              : !texts->text[id].empty() && t.feed(texts->text[id]);
                        INFO("step " << step << " id " << id);
                        REQUIRE_FALSE(fits);
                    }
                    REQUIRE(so_far.feed(texts->text[static_cast<size_t>(chosen)]));
                    cpu->forward({&chosen, 1}, *cache, 0, logits);
                }
            }
    }
    CHECK(whole >= 2);  // documents were finished, not only cut at max_tokens
}

}  // namespace generate_test
