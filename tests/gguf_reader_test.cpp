// The GGUF reader on hand-made valid files, on a file written by llama.cpp's own `gguf` package,
// and on a catalogue of broken files: each is refused with one line naming the file (and the key
// or tensor) and what is wrong.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.hpp"
#include "formats/gguf.hpp"
#include "gguf_builder.hpp"
#include "test_support.hpp"

namespace gguf_reader_test {

using namespace qforge;
using namespace qforge::test;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "gguf";

// A small valid file: every scalar kind, arrays, and three tensors (F32, Q8_0, F16).
TestGguf valid_file() {
    TestGguf g;
    g.kvs = {kv_str("general.architecture", "llama"),
             kv_u32("llama.block_count", 2),
             kv_f32("llama.rope.freq_base", 10000.0f),
             kv_bool("tokenizer.ggml.add_bos_token", true),
             kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c"}),
             kv_i32_array("tokenizer.ggml.token_type", {1, 3, -2})};
    std::vector<uint8_t> q8(34, 0);
    q8[0] = 0x00, q8[1] = 0x3c;  // d = 1.0
    q8[2] = 5;
    g.tensors = {{"a.weight", {4}, 0, f32_bytes({1, 2, 3, 4}), {}},
                 {"b.weight", {32, 1}, 8, q8, {}},
                 {"c.weight", {2, 3}, 1, std::vector<uint8_t>(12, 0), {}}};
    return g;
}

// Writes `g`'s bytes (after `edit`) and returns the reader's error, which must name the file.
std::string error_of(const ScratchDir& dir, const std::vector<uint8_t>& bytes) {
    const fs::path p = dir / "broken.gguf";
    write_file(p, bytes);
    try {
        GgufFile f(p.string());
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find(p.string()) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
        return msg;
    }
    FAIL("the broken file was accepted");
    return {};
}

}  // namespace

TEST_CASE("GGUF reader: a hand-made file's metadata and tensors", "[gguf]") {
    ScratchDir dir("gguf-reader");
    const fs::path p = dir / "valid.gguf";
    write_file(p, valid_file().bytes());
    const GgufFile f(p.string());
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.data_offset() % 32 == 0);
    REQUIRE(f.metadata().size() == 6);
    CHECK(f.metadata()[1].key == "llama.block_count");  // file order
    CHECK(*f.get_string("general.architecture") == "llama");
    CHECK(f.get_uint("llama.block_count") == 2u);
    CHECK(f.get_float("llama.rope.freq_base") == 10000.0);
    CHECK(f.get_bool("tokenizer.ggml.add_bos_token") == true);
    CHECK(*f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"a", "b", "c"});
    CHECK(f.get_int_array("tokenizer.ggml.token_type") == std::vector<int64_t>{1, 3, -2});
    CHECK_FALSE(f.get_uint("absent"));
    CHECK(f.get_string("absent") == nullptr);

    // A key of another type is an error naming the key and both types.
    try {
        f.get_uint("general.architecture");
        FAIL("a string read as an integer");
    } catch (const Error& e) {
        CHECK_THAT(e.what(),
                   Catch::Contains("'general.architecture' is string, expected an integer"));
    }
    CHECK_THROWS_WITH(f.get_string_array("tokenizer.ggml.token_type"),
                      Catch::Contains("is array of int32, expected array of string"));

    REQUIRE(f.tensors().size() == 3);
    const GgufTensorInfo* b = f.find_tensor("b.weight");
    REQUIRE(b);
    CHECK(b->type == GgmlType::q8_0);
    CHECK(b->ne == std::vector<uint64_t>{32, 1});
    CHECK(b->shape() == std::vector<uint64_t>{1, 32});
    CHECK(b->bytes == 34);
    CHECK(b->offset % 32 == 0);
    CHECK(f.tensor_data(*b)[2] == 5);
    const GgufTensorInfo* a = f.find_tensor("a.weight");
    float first;
    std::memcpy(&first, f.tensor_data(*a).data(), 4);
    CHECK(first == 1.0f);
    CHECK(f.find_tensor("c.weight")->elements == 6);
    CHECK(f.find_tensor("absent") == nullptr);
}

TEST_CASE("GGUF reader: a file written by llama.cpp's gguf package", "[gguf]") {
    const GgufFile f((kFixtures / "tiny_llama.gguf").string());
    CHECK(*f.get_string("general.architecture") == "llama");
    CHECK(f.get_uint("llama.embedding_length") == 64u);
    CHECK(f.get_string_array("tokenizer.ggml.tokens")->size() == 300);
    CHECK(f.tensors().size() == 21);
    for (const auto& t : f.tensors()) CHECK(t.offset % f.alignment() == 0);
}

TEST_CASE("GGUF reader: version 2 files are read, custom alignment is honoured", "[gguf]") {
    ScratchDir dir("gguf-reader-v2");
    TestGguf g = valid_file();
    g.version = 2;
    g.alignment = 64;
    g.kvs.push_back(kv_u32("general.alignment", 64));
    write_file(dir / "v2.gguf", g.bytes());
    const GgufFile f((dir / "v2.gguf").string());
    CHECK(f.version() == 2);
    CHECK(f.alignment() == 64);
    CHECK(f.data_offset() % 64 == 0);
    CHECK(f.find_tensor("c.weight")->offset == 128);
}

TEST_CASE("GGUF reader: broken files are refused with one line naming the problem", "[gguf]") {
    ScratchDir dir("gguf-reader-broken");
    const std::vector<uint8_t> good = valid_file().bytes();
    struct Case {
        const char* name;
        std::function<std::vector<uint8_t>()> make;
        const char* expected;  // a fragment of the message
    };
    auto with = [](std::function<void(TestGguf&)> edit) {
        return [edit]() {
            TestGguf g = valid_file();
            edit(g);
            return g.bytes();
        };
    };
    auto truncated = [&](size_t n) {
        return [&good, n]() { return std::vector<uint8_t>(good.begin(), good.begin() + n); };
    };
    const std::vector<Case> cases = {
        {"empty file", truncated(0), "too short|24-byte header"},
        {"bad magic", with([](TestGguf& g) { std::memcpy(g.magic, "GGUX", 4); }),
         "not a GGUF file"},
        {"version 1", with([](TestGguf& g) { g.version = 1; }), "version 1 is too old"},
        {"version 4", with([](TestGguf& g) { g.version = 4; }), "newer than version 3"},
        {"big-endian", with([](TestGguf& g) { g.version = 0x03000000; }), "big-endian"},
        {"truncated header", truncated(20), "24-byte header"},
        {"truncated metadata", truncated(130),
         "truncated: metadata key 'llama.rope.freq_base' value type needs 4 bytes at offset 130"},
        {"truncated tensor infos",
         [&]() {
             const std::string name = "c.weight";
             const auto at = std::search(good.begin(), good.end(), name.begin(), name.end());
             return std::vector<uint8_t>(good.begin(), at + 3);
         },
         "name of tensor 2 length 8 at offset"},
        {"huge kv_count", with([](TestGguf& g) { g.kv_count = uint64_t{1} << 60; }),
         "metadata pairs, more than"},
        {"huge tensor_count", with([](TestGguf& g) { g.tensor_count = ~uint64_t{0}; }),
         "tensors, more than"},
        {"key length past end",
         [&]() {
             auto b = good;
             const uint64_t huge = uint64_t{1} << 40;
             std::memcpy(b.data() + 24, &huge, 8);  // the first key's length
             return b;
         },
         "metadata key 0 is 1099511627776 bytes long, above the limit of 65535"},
        {"string value past end", with([](TestGguf& g) {
             TestKv kv{"general.name", kStr, {}};
             put_u64(kv.payload, uint64_t{1} << 40);
             g.kvs.push_back(kv);
         }),
         "runs past the end of the file"},
        {"array count past end", with([](TestGguf& g) {
             TestKv kv{"tokenizer.ggml.merges", kArr, {}};
             put_u32(kv.payload, kStr);
             put_u64(kv.payload, uint64_t{1} << 61);
             g.kvs.push_back(kv);
         }),
         "claims 2305843009213693952 elements"},
        {"unknown value type", with([](TestGguf& g) {
             g.kvs.push_back({"x.y", 99, {0}});
         }),
         "unknown value type 99"},
        {"array of arrays", with([](TestGguf& g) {
             TestKv kv{"x.y", kArr, {}};
             put_u32(kv.payload, kArr);
             put_u64(kv.payload, 0);
             g.kvs.push_back(kv);
         }),
         "array of arrays"},
        {"bool of 2", with([](TestGguf& g) {
             g.kvs.push_back({"x.flag", kBool, {2}});
         }),
         "bool stored as 2"},
        {"empty key", with([](TestGguf& g) { g.kvs.push_back(kv_u32("", 1)); }), "is empty"},
        {"duplicate key",
         with([](TestGguf& g) { g.kvs.push_back(kv_u32("llama.block_count", 3)); }),
         "'llama.block_count' appears twice"},
        {"alignment not a power of two",
         with([](TestGguf& g) { g.kvs.push_back(kv_u32("general.alignment", 24)); }),
         "not a power of two"},
        {"alignment of the wrong type",
         with([](TestGguf& g) { g.kvs.push_back(kv_str("general.alignment", "32")); }),
         "expected uint32"},
        {"zero dimensions", with([](TestGguf& g) { g.tensors[0].ne = {}; }),
         "tensor 'a.weight': 0 dimensions"},
        {"five dimensions", with([](TestGguf& g) {
             g.tensors[0].ne = {1, 1, 4, 1, 1};
         }),
         "'a.weight': 5 dimensions"},
        {"a zero dimension", with([](TestGguf& g) {
             g.tensors[2].ne = {2, 0};
         }),
         "'c.weight': dimension 1 is 0"},
        {"element count overflow", with([](TestGguf& g) {
             g.tensors[2].ne = {uint64_t{1} << 40, uint64_t{1} << 40};
         }),
         "'c.weight': shape has more than 2^63 elements"},
        {"unknown type", with([](TestGguf& g) { g.tensors[1].type = 99; }),
         "'b.weight': unknown ggml type id 99"},
        {"removed type", with([](TestGguf& g) { g.tensors[1].type = 4; }),
         "'b.weight': type id 4 is a ggml type that has been removed"},
        {"row not whole blocks", with([](TestGguf& g) {
             g.tensors[1].ne = {30, 1};
         }),
         "'b.weight': row length 30 is not a multiple of Q8_0's block of 32"},
        {"misaligned offset", with([](TestGguf& g) { g.tensors[2].offset = 80; }),
         "'c.weight': offset 80 is not a multiple of the alignment 32"},
        {"tensor past the end", with([](TestGguf& g) {
             g.tensors[2].offset = 1 << 20;
             g.tensors[2].data.clear();
         }),
         "'c.weight': bytes [1048576, 1048588) of the data section run past its end"},
        {"offset overflow", with([](TestGguf& g) {
             g.tensors[2].ne = {64, 1};  // 128 bytes of F16 from 2^64 - 32
             g.tensors[2].offset = ~uint64_t{0} - 31;
             g.tensors[2].data.clear();
         }),
         "'c.weight': bytes [18446744073709551584, 2^64+)"},
        {"overlapping tensors", with([](TestGguf& g) { g.tensors[2].offset = 0; }),
         "overlap tensor"},
        {"duplicate tensor", with([](TestGguf& g) { g.tensors[2].name = "a.weight"; }),
         "'a.weight': appears twice in the tensor list"},
        {"tensor name too long",
         with([](TestGguf& g) { g.tensors[0].name = std::string(100, 'n'); }),
         "above ggml's limit of 63"},
        {"tensor name not UTF-8", with([](TestGguf& g) { g.tensors[0].name = "a\xcb.weight"; }),
         "tensor 'a\\xcb.weight': name is not printable UTF-8"},
        {"key with a control character",
         with([](TestGguf& g) { g.kvs.push_back(kv_u32("x\ny", 1)); }),
         "metadata key 6 'x\\x0ay' is not printable UTF-8"},
        {"empty tensor name", with([](TestGguf& g) { g.tensors[0].name.clear(); }),
         "has an empty name"},
        {"data section truncated",
         [&]() {
             auto b = good;
             b.resize(b.size() - 4);
             return b;
         },
         "'c.weight': bytes [96, 108) of the data section run past its end"},
    };
    for (const Case& c : cases) {
        INFO("case: " << c.name);
        const std::string msg = error_of(dir, c.make());
        INFO("message: " << msg);
        bool found = false;
        // '|' separates alternatives
        std::string_view want = c.expected;
        while (true) {
            const size_t bar = want.find('|');
            if (msg.find(want.substr(0, bar)) != std::string::npos) found = true;
            if (bar == std::string_view::npos) break;
            want.remove_prefix(bar + 1);
        }
        CHECK(found);
    }
}

TEST_CASE("GGUF reader: the type table", "[gguf]") {
    // Ids follow ggml; removed ids are named as such; every row has a size.
    CHECK(ggml_type_traits(0)->name == "F32");
    CHECK(ggml_type_traits(30)->name == "BF16");
    CHECK(ggml_type_traits(14)->block_bytes == 210);
    for (uint32_t id : {4u, 5u, 31u, 33u, 36u, 38u}) {
        CHECK(ggml_type_traits(id) == nullptr);
        CHECK(ggml_type_removed(id));
    }
    CHECK(ggml_type_traits(1000) == nullptr);
    CHECK_FALSE(ggml_type_removed(1000));
    for (const auto& row : ggml_type_table()) {
        CHECK(row.block_elems > 0);
        CHECK(row.block_bytes > 0);
        CHECK(&ggml_type_traits(row.type) == &row);
    }
}

}  // namespace gguf_reader_test
