#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "convert/gguf_export.hpp"
#include "convert/hf_export.hpp"
#include "core/output_path.hpp"
#include "core/progress.hpp"

namespace qforge::cli {

namespace {

namespace fs = std::filesystem;

void print_warnings(const std::vector<std::string>& warnings) {
    for (const auto& w : warnings) std::fprintf(stderr, "qforge: warning: %s\n", w.c_str());
}

int run_gguf_export(const std::string& input, const std::string& output, bool json) {
    check_output_path(output, {input}, OutputKind::file);
    const auto converted = open_qf_input(input);
    // general.name: the model the user named, not a temporary conversion's file.
    fs::path named(input);
    if (named.filename().empty()) named = named.parent_path();
    const GgufExportReport r =
        export_gguf({.input = converted->path(), .output = output, .name = named.stem().string()});
    print_warnings(r.warnings);
    if (json) {
        const nlohmann::json j = {{"output", output},         {"format", "gguf"},
                                  {"file_type", r.file_type}, {"tensors", r.tensors},
                                  {"bytes", r.bytes},         {"ggml_types", r.ggml_types},
                                  {"warnings", r.warnings}};
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("wrote %s (gguf, %s): %llu tensors, %s\n", output.c_str(), r.file_type.c_str(),
                    static_cast<unsigned long long>(r.tensors), human_bytes(r.bytes).c_str());
    }
    return 0;
}

}  // namespace

Runner register_export(CLI::App& app, CommonOptions& common) {
    struct Args {
        ExportOptions opts;
        std::string format;
    };
    auto a = std::make_shared<Args>();
    add_model_input(app, "input", a->opts.input,
                    "quantized .qf file, or a GPTQ/AWQ checkpoint directory or GGUF (converted "
                    "to a temporary .qf first)")
        ->required();
    add_choice_option(app, "--format", a->format,
                      {"gptq", "awq", "compressed-tensors", "gguf", "gptq_v2"},
                      "gptq (AutoGPTQ v1: q4_g*, q4s_g*, q8 types), gptq_v2 (the same with true "
                      "zeros, GPTQModel's layout), awq (GEMM: q4_g* only), "
                      "compressed-tensors (pack-quantized, for vLLM/SGLang: q4_g*, q4s_g*, q8 "
                      "types) or gguf (llama.cpp: q4s_g32 as Q4_0, q8_g32 as Q8_0, f32/f16/bf16)")
        ->required();
    app.add_option("-o,--output", a->opts.output_dir,
                   "output directory (gptq, gptq_v2, awq, compressed-tensors: must not exist, or "
                   "be empty) or "
                   ".gguf file")
        ->required();
    add_json_option(app, common);

    return [a, &common]() {
        if (a->format == "gguf")
            return run_gguf_export(a->opts.input, a->opts.output_dir, common.json);
        check_output_path(a->opts.output_dir, {a->opts.input}, OutputKind::directory);
        a->opts.gptq_v2 = a->format == "gptq_v2";
        a->opts.format = a->format == "awq"                  ? HfQuantMethod::awq
                         : a->format == "compressed-tensors" ? HfQuantMethod::compressed_tensors
                                                             : HfQuantMethod::gptq;
        const auto input = open_qf_input(a->opts.input);
        ExportOptions opts = a->opts;
        opts.input = input->path();
        const ExportReport r = export_hf_quantized(opts);
        print_warnings(r.warnings);
        if (common.json) {
            const nlohmann::json j = {
                {"output", a->opts.output_dir}, {"format", a->format}, {"qtype", r.quant_type},
                {"tensors", r.tensors},         {"bytes", r.bytes},    {"files", r.files},
                {"warnings", r.warnings}};
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("wrote %s (%s, linears %s): %llu tensors, %s in %zu files\n",
                        a->opts.output_dir.c_str(), a->format.c_str(), r.quant_type.c_str(),
                        static_cast<unsigned long long>(r.tensors), human_bytes(r.bytes).c_str(),
                        r.files.size());
        }
        return 0;
    };
}

}  // namespace qforge::cli
