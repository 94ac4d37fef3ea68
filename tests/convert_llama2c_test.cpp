// llama2.c checkpoints -> .qf: the real stories260K.bin against an independent Hugging Face
// conversion of the same model (made with transformers' RoPE permutation), small hand-built files
// for the unshared classifier and --dtype, and a catalogue of broken files.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/error.hpp"
#include "formats/qf.hpp"
#include "sources/llama2c.hpp"
#include "sources/source_common.hpp"
#include "test_support.hpp"

namespace convert_llama2c_test {

using namespace qforge;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

// A llama2.c version-0 file built from the README's description, independently of the converter:
// the header, then every float array in file order. Element k of the whole float section holds
// value_at(k), so a test can find any element by its file position.
struct V0File {
    Llama2cHeader h;
    std::vector<uint8_t> bytes;
    uint64_t D, H, L, V, KV, S, HD;

    static float value_at(uint64_t k) { return static_cast<float>(k % 997) * 1e-3f - 0.5f; }

    explicit V0File(Llama2cHeader header) : h(header) {
        D = static_cast<uint64_t>(h.dim), H = static_cast<uint64_t>(h.hidden_dim);
        L = static_cast<uint64_t>(h.n_layers), S = static_cast<uint64_t>(h.seq_len);
        V = static_cast<uint64_t>(std::abs(h.vocab_size));
        HD = D / static_cast<uint64_t>(h.n_heads);
        KV = HD * static_cast<uint64_t>(h.n_kv_heads);
        uint64_t floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D +
                          3 * L * H * D + D + 2 * S * (HD / 2);
        if (h.vocab_size < 0) floats += V * D;
        bytes.resize(28 + 4 * floats);
        std::memcpy(bytes.data(), &h, 28);
        for (uint64_t k = 0; k < floats; ++k) set(k, value_at(k));
    }
    void set(uint64_t k, float v) { std::memcpy(bytes.data() + 28 + 4 * k, &v, 4); }
    float get(uint64_t k) const {
        float v;
        std::memcpy(&v, bytes.data() + 28 + 4 * k, 4);
        return v;
    }
    // Float index where the arrays start (README order).
    uint64_t wq() const { return V * D + L * D; }
    uint64_t wk() const { return wq() + L * D * D; }
    uint64_t rms_final() const { return wk() + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D; }
    uint64_t wcls() const { return rms_final() + D + 2 * S * (HD / 2); }
};

// dim 16, hidden 24, 2 layers, 4 heads of 4, 2 kv heads, vocab 10, seq 8.
constexpr Llama2cHeader kSmall{16, 24, 2, 4, 2, 10, 8};

std::vector<float> floats_of(std::span<const uint8_t> b) {
    std::vector<float> f(b.size() / 4);
    std::memcpy(f.data(), b.data(), b.size());
    return f;
}

ConvertOptions options(const fs::path& in, const fs::path& out, const fs::path& tokenizer = {}) {
    ConvertOptions o;
    o.input = in.string();
    o.output = out.string();
    o.tokenizer = tokenizer.string();
    return o;
}

void require_no_output(const fs::path& dir) { REQUIRE(test::files_containing(dir, ".qf").empty()); }

}  // namespace

TEST_CASE("llama2c: stories260K.bin gives the tensors and config of its HF conversion",
          "[llama2c][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("llama2c-stories");
    const fs::path st = data / "stories260K";
    const fs::path tok = st / "tok512.bin";

    const ConvertOptions from_bin = options(st / "stories260K.bin", dir / "bin.qf");
    const ConvertReport rb = convert_checkpoint(from_bin);  // tokenizer found beside it
    REQUIRE(fs::path(rb.tokenizer).filename() == "tok512.bin");
    REQUIRE(rb.parameters == 260032);  // stated in the model's README
    const ConvertOptions from_hf = options(st / "hf", dir / "hf.qf", tok);
    convert_checkpoint(from_hf);

    QfFile a(from_bin.output, {.verify_checksums = true}), b(from_hf.output);
    REQUIRE(a.model() == b.model());
    REQUIRE(a.header().at("tokenizer") == b.header().at("tokenizer"));
    REQUIRE(a.header()["provenance"]["recipe"]["source_format"] == "llama2c-v0");
    REQUIRE(a.tensors().size() == b.tensors().size());
    std::vector<uint8_t> sa, sb;
    for (size_t i = 0; i < a.tensors().size(); ++i) {
        const QfTensorInfo &ta = a.tensors()[i], &tb = b.tensors()[i];
        INFO(ta.name);
        REQUIRE(ta.name == tb.name);
        REQUIRE(ta.qtype == tb.qtype);
        REQUIRE(ta.shape == tb.shape);
        REQUIRE(ta.checksum == tb.checksum);
        const auto ba = a.tensor_bytes(ta, sa), bb = b.tensor_bytes(tb, sb);
        REQUIRE(std::equal(ba.begin(), ba.end(), bb.begin(), bb.end()));
    }
}

TEST_CASE("llama2c: the qforge CLI converts a .bin and names the tokenizer", "[llama2c][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("llama2c-cli");
    const fs::path st = data / "stories260K";
    auto r = test::run_qforge("convert " + q(st / "stories260K.bin") + " -o " + q(dir / "s.qf") +
                              " --tokenizer " + q(st / "tok512.bin"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE_THAT(r.output, Contains("47 tensors, 260032 parameters"));
    REQUIRE(test::run_qforge("verify " + q(dir / "s.qf")).exit_code == 0);
}

TEST_CASE("llama2c: RoPE rows go from adjacent pairs to rotate-half as HF's permute does",
          "[llama2c]") {
    // transformers' permute(w, n_heads=2) for head_dim 4 on 8 one-byte rows: within a head, the
    // even rows (first element of each pair) then the odd rows.
    const std::vector<uint8_t> in{0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<uint8_t> out(8);
    permute_rope_pairs_to_halves(in, out, 2, 4, 1);
    REQUIRE(out == std::vector<uint8_t>{0, 2, 1, 3, 4, 6, 5, 7});
    // head_dim 8, one head, rows of 3 bytes: the rows move whole.
    std::vector<uint8_t> in3(24), out3(24);
    for (size_t i = 0; i < in3.size(); ++i) in3[i] = static_cast<uint8_t>(i);
    permute_rope_pairs_to_halves(in3, out3, 1, 8, 3);
    const size_t order[] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (size_t r = 0; r < 8; ++r)
        for (size_t c = 0; c < 3; ++c) REQUIRE(out3[3 * r + c] == in3[3 * order[r] + c]);
}

TEST_CASE("llama2c: unshared classifier, GQA permutation and --dtype on a small file",
          "[llama2c]") {
    test::ScratchDir dir("llama2c-small");
    Llama2cHeader h = kSmall;
    h.vocab_size = -h.vocab_size;  // wcls follows the freq_cis arrays
    const V0File f(h);
    const fs::path in = dir / "small.bin";
    test::write_file(in, f.bytes);
    REQUIRE(is_llama2c_checkpoint(in.string()));

    const ConvertOptions o = options(in, dir / "small.qf");
    const ConvertReport r = convert_checkpoint(o);
    REQUIRE(r.tokenizer.empty());  // none beside it: a warning, not an error
    REQUIRE(r.warnings.size() == 1);

    QfFile qf(o.output, {.verify_checksums = true});
    const auto& m = qf.model();
    REQUIRE(m["tie_word_embeddings"] == false);
    REQUIRE(m["vocab_size"] == 10);
    REQUIRE(m["head_dim"] == 4);
    REQUIRE(m["num_key_value_heads"] == 2);
    REQUIRE(m["max_position_embeddings"] == 8);
    REQUIRE(m["rms_norm_eps"] == 1e-5);
    REQUIRE(m["rope_theta"] == 10000.0);
    REQUIRE(m["bos_token_id"] == 1);
    REQUIRE(m["eos_token_ids"] == nlohmann::json::array({2}));
    REQUIRE(qf.tensors().back().name == "lm_head");

    std::vector<uint8_t> scratch;
    const auto lm_head = floats_of(qf.tensor_bytes(qf.at("lm_head"), scratch));
    for (uint64_t k = 0; k < f.V * f.D; ++k) REQUIRE(lm_head[k] == f.get(f.wcls() + k));
    // Layer 1's k projection (2 kv heads of 4 rows): rows 0,2,1,3 then 4,6,5,7 of the file's.
    const auto k1 = floats_of(qf.tensor_bytes(qf.at("layers.1.attn.k"), scratch));
    const size_t order[] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (uint64_t row = 0; row < f.KV; ++row)
        for (uint64_t c = 0; c < f.D; ++c)
            REQUIRE(k1[row * f.D + c] == f.get(f.wk() + f.KV * f.D + order[row] * f.D + c));

    // --dtype f16: matrices f16, norms f32.
    ConvertOptions o16 = options(in, dir / "small16.qf");
    o16.dtype = QType::f16;
    convert_checkpoint(o16);
    QfFile qf16(o16.output);
    REQUIRE(qf16.at("layers.0.attn.q").qtype == QType::f16);
    REQUIRE(qf16.at("final_norm").qtype == QType::f32);
}

TEST_CASE("llama2c: detection by extension, magic or a header that matches the length",
          "[llama2c]") {
    test::ScratchDir dir("llama2c-detect");
    const V0File f(kSmall);
    test::write_file(dir / "no_extension", f.bytes);
    REQUIRE(is_llama2c_checkpoint((dir / "no_extension").string()));
    std::vector<uint8_t> longer = f.bytes;
    longer.push_back(0);
    test::write_file(dir / "other", longer);
    REQUIRE_FALSE(is_llama2c_checkpoint((dir / "other").string()));
    test::write_file(dir / "new.export", std::vector<uint8_t>{0x32, 0x34, 0x6b, 0x61, 1, 0, 0, 0});
    REQUIRE(is_llama2c_checkpoint((dir / "new.export").string()));
    test::write_file(dir / "model.safetensors", f.bytes);
    REQUIRE_FALSE(is_llama2c_checkpoint((dir / "model.safetensors").string()));
    REQUIRE_FALSE(is_llama2c_checkpoint(dir.path().string()));
    REQUIRE_FALSE(is_llama2c_checkpoint((dir / "absent.bin").string()));
}

TEST_CASE("llama2c: broken files each give their error and leave no output", "[llama2c][broken]") {
    test::ScratchDir dir("llama2c-broken");
    const fs::path in = dir / "broken.bin";
    const ConvertOptions o = options(in, dir / "out.qf");
    auto expect = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
        test::write_file(in, bytes);
        INFO(what);
        REQUIRE_THROWS_WITH(convert_checkpoint(o), Contains(what) && Contains(in.string()));
        require_no_output(dir.path());
    };
    auto with_header = [](Llama2cHeader h) {
        std::vector<uint8_t> b(28 + 64);
        std::memcpy(b.data(), &h, 28);
        return b;
    };
    const V0File good(kSmall);

    SECTION("empty") { expect({}, "truncated: 0 bytes"); }
    SECTION("shorter than the header") {
        expect(std::vector<uint8_t>(20, 1), "truncated: 20 bytes");
    }
    SECTION("truncated weights") {
        auto b = good.bytes;
        b.resize(b.size() - 4);
        expect(b, "implies " + std::to_string(good.bytes.size()) + " (truncated)");
    }
    SECTION("trailing bytes") {
        auto b = good.bytes;
        b.resize(b.size() + 4);
        expect(b, "(trailing bytes)");
    }
    SECTION("header values out of range") {
        struct Case {
            const char* what;
            void (*mutate)(Llama2cHeader&);
        };
        const Case cases[] = {
            {"n_heads must be at least 1", [](Llama2cHeader& h) { h.n_heads = 0; }},
            {"n_layers must be at least 1", [](Llama2cHeader& h) { h.n_layers = -3; }},
            {"dim is not a multiple of n_heads", [](Llama2cHeader& h) { h.n_heads = 3; }},
            {"head_dim = dim / n_heads is odd",
             [](Llama2cHeader& h) { h.n_heads = h.n_kv_heads = 16; }},
            {"n_heads is not a multiple of n_kv_heads", [](Llama2cHeader& h) { h.n_kv_heads = 3; }},
            {"vocab_size must be non-zero", [](Llama2cHeader& h) { h.vocab_size = 0; }},
        };
        for (const Case& c : cases) {
            Llama2cHeader h = kSmall;
            c.mutate(h);
            expect(with_header(h), c.what);
        }
    }
    SECTION("sizes that overflow 64 bits") {
        constexpr int32_t big = std::numeric_limits<int32_t>::max();
        expect(with_header({1 << 30, big, big, 2, 2, big, big}), "larger than 2^64 bytes");
    }
    SECTION("huge but representable sizes") {
        expect(with_header({4096, 11008, 32, 32, 32, 32000, 2048}), "(truncated)");
    }
    SECTION("NaN in a weight names the tensor and the element in file order") {
        V0File f(kSmall);
        f.set(f.wq() + f.D * f.D + 5, std::numeric_limits<float>::quiet_NaN());  // layer 1
        expect(f.bytes, "tensor 'layers.1.attn.q (llama2.c wq, layer 1)': element 5 is nan");
    }
    SECTION("Inf in the final norm") {
        V0File f(kSmall);
        f.set(f.rms_final() + 2, -std::numeric_limits<float>::infinity());
        expect(f.bytes, "'final_norm (llama2.c rms_final_weight)': element 2 is -inf");
    }
    SECTION("newer export formats") {
        expect({0x32, 0x34, 0x6b, 0x61, 2, 0, 0, 0, 0, 0, 0, 0},
               "llama2.c export version 2 (magic \"ak42\") is not supported");
    }
    SECTION("a PyTorch checkpoint named .bin (zip)") {
        expect({'P', 'K', 3, 4, 0, 0, 0, 0}, "PyTorch checkpoint");
    }
    SECTION("a PyTorch checkpoint named .bin (pickle)") {
        std::vector<uint8_t> b(64, 0);
        b[0] = 0x80, b[1] = 0x02, b[2] = ']';
        expect(b, "PyTorch checkpoint");
    }
}

TEST_CASE("llama2c: a genuine header that starts like a pickle (dim 640) converts", "[llama2c]") {
    test::ScratchDir dir("llama2c-dim640");
    const V0File f({640, 8, 1, 10, 1, 4, 2});  // dim 640 is the bytes 0x80 0x02
    REQUIRE(f.bytes[0] == 0x80);
    REQUIRE(f.bytes[1] == 0x02);
    test::write_file(dir / "wide.bin", f.bytes);
    const ConvertReport r = convert_checkpoint(options(dir / "wide.bin", dir / "wide.qf"));
    REQUIRE(r.parameters == 4 * 640 + 640 + 2 * 640 * 640 + 2 * 64 * 640 + 640 + 3 * 8 * 640 + 640);
}

TEST_CASE("llama2c: a tokenizer of another vocabulary is refused", "[llama2c][broken][shared]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("llama2c-tokvocab");
    const V0File f(kSmall);
    test::write_file(dir / "small.bin", f.bytes);
    const ConvertOptions o =
        options(dir / "small.bin", dir / "out.qf", data / "stories260K" / "tok512.bin");
    REQUIRE_THROWS_WITH(convert_checkpoint(o),
                        Contains("tokenizer has 512 tokens, more than the vocab_size 10 of"));
    require_no_output(dir.path());
}

TEST_CASE("llama2c: CLI errors are one line and leave no file", "[llama2c][broken]") {
    test::ScratchDir dir("llama2c-cli-broken");
    V0File f(kSmall);
    f.bytes.resize(f.bytes.size() - 1);
    test::write_file(dir / "cut.bin", f.bytes);
    auto r = test::run_qforge("convert " + q(dir / "cut.bin") + " -o " + q(dir / "o.qf"));
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    REQUIRE(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    REQUIRE_THAT(r.output, Contains("qforge: error: ") && Contains("(truncated)"));
    require_no_output(dir.path());
}

}  // namespace convert_llama2c_test
