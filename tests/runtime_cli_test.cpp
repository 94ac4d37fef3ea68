// `qforge generate` and `qforge ppl` end to end on stories260K: run.c's greedy text byte for
// byte, the JSON result, and every bad input as one clear line of error.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "test_support.hpp"

namespace runtime_cli_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

size_t count_lines(const std::string& s) {
    return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

void require_one_line_error(const test::CommandResult& r, const std::string& what) {
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    REQUIRE(count_lines(r.output) == 1);
    REQUIRE(r.output.rfind("qforge: error: ", 0) == 0);
    REQUIRE_THAT(r.output, Contains(what));
}

// stories260K converted once per test case, with its tokenizer.
fs::path stories(const fs::path& data, const test::ScratchDir& dir) {
    const fs::path out = dir / "s.qf";
    auto r = test::run_qforge("convert " + q(data / "stories260K" / "hf") + " -o " + q(out) +
                              " --tokenizer " + q(data / "stories260K" / "tok512.bin"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return out;
}

}  // namespace

TEST_CASE("qforge generate --greedy reproduces run.c's greedy sample byte for byte",
          "[runtime][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("gen-greedy");
    const fs::path model = stories(data, dir);
    const auto expected =
        test::read_file(data / "stories260K" / "reference" / "greedy_t0_n256.txt");
    // run.c -n 256 runs 256 forward passes from BOS and prints the token chosen after each:
    // 256 new tokens (the last one is the final '.'), then a newline. It never emits BOS here.
    for (const char* threads : {"1", "2"}) {
        auto r = test::run_qforge("generate " + q(model) + " -n 256 --greedy -q -t " + threads);
        REQUIRE(r.exit_code == 0);
        REQUIRE(r.output == std::string(expected.begin(), expected.end()));
    }
    // Sampling: deterministic for a seed, different across seeds.
    auto a = test::run_qforge("generate " + q(model) + " -p 'Once upon a time' -n 40 --seed 7 -q");
    auto b =
        test::run_qforge("generate " + q(model) + " -p 'Once upon a time' -n 40 --seed 7 -t 1 -q");
    auto c = test::run_qforge("generate " + q(model) + " -p 'Once upon a time' -n 40 --seed 8 -q");
    REQUIRE(a.exit_code == 0);
    REQUIRE(a.output == b.output);
    REQUIRE(a.output != c.output);
    REQUIRE(a.output.rfind("Once upon a time", 0) == 0);
    // --ignore-eos: a bias that makes the stop token (llama2.c's BOS) every choice ends the
    // generation at once, unless told to go on to -n.
    const std::string forced =
        "generate " + q(model) + " -p 'Once' -n 6 --greedy --logit-bias 1=100";
    auto stopped = test::run_qforge(forced);
    auto on = test::run_qforge(forced + " --ignore-eos");
    REQUIRE(stopped.exit_code == 0);
    REQUIRE(on.exit_code == 0);
    CHECK(stopped.output.find("generated: 0 tokens") != std::string::npos);
    CHECK(on.output.find("generated: 6 tokens") != std::string::npos);
}

TEST_CASE("qforge ppl --json reports the statistics, bad inputs get one clear line",
          "[runtime][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("ppl-cli");
    const fs::path model = stories(data, dir);
    const fs::path text = dir / "stories.txt";
    test::write_file(text, test::tinystories_head(data));

    auto r = test::run_qforge("ppl " + q(model) + " -f " + q(text) +
                              " --ctx 128 --chunks 2 --kl-base " + q(model) + " --json -q");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.output);
    REQUIRE(j.at("n_chunks") == 2);
    REQUIRE(j.at("n_tokens_scored") == 2 * 63);  // llamacpp: positions 65 .. 127 of each chunk
    REQUIRE(j.at("ppl").get<double>() > 1.0);
    REQUIRE(j.at("ppl_stderr").get<double>() > 0.0);
    REQUIRE(j.at("kld").get<double>() == Approx(0.0).margin(1e-12));
    REQUIRE(j.at("top1_agreement") == 1.0);
    REQUIRE(j.at("rms_dp") == 0.0);
    REQUIRE(j.contains("kld_stderr"));
    // The base model's own perplexity over the same tokens: the same model, so the same value.
    REQUIRE(j.at("base_ppl").get<double>() == j.at("ppl").get<double>());

    r = test::run_qforge("ppl " + q(model) + " -f " + q(text) + " --ctx 64 --chunks 1 -q");
    REQUIRE(r.exit_code == 0);
    REQUIRE_THAT(r.output, Contains("PPL = "));
    REQUIRE_THAT(r.output, Contains(" +/- "));
    REQUIRE_THAT(r.output, Contains("tokens/s"));

    // --ctx above max_position_embeddings (512): refused.
    require_one_line_error(test::run_qforge("ppl " + q(model) + " -f " + q(text) + " --ctx 1024"),
                           "--ctx 1024 exceeds the model's max_position_embeddings (512)");
    // A text shorter than 2 * ctx tokens.
    const fs::path short_text = dir / "short.txt";
    test::write_file(short_text, std::string("Once upon a time there was a cat.\n"));
    require_one_line_error(
        test::run_qforge("ppl " + q(model) + " -f " + q(short_text) + " --ctx 64"),
        "the llamacpp protocol with --ctx 64 needs at least 128");
    // An empty file.
    const fs::path empty = dir / "empty.txt";
    test::write_file(empty, std::string());
    require_one_line_error(test::run_qforge("ppl " + q(model) + " -f " + q(empty)),
                           "the file is empty");
    // A prompt longer than the context.
    std::string long_prompt;
    for (int i = 0; i < 600; ++i) long_prompt += "cat ";
    require_one_line_error(
        test::run_qforge("generate " + q(model) + " -p '" + long_prompt + "' -n 4"),
        "the model's context holds 512");
    // A logit bias for a token the vocabulary does not have.
    require_one_line_error(test::run_qforge("generate " + q(model) + " -n 4 --logit-bias 512=1"),
                           "token 512 is outside the vocabulary (512)");
    // A .qf without a tokenizer: a copy of the checkpoint with no tokenizer beside it.
    const fs::path bare_dir = dir / "bare";
    fs::create_directories(bare_dir);
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file(data / "stories260K" / "hf" / f, bare_dir / f);
    const fs::path bare = dir / "bare.qf";
    REQUIRE(test::run_qforge("convert " + q(bare_dir) + " -o " + q(bare)).exit_code == 0);
    require_one_line_error(test::run_qforge("ppl " + q(bare) + " -f " + q(text)),
                           "has no tokenizer");
    require_one_line_error(test::run_qforge("generate " + q(bare)), "has no tokenizer");
}

TEST_CASE("qforge generate --chat-template renders the prompt with the given template",
          "[runtime][cli][shared][chat]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("gen-chat-template");
    const fs::path model = stories(data, dir);  // a llama2.c vocabulary: no template of its own
    // The template's exception names the message it was given, so the warning proves the file
    // was read and rendered with the prompt; generation then continues the raw prompt.
    const fs::path raising = dir / "raising.jinja";
    test::write_file(raising,
                     std::string("{{ raise_exception('rendered ' + messages[0]['content']) }}"));
    auto r = test::run_qforge("generate " + q(model) + " --chat-template " + q(raising) +
                              " -p 'Once upon' -n 4 --greedy -q");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output,
               Contains("warning: chat template raised an exception: rendered Once upon"));
    CHECK_THAT(r.output, Contains("continuing the raw prompt"));
    // A template that renders: only the reply is printed, as for a model's own template.
    const fs::path plain = dir / "plain.jinja";
    test::write_file(plain, std::string("{{ messages[0]['content'] }}"));
    r = test::run_qforge("generate " + q(model) + " --chat-template " + q(plain) +
                         " -p 'Once upon a time' -n 8 --greedy -q");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind("Once upon a time", 0) != 0);
    r = test::run_qforge("generate " + q(model) + " --chat-template " + q(dir / "absent.jinja") +
                         " -p x");
    CHECK(r.exit_code == 2);  // a usage error, as for every input option
    CHECK_THAT(r.output, Contains("error: --chat-template: ") && Contains("absent.jinja"));
}

}  // namespace runtime_cli_test
