// The sources layer (sources/model_source.hpp) end to end: every command that takes a model
// reads any input kind without a separate convert step, and gets what the convert step would
// have given it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "core/error.hpp"
#include "formats/qf.hpp"
#include "sources/model_source.hpp"
#include "test_support.hpp"

namespace sources_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data";
const fs::path kGguf = kData / "gguf" / "tiny_llama.gguf";
const fs::path kHf = kData / "hf_models" / "llama_gqa_untied";

using qforge::test::q;

test::CommandResult run_ok(const std::string& args, const std::string& prefix = "") {
    auto r = test::run_qforge(args, prefix);
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return r;
}

// Every tensor of two .qf files: same names, types, shapes and bytes.
void require_same_tensors(const fs::path& a, const fs::path& b) {
    const QfFile fa(a.string()), fb(b.string());
    REQUIRE(fa.tensors().size() == fb.tensors().size());
    std::vector<uint8_t> sa, sb;
    for (size_t i = 0; i < fa.tensors().size(); ++i) {
        const QfTensorInfo& ta = fa.tensors()[i];
        const QfTensorInfo& tb = fb.tensors()[i];
        INFO(ta.name);
        REQUIRE(ta.name == tb.name);
        REQUIRE(ta.qtype == tb.qtype);
        REQUIRE(ta.shape == tb.shape);
        const auto ba = fa.tensor_bytes(ta, sa, true), bb = fb.tensor_bytes(tb, sb, true);
        REQUIRE(std::equal(ba.begin(), ba.end(), bb.begin(), bb.end()));
    }
}

}  // namespace

TEST_CASE("ppl reads a GGUF directly, as the .qf convert makes of it, and leaves no temporary",
          "[sources][cli]") {
    test::ScratchDir dir("sources-ppl");
    const fs::path tmp = dir / "tmp";
    fs::create_directory(tmp);
    const std::string env = "TMPDIR=" + q(tmp) + "; export TMPDIR;";
    const fs::path text = dir / "text.txt";
    std::string words;
    for (int i = 0; i < 20; ++i) words += "Once upon a time there was a little model. ";
    test::write_file(text, words);
    const fs::path converted = dir / "tiny.qf";
    run_ok("convert " + q(kGguf) + " -o " + q(converted));

    // The GGUF as the model and the converted file as the base: the same logits, so KL 0 and
    // every top-1 the same; and the same perplexity as the .qf alone gives.
    auto r = run_ok("ppl " + q(kGguf) + " -f " + q(text) + " --ctx 16 --chunks 2 --kl-base " +
                        q(converted) + " --json -q",
                    env);
    const auto direct = nlohmann::json::parse(r.output);
    REQUIRE(direct.at("n_chunks") == 2);
    REQUIRE(direct.at("kld").get<double>() == 0.0);
    REQUIRE(direct.at("top1_agreement") == 1.0);
    REQUIRE(direct.at("base_ppl").get<double>() == direct.at("ppl").get<double>());
    r = run_ok("ppl " + q(converted) + " -f " + q(text) + " --ctx 16 --chunks 2 --json -q");
    REQUIRE(nlohmann::json::parse(r.output).at("ppl").get<double>() ==
            direct.at("ppl").get<double>());
    REQUIRE(fs::is_empty(tmp));  // the temporary .qf is removed when the command ends

    // inspect shows the GGUF as the .qf it converts to.
    r = run_ok("inspect " + q(kGguf) + " --json", env);
    const auto j = nlohmann::json::parse(r.output);
    REQUIRE(j.at("tensors").size() == QfFile(converted.string()).tensors().size());
    REQUIRE(fs::is_empty(tmp));

    // A missing model is still one clear line, naming the path given.
    r = test::run_qforge("ppl " + q(dir / "absent.gguf") + " -f " + q(text));
    REQUIRE(r.exit_code != 0);
    REQUIRE_THAT(r.output, Contains("absent.gguf"));
}

TEST_CASE(
    "quantize reads a Hugging Face directory and a GGUF directly, as convert then "
    "quantize does",
    "[sources][cli]") {
    test::ScratchDir dir("sources-quantize");
    for (const fs::path& input : {kHf, kGguf}) {
        INFO(input);
        const fs::path converted = dir / "f.qf", two_step = dir / "two.qf", direct = dir / "one.qf";
        run_ok("convert " + q(input) + " -o " + q(converted));
        run_ok("quantize " + q(converted) + " -o " + q(two_step) + " --qtype q4_g32 -q");
        run_ok("quantize " + q(input) + " -o " + q(direct) + " --qtype q4_g32 -q");
        require_same_tensors(direct, two_step);
        const QfFile out(direct.string());
        const std::string format = out.header().at("provenance").at("recipe").at("source_format");
        REQUIRE(format == (input == kGguf ? "gguf" : "safetensors"));
        for (const fs::path& p : {converted, two_step, direct}) fs::remove(p);
    }
}

TEST_CASE("open_model_source: every kind by content, options that do not apply are refused",
          "[sources]") {
    const auto gguf = open_model_source(kGguf.string(), SourceOptions{});
    REQUIRE(gguf->format() == "gguf");
    REQUIRE(gguf->default_dtype() == QType::f32);
    REQUIRE(gguf->tensors().front().name == "embed");
    REQUIRE(gguf->recipe_extra().at("source_format") == "gguf");
    const auto hf = open_model_source(kHf.string(), SourceOptions{});
    REQUIRE(hf->format() == "safetensors");
    REQUIRE(hf->sources().front().at("file") == "config.json");
    REQUIRE(hf->tensors().back().name == "lm_head");  // untied: its own output head
    REQUIRE_THROWS_WITH(
        open_model_source(kHf.string(), SourceOptions{.tokenizer = {}, .keep_quant = true}),
        Contains("--keep-quant applies to GGUF input only"));
    test::ScratchDir dir("sources-open");
    test::write_file(dir / "x.gguf", std::string("not a model at all"));
    REQUIRE_THROWS_WITH(open_model_source((dir / "x.gguf").string(), SourceOptions{}),
                        Contains("not a known model file"));
}

// The model argument of every command that runs one takes a Hugging Face directory (the
// fixture has no tokenizer: bench runs it; ppl and generate get as far as asking for one).
TEST_CASE("bench, ppl and generate take a Hugging Face directory as the model", "[sources][cli]") {
    test::ScratchDir dir("sources-hf-run");
    const fs::path tmp = dir / "tmp";
    fs::create_directory(tmp);
    const std::string env = "TMPDIR=" + q(tmp) + "; export TMPDIR;";
    const fs::path text = dir / "text.txt";
    test::write_file(text, std::string("Once upon a time there was a little model."));
    const auto r = run_ok("bench " + q(kHf) + " -p 4 -n 2 -r 1 -t 1 --bandwidth 10 --json", env);
    REQUIRE_THAT(r.output, Contains("warning: no tokenizer found"));  // stderr, merged
    REQUIRE_THAT(r.output, Contains("\"prefill"));
    for (const std::string& cmd :
         std::vector<std::string>{"ppl " + q(kHf) + " -f " + q(text) + " --ctx 4",
                                  "generate " + q(kHf) + " -p 'Once' -n 2 --greedy"}) {
        const auto bad = test::run_qforge(cmd, env);
        INFO(cmd << "\n" << bad.output);
        REQUIRE(bad.exit_code != 0);
        REQUIRE_THAT(bad.output, Contains("tokenizer"));
        REQUIRE_THAT(bad.output, !Contains("is a directory"));
    }
    REQUIRE(fs::is_empty(tmp));
}

}  // namespace sources_test
