#include "sources/model_source.hpp"

#include "core/alloc.hpp"
#include "core/error.hpp"
#include "sources/detect.hpp"
#include "sources/source_kinds.hpp"

namespace qforge {

std::unique_ptr<ModelSource> open_model_source(const std::string& input,
                                               const SourceOptions& options) {
    const ModelFileProbe probe = detect_model_file(input);
    const bool known = probe.kind == ModelFileKind::qf || probe.kind == ModelFileKind::gguf ||
                       probe.kind == ModelFileKind::llama2c ||
                       probe.kind == ModelFileKind::safetensors ||
                       probe.kind == ModelFileKind::hf_directory;
    if (!known) throw_not_a_model_file(input, probe);
    if (options.keep_quant && probe.kind != ModelFileKind::gguf)
        throw Error(input, {},
                    "--keep-quant applies to GGUF input only (GPTQ and AWQ checkpoints keep "
                    "their codes without it)");
    return naming_file_on_bad_alloc(input, [&]() -> std::unique_ptr<ModelSource> {
        switch (probe.kind) {
            case ModelFileKind::qf:
                if (!options.tokenizer.empty())
                    throw Error(input, {},
                                "--tokenizer applies to checkpoints; a .qf input keeps its own "
                                "tokenizer");
                return open_qf_source(input);
            case ModelFileKind::gguf:
                return open_gguf_source(input, options);
            case ModelFileKind::llama2c:
                return open_llama2c_source(input, options);
            case ModelFileKind::safetensors:
            case ModelFileKind::hf_directory:
                return open_hf_source(input, options);
            default:
                throw_not_a_model_file(input, probe);  // unreachable: refused above
        }
    });
}

std::unique_ptr<ModelSource> open_model_source(const std::string& input,
                                               const std::string& tokenizer) {
    return open_model_source(input, SourceOptions{.tokenizer = tokenizer});
}

}  // namespace qforge
