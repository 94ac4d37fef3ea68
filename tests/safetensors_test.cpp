// safetensors reader and writer: fixtures written by the independent PyPI `safetensors` package
// (scripts/make_safetensors_fixtures.py), writer round trips, a catalogue of hand-made broken
// files, checkpoint directory resolution, and the shared stories260K checkpoint.
#include "formats/safetensors.hpp"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.hpp"
#include "core/half.hpp"
#include "test_support.hpp"

namespace safetensors_test {

using namespace qforge;
using qforge::test::read_file;
using qforge::test::ScratchDir;
using qforge::test::write_file;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(QFORGE_SOURCE_DIR) / "tests" / "data" / "safetensors";

nlohmann::json read_json(const fs::path& p) {
    const auto bytes = read_file(p);
    return nlohmann::json::parse(bytes.begin(), bytes.end());
}

std::string to_hex(std::span<const uint8_t> bytes) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    for (uint8_t b : bytes) {
        s += digits[b >> 4];
        s += digits[b & 15];
    }
    return s;
}

// The element at index i of a tensor as a double, decoded the way the converter will decode it.
double element(const TensorView& v, size_t i) {
    const uint8_t* p = v.data.data() + i * dtype_info(v.dtype).size;
    auto load = [p](auto x) {
        std::memcpy(&x, p, sizeof x);
        return x;
    };
    switch (v.dtype) {
        case DType::f32:
            return load(float{});
        case DType::f16:
            return f16_to_f32(load(uint16_t{}));
        case DType::bf16:
            return bf16_to_f32(load(uint16_t{}));
        case DType::i8:
            return load(int8_t{});
        case DType::u8:
            return load(uint8_t{});
        case DType::i32:
            return load(int32_t{});
        case DType::i64:
            return static_cast<double>(load(int64_t{}));
    }
    return 0;
}

// A safetensors file from a header text and `data_bytes` filler bytes; the length prefix is the
// header's true length unless `declared` overrides it.
std::vector<uint8_t> st_bytes(std::string_view header, size_t data_bytes = 0,
                              std::optional<uint64_t> declared = std::nullopt) {
    const uint64_t n = declared.value_or(header.size());
    std::vector<uint8_t> out;
    out.reserve(8 + header.size() + data_bytes);
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
    for (char c : header) out.push_back(static_cast<uint8_t>(c));
    out.resize(out.size() + data_bytes, 0xab);
    return out;
}

std::vector<uint8_t> bytes_of(std::initializer_list<float> values) {
    std::vector<uint8_t> out(values.size() * sizeof(float));
    std::memcpy(out.data(), std::data(values), out.size());
    return out;
}

void write_index(const fs::path& dir, const std::string& weight_map_json) {
    write_file(dir / "model.safetensors.index.json",
               R"({"metadata": {"total_size": 0}, "weight_map": )" + weight_map_json + "}");
}

}  // namespace

TEST_CASE("reads every dtype as written by the safetensors package", "[formats][safetensors]") {
    const SafetensorsFile f((kFixtures / "dtypes.safetensors").string());
    const auto expected = read_json(kFixtures / "dtypes.expected.json");
    REQUIRE(f.tensors().size() == expected["tensors"].size());
    REQUIRE(f.metadata() == expected["metadata"].get<std::map<std::string, std::string>>());
    REQUIRE(f.data_offset() % 8 == 0);  // the reference writer pads the header

    for (const auto& [name, want] : expected["tensors"].items()) {
        INFO("tensor " << name);
        const SafetensorsTensorInfo* t = f.find(name);
        REQUIRE(t != nullptr);
        const TensorView v = f.view(*t);
        CHECK(v.name == name);
        CHECK(dtype_info(v.dtype).safetensors_name == want["dtype"].get<std::string>());
        CHECK(v.shape == want["shape"].get<std::vector<uint64_t>>());
        CHECK(to_hex(v.data) == want["hex"].get<std::string>());
        const auto& values = want["values"];
        REQUIRE(v.data.size() == values.size() * dtype_info(v.dtype).size);
        for (size_t i = 0; i < values.size(); ++i) {
            if (v.dtype == DType::i64) {  // beyond double precision: compare as integers
                int64_t x;
                std::memcpy(&x, v.data.data() + 8 * i, 8);
                CHECK(x == values[i].get<int64_t>());
            } else {
                CHECK(element(v, i) == values[i].get<double>());
            }
        }
        f.release(*t);
    }
    CHECK(f.find("scalar")->shape.empty());
    CHECK(f.view(*f.find("empty")).data.empty());
    CHECK(f.find("absent") == nullptr);
    for (size_t i = 1; i < f.tensors().size(); ++i)
        CHECK(f.tensors()[i - 1].begin <= f.tensors()[i].begin);
}

TEST_CASE("real dtypes we do not support are named as unsupported", "[formats][safetensors]") {
    const std::string path = (kFixtures / "unsupported.safetensors").string();
    REQUIRE_THROWS_AS(SafetensorsFile(path), Error);
    REQUIRE_THROWS_WITH(SafetensorsFile(path),
                        Catch::Contains("tensor 'f64': unsupported dtype 'F64'"));
}

TEST_CASE("sharded checkpoint written like transformers", "[formats][safetensors]") {
    const fs::path dir = kFixtures / "sharded";
    const SafetensorsCheckpoint ckpt(dir.string());
    const auto expected = read_json(kFixtures / "sharded.expected.json");
    REQUIRE(ckpt.files() ==
            std::vector<std::string>{(dir / "model-00001-of-00002.safetensors").string(),
                                     (dir / "model-00002-of-00002.safetensors").string()});
    REQUIRE(ckpt.tensor_names().size() == expected["tensors"].size());
    CHECK(ckpt.tensor_names().front() == "model.embed_tokens.weight");  // shard 1, offset 0
    CHECK(ckpt.total_tensor_bytes() == expected["total_size"].get<uint64_t>());
    for (const auto& [name, want] : expected["tensors"].items()) {
        INFO("tensor " << name);
        REQUIRE(ckpt.contains(name));
        CHECK(fs::path(ckpt.file_of(name)).filename() == want["file"].get<std::string>());
        const TensorView v = ckpt.tensor(name);
        CHECK(dtype_info(v.dtype).safetensors_name == want["dtype"].get<std::string>());
        CHECK(v.shape == want["shape"].get<std::vector<uint64_t>>());
        CHECK(to_hex(v.data) == want["hex"].get<std::string>());
        ckpt.release(name);
    }
    CHECK_FALSE(ckpt.contains("model.layers.9.weight"));
    CHECK(ckpt.find("model.layers.9.weight") == nullptr);
    REQUIRE_THROWS_WITH(ckpt.tensor("model.layers.9.weight"),
                        Catch::Contains("tensor 'model.layers.9.weight': no such tensor"));
}

TEST_CASE("writer output reads back identically", "[formats][safetensors]") {
    ScratchDir dir("st-writer");
    const std::vector<uint8_t> f32 = bytes_of({1.0f, -2.5f, 3.25f, 0.0f, 7.0f, -0.125f});
    const std::vector<uint8_t> f16 = {0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b};
    const std::vector<uint8_t> bf16 = {0x80, 0x3f, 0x00, 0x00};
    const std::vector<uint8_t> i8 = {0x80, 0x7f, 0x00};
    const std::vector<uint8_t> u8 = {0, 255, 17, 4, 5};
    const std::vector<uint8_t> i32 = {1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    const std::vector<uint8_t> i64 = {0, 0, 0, 0, 0, 0, 0, 0x80};
    const std::vector<TensorView> tensors = {
        {"w.f32", DType::f32, {2, 3}, f32},    {"w.f16", DType::f16, {3}, f16},
        {"w.bf16", DType::bf16, {2, 1}, bf16}, {"w.i8", DType::i8, {3}, i8},
        {"w.u8", DType::u8, {5, 1, 1}, u8},    {"w.i32", DType::i32, {2}, i32},
        {"scalar", DType::i64, {}, i64},       {"empty", DType::f32, {0, 5}, {}},
    };
    const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"source", "qforge"}};
    const std::string first = (dir / "a.safetensors").string();
    write_safetensors(first, tensors, metadata);

    const SafetensorsFile f(first);
    CHECK(f.metadata() == metadata);
    CHECK(f.data_offset() % 8 == 0);
    REQUIRE(f.tensors().size() == tensors.size());
    std::vector<TensorView> back;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const TensorView v = f.view(f.tensors()[i]);  // written in the given order
        CHECK(v.name == tensors[i].name);
        CHECK(v.dtype == tensors[i].dtype);
        CHECK(v.shape == tensors[i].shape);
        CHECK(to_hex(v.data) == to_hex(tensors[i].data));
        back.push_back(v);
    }
    const std::string second = (dir / "b.safetensors").string();
    write_safetensors(second, back, f.metadata());
    CHECK(read_file(first) == read_file(second));
}

TEST_CASE("writer reproduces the reference implementation's bytes", "[formats][safetensors]") {
    // Same tensors, same order, same metadata: the header layout must match to the byte.
    ScratchDir dir("st-ref-bytes");
    const fs::path fixture = kFixtures / "dtypes.safetensors";
    const SafetensorsFile f(fixture.string());
    std::vector<TensorView> views;
    for (const auto& t : f.tensors()) views.push_back(f.view(t));
    write_safetensors((dir / "copy.safetensors").string(), views, f.metadata());
    CHECK(read_file(dir / "copy.safetensors") == read_file(fixture));
}

TEST_CASE("writer refuses inconsistent tensors and leaves no file", "[formats][safetensors]") {
    ScratchDir dir("st-writer-bad");
    const std::string path = (dir / "bad.safetensors").string();
    const std::vector<uint8_t> four = bytes_of({1.0f});
    const std::vector<TensorView> short_data = {{"x", DType::f32, {2, 3}, four}};
    REQUIRE_THROWS_WITH(
        write_safetensors(path, short_data),
        Catch::Contains("tensor 'x': has 4 bytes but shape [2, 3] of F32 needs 24"));
    const std::vector<TensorView> twice = {{"x", DType::f32, {1}, four},
                                           {"x", DType::f32, {1}, four}};
    REQUIRE_THROWS_WITH(write_safetensors(path, twice),
                        Catch::Contains("tensor 'x': name given twice"));
    const std::vector<TensorView> reserved = {{"__metadata__", DType::f32, {1}, four}};
    REQUIRE_THROWS_WITH(write_safetensors(path, reserved), Catch::Contains("reserved"));
    CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("broken files: each refused with its own message", "[formats][safetensors]") {
    struct Case {
        const char* what;
        std::vector<uint8_t> bytes;
        std::string message;
    };
    const std::string ok_entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
    const std::string deep(100000, '[');
    const std::vector<Case> cases = {
        {"empty file", {}, "file is 0 bytes, too short for the 8-byte header length"},
        {"5 bytes", {1, 0, 0, 0, 0}, "file is 5 bytes, too short"},
        {"header length past EOF", st_bytes("{}", 0, 100),
         "header length 100 runs past the end of the file (10 bytes)"},
        {"header length 2^63", st_bytes("{}", 0, uint64_t{1} << 63),
         "header length 9223372036854775808 exceeds the limit of 100000000"},
        {"header length just over 100 MB", st_bytes("{}", 0, 100000001),
         "exceeds the limit of 100000000"},
        {"zero-length header", st_bytes(""), "header is not valid JSON"},
        {"truncated JSON", st_bytes(R"({"x": {"dtype": )"), "header is not valid JSON"},
        {"invalid UTF-8", st_bytes("{\"\xff\": 1}"), "header is not valid JSON"},
        {"top level array", st_bytes("[1, 2]"), "header is a JSON array, expected a JSON object"},
        {"top level number", st_bytes("42"), "header is 42, expected a JSON object"},
        {"nesting bomb", st_bytes(deep), "header nested deeper than 32 levels at byte"},
        {"entry not an object", st_bytes(R"({"x": 5})"),
         "tensor 'x': header entry is 5, expected an object"},
        {"missing data_offsets", st_bytes(R"({"x":{"dtype":"F32","shape":[2]}})"),
         "tensor 'x': missing key 'data_offsets'"},
        {"missing dtype", st_bytes(R"({"x":{"shape":[2],"data_offsets":[0,8]}})", 8),
         "tensor 'x': missing key 'dtype'"},
        {"extra key",
         st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offset":0}})", 8),
         "tensor 'x': unexpected key 'offset'"},
        {"dtype not a string", st_bytes(R"({"x":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
         "tensor 'x': dtype is 4, expected a string"},
        {"unknown dtype", st_bytes(R"({"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4),
         "tensor 'x': unknown dtype 'F33'"},
        {"unsupported dtype",
         st_bytes(R"({"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
         "tensor 'x': unsupported dtype 'F8_E4M3'"},
        {"shape not an array",
         st_bytes(R"({"x":{"dtype":"F32","shape":"2x3","data_offsets":[0,24]}})", 24),
         "tensor 'x': shape is the string \"2x3\", expected an array"},
        {"negative dim",
         st_bytes(R"({"x":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", 24),
         "tensor 'x': shape[1] is -3, expected a non-negative integer"},
        {"fractional dim",
         st_bytes(R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
         "tensor 'x': shape[0] is 2.5, expected a non-negative integer"},
        {"dim product overflows",
         st_bytes(R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
         "tensor 'x': shape [4294967296, 4294967296] has more than 2^64 elements"},
        {"bytes overflow",
         st_bytes(R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
         "tensor 'x': shape [4611686018427387904] of F32 needs more than 2^64 bytes"},
        {"one offset", st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
         "tensor 'x': data_offsets is a JSON array, expected two unsigned integers"},
        {"negative offset",
         st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8),
         "tensor 'x': data_offsets is [0, -8], expected two unsigned integers"},
        {"offset beyond u64",
         st_bytes(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[0,18446744073709551616]}})"),
         "expected two unsigned integers"},
        {"begin after end",
         st_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
         "tensor 'x': data_offsets [8, 0): begin is after end"},
        {"end past data",
         st_bytes(R"({"x":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", 16),
         "tensor 'x': data_offsets [0, 24) run past the end of the data section (16 bytes)"},
        {"offsets at u64 max",
         st_bytes(R"({"x":{"dtype":"F32","shape":[0],)"
                  R"("data_offsets":[18446744073709551615,18446744073709551615]}})",
                  8),
         "run past the end of the data section"},
        {"byte count mismatch",
         st_bytes(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", 24),
         "tensor 'x': data_offsets [0, 12) hold 12 bytes but shape [2, 3] of F32 needs 24"},
        {"overlap",
         st_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                  24),
         "tensor 'b': data_offsets [8, 24) overlap tensor 'a' at [0, 16)"},
        {"nested overlap",
         st_bytes(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                  R"("c":{"dtype":"U8","shape":[4],"data_offsets":[12,16]}})",
                  16),
         "tensor 'b': data_offsets [4, 8) overlap tensor 'a' at [0, 16)"},
        {"duplicate tensor", st_bytes("{\"x\":" + ok_entry + ",\"x\":" + ok_entry + "}", 8),
         "tensor 'x': appears twice in the header"},
        {"duplicate key in entry",
         st_bytes(R"({"x":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8),
         "key 'dtype' appears twice in one object of the header"},
        {"metadata not an object", st_bytes(R"({"__metadata__":["a"]})"),
         "__metadata__ is a JSON array, expected an object of strings"},
        {"metadata value not a string", st_bytes(R"({"__metadata__":{"format":"pt","epoch":3}})"),
         "__metadata__ value for key 'epoch' is 3, expected a string"},
    };
    ScratchDir dir("st-broken");
    const std::string path = (dir / "broken.safetensors").string();
    for (const Case& c : cases) {
        INFO("case: " << c.what);
        write_file(path, c.bytes);
        REQUIRE_THROWS_AS(SafetensorsFile(path), Error);
        REQUIRE_THROWS_WITH(SafetensorsFile(path),
                            Catch::StartsWith(path + ": ") && Catch::Contains(c.message));
    }
}

TEST_CASE("well-formed edge cases are accepted", "[formats][safetensors]") {
    ScratchDir dir("st-edge");
    const std::string path = (dir / "edge.safetensors").string();
    // No tensors at all; leading and trailing whitespace; an empty tensor inside another's bytes
    // (holds nothing, overlaps nothing); a gap before a tensor and unused bytes at the end.
    write_file(path, st_bytes("{}"));
    CHECK(SafetensorsFile(path).tensors().empty());
    write_file(path, st_bytes(R"(  {"e":{"dtype":"F32","shape":[3,0],"data_offsets":[4,4]},)"
                              R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[12,14]}}     )",
                              20));
    const SafetensorsFile f(path);
    REQUIRE(f.tensors().size() == 3);
    CHECK(f.tensors()[0].name == "a");
    CHECK(f.tensors()[1].name == "e");
    CHECK(f.view(*f.find("b")).data.size() == 2);
}

TEST_CASE("mutated files are read or refused, never crash", "[formats][safetensors]") {
    // Each mutant either parses, with every view inside the file, or throws qforge::Error.
    ScratchDir dir("st-mutants");
    const auto original = read_file(kFixtures / "dtypes.safetensors");
    const std::string path = (dir / "mutant.safetensors").string();
    std::mt19937 rng(20240601);
    int accepted = 0;
    for (int i = 0; i < 1500; ++i) {
        auto bytes = original;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < flips; ++k)
            bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
        write_file(path, bytes);
        try {
            const SafetensorsFile f(path);
            for (const auto& t : f.tensors()) REQUIRE(f.data_offset() + t.end <= bytes.size());
            ++accepted;
        } catch (const Error&) {
        }
    }
    CHECK(accepted > 0);  // flips inside tensor data leave a valid file
}

TEST_CASE("checkpoint directory resolution", "[formats][safetensors]") {
    ScratchDir dir("st-dirs");
    const std::vector<uint8_t> data = bytes_of({1.0f, 2.0f});
    const std::vector<TensorView> one = {{"w", DType::f32, {2}, data}};

    SECTION("a file path is a single-file checkpoint") {
        write_safetensors((dir / "x.safetensors").string(), one);
        const SafetensorsCheckpoint c((dir / "x.safetensors").string());
        CHECK(c.files() == std::vector<std::string>{(dir / "x.safetensors").string()});
        CHECK(c.tensor_names() == std::vector<std::string>{"w"});
        CHECK(c.total_tensor_bytes() == 8);
    }
    SECTION("a directory with model.safetensors") {
        write_safetensors((dir / "model.safetensors").string(), one);
        const SafetensorsCheckpoint c(dir.path().string());
        CHECK(c.files() == std::vector<std::string>{(dir / "model.safetensors").string()});
        CHECK(c.file_of("w") == c.files()[0]);
    }
    SECTION("the index wins over model.safetensors") {
        write_safetensors((dir / "model.safetensors").string(), one);
        write_safetensors((dir / "s1.safetensors").string(), one);
        write_index(dir.path(), R"({"w": "s1.safetensors"})");
        const SafetensorsCheckpoint c(dir.path().string());
        CHECK(c.files() == std::vector<std::string>{(dir / "s1.safetensors").string()});
    }
    SECTION("other .safetensors files only: listed in the error") {
        write_safetensors((dir / "b.safetensors").string(), one);
        write_safetensors((dir / "a.safetensors").string(), one);
        REQUIRE_THROWS_WITH(
            SafetensorsCheckpoint(dir.path().string()),
            Catch::Contains("only other .safetensors files (a.safetensors, b.safetensors)"));
    }
    SECTION("an empty directory") {
        REQUIRE_THROWS_WITH(SafetensorsCheckpoint(dir.path().string()),
                            Catch::Contains("no safetensors checkpoint here"));
    }
    SECTION("a PyTorch checkpoint is named as unsupported") {
        write_file(dir / "pytorch_model.bin", std::string("PK"));
        REQUIRE_THROWS_WITH(
            SafetensorsCheckpoint(dir.path().string()),
            Catch::Contains(
                "pytorch_model.bin is a PyTorch pickle checkpoint, which is not supported"));
    }
    SECTION("a path that does not exist") {
        REQUIRE_THROWS_WITH(SafetensorsCheckpoint((dir / "nope").string()),
                            Catch::Contains("no such file or directory"));
    }
}

TEST_CASE("broken sharded checkpoints", "[formats][safetensors]") {
    ScratchDir dir("st-shards");
    const std::vector<uint8_t> data = bytes_of({1.0f, 2.0f});
    const std::vector<TensorView> w = {{"w", DType::f32, {2}, data}};
    const std::vector<TensorView> v = {{"v", DType::f32, {2}, data}};
    const std::vector<TensorView> vw = {{"v", DType::f32, {2}, data}, {"w", DType::f32, {2}, data}};
    write_safetensors((dir / "s1.safetensors").string(), w);
    write_safetensors((dir / "s2.safetensors").string(), v);
    write_safetensors((dir / "s3.safetensors").string(), vw);
    auto fails_with = [&](const std::string& message) {
        REQUIRE_THROWS_AS(SafetensorsCheckpoint(dir.path().string()), Error);
        REQUIRE_THROWS_WITH(SafetensorsCheckpoint(dir.path().string()), Catch::Contains(message));
    };
    const std::string index = (dir / "model.safetensors.index.json").string();

    write_file(index, std::string(R"({"weight_map": {"w": "s1.safetensors",)"));
    fails_with(index + ": index is not valid JSON");
    write_file(index, std::string("[]"));
    fails_with("index is a JSON array, expected a JSON object");
    write_file(index, std::string(R"({"metadata": {}})"));
    fails_with(index + ": missing key 'weight_map'");
    write_index(dir.path(), "{}");
    fails_with("weight_map is a JSON object, expected a non-empty object");
    write_index(dir.path(), R"({"w": 3})");
    fails_with("tensor 'w': weight_map value is 3, expected a shard file name");
    write_index(dir.path(), R"({"w": "../s1.safetensors"})");
    fails_with("tensor 'w': shard '../s1.safetensors' is not a plain file name");
    write_index(dir.path(), R"({"w": "/etc/passwd"})");
    fails_with("shard '/etc/passwd' is not a plain file name");
    write_index(dir.path(), R"({"w": ".."})");
    fails_with("shard '..' is not a plain file name");
    write_index(dir.path(), R"({"w": "s1.safetensors", "w": "s2.safetensors"})");
    fails_with("key 'w' appears twice in one object of the index");
    write_index(dir.path(), R"({"w": "s1.safetensors", "v": "s9.safetensors"})");
    fails_with("shard 's9.safetensors' is listed in the index but does not exist");
    write_index(dir.path(), R"({"w": "s1.safetensors", "ghost": "s1.safetensors"})");
    fails_with("tensor 'ghost': is listed in the index under shard 's1.safetensors' but absent");
    write_index(dir.path(), R"({"w": "s2.safetensors", "v": "s2.safetensors"})");
    fails_with("tensor 'w': is listed in the index under shard 's2.safetensors' but absent");
    write_index(dir.path(), R"({"w": "s1.safetensors", "v": "s3.safetensors"})");
    fails_with("tensor 'w': is also present in shard '" + (dir / "s1.safetensors").string() + "'");
    write_index(dir.path(), R"({"v": "s3.safetensors"})");
    fails_with((dir / "s3.safetensors").string() + ": tensor 'w': is in this shard but not listed");
    write_file(dir / "s4.safetensors", std::string("junk"));
    write_index(dir.path(), R"({"w": "s4.safetensors"})");
    fails_with((dir / "s4.safetensors").string() + ": file is 4 bytes, too short");

    write_index(dir.path(), R"({"w": "s1.safetensors", "v": "s2.safetensors"})");
    const SafetensorsCheckpoint ok(dir.path().string());
    CHECK(ok.tensor_names() == std::vector<std::string>{"w", "v"});  // shard order
    CHECK(ok.total_tensor_bytes() == 16);
}

TEST_CASE("stories260K checkpoint from ../shared", "[formats][safetensors]") {
    QF_REQUIRE_SHARED_DATA(data);
    const SafetensorsCheckpoint ckpt((data / "stories260K" / "hf").string());
    // 5 layers x 9 tensors + embeddings + final norm; the output head is tied to the embeddings.
    CHECK(ckpt.tensor_names().size() == 47);
    const TensorView emb = ckpt.tensor("model.embed_tokens.weight");
    CHECK(emb.dtype == DType::f32);
    CHECK(emb.shape == std::vector<uint64_t>{512, 64});
    CHECK(emb.data.size() == 512 * 64 * 4);
}

}  // namespace safetensors_test
