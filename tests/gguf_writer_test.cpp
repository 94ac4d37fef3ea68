// formats/gguf_writer: what it writes, GgufFile (the hostile-input reader) reads back: every
// value kind, tensor infos in ggml's ne order, offsets on the alignment, the bytes in place;
// and what the writer refuses (a name over ggml's 63 bytes, rows that are not whole blocks).
#include "formats/gguf_writer.hpp"

#include <catch2/catch.hpp>
#include <numeric>

#include "core/error.hpp"
#include "test_support.hpp"

namespace gguf_writer_test {

using namespace qforge;
using namespace qforge::test;

TEST_CASE("GGUF writer: values, tensor infos and data read back through GgufFile",
          "[gguf][export][formats]") {
    ScratchDir dir("gguf-writer");
    const std::string path = (dir / "w.gguf").string();
    std::vector<uint8_t> f32_bytes(3 * 5 * 4), q8_bytes(2 * 34);
    std::iota(f32_bytes.begin(), f32_bytes.end(), uint8_t{1});
    std::iota(q8_bytes.begin(), q8_bytes.end(), uint8_t{7});
    {
        GgufWriter w(path, 64);
        w.add("a.u32", gguf_u32(4000000000u));
        w.add("a.f32", gguf_f32(1e-5f));
        w.add("a.bool", gguf_bool(true));
        w.add("a.string", gguf_string("h\xc3\xa9llo"));
        w.add("a.strings", gguf_string_array({"x", "", "z z"}));
        w.add("a.floats", gguf_f32_array({-1.0, 0.5}));
        w.add("a.ints", gguf_i32_array({-7, 2147483647}));
        w.add_tensor("t.f32", GgmlType::f32, std::vector<uint64_t>{3, 5});
        w.add_tensor("t.q8", GgmlType::q8_0, std::vector<uint64_t>{2, 32});
        w.write_tensor(f32_bytes);
        w.write_tensor(q8_bytes);
        w.finish();
    }
    const GgufFile g(path);
    CHECK(g.version() == 3);
    CHECK(g.alignment() == 64);
    CHECK(g.data_offset() % 64 == 0);
    CHECK(g.metadata().front().key == "general.alignment");
    CHECK(g.get_uint("a.u32") == 4000000000u);
    CHECK(g.get_float("a.f32") == double(1e-5f));
    CHECK(g.get_bool("a.bool") == true);
    CHECK(*g.get_string("a.string") == "h\xc3\xa9llo");
    CHECK(*g.get_string_array("a.strings") == std::vector<std::string>{"x", "", "z z"});
    CHECK(g.find("a.floats")->floats == std::vector<double>{-1.0, 0.5});
    CHECK(g.get_int_array("a.ints") == std::vector<int64_t>{-7, 2147483647});
    REQUIRE(g.tensors().size() == 2);
    const GgufTensorInfo& a = g.tensors()[0];
    const GgufTensorInfo& b = g.tensors()[1];
    CHECK(a.ne == std::vector<uint64_t>{5, 3});
    CHECK(b.ne == std::vector<uint64_t>{32, 2});
    CHECK(b.offset % 64 == 0);
    CHECK(b.offset >= a.bytes);
    const auto da = g.tensor_data(a), db = g.tensor_data(b);
    CHECK(std::vector<uint8_t>(da.begin(), da.end()) == f32_bytes);
    CHECK(std::vector<uint8_t>(db.begin(), db.end()) == q8_bytes);
}

TEST_CASE("GGUF writer: long names and partial blocks are refused by name",
          "[gguf][export][formats]") {
    ScratchDir dir("gguf-writer-refused");
    GgufWriter w((dir / "w.gguf").string());
    CHECK_THROWS_WITH(w.add_tensor(std::string(64, 'n'), GgmlType::f32, std::vector<uint64_t>{1}),
                      Catch::Contains("64 bytes; GGUF allows 63"));
    CHECK_THROWS_WITH(w.add_tensor("odd", GgmlType::q4_0, std::vector<uint64_t>{2, 48}),
                      Catch::Contains("'odd'") && Catch::Contains("whole Q4_0 blocks of 32"));
}

}  // namespace gguf_writer_test
