// `qforge bench` runs and reports sane figures. Speed itself is never asserted (it depends on the
// machine and its load); the weight bytes per decoded token are, against a sum computed here from
// the .qf tensor list: every 2-D tensor but the embedding table, which counts only when it is
// also the LM head (tied).
#include "runtime/bench.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "formats/qf.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/isa.hpp"
#include "test_support.hpp"

namespace bench_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

fs::path convert(const fs::path& hf, const fs::path& out, const std::string& extra = "") {
    auto r = test::run_qforge("convert " + q(hf) + " -o " + q(out) + " -q " + extra);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return out;
}

uint64_t expected_weight_bytes(const fs::path& model) {
    const QfFile f(model.string());
    bool has_lm_head = false;
    for (const auto& t : f.tensors()) has_lm_head |= t.name.find("lm_head") != std::string::npos;
    uint64_t sum = 0;
    int matrices = 0;
    for (const auto& t : f.tensors()) {
        if (t.shape.size() != 2) continue;
        const bool embedding = t.name.find("embed") != std::string::npos;
        if (embedding && has_lm_head) continue;
        sum += t.length;
        ++matrices;
    }
    INFO("2-D tensors counted: " << matrices);
    REQUIRE(matrices > 0);
    return sum;
}

void require_rate(const nlohmann::json& s, int reps) {
    INFO(s.dump());
    for (const char* k : {"median", "min", "max"}) {
        const double v = s.at(k).get<double>();
        REQUIRE(std::isfinite(v));
        REQUIRE(v > 0.0);
    }
    REQUIRE(s.at("min").get<double>() <= s.at("median").get<double>());
    REQUIRE(s.at("median").get<double>() <= s.at("max").get<double>());
    REQUIRE(s.at("runs").size() == static_cast<size_t>(reps));
}

nlohmann::json bench_json(const fs::path& model, const std::string& args) {
    auto r = test::run_qforge("bench " + q(model) + " --json -q " + args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.output);
}

}  // namespace

TEST_CASE("rate_stats: median of odd and even counts, extremes, runs in order", "[bench]") {
    const RateStats odd = rate_stats({3.0, 1.0, 2.0});
    REQUIRE(odd.median == 2.0);
    REQUIRE(odd.min == 1.0);
    REQUIRE(odd.max == 3.0);
    REQUIRE(odd.runs == std::vector<double>{3.0, 1.0, 2.0});
    REQUIRE(rate_stats({4.0, 1.0, 2.0, 8.0}).median == 3.0);
    REQUIRE(rate_stats({}).median == 0.0);
}

TEST_CASE("qforge bench on stories260K: JSON fields, sane values, bytes per token (tied head)",
          "[bench][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("bench-stories");
    const fs::path model = convert(data / "stories260K" / "hf", dir / "s.qf",
                                   "--tokenizer " + q(data / "stories260K" / "tok512.bin"));

    const auto j = bench_json(model, "-p 32 -n 16 -r 3 -t 2 --bandwidth 20");
    INFO(j.dump(2));
    REQUIRE(j.at("threads") == 2);
    REQUIRE(j.at("prefill_tokens") == 32);
    REQUIRE(j.at("decode_tokens") == 16);
    REQUIRE(j.at("repetitions") == 3);
    REQUIRE(j.at("cpu_isa") == isa_name(cpu_isa()));  // the child inherits this environment
    require_rate(j.at("prefill_tok_per_s"), 3);
    require_rate(j.at("decode_tok_per_s"), 3);

    const uint64_t bytes = j.at("weight_bytes_per_token").get<uint64_t>();
    REQUIRE(bytes == expected_weight_bytes(model));
    const double effective = j.at("effective_gb_per_s").get<double>();
    REQUIRE(std::isfinite(effective));
    REQUIRE(effective ==
            Approx(j.at("decode_tok_per_s").at("median").get<double>() * double(bytes) / 1e9));
    REQUIRE(j.at("read_bandwidth_gb_s").get<double>() == 20.0);
    REQUIRE_FALSE(j.at("read_bandwidth_measured").get<bool>());
    REQUIRE(j.at("bandwidth_fraction").get<double>() == Approx(effective / 20.0));
    REQUIRE(j.at("prefill_tok_s").get<double>() ==
            j.at("prefill_tok_per_s").at("median").get<double>());
    REQUIRE(j.at("decode_tok_s").get<double>() ==
            j.at("decode_tok_per_s").at("median").get<double>());

    // The table form prints both phases; without --bandwidth the read bandwidth is measured.
    auto t = test::run_qforge("bench " + q(model) + " --prompt 8 --gen 4 -r 1 -t 1 -q");
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    REQUIRE_THAT(t.output, Contains("prefill") && Contains("decode") && Contains("GB/s effective"));
    REQUIRE_THAT(t.output, Contains("read bandwidth"));
    // Measured after each repetition's decode: each repetition's fraction is its effective
    // GB/s over its own measurement, and the reported fraction their median.
    const auto m = bench_json(model, "-p 4 -n 4 -r 3");
    INFO(m.dump(2));
    REQUIRE(m.at("read_bandwidth_measured").get<bool>());
    const auto& bw = m.at("read_bandwidth_gb_per_s");
    require_rate(bw, 3);
    REQUIRE(m.at("read_bandwidth_gb_s").get<double>() == bw.at("median").get<double>());
    REQUIRE(bw.at("min").get<double>() > 0.1);
    const auto& decode = m.at("decode_tok_per_s").at("runs");
    std::vector<double> fractions;
    for (size_t r = 0; r < 3; ++r)
        fractions.push_back(decode.at(r).get<double>() * double(bytes) / 1e9 /
                            bw.at("runs").at(r).get<double>());
    std::sort(fractions.begin(), fractions.end());
    REQUIRE(m.at("bandwidth_fraction").get<double>() == Approx(fractions[1]).epsilon(1e-12));
    REQUIRE_FALSE(j.contains("read_bandwidth_gb_per_s"));  // given, not measured
}

TEST_CASE("qforge bench, untied head: lm_head counted, embedding not, context enforced",
          "[bench][cli]") {
    const fs::path hf = test::fixture("hf_models/llama_gqa_untied");
    test::ScratchDir dir("bench-untied");
    const fs::path model = convert(hf, dir / "u.qf");

    const auto j = bench_json(model, "-p 16 -n 8 -r 2 -t 1");
    require_rate(j.at("prefill_tok_per_s"), 2);
    require_rate(j.at("decode_tok_per_s"), 2);
    REQUIRE(j.at("weight_bytes_per_token").get<uint64_t>() == expected_weight_bytes(model));

    // A batched decode: 3 sequences of 40 positions each; tok/s counts all three, and the weights
    // are read once per step (effective GB/s is per step, not per token).
    const auto b = bench_json(model, "-p 4 -n 8 -r 2 -t 2 --batch 3 --context 40 --bandwidth 20");
    require_rate(b.at("decode_tok_per_s"), 2);
    REQUIRE(b.at("decode_batch") == 3);
    REQUIRE(b.at("decode_context") == 40);
    REQUIRE(b.at("kv_type") == "f32");
    REQUIRE(bench_json(model, "-p 4 -n 4 -r 1 -t 1 --batch 2 --kv-type f16").at("kv_type") ==
            "f16");
    REQUIRE(b.at("effective_gb_per_s").get<double>() ==
            Approx(b.at("decode_tok_s").get<double>() / 3.0 *
                   double(b.at("weight_bytes_per_token").get<uint64_t>()) / 1e9));

    // max_position_embeddings is 128: a longer prefill, or decode past it, is one line of error.
    for (const char* args : {"-p 129", "-n 125", "-c 121 -n 8", "-c 129 -n 1"}) {
        auto r = test::run_qforge("bench " + q(model) + " -q " + args);
        INFO(r.output);
        REQUIRE(r.exit_code == 1);
        REQUIRE(r.output.rfind("qforge: error: ", 0) == 0);
        REQUIRE_THAT(r.output, Contains("context of 128"));
    }
}

TEST_CASE(
    "qforge bench --bf16-activations: bf16 models run, others get a note, refused below "
    "AVX-512 BF16",
    "[bench][cli][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("bench-bf16");
    const fs::path hf = data / "stories260K" / "hf";
    const fs::path f32 = convert(hf, dir / "f32.qf");
    const fs::path bf16 = convert(hf, dir / "bf16.qf", "--dtype bf16");
    const std::string args = " -p 8 -n 4 -r 1 -t 2 -q --bf16-activations";
    const auto lowered = test::run_qforge("bench " + q(bf16) + args, "QFORGE_ISA=avx2");
    INFO(lowered.output);
    REQUIRE(lowered.exit_code == 1);
    REQUIRE_THAT(lowered.output,
                 Contains("bf16 activations need the avx512 level and AVX-512 BF16"));
    if (!bf16_dot_available()) {
        WARN("no AVX-512 BF16 at this process's level: only the refusal is checked");
        return;
    }
    const auto plain = test::run_qforge("bench " + q(f32) + args);
    INFO(plain.output);
    REQUIRE(plain.exit_code == 0);
    REQUIRE_THAT(plain.output,
                 Contains("has no bf16 matrices: --bf16-activations changes nothing"));
    const auto j = bench_json(bf16, "-p 8 -n 4 -r 1 -t 2 --bf16-activations");
    REQUIRE(j.at("bf16_activations").get<bool>());
    auto r = test::run_qforge("bench " + q(bf16) + args);
    REQUIRE(r.exit_code == 0);
    REQUIRE_THAT(r.output, !Contains("no bf16 matrices"));
}

}  // namespace bench_test
