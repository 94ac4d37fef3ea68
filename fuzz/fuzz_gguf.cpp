// GGUF: the reader (every metadata value through the typed accessors, every tensor's bytes
// dequantized), the model config and tokenizer it carries, and `convert` of the file to .qf
// (with --keep-quant when the input's last byte is odd), whose output must load again.
#include <vector>

#include "convert/convert.hpp"
#include "formats/gguf.hpp"
#include "formats/gguf_dequant.hpp"
#include "fuzz/fuzz_exercise.hpp"
#include "fuzz/fuzz_support.hpp"
#include "sources/gguf.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/source_gguf.hpp"

using namespace qforge;

namespace {

// Dequantizing is linear in the tensor's size; above this many elements a tensor is skipped, so
// one input stays well inside the per-input time limit (the converter still reads it).
constexpr uint64_t kMaxDequantElements = 1u << 20;

void read_all(const GgufFile& f) {
    volatile uint64_t sink = f.version() + f.alignment() + f.data_offset();
    for (const GgufKeyValue& kv : f.metadata()) {
        if (f.find(kv.key) != &kv.value) std::abort();
        sink = sink + kv.value.size() + gguf_value_type_name(kv.value.type).size();
        fuzz::run_reader([&] { sink = sink + f.get_uint(kv.key).value_or(0); });
        fuzz::run_reader(
            [&] { sink = sink + static_cast<uint64_t>(f.get_float(kv.key).value_or(0) != 0); });
        fuzz::run_reader([&] { sink = sink + f.get_bool(kv.key).value_or(false); });
        fuzz::run_reader([&] { sink = sink + (f.get_string(kv.key) ? 1 : 0); });
        fuzz::run_reader([&] { sink = sink + (f.get_string_array(kv.key) ? 1 : 0); });
        fuzz::run_reader([&] { sink = sink + f.get_int_array(kv.key).size(); });
    }
    std::vector<float> out;
    for (const GgufTensorInfo& t : f.tensors()) {
        if (f.find_tensor(t.name) != &t) std::abort();
        std::span<const uint8_t> bytes = f.tensor_data(t);
        if (bytes.size() != t.bytes) std::abort();
        if (t.elements > kMaxDequantElements || !ggml_type_traits(t.type).to_float) continue;
        out.assign(t.elements, 0.0f);
        fuzz::run_reader([&] { gguf_dequantize(t.type, bytes, out, f.path(), t.name); });
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const std::string path =
        fuzz::write_file("model.gguf", {reinterpret_cast<const char*>(data), size});
    fuzz::run_reader([&] {
        GgufFile f(path);
        read_all(f);
        fuzz::run_reader([&] {
            volatile auto cfg = gguf_model_config(f).vocab_size;
            (void)cfg;
        });
        fuzz::run_reader([&] {
            nlohmann::json schema = tokenizer_schema_from_gguf(f);
            validate_tokenizer_schema(schema, path);
            fuzz::exercise_tokenizer(Tokenizer::from_schema(schema, path));
        });
    });
    fuzz::run_reader([&] {
        ConvertOptions o;
        o.input = path;
        o.output = (fuzz::scratch_dir() / "out.qf").string();
        o.keep_quant = size > 0 && (data[size - 1] & 1);
        convert_checkpoint(o);
        fuzz::reopen_written_qf(o.output);
    });
    return 0;
}
