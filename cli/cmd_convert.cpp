#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "convert/convert.hpp"
#include "convert/input_files.hpp"
#include "core/error.hpp"
#include "core/output_path.hpp"
#include "core/progress.hpp"
#include "formats/qtype.hpp"

namespace qforge::cli {

Runner register_convert(CLI::App& app, CommonOptions& common) {
    struct Args {
        ConvertOptions opts;
        std::string dtype;
    };
    auto a = std::make_shared<Args>();
    add_input_option(app, "input", a->opts.input,
                     "Hugging Face directory (float, or GPTQ/AWQ: codes kept), .safetensors file, "
                     "llama2.c .bin checkpoint or GGUF model (.gguf, dequantized unless "
                     "--keep-quant)",
                     true)
        ->required();
    app.add_option("-o,--output", a->opts.output, "output .qf file")->required();
    std::vector<std::string> float_types;
    for (const auto& row : kQTypes)
        if (row.is_float) float_types.emplace_back(row.name);
    add_choice_option(app, "--dtype", a->dtype, float_types,
                      "store matrices as " + join_names(float_types) +
                          " (default: keep the source precision, f32 for GGUF; norms and biases "
                          "then stay f32)");
    add_input_option(app, "--tokenizer", a->opts.tokenizer,
                     "tokenizer.json or llama2.c tokenizer .bin (default: found beside the "
                     "checkpoint, or a GGUF's own)");
    app.add_flag("--keep-quant", a->opts.keep_quant,
                 "GGUF: store Q8_0 tensors as q8_g32 and Q4_0 as q4s_g32, losslessly, instead of "
                 "dequantizing them");
    app.add_flag("--compress", a->opts.compress, "zstd-compress tensors where it saves space");
    add_json_option(app, common);

    return [a, &common]() {
        check_output_path(a->opts.output, checkpoint_input_files(a->opts.input, a->opts.tokenizer));
        if (!a->dtype.empty()) a->opts.dtype = qtype_from_name(a->dtype);
        ConvertReport r = convert_checkpoint(a->opts);
        for (const auto& w : r.warnings) std::fprintf(stderr, "qforge: warning: %s\n", w.c_str());
        if (common.json) {
            nlohmann::json j = {{"output", a->opts.output},   {"tensors", r.tensors},
                                {"parameters", r.parameters}, {"bytes", r.bytes_written},
                                {"tokenizer", r.tokenizer},   {"warnings", r.warnings}};
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("wrote %s: %llu tensors, %llu parameters, %s; tokenizer: %s\n",
                        a->opts.output.c_str(), static_cast<unsigned long long>(r.tensors),
                        static_cast<unsigned long long>(r.parameters),
                        human_bytes(r.bytes_written).c_str(),
                        r.tokenizer.empty() ? "none" : r.tokenizer.c_str());
        }
        return 0;
    };
}

}  // namespace qforge::cli
