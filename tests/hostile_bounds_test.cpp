// Hostile inputs whose declared sizes exceed what their bytes can hold, and hostile lengths that
// would make tokenizer building quadratic: each must fail (or finish) without allocating what
// the file declares, with one error naming the file and what was found against what was
// expected.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_support.hpp"
#include "convert/convert.hpp"
#include "core/error.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/zstd_frame.hpp"
#include "qf_support.hpp"
#include "sources/detect.hpp"
#include "test_support.hpp"
#include "tokenizer/added_tokens.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/tokenizer.hpp"

namespace hostile_bounds_test {

using namespace qforge;
using Catch::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using qforge::test::q;

size_t count_lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

void put_le(std::vector<uint8_t>& b, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// One zstd frame by hand (RFC 8878): single segment, an 8-byte Frame_Content_Size, then the
// blocks given as (type, size, content bytes).
struct Block {
    unsigned type;  // 0 raw, 1 RLE, 2 compressed
    uint32_t size;
    std::vector<uint8_t> content;
};
std::vector<uint8_t> zstd_frame(uint64_t content_size, const std::vector<Block>& blocks) {
    std::vector<uint8_t> f;
    put_le(f, 0xFD2FB528u, 4);
    f.push_back(0xE0);  // FCS flag 3 (8 bytes), single segment, no checksum, no dictionary
    put_le(f, content_size, 8);
    for (size_t i = 0; i < blocks.size(); ++i) {
        const uint32_t last = i + 1 == blocks.size() ? 1 : 0;
        put_le(f, last | blocks[i].type << 1 | blocks[i].size << 3, 3);
        f.insert(f.end(), blocks[i].content.begin(), blocks[i].content.end());
    }
    return f;
}

// A compressed .qf with one incompressible f32 tensor "w", then its tensor bytes replaced by
// `frame` and its shape by `shape` (length to match), the preamble kept consistent. With a
// `model`, the file is a valid model but for the bomb: "w" is its embedding (so `shape` must be
// [vocab, hidden]) and every other tensor it expects follows, in f32 zeros; without one, only
// the container is valid (open it with check_model = false).
void write_bomb_qf(const fs::path& path, const std::vector<uint8_t>& frame,
                   const std::vector<uint64_t>& shape, const ModelConfig* model = nullptr) {
    {
        QfWriter w(path.string(), {.compress = true});
        w.set_model(model ? model_config_to_json(*model) : json{{"arch", "llama"}});
        w.set_provenance({{"recipe", {{"command", "test"}}}});
        const uint64_t n = frame.size() / 4 + 64;
        std::vector<uint8_t> bytes(n * 4);
        std::mt19937 rng(1);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
        w.add_tensor(model ? "embed" : "w", QType::f32, {n}, bytes);
        if (model) test::add_zero_tensors(w, *model, "embed");
        w.finish();
    }
    auto bytes = test::read_file(path);
    QfPreamble pre;
    std::memcpy(&pre, bytes.data(), sizeof pre);
    json h = json::parse(bytes.begin() + static_cast<long>(pre.header_offset), bytes.end());
    json& t = h["tensors"][0];
    REQUIRE(t["stored_length"].get<uint64_t>() >= frame.size());
    uint64_t length = 4;
    for (uint64_t d : shape) length *= d;
    t["shape"] = shape;
    t["length"] = length;
    t["stored_length"] = frame.size();
    t["encoding"] = "zstd";  // the writer stored the incompressible bytes raw
    std::memcpy(bytes.data() + pre.data_offset + t["offset"].get<uint64_t>(), frame.data(),
                frame.size());
    test::write_file(path, bytes);
    test::replace_qf_header(path, h.dump());
}

// Address-space limit for child runs that prove nothing huge is allocated; ASan reserves
// terabytes of shadow memory, so there the limit is not applied.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCanLimitMemory = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kCanLimitMemory = false;
#else
constexpr bool kCanLimitMemory = true;
#endif
#else
constexpr bool kCanLimitMemory = true;
#endif
const std::string kLimit1GiB = kCanLimitMemory ? "ulimit -v 1048576;" : "";

void require_one_line_error(const test::CommandResult& r, const std::vector<std::string>& parts) {
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    REQUIRE(count_lines(r.output) == 1);
    REQUIRE(r.output.rfind("qforge: error: ", 0) == 0);
    for (const auto& p : parts) REQUIRE_THAT(r.output, Contains(p));
    REQUIRE_THAT(r.output, !Contains("out of memory") && !Contains("_M_") && !Contains(".tmp."));
}

}  // namespace

TEST_CASE("zstd frame bound: matches what the frame regenerates", "[hostile][bounds]") {
    std::string why;
    const auto rle = zstd_frame(131072, {{1, 131072, {0x5a}}});
    const auto b = zstd_frame_bound(rle, why);
    REQUIRE(b);
    CHECK(b->frame_bytes == rle.size());
    CHECK(b->max_content == 131072);
    CHECK(b->content_size == 131072);
    // The hand-made frame really decodes, so the walker read the same format zstd does.
    std::vector<uint8_t> out;
    zstd_decode_exact(rle, 131072, "f", "t", out);
    CHECK(out == std::vector<uint8_t>(131072, 0x5a));

    // Incomplete frames: no last block, a block past the end.
    auto open = rle;
    open[13] &= 0xfe;  // clear Last_Block
    CHECK_FALSE(zstd_frame_bound(open, why));
    CHECK_THAT(why, Contains("no last block"));
    const auto cut = std::vector<uint8_t>(rle.begin(), rle.end() - 1);
    CHECK_FALSE(zstd_frame_bound(cut, why));
    CHECK_THAT(why, Contains("truncated"));
    CHECK_FALSE(zstd_frame_bound(std::vector<uint8_t>(16, 0), why));
    CHECK_THAT(why, Contains("magic"));
}

TEST_CASE("a zstd bomb .qf fails before anything of its declared size is allocated",
          "[hostile][bounds]") {
    test::ScratchDir dir("bounds-zstd");
    const fs::path p = dir / "bomb.qf";

    SECTION("16 stored bytes declaring 1.5 GiB: refused at open by the 32768:1 ratio") {
        const uint64_t rows = 393216, cols = 1024;  // x 4 bytes = 1.5 GiB
        auto frame = zstd_frame(rows * cols * 4, {{1, 131072, {0}}});
        frame.pop_back();  // 16 bytes: the frame is not even complete
        REQUIRE(frame.size() == 16);
        write_bomb_qf(p, frame, {rows, cols});
        REQUIRE_THROWS_WITH(
            QfFile(p.string(), {.check_model = false}),
            Contains(p.string()) && Contains("tensor 'w'") &&
                Contains("declares 1.50 GiB (1610612736 bytes) uncompressed from 16 "
                         "stored bytes; zstd cannot expand more than 32768:1"));
    }
    SECTION("2^62 bytes declared") {
        write_bomb_qf(p, zstd_frame(uint64_t{1} << 62, {{1, 8, {0}}}), {uint64_t{1} << 60});
        REQUIRE_THROWS_WITH(QfFile(p.string(), {.check_model = false}),
                            Contains("tensor 'w'") && Contains("4611686018427387904"));
    }
    SECTION("a frame whose blocks cannot produce the declared size, within the ratio") {
        // 16 raw bytes and one 128 KiB RLE block can make at most 131088 bytes, not 1 MiB.
        const auto frame =
            zstd_frame(1 << 20, {{0, 16, std::vector<uint8_t>(16, 1)}, {1, 131072, {2}}});
        write_bomb_qf(p, frame, {256, 1024});
        const QfFile qf(p.string(), {.check_model = false});
        std::vector<uint8_t> scratch;
        REQUIRE_THROWS_WITH(qf.tensor_bytes(qf.at("w"), scratch, true),
                            Contains("tensor 'w'") && Contains("regenerate at most 131088 bytes"));
        CHECK(scratch.capacity() < (1 << 20));
    }
    SECTION("the frame is followed by other bytes") {
        auto frame = zstd_frame(4, {{0, 4, {1, 2, 3, 4}}});
        frame.push_back(0);
        write_bomb_qf(p, frame, {1});
        const QfFile qf(p.string(), {.check_model = false});
        std::vector<uint8_t> scratch;
        REQUIRE_THROWS_WITH(qf.tensor_bytes(qf.at("w"), scratch, true),
                            Contains("expected exactly one frame"));
    }
    SECTION("the CLI, under a 1 GiB address-space limit, for 1.5 GiB declared in 48 KiB") {
        // Within the ratio (48 KiB x 32768 = 1.5 GiB), so only the block walk refuses it: an
        // allocation of the declared size would fail under the limit with no context.
        std::vector<Block> blocks;
        blocks.push_back({0, 49200, std::vector<uint8_t>(49200, 7)});
        blocks.push_back({1, 131072, {0}});
        // A valid model but for the bomb (verify checks the model before any tensor's bytes):
        // vocabulary 393216 x hidden 1024, every other tensor a few KiB.
        const ModelConfig c = test::tiny_llama_config(393216, 1024);
        write_bomb_qf(p, zstd_frame(uint64_t{1610612736}, blocks), {393216, 1024}, &c);
        const auto r = test::run_qforge("verify " + q(p), kLimit1GiB);
        require_one_line_error(r,
                               {p.string(), "tensor 'embed'", "regenerate at most 180272 bytes"});
    }
}

TEST_CASE("input detection looks at content, convert and quantize agree", "[hostile][bounds]") {
    test::ScratchDir dir("bounds-detect");
    const fs::path out = dir / "out.qf";
    auto both = [&](const fs::path& in, const std::vector<std::string>& parts) {
        for (const std::string cmd : {"convert ", "quantize --qtype q8 "}) {
            const auto r = test::run_qforge(cmd + q(in) + " -o " + q(out), kLimit1GiB);
            INFO(cmd);
            require_one_line_error(r, parts);
            REQUIRE_FALSE(fs::exists(out));
        }
    };
    const std::string expected =
        "expected a GGUF ('GGUF'), .qf ('QFORGE'), safetensors or llama2.c";

    SECTION("a .gguf with a bad magic") {
        test::write_file(dir / "x.gguf", std::string("GGUX\x03\0\0\0 and more bytes", 24));
        both(dir / "x.gguf",
             {"x.gguf: not a known model file: starts with bytes 47 47 55 58 03 00 00 00", expected,
              "does not start with 'GGUF'"});
        CHECK(detect_model_file((dir / "x.gguf").string()).kind == ModelFileKind::unknown);
    }
    SECTION("an empty file") {
        test::write_file(dir / "empty.safetensors.bak", std::string());
        both(dir / "empty.safetensors.bak",
             {"empty.safetensors.bak", "it is empty (0 bytes)", expected});
    }
    SECTION("random bytes") {
        std::mt19937 rng(14);
        std::vector<uint8_t> b(4096);
        for (auto& x : b) x = static_cast<uint8_t>(rng() & 0x7f);  // no 0x80: not a pickle
        b[0] = 'Z';
        test::write_file(dir / "random.dat", b);
        both(dir / "random.dat",
             {"random.dat: not a known model file: starts with bytes 5a", expected});
    }
    SECTION("a .qf given to convert; a GGUF magic under another name read as a GGUF") {
        {
            QfWriter w((dir / "m.qf").string(), {});
            w.set_model({{"arch", "llama"}});
            w.set_provenance({{"recipe", {{"command", "test"}}}});
            w.add_tensor("x", QType::f32, {1}, std::vector<uint8_t>(4, 0));
            w.finish();
        }
        const auto r = test::run_qforge("convert " + q(dir / "m.qf") + " -o " + q(out));
        require_one_line_error(
            r, {"m.qf", "already a .qf model", "qforge quantize", "qforge inspect"});
        CHECK(detect_model_file((dir / "m.qf").string()).kind == ModelFileKind::qf);
        // A .qf named otherwise is still a .qf.
        fs::copy_file(dir / "m.qf", dir / "m.bin");
        CHECK(detect_model_file((dir / "m.bin").string()).kind == ModelFileKind::qf);

        test::write_file(dir / "g.bin", std::string("GGUF\x03\0\0\0", 8) + std::string(16, '\0'));
        const auto g =
            test::run_qforge("quantize --qtype q8 " + q(dir / "g.bin") + " -o " + q(out));
        // quantize reads GGUF directly (sources/): the error is the GGUF reader's, naming the key.
        require_one_line_error(g, {"g.bin", "'general.architecture'", "is absent"});
    }
    SECTION("a safetensors header is recognised without the extension") {
        const std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
        std::vector<uint8_t> b;
        put_le(b, header.size(), 8);
        b.insert(b.end(), header.begin(), header.end());
        b.resize(b.size() + 4, 0);
        test::write_file(dir / "weights.data", b);
        CHECK(detect_model_file((dir / "weights.data").string()).kind ==
              ModelFileKind::safetensors);
    }
}

TEST_CASE("safetensors and llama2.c declared sizes are bounded by the file", "[hostile][bounds]") {
    test::ScratchDir dir("bounds-sizes");
    const fs::path out = dir / "out.qf";
    SECTION("a safetensors shape whose byte count overflows 64 bits") {
        const fs::path ckpt = dir / "ckpt";
        fs::create_directories(ckpt);
        test::write_file(ckpt / "config.json",
                         std::string(R"({"model_type": "llama", "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 4, "max_position_embeddings": 16,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": true})"));
        const std::string header =
            R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,4]}})";
        std::vector<uint8_t> b;
        put_le(b, header.size(), 8);
        b.insert(b.end(), header.begin(), header.end());
        b.resize(b.size() + 4, 0);
        test::write_file(ckpt / "model.safetensors", b);
        const auto r = test::run_qforge("convert " + q(ckpt) + " -o " + q(out), kLimit1GiB);
        require_one_line_error(r, {"model.safetensors", "model.embed_tokens.weight", "2^64"});
    }
    SECTION("config.json declaring 2^31 - 1 layers beside a one-tensor checkpoint") {
        const fs::path ckpt = dir / "deep";
        fs::create_directories(ckpt);
        test::write_file(
            ckpt / "config.json",
            std::string(R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "hidden_act": "silu", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2147483647, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 4, "max_position_embeddings": 16,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": true})"));
        const std::string header =
            R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[0,128]}})";
        std::vector<uint8_t> b;
        put_le(b, header.size(), 8);
        b.insert(b.end(), header.begin(), header.end());
        b.resize(b.size() + 128, 0);
        test::write_file(ckpt / "model.safetensors", b);
        for (const std::string cmd : {"convert ", "quantize --qtype q8 "}) {
            const auto r = test::run_qforge(cmd + q(ckpt) + " -o " + q(out), kLimit1GiB);
            require_one_line_error(
                r, {"num_hidden_layers is 2147483647 but the checkpoint holds only 1 tensors"});
        }
    }
    SECTION("a GGUF array count no file can hold") {
        std::vector<uint8_t> g{'G', 'G', 'U', 'F'};
        put_le(g, 3, 4);  // version
        put_le(g, 0, 8);  // tensor_count
        put_le(g, 1, 8);  // kv_count
        put_le(g, 3, 8);
        g.insert(g.end(), {'a', '.', 'b'});
        put_le(g, 9, 4);                  // array
        put_le(g, 8, 4);                  // of strings
        put_le(g, uint64_t{1} << 61, 8);  // elements
        g.resize(g.size() + 64, 0);
        test::write_file(dir / "huge.gguf", g);
        const auto r =
            test::run_qforge("convert " + q(dir / "huge.gguf") + " -o " + q(out), kLimit1GiB);
        require_one_line_error(
            r, {"huge.gguf", "metadata key 'a.b' claims 2305843009213693952 elements"});
    }
    SECTION("a llama2.c header with huge dims") {
        std::vector<uint8_t> b;
        for (int32_t v : {1 << 20, 1 << 22, 1 << 10, 1 << 10, 1 << 10, 1 << 20, 1 << 20})
            put_le(b, static_cast<uint32_t>(v), 4);
        b.resize(4096, 0);
        test::write_file(dir / "huge.bin", b);
        const auto r =
            test::run_qforge("convert " + q(dir / "huge.bin") + " -o " + q(out), kLimit1GiB);
        require_one_line_error(r, {"huge.bin", "llama2.c header", "(truncated)"});
    }
}

TEST_CASE("llama2.c vocabulary records are named by index and byte offset", "[hostile][bounds]") {
    test::ScratchDir dir("bounds-vocab");
    const fs::path p = dir / "tok.bin";
    std::vector<uint8_t> b;
    put_le(b, 16, 4);  // max_token_length
    auto record = [&](const std::string& piece, uint32_t len) {
        put_le(b, 0, 4);  // score 0.0f
        put_le(b, len, 4);
        b.insert(b.end(), piece.begin(), piece.end());
    };
    record("a", 1);
    record("bc", 2);
    SECTION("a huge length") {
        record("", 0x7fffffff);
        test::write_file(p, b);
        REQUIRE_THROWS_WITH(load_tokenizer_source(p.string()),
                            Contains(p.string()) &&
                                Contains("llama2.c vocabulary record 2 at byte 23") &&
                                Contains("length 2147483647 outside 0..max_token_length 16") &&
                                !Contains("tensor"));
    }
    SECTION("a piece past the end") {
        record("xy", 9);
        test::write_file(p, b);
        REQUIRE_THROWS_WITH(load_tokenizer_source(p.string()),
                            Contains("record 2 at byte 23: truncated: the piece needs 9 bytes") &&
                                !Contains("tensor"));
    }
}

namespace {

// A llama2.c schema: <unk>, BOS, EOS, the 256 byte pieces, then `extra` with their scores.
json llama2c_schema(const std::vector<std::pair<std::string, double>>& extra) {
    json pieces = json::array(), scores = json::array(), types = json::array();
    for (const char* s : {"<unk>", "<s>", "</s>"}) pieces.push_back(s), scores.push_back(0.0);
    types.push_back("unknown"), types.push_back("special"), types.push_back("special");
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        pieces.push_back(name), scores.push_back(0.0), types.push_back("byte");
    }
    for (const auto& [piece, score] : extra)
        pieces.push_back(piece), scores.push_back(score), types.push_back("normal");
    return {{"schema_version", kTokenizerSchemaVersion},
            {"model", "llama2c"},
            {"source", "llama2c"},
            {"pieces", pieces},
            {"scores", scores},
            {"token_types", types},
            {"max_token_length", 1 << 20},
            {"added_tokens", json::array()},
            {"normalizer", json::array()},
            {"pre_tokenizer", nullptr},
            {"bos_id", 1},
            {"eos_id", 2},
            {"unk_id", 0},
            {"add_bos", true},
            {"add_eos", false},
            {"stop_ids", json::array({1})},
            {"chat_template", ""}};
}

// run.c's encode as written there: code points (or their bytes + 3), then repeatedly merge the
// best-scoring adjacent pair whose concatenation is a piece, leftmost on ties. Quadratic; the
// independent reference for short texts.
std::vector<int32_t> run_c_encode(const json& schema, const std::string& text) {
    std::map<std::string, int32_t> id;
    for (size_t i = 0; i < schema["pieces"].size(); ++i)
        id[schema["pieces"][i]] = static_cast<int32_t>(i);
    std::vector<int32_t> t{1};
    if (text.empty()) return t;  // run.c adds the dummy prefix only to a non-empty text
    t.clear();
    const std::string s = " " + text;
    for (size_t i = 0; i < s.size();) {
        size_t n = 1;
        while (i + n < s.size() && (static_cast<uint8_t>(s[i + n]) & 0xc0) == 0x80) ++n;
        auto it = id.find(s.substr(i, n));
        if (it != id.end())
            t.push_back(it->second);
        else
            for (size_t k = 0; k < n; ++k) t.push_back(static_cast<uint8_t>(s[i + k]) + 3);
        i += n;
    }
    for (;;) {
        double best = -1e10;
        size_t at = t.size();
        int32_t best_id = -1;
        for (size_t i = 0; i + 1 < t.size(); ++i) {
            const std::string m =
                schema["pieces"][static_cast<size_t>(t[i])].get<std::string>() +
                schema["pieces"][static_cast<size_t>(t[i + 1])].get<std::string>();
            auto it = id.find(m);
            if (it != id.end() &&
                schema["scores"][static_cast<size_t>(it->second)].get<double>() > best)
                best = schema["scores"][static_cast<size_t>(it->second)], at = i,
                best_id = it->second;
        }
        if (best_id < 0) break;
        t[at] = best_id;
        t.erase(t.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    t.insert(t.begin(), 1);
    return t;
}

}  // namespace

TEST_CASE("llama2.c merges are built in linear time from a 512 KiB piece", "[hostile][bounds]") {
    // Pieces a, aa, aaaa, ..., a^(2^19), b, ab, ba, " ": merges double the run of a's. Building
    // merges by hashing every split of every piece costs (2^19)^2 byte operations here.
    auto vocab = [](int levels) {
        std::vector<std::pair<std::string, double>> v{
            {" ", 0.0}, {"b", 0.0}, {"ab", -1.0}, {"ba", -2.0}};
        for (int k = 0; k <= levels; ++k)
            v.push_back({std::string(size_t{1} << k, 'a'), static_cast<double>(k)});
        return v;
    };
    const json small_schema = llama2c_schema(vocab(6));
    const Tokenizer small = Tokenizer::from_schema(small_schema, "small");
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
        std::string text;
        const size_t n = rng() % 200;
        for (size_t i = 0; i < n; ++i) text += "aab "[rng() % 4];
        INFO(text);
        REQUIRE(small.encode(text) == run_c_encode(small_schema, text));
    }

    const int levels = 19;
    const Tokenizer big = Tokenizer::from_schema(llama2c_schema(vocab(levels)), "big");
    const int32_t first_a = 3 + 256 + 4;  // ids of the a-runs follow " ", b, ab, ba
    // The same structure as on the short vocabulary, checked there against run.c.
    for (size_t n : {64, 65})
        REQUIRE(small.encode(std::string(n, 'a')) ==
                run_c_encode(small_schema, std::string(n, 'a')));
    REQUIRE(small.encode(std::string(64, 'a')) == std::vector<int32_t>{1, 259, first_a + 6});
    REQUIRE(small.encode(std::string(65, 'a')) ==
            std::vector<int32_t>{1, 259, first_a + 6, first_a});
    REQUIRE(big.encode(std::string(size_t{1} << levels, 'a')) ==
            std::vector<int32_t>{1, 259, first_a + levels});
    REQUIRE(big.encode(std::string((size_t{1} << levels) + 1, 'a')) ==
            std::vector<int32_t>{1, 259, first_a + levels, first_a});
}

TEST_CASE("decoding tables from a piece of 128 Ki meta spaces are built in linear time",
          "[hostile][bounds]") {
    const std::string meta = "\xe2\x96\x81";
    json pieces = json::array({"<unk>", "<s>", "</s>", meta, "a"});
    std::string long_piece;
    for (int i = 0; i < (1 << 17); ++i) long_piece += meta;
    long_piece += "a";
    pieces.push_back(long_piece);
    const json schema = {
        {"schema_version", kTokenizerSchemaVersion},
        {"model", "bpe_sentencepiece"},
        {"pieces", pieces},
        {"token_types", {"unknown", "special", "special", "normal", "normal", "normal"}},
        {"merges", json::array()},
        {"added_tokens", json::array()},
        {"bos_id", 1},
        {"eos_id", 2},
        {"unk_id", 0},
        {"stop_ids", json::array()},
        {"decoder", {{"metaspace", meta}}}};
    const Tokenizer tok = Tokenizer::from_schema(schema, "sp");
    const std::vector<int32_t> ids{5};
    CHECK(tok.decode(ids) == std::string(1 << 17, ' ') + "a");
    CHECK(tok.decode(std::vector<int32_t>{3, 4, 3}) == " a ");
}

TEST_CASE("the calibration text error names every file and its token count", "[hostile][bounds]") {
    QF_REQUIRE_SHARED_DATA(data);
    test::ScratchDir dir("bounds-calib");
    const fs::path qf = test::convert_stories(data, "hf", dir);
    test::write_file(dir / "one.txt", std::string("Once upon a time"));
    test::write_file(dir / "two.txt", std::string("there was"));
    const auto r = test::run_qforge("quantize " + q(qf) + " --method gptq --qtype q4_g32 --calib " +
                                    q(dir / "one.txt") + " --calib " + q(dir / "two.txt") +
                                    " --seqlen 64 -q -o " + q(dir / "out.qf"));
    // The plan lines before it are progress output; the error is the last line, and the only one.
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    const size_t at = r.output.find("qforge: error: ");
    REQUIRE(at != std::string::npos);
    const std::string error = r.output.substr(at);
    REQUIRE(count_lines(error) == 1);
    for (const char* part : {"one.txt, ", "two.txt: calibration text too short",
                             "(one.txt 4, two.txt ", "joined by blank lines"})
        REQUIRE_THAT(error, Contains(part));
}

namespace {

// Leftmost-longest matching by brute force: at each position try every token.
std::vector<AddedTokenMatcher::Segment> brute_force_split(const std::vector<AddedToken>& tokens,
                                                          const std::string& text) {
    std::vector<AddedTokenMatcher::Segment> out;
    size_t emitted = 0, pos = 0;
    while (pos < text.size()) {
        int best = -1;
        for (size_t k = 0; k < tokens.size(); ++k)
            if (text.compare(pos, tokens[k].content.size(), tokens[k].content) == 0 &&
                (best < 0 ||
                 tokens[k].content.size() >= tokens[static_cast<size_t>(best)].content.size()))
                best = static_cast<int>(k);
        if (best < 0) {
            ++pos;
            continue;
        }
        const AddedToken& t = tokens[static_cast<size_t>(best)];
        if (emitted < pos) out.push_back({emitted, pos, -1});
        out.push_back({pos, pos + t.content.size(), t.id});
        pos = emitted = pos + t.content.size();
    }
    if (emitted < text.size() || text.empty()) out.push_back({emitted, text.size(), -1});
    return out;
}

bool same_segments(const std::vector<AddedTokenMatcher::Segment>& a,
                   const std::vector<AddedTokenMatcher::Segment>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].begin != b[i].begin || a[i].end != b[i].end || a[i].id != b[i].id) return false;
    return true;
}

}  // namespace

TEST_CASE("added tokens longer than 64 bytes are matched in linear time, leftmost-longest",
          "[hostile][bounds]") {
    std::mt19937 rng(3);
    auto random_text = [&](size_t n) {
        std::string s;
        for (size_t i = 0; i < n; ++i) s += "aab"[rng() % 3];
        return s;
    };
    for (int trial = 0; trial < 300; ++trial) {
        std::vector<AddedToken> tokens;
        const int count = 1 + static_cast<int>(rng() % 6);
        for (int k = 0; k < count; ++k) tokens.push_back({100 + k, random_text(1 + rng() % 5)});
        // One long token (the automaton path) in most trials, none in the rest (the direct path).
        if (trial % 4 != 0) tokens.push_back({99, std::string(65 + rng() % 10, 'a') + "b"});
        const AddedTokenMatcher m(tokens);
        for (int t = 0; t < 5; ++t) {
            std::string text = random_text(rng() % 300);
            if (t == 0 && trial % 4 != 0) text += tokens.back().content + random_text(5);
            std::vector<AddedTokenMatcher::Segment> got;
            m.split(text, got);
            INFO("trial " << trial << " text " << text);
            REQUIRE(same_segments(got, brute_force_split(tokens, text)));
        }
    }
    // A 100 KB added token against 400 KB of its prefix byte: every position starts a 100 KB
    // partial match, 4e10 byte comparisons for a scan from each position.
    const std::vector<AddedToken> hostile{{7, std::string(100000, 'a') + "b"}, {8, "a"}};
    const AddedTokenMatcher m(hostile);
    std::vector<AddedTokenMatcher::Segment> got;
    const std::string text = std::string(400000, 'a') + "b";
    m.split(text, got);
    REQUIRE(got.size() == 300001);  // 300000 single "a" matches, then the long token
    CHECK(got.back().id == 7);
    CHECK(got.back().begin == 300000);
    CHECK(got.front().id == 8);
}

}  // namespace hostile_bounds_test
