// The .qf writer and reader: round trips, determinism, atomic output, and a catalogue of broken
// files each refused with its own message.
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/half.hpp"
#include "formats/qf.hpp"
#include "qf_support.hpp"
#include "test_support.hpp"

namespace qf_test {

using namespace qforge;
using Catch::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto& b : v) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = static_cast<uint8_t>(x);
    }
    return v;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& f) {
    std::vector<uint8_t> b(f.size() * 4);
    std::memcpy(b.data(), f.data(), b.size());
    return b;
}

struct Sample {
    std::string name;
    QType qtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
};

std::vector<Sample> samples() {
    std::vector<float> smooth(3 * 17);  // compressible
    for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = static_cast<float>(i % 7) * 0.25f;
    return {
        {"embed", QType::f32, {3, 17}, f32_bytes(smooth)},
        {"layers.0.attn.q", QType::f16, {5, 9}, pattern_bytes(5 * 9 * 2, 1)},
        {"layers.0.attn_norm", QType::bf16, {9}, pattern_bytes(18, 2)},
        {"zeros", QType::f32, {64, 64}, std::vector<uint8_t>(64 * 64 * 4, 0)},
        {"empty", QType::f32, {0, 4}, {}},
    };
}

void write_sample(const fs::path& path, bool compress) {
    QfWriter w(path.string(), {.compress = compress});
    w.set_model({{"arch", "llama"}});
    w.set_provenance({{"recipe", {{"command", "test"}}}});
    for (const auto& s : samples()) w.add_tensor(s.name, s.qtype, s.shape, s.bytes);
    w.finish();
}

// Rewrites a valid file's JSON header through `edit`, keeping the preamble consistent, so each
// test breaks exactly one thing.
void edit_header(const fs::path& path, const std::function<void(json&)>& edit) {
    json h = json::parse(test::qf_header_text(path));
    edit(h);
    test::replace_qf_header(path, h.dump());
}

void edit_preamble(const fs::path& path, const std::function<void(QfPreamble&)>& edit) {
    auto bytes = test::read_file(path);
    QfPreamble pre;
    std::memcpy(&pre, bytes.data(), sizeof pre);
    edit(pre);
    std::memcpy(bytes.data(), &pre, sizeof pre);
    test::write_file(path, bytes);
}

bool no_temp_files(const fs::path& dir) {
    return test::files_containing(dir, "qforge-tmp").empty();
}

}  // namespace

TEST_CASE("qf round trip keeps every tensor byte-identical, raw and zstd", "[formats][qf]") {
    test::ScratchDir dir("qf-roundtrip");
    for (bool compress : {false, true}) {
        const fs::path p = dir / (compress ? "z.qf" : "r.qf");
        write_sample(p, compress);
        QfFile qf(p.string(), {.verify_checksums = true, .check_model = false});
        REQUIRE(qf.version() == kQfVersion);
        REQUIRE(qf.tensors().size() == samples().size());
        std::vector<uint8_t> scratch;
        for (const auto& s : samples()) {
            const auto& t = qf.at(s.name);
            REQUIRE(t.qtype == s.qtype);
            REQUIRE(t.shape == s.shape);
            REQUIRE(t.offset % kQfTensorAlignment == 0);
            auto got = qf.tensor_bytes(t, scratch, true);
            REQUIRE(std::vector<uint8_t>(got.begin(), got.end()) == s.bytes);
        }
        if (compress) REQUIRE(qf.at("zeros").encoding == QfEncoding::zstd);
        REQUIRE(qf.at("layers.0.attn.q").encoding == QfEncoding::raw);  // random bytes stay raw
        REQUIRE_FALSE(qf.has_tokenizer());
        REQUIRE_THROWS_WITH(qf.tokenizer(), Contains("has no tokenizer"));
    }
    REQUIRE(no_temp_files(dir.path()));
}

TEST_CASE("qf raw tensors are used in place from the mapping", "[formats][qf]") {
    test::ScratchDir dir("qf-zerocopy");
    write_sample(dir / "a.qf", false);
    QfFile qf((dir / "a.qf").string(), {.check_model = false});
    std::vector<uint8_t> scratch;
    auto a = qf.tensor_bytes(qf.at("embed"), scratch);
    auto b = qf.tensor_bytes(qf.at("embed"), scratch);
    REQUIRE(a.data() == b.data());
    REQUIRE(scratch.empty());
    REQUIRE(reinterpret_cast<uintptr_t>(a.data()) % kQfTensorAlignment == 0);
}

TEST_CASE("qf version 1 files: rows padded to 64 bytes read as the packed rows", "[formats][qf]") {
    test::ScratchDir dir("qf-v1");
    // Odd strides: q4_g128 at k = 576 is 303 bytes a row (320 in version 1), q4s_g32 at k = 33
    // is 36 (64), q8 at k = 5 is 34 (64); q3_g128 at k = 4096 is 1632 (1664).
    const std::pair<QType, uint64_t> cases[] = {
        {QType::q4_g128, 576}, {QType::q4s_g32, 33}, {QType::q8, 5}, {QType::q3_g128, 4096}};
    for (bool compress : {false, true}) {
        const fs::path v1 = dir / (compress ? "z1.qf" : "r1.qf");
        std::vector<std::vector<uint8_t>> packed;
        {
            QfWriter w(v1.string(), {.compress = compress, .version = 1});
            w.set_model({{"arch", "llama"}});
            for (const auto& [t, k] : cases) {
                const uint64_t rows = 3, tight = *qtype_row_bytes(t, k),
                               padded = *qtype_row_bytes(t, k, kQfV1RowAlign);
                std::vector<uint8_t> p(rows * tight), old(rows * padded, 0);
                for (uint64_t r = 0; r < rows; ++r) {
                    std::vector<float> wts(k);
                    for (uint64_t j = 0; j < k; ++j)
                        wts[j] = std::sin(0.37f * static_cast<float>(j + 11 * r));
                    REQUIRE(quantize_row_ref(t, wts.data(), k, p.data() + r * tight) ==
                            QuantStatus::ok);
                    std::memcpy(old.data() + r * padded, p.data() + r * tight, tight);
                }
                packed.push_back(p);
                w.add_tensor(std::string(qtype_traits(t).name), t, {rows, k}, old);
            }
            w.add_tensor("embed", QType::f32, {3, 17}, samples()[0].bytes);
            w.finish();
        }
        QfFile qf(v1.string(), {.verify_checksums = true, .check_model = false});
        REQUIRE(qf.version() == 1);
        std::vector<uint8_t> scratch;
        for (size_t i = 0; i < std::size(cases); ++i) {
            const auto& t = qf.at(qtype_traits(cases[i].first).name);
            INFO(t.name << (compress ? " zstd" : " raw"));
            REQUIRE(t.length == 3 * *qtype_row_bytes(t.qtype, t.shape[1], kQfV1RowAlign));
            const auto got = qf.tensor_bytes(t, scratch, true);
            REQUIRE(std::vector<uint8_t>(got.begin(), got.end()) == packed[i]);
        }
        // Float tensors are the same in both versions, in place from the mapping when raw.
        scratch.clear();
        const auto e = qf.tensor_bytes(qf.at("embed"), scratch);
        REQUIRE(std::vector<uint8_t>(e.begin(), e.end()) == samples()[0].bytes);
        if (!compress) REQUIRE(scratch.empty());
    }
    // Version 2 files cannot be written in the version 1 layout by mistake.
    QfWriter w((dir / "bad.qf").string(), {.version = 1});
    REQUIRE_THROWS_WITH(w.add_tensor("x", QType::q8, {1, 5}, std::vector<uint8_t>(34)),
                        Contains("internal error: 34 bytes"));
}

TEST_CASE("qf writer is deterministic", "[formats][qf]") {
    test::ScratchDir dir("qf-determinism");
    write_sample(dir / "a.qf", true);
    write_sample(dir / "b.qf", true);
    REQUIRE(test::read_file(dir / "a.qf") == test::read_file(dir / "b.qf"));
}

TEST_CASE("qf writer leaves nothing behind when it does not finish", "[formats][qf]") {
    test::ScratchDir dir("qf-atomic");
    const fs::path p = dir / "out.qf";
    {
        QfWriter w(p.string());
        w.set_model({{"arch", "llama"}});
        w.add_tensor("a", QType::f32, {2}, pattern_bytes(8, 3));
        REQUIRE_THROWS_WITH(w.add_tensor("b", QType::f32, {3}, pattern_bytes(8, 3)),
                            Contains("8 bytes for shape [3]"));
    }  // destroyed without finish()
    REQUIRE_FALSE(fs::exists(p));
    REQUIRE(no_temp_files(dir.path()));
}

TEST_CASE("qf broken files: each refused with its own message", "[formats][qf][broken]") {
    test::ScratchDir dir("qf-broken");
    const fs::path p = dir / "x.qf";
    auto fresh = [&] { write_sample(p, true); };
    auto expect = [&](const std::string& what) {
        INFO(what);
        REQUIRE_THROWS_WITH(QfFile(p.string(), {.verify_checksums = true, .check_model = false}),
                            Contains(what));
    };
    auto tensor_at = [](json& h, const std::string& name) -> json& {
        for (auto& t : h["tensors"])
            if (t["name"] == name) return t;
        throw std::runtime_error("no tensor " + name);
    };

    SECTION("shorter than the preamble") {
        test::write_file(p, std::vector<uint8_t>(10, 0));
        expect("truncated: 10 bytes");
    }
    SECTION("wrong magic") {
        fresh();
        edit_preamble(p, [](QfPreamble& q) { q.magic[0] = 'X'; });
        expect("not a .qf file (bad magic");
    }
    SECTION("newer version") {
        fresh();
        edit_preamble(p, [](QfPreamble& q) { q.version = kQfColPermVersion + 1; });
        expect("is newer than this qforge reads");
    }
    SECTION("big-endian byte-order tag") {
        fresh();
        edit_preamble(p, [](QfPreamble& q) { q.endian_tag = 0x04030201; });
        expect("byte-order tag is wrong");
    }
    SECTION("truncated file") {
        fresh();
        auto bytes = test::read_file(p);
        bytes.resize(bytes.size() - 100);
        test::write_file(p, bytes);
        expect("truncated: the header ends at byte");
    }
    SECTION("trailing garbage") {
        fresh();
        auto bytes = test::read_file(p);
        bytes.push_back(0);
        test::write_file(p, bytes);
        expect("unexpected bytes after the header");
    }
    SECTION("data offset not page aligned") {
        fresh();
        edit_preamble(p, [](QfPreamble& q) {
            q.data_offset += 64;
            q.data_length -= 64;
        });
        expect("is not a multiple of 4096");
    }
    SECTION("header offset inconsistent with the data section") {
        fresh();
        edit_preamble(p, [](QfPreamble& q) { q.data_length -= 64; });
        expect("does not follow the data section");
    }
    SECTION("header checksum mismatch") {
        fresh();
        auto bytes = test::read_file(p);
        bytes[bytes.size() - 3] ^= 0x20;
        test::write_file(p, bytes);
        expect("header checksum mismatch");
    }
    SECTION("header is not JSON") {
        fresh();
        auto bytes = test::read_file(p);
        QfPreamble pre;
        std::memcpy(&pre, bytes.data(), sizeof pre);
        bytes[pre.header_offset] = '#';
        pre.header_checksum = XXH3_64bits(bytes.data() + pre.header_offset, pre.header_length);
        std::memcpy(bytes.data(), &pre, sizeof pre);
        test::write_file(p, bytes);
        expect("header is not valid JSON");
    }
    SECTION("header lacks the tensor list") {
        fresh();
        edit_header(p, [](json& h) { h.erase("tensors"); });
        expect("header lacks \"tensors\"");
    }
    SECTION("header version disagrees with the preamble") {
        fresh();
        edit_header(p, [](json& h) { h["format_version"] = 7; });
        expect("disagrees with the preamble");
    }
    SECTION("unknown qtype") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "embed")["qtype"] = "q9_g7"; });
        expect("tensor 'embed': unknown qtype 'q9_g7'");
    }
    SECTION("shape whose byte count overflows") {
        fresh();
        edit_header(p, [&](json& h) {
            tensor_at(h, "embed")["shape"] = {uint64_t{1} << 40, uint64_t{1} << 30};
        });
        expect("tensor 'embed': shape [1099511627776, 1073741824] overflows");
    }
    SECTION("negative dimension") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "embed")["shape"] = {-3, 17}; });
        expect("key 'tensors[0].shape[0]': expected a non-negative integer, found number -3");
    }
    SECTION("length disagrees with shape and qtype") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "layers.0.attn.q")["shape"] = {5, 10}; });
        expect("tensor 'layers.0.attn.q': length 90 but shape [5, 10] of f16 needs 100 bytes");
    }
    SECTION("misaligned offset") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "layers.0.attn.q")["offset"] = 72; });
        expect("is not a multiple of the 64-byte tensor alignment");
    }
    SECTION("tensor past the data section") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "zeros")["offset"] = uint64_t{1} << 40; });
        expect("tensor 'zeros': data [1099511627776");
    }
    SECTION("overlapping tensors") {
        fresh();
        edit_header(p, [&](json& h) {
            tensor_at(h, "layers.0.attn_norm")["offset"] =
                tensor_at(h, "layers.0.attn.q")["offset"];
        });
        expect("data overlaps tensor");
    }
    SECTION("duplicate tensor names") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "zeros")["name"] = "embed"; });
        expect("tensor 'embed': tensor name appears twice");
    }
    SECTION("raw tensor with a different stored length") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "layers.0.attn.q")["stored_length"] = 64; });
        expect("raw tensor stores 64 bytes");
    }
    SECTION("unknown encoding") {
        fresh();
        edit_header(p, [&](json& h) { tensor_at(h, "embed")["encoding"] = "lz4"; });
        expect("unknown encoding 'lz4'");
    }
    SECTION("bad tensor checksum") {
        fresh();
        uint64_t off;
        {
            QfFile qf(p.string(), {.check_model = false});
            off = qf.at("layers.0.attn.q").offset;
        }
        auto bytes = test::read_file(p);
        bytes[kQfDataAlignment + off + 5] ^= 1;
        test::write_file(p, bytes);
        // structure is fine; data is checked on request
        REQUIRE_NOTHROW(QfFile(p.string(), {.check_model = false}));
        expect("checksum mismatch: header says xxh3-64:");
    }
    SECTION("corrupt zstd frame") {
        fresh();
        {
            QfFile qf(p.string(), {.check_model = false});
            REQUIRE(qf.at("zeros").encoding == QfEncoding::zstd);
        }
        edit_header(p, [&](json& hh) { tensor_at(hh, "zeros")["length"] = 64 * 64 * 4; });
        auto bytes = test::read_file(p);
        QfPreamble pre;
        std::memcpy(&pre, bytes.data(), sizeof pre);
        json hdr = json::parse(bytes.begin() + static_cast<long>(pre.header_offset), bytes.end());
        const uint64_t off = tensor_at(hdr, "zeros")["offset"].get<uint64_t>();
        for (int i = 0; i < 4; ++i)
            bytes[kQfDataAlignment + off + static_cast<uint64_t>(i)] = 0;  // frame magic
        test::write_file(p, bytes);
        expect("tensor 'zeros': zstd data from " +
               std::to_string(tensor_at(hdr, "zeros")["stored_length"].get<uint64_t>()) +
               " stored bytes: does not start with a zstd frame");
    }
    REQUIRE(no_temp_files(dir.path()));
}

}  // namespace qf_test
