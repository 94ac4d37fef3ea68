// Numbers that make no sense are errors, not results: NaN/Inf weights make ppl, generate and
// bench fail naming the model and the position (and verify names the tensor and element), a
// perplexity that would score no token fails naming the text and the ctx, and generation never
// chooses an id the tokenizer has no token for.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>

#include "cli_support.hpp"
#include "formats/qf.hpp"
#include "formats/qf_validate.hpp"
#include "formats/qtype.hpp"
#include "runtime/backend.hpp"
#include "runtime/generate.hpp"
#include "runtime/model.hpp"
#include "runtime/thread_pool.hpp"
#include "test_support.hpp"

namespace nonfinite_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// A copy of `good` with one f32 weight of `tensor` replaced by `value`.
void poison(const fs::path& good, const fs::path& out, const std::string& tensor, size_t index,
            float value) {
    const QfFile src(good.string());
    QfWriter w(out.string());
    w.set_model(src.model());
    w.set_tokenizer(src.header().at("tokenizer"));
    std::vector<uint8_t> scratch;
    for (const auto& t : src.tensors()) {
        const auto b = src.tensor_bytes(t, scratch);
        std::vector<uint8_t> bytes(b.begin(), b.end());
        if (t.name == tensor) {
            REQUIRE(t.qtype == QType::f32);
            std::memcpy(bytes.data() + 4 * index, &value, 4);
        }
        w.add_tensor(t.name, t.qtype, t.shape, bytes);
    }
    w.finish();
}

// Text of about 300 tokens for stories260K's tokenizer.
std::string story() {
    std::string s;
    for (int i = 0; i < 12; ++i)
        s += "Once upon a time, there was a little girl named Lily. She liked to play. ";
    return s;
}

// Forwards to a real backend, then makes the last id the most likely at every position: the
// id the tokenizer lacks in the masking test.
class FavourLastId final : public Backend {
  public:
    explicit FavourLastId(Backend& inner) : inner_(inner) {}
    std::string_view name() const override { return "favour-last-id"; }
    const Model& model() const override { return inner_.model(); }
    std::unique_ptr<KvCache> new_cache(uint64_t capacity) const override {
        return inner_.new_cache(capacity);
    }
    void forward(std::span<const int32_t> tokens, KvCache& cache, uint64_t logits_from,
                 std::span<float> logits) override {
        inner_.forward(tokens, cache, logits_from, logits);
        const uint64_t vocab = model().config().vocab_size;
        for (uint64_t r = 0; r < logits.size() / vocab; ++r) logits[r * vocab + vocab - 1] = 1e4f;
    }

  private:
    Backend& inner_;
};

}  // namespace

TEST_CASE("nonfinite: NaN or Inf weights are an error naming the model and the position",
          "[hostile][validate][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("nonfinite-weights");
    const fs::path good = test::convert_stories(data, "hf", dir);
    const fs::path text = dir / "story.txt";
    test::write_file(text, story());
    REQUIRE(
        test::run_qforge("ppl " + quoted(good) + " -f " + quoted(text) + " --ctx 32").exit_code ==
        0);

    struct Case {
        const char* label;
        const char* tensor;
        size_t index;
        float value;
        const char* verify_says;
    };
    const Case cases[] = {
        {"nan", "layers.0.attn.q", 5, std::numeric_limits<float>::quiet_NaN(),
         "tensor 'layers.0.attn.q': element 5 (row 0, column 5) is nan"},
        {"inf", "layers.1.mlp.down", 64 * 3 + 1, std::numeric_limits<float>::infinity(),
         "tensor 'layers.1.mlp.down': element 193 (row 1, column 21) is inf"},
    };
    for (const Case& c : cases) {
        INFO(c.label);
        const fs::path bad = dir / (std::string(c.label) + ".qf");
        poison(good, bad, c.tensor, c.index, c.value);
        const std::string model_error =
            "qforge: error: " + bad.string() + ": the logits at position ";

        auto v = test::run_qforge("verify " + quoted(bad));
        INFO(v.output);
        REQUIRE(v.exit_code == 1);
        REQUIRE_THAT(v.output, Contains(bad.string() + ": " + c.verify_says));

        for (const std::string& cmd :
             {"ppl " + quoted(bad) + " -f " + quoted(text) + " --ctx 32",
              "ppl " + quoted(bad) + " -f " + quoted(text) + " --ctx 32 --protocol gptq",
              "ppl " + quoted(good) + " -f " + quoted(text) + " --ctx 32 --kl-base " + quoted(bad),
              "generate " + quoted(bad) + " -n 8 --greedy",
              "generate " + quoted(bad) + " -n 8 -p Once",
              "bench " + quoted(bad) + " -p 8 -n 4 -r 1"}) {
            INFO(cmd);
            const auto r = test::run_qforge("-q " + cmd);
            INFO(r.output);
            REQUIRE(r.exit_code == 1);
            REQUIRE_THAT(r.output, Contains(model_error));
            REQUIRE_THAT(r.output, Contains("are not finite"));
            REQUIRE_THAT(r.output, !Contains("PPL ="));
        }
        // Quantizing reads every weight before any calibration: the same error, naming the
        // tensor, from every method, and no output file.
        for (const char* method : {"rtn", "gptq", "awq"}) {
            INFO(method);
            const fs::path out = dir / (std::string(c.label) + "-" + method + ".qf");
            const auto r =
                test::run_qforge("-q quantize " + quoted(bad) + " -o " + quoted(out) +
                                 " --qtype q4_g32 --method " + method +
                                 (std::string(method) == "rtn"
                                      ? ""
                                      : " --calib " + quoted(text) + " --seqlen 32 --nsamples 4"));
            INFO(r.output);
            REQUIRE(r.exit_code == 1);
            REQUIRE_THAT(r.output, Contains(bad.string() + ": tensor '" + c.tensor + "'"));
            REQUIRE_THAT(r.output, Contains("weights must be finite"));
            REQUIRE_THAT(r.output, !Contains("block"));  // before any calibration work
            REQUIRE(!fs::exists(out));
        }
        // ppl names the chunk and the text token.
        const auto p = test::run_qforge("-q ppl " + quoted(bad) + " -f " + quoted(text) +
                                        " --ctx 32 --protocol gptq");
        REQUIRE_THAT(p.output, Contains("position 0 of chunk 0 (text token 0, scoring the next)"));
    }
}

TEST_CASE("nonfinite: a perplexity that scores no token is an error naming the text and ctx",
          "[hostile][validate][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("nonfinite-ppl-ctx");
    const fs::path qf = test::convert_stories(data, "hf", dir);
    const fs::path text = dir / "story.txt", tiny = dir / "tiny.txt";
    test::write_file(text, story());
    test::write_file(tiny, std::string("Once upon a time"));
    // Token counts as ppl sees them (BOS included), from the tokenizer itself.
    const auto count = [&](const fs::path& p) {
        const auto r = test::run_qforge("tokenize " + quoted(qf) + " --count -f " + quoted(p));
        REQUIRE(r.exit_code == 0);
        // stdout's count, beside the summary on stderr.
        std::istringstream lines(r.output);
        for (std::string line; std::getline(lines, line);)
            if (!line.empty() && line.find_first_not_of("0123456789") == std::string::npos)
                return std::stoul(line);
        FAIL("no count in: " << r.output);
        return 0ul;
    };
    const std::string n = std::to_string(count(text)), m = std::to_string(count(tiny));
    REQUIRE(count(tiny) < 6);  // too short for llamacpp at any ctx

    struct Case {
        std::string args, expected;
    };
    const Case cases[] = {
        // llamacpp scores positions ctx/2+1 .. ctx-1: none for ctx 2, whatever the text.
        {"-f " + quoted(text) + " --ctx 2",
         text.string() + ": the llamacpp protocol with --ctx 2 scores no token"},
        {"-f " + quoted(text) + " --ctx 2", "the text has " + n + " tokens: --ctx 3 to " +
                                                std::to_string(std::stoul(n) / 2) +
                                                " would score tokens of this text"},
        {"-f " + quoted(tiny) + " --ctx 64",
         tiny.string() + ": the text has " + m +
             " tokens; the llamacpp protocol with --ctx 64 needs at least 128: the text is too "
             "short for the llamacpp protocol at any --ctx (it needs 6 tokens)"},
        {"-f " + quoted(tiny) + " --ctx 3",
         "--protocol gptq with --ctx 2 to " + m + " would score some"},
        {"-f " + quoted(tiny) + " --ctx 64 --protocol gptq",
         tiny.string() + ": the text has " + m +
             " tokens; the gptq protocol with --ctx 64 needs at least 64: --ctx 2 to " + m +
             " would score tokens of this text"},
    };
    for (const Case& c : cases) {
        INFO(c.args);
        const auto r = test::run_qforge("-q ppl " + quoted(qf) + " " + c.args);
        INFO(r.output);
        REQUIRE(r.exit_code == 1);
        REQUIRE_THAT(r.output, Contains("qforge: error: "));
        REQUIRE_THAT(r.output, Contains(c.expected));
        REQUIRE_THAT(r.output, !Contains("PPL ="));
    }
    // The smallest ctx each protocol scores with does run.
    REQUIRE(
        test::run_qforge("-q ppl " + quoted(qf) + " -f " + quoted(text) + " --ctx 3").exit_code ==
        0);
    REQUIRE(test::run_qforge("-q ppl " + quoted(qf) + " -f " + quoted(tiny) +
                             " --ctx 2 --protocol gptq")
                .exit_code == 0);
}

TEST_CASE("nonfinite: generation never chooses an id without a token, greedy or sampled",
          "[hostile][validate][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("nonfinite-mask");
    const Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool pool(1);
    auto cpu = make_cpu_backend(model, pool);
    FavourLastId favour(*cpu);
    const uint64_t vocab = model.config().vocab_size;
    const int32_t last = static_cast<int32_t>(vocab - 1);
    const int32_t prompt[] = {1};
    for (float temp : {0.0f, 1.0f}) {
        INFO("temperature " << temp);
        GenerateOptions o;
        o.sampling = {temp, 0, 1.0f, 7};
        o.max_new_tokens = 16;
        // Without a limit the favoured id wins every step: the fixture can fail.
        const GenerateResult unmasked = generate(favour, prompt, o);
        REQUIRE(unmasked.tokens == std::vector<int32_t>(16, last));
        // With the tokenizer one short of the vocabulary, it is never chosen.
        o.token_count = vocab - 1;
        const GenerateResult masked = generate(favour, prompt, o);
        REQUIRE(masked.tokens.size() == 16);
        for (int32_t id : masked.tokens) REQUIRE(id < last);
    }
}

TEST_CASE("nonfinite: verify's scan finds NaN/Inf in every float type and in packed scales",
          "[hostile][validate]") {
    const auto u16 = [](std::vector<uint8_t>& b, size_t at, uint16_t v) {
        std::memcpy(b.data() + at, &v, 2);
    };
    // Float tensors: one bad element at index 5 of a [2, 3] matrix.
    struct FloatCase {
        QType qtype;
        uint16_t bits;  // f16/bf16 bits; f32 uses the float below
        float f32;
        const char* says;
    };
    // clang-format off
    const FloatCase floats[] = {
        {QType::f32, 0, std::numeric_limits<float>::quiet_NaN(), "element 5 (row 1, column 2) is nan"},
        {QType::f32, 0, -std::numeric_limits<float>::infinity(), "element 5 (row 1, column 2) is inf"},
        {QType::f16, 0x7E00, 0, "element 5 (row 1, column 2) is nan"},
        {QType::f16, 0xFC00, 0, "element 5 (row 1, column 2) is inf"},
        {QType::bf16, 0x7FC0, 0, "element 5 (row 1, column 2) is nan"},
        {QType::bf16, 0x7F80, 0, "element 5 (row 1, column 2) is inf"},
    };
    // clang-format on
    for (const auto& c : floats) {
        INFO(qtype_traits(c.qtype).name << " " << c.says);
        const QfTensorInfo t{"w", c.qtype, {2, 3}, 0, 0, 0, QfEncoding::raw, ""};
        const size_t size = c.qtype == QType::f32 ? 4 : 2;
        std::vector<uint8_t> b(6 * size, 0);
        REQUIRE_FALSE(find_non_finite(t, b));
        // The largest finite values are not flagged.
        if (c.qtype == QType::f32) {
            const float big = std::numeric_limits<float>::max();
            std::memcpy(b.data() + 20, &big, 4);
        } else {
            u16(b, 10, c.qtype == QType::f16 ? 0x7BFF : 0x7F7F);
        }
        REQUIRE_FALSE(find_non_finite(t, b));
        if (c.qtype == QType::f32)
            std::memcpy(b.data() + 20, &c.f32, 4);
        else
            u16(b, 10, c.bits);
        REQUIRE(find_non_finite(t, b) == std::optional<std::string>(c.says));
    }
    // Packed rows: codes are integers; a scale is the only place a NaN or Inf can hide.
    for (const auto& row : kQTypes) {
        if (row.is_float) continue;
        INFO(row.name);
        const QfTensorInfo t{"w", row.type, {3, 256}, 0, 0, 0, QfEncoding::raw, ""};
        const QRowLayout l = *qtype_row_layout(row.type, 256);
        std::vector<uint8_t> b(3 * l.row_bytes, 0xFF);  // codes and zeros all ones: still finite
        if (row.super_block) {  // one record: d and dmin are the fp16 values, sm all ones is fine
            u16(b, l.scales_offset, 0x3C00);
            u16(b, l.scales_offset + 2, 0x3C00);
            for (uint64_t r = 1; r < 3; ++r)
                std::memcpy(b.data() + r * l.row_bytes, b.data(), l.row_bytes);
            REQUIRE_FALSE(find_non_finite(t, b));
            u16(b, 2 * l.row_bytes + l.scales_offset + 2, 0x7E00);
            REQUIRE(find_non_finite(t, b) ==
                    std::optional<std::string>("row 2, super-block 0: dmin is nan"));
            continue;
        }
        for (uint64_t r = 0; r < 3; ++r)
            for (uint64_t g = 0; g < l.groups; ++g)
                u16(b, r * l.row_bytes + l.scales_offset + 2 * g, 0x3C00);  // 1.0
        REQUIRE_FALSE(find_non_finite(t, b));
        const uint64_t g = l.groups - 1;
        u16(b, 2 * l.row_bytes + l.scales_offset + 2 * g, 0x7C00);
        const std::string says = "row 2, group " + std::to_string(g) + ": the scale is inf";
        REQUIRE(find_non_finite(t, b) == std::optional<std::string>(says));
    }
}

}  // namespace nonfinite_test
