#include "convert/convert.hpp"

#include <filesystem>
#include <map>
#include <set>

#include "convert/convert_common.hpp"
#include "convert/detect.hpp"
#include "convert/gguf.hpp"
#include "convert/hf_quantized.hpp"
#include "convert/llama2c.hpp"
#include "convert/tensor_cast.hpp"
#include "core/alloc.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string config_path_for(const std::string& input) {
    fs::path p(input);
    fs::path dir = fs::is_directory(p) ? p : p.parent_path();
    fs::path cfg = dir / "config.json";
    if (!fs::exists(cfg))
        throw Error(input, {}, "no config.json " + std::string(fs::is_directory(p) ? "in" : "beside") +
                                   " the checkpoint (needed for the model's architecture)");
    return cfg.string();
}

}  // namespace

ConvertReport convert_hf_checkpoint(const ConvertOptions& options) {
    ConvertReport report;
    const std::string cfg_path = config_path_for(options.input);
    const ModelConfig cfg = read_model_config(cfg_path);
    const SafetensorsCheckpoint ckpt(options.input);
    // GPTQ/AWQ: linears whose X.qweight is present are imported as packed rows; the rest (the
    // embeddings, norms, lm_head, modules_to_not_convert) are float tensors as usual.
    const std::optional<HfQuantConfig> quant = read_hf_quant_config(cfg_path);
    const QType quant_target = quant ? hf_quant_target(*quant) : QType::f32;

    // Match checkpoint tensors to the architecture table before writing anything.
    check_layers_fit(cfg.num_layers, ckpt.tensor_names().size(), cfg_path, "num_hidden_layers");
    const std::vector<TensorSpec> specs = expected_tensors(cfg);
    std::map<std::string, const TensorSpec*> by_hf_name;
    for (const auto& s : specs) by_hf_name[s.hf_name] = &s;
    for (const std::string& name : ckpt.tensor_names()) {
        if (by_hf_name.count(name) || is_ignorable_hf_tensor(name)) continue;
        if (const auto weight = hf_quantized_part_of(name); weight && by_hf_name.count(*weight)) {
            if (!quant)
                throw Error(ckpt.file_of(name), name,
                            "a GPTQ/AWQ tensor, but " + cfg_path +
                                " declares no quantization_config (and there is no "
                                "quantize_config.json or quant_config.json beside it)");
            continue;
        }
        if (name == "lm_head.weight" && cfg.tie_word_embeddings) {
            report.warnings.push_back("lm_head.weight ignored: config.json ties it to the embeddings");
            continue;
        }
        throw Error(ckpt.file_of(name), name,
                    "unexpected tensor for architecture '" + std::string(architecture_name(cfg.arch)) +
                        "' (not in the architecture table)");
    }
    uint64_t total_bytes = 0;
    std::set<std::string> quantized;  // our names of the linears imported from GPTQ/AWQ parts
    for (const auto& s : specs) {
        const std::string qweight = hf_qweight_name(s.hf_name);
        if (quant && s.shape.size() == 2 && !qweight.empty() && ckpt.contains(qweight)) {
            if (ckpt.contains(s.hf_name))
                throw Error(ckpt.file_of(s.hf_name), s.hf_name,
                            "both a float weight and " + qweight + " are present");
            quantized.insert(s.name);
            total_bytes += ckpt.find(qweight)->end - ckpt.find(qweight)->begin;
            continue;
        }
        if (!ckpt.contains(s.hf_name))
            throw Error(options.input, s.hf_name, "missing from the checkpoint (expected shape " +
                                                      shape_to_string(s.shape) + ")");
        TensorView v = ckpt.tensor(s.hf_name);
        if (v.shape != s.shape)
            throw Error(ckpt.file_of(s.hf_name), s.hf_name,
                        "shape " + shape_to_string(v.shape) + " but config.json implies " +
                            shape_to_string(s.shape));
        if (!qtype_from_dtype(v.dtype))
            throw Error(ckpt.file_of(s.hf_name), s.hf_name,
                        "dtype " + std::string(dtype_info(v.dtype).safetensors_name) +
                            " is not a float type (expected F32, F16 or BF16)");
        total_bytes += v.data.size();
    }

    // Tokenizer: given, or found beside the checkpoint; a .qf without one is allowed.
    json tokenizer = resolve_tokenizer(
        options.tokenizer,
        options.tokenizer.empty() ? find_tokenizer(options.input) : std::nullopt, options.input,
        cfg, report);

    json sources = json::array();
    sources.push_back(source_entry(cfg_path));
    for (const auto& f : ckpt.files()) sources.push_back(source_entry(f));
    if (!report.tokenizer.empty()) sources.push_back(source_entry(report.tokenizer));

    QfWriter writer(options.output, {.compress = options.compress});
    writer.set_model(model_config_to_json(cfg));
    writer.set_tokenizer(std::move(tokenizer));
    json recipe_extra = json::object();
    if (quant) {
        recipe_extra["source_format"] = hf_quant_method_name(quant->method);
        recipe_extra["source_quantization"] = quant->declared;
        recipe_extra["imported_qtype"] = qtype_traits(quant_target).name;
    }
    writer.set_provenance(convert_provenance(std::move(sources), options, recipe_extra));

    Progress progress("convert", total_bytes);
    std::vector<uint8_t> buffer;
    for (const auto& s : specs) {
        if (quantized.count(s.name)) {
            import_hf_quantized_linear(*quant, quant_target, ckpt, s.hf_name, s.shape[0],
                                       s.shape[1], buffer);
            writer.add_tensor(s.name, quant_target, s.shape, buffer);
            report.tensors += 1;
            report.parameters += *checked_product(s.shape);
            const auto* qweight = ckpt.find(hf_qweight_name(s.hf_name));
            progress.advance(qweight->end - qweight->begin);
            continue;
        }
        TensorView v = ckpt.tensor(s.hf_name);
        const QType source = *qtype_from_dtype(v.dtype);
        const QType target = target_qtype(s, source, options.dtype);
        std::span<const uint8_t> bytes = cast_tensor(v, source, target, ckpt.file_of(s.hf_name), buffer);
        writer.add_tensor(s.name, target, s.shape, bytes);
        ckpt.release(s.hf_name);
        report.tensors += 1;
        report.parameters += *checked_product(s.shape);
        progress.advance(v.data.size());
    }
    writer.finish();
    progress.finish();
    report.bytes_written = writer.bytes_written();
    return report;
}

ConvertReport convert_checkpoint(const ConvertOptions& options) {
    const ModelFileProbe probe = detect_model_file(options.input);
    if (probe.kind == ModelFileKind::qf)
        throw Error(options.input, {},
                    "already a .qf model: nothing to convert (use `qforge quantize` to change "
                    "its qtypes, `qforge inspect` to read it)");
    if (probe.kind != ModelFileKind::gguf && probe.kind != ModelFileKind::llama2c &&
        probe.kind != ModelFileKind::safetensors && probe.kind != ModelFileKind::hf_directory)
        throw_not_a_model_file(options.input, probe);
    if (options.keep_quant && probe.kind != ModelFileKind::gguf)
        throw Error(options.input, {},
                    "--keep-quant applies to GGUF input only (GPTQ and AWQ checkpoints keep "
                    "their codes without it)");
    return naming_file_on_bad_alloc(options.input, [&] {
        if (probe.kind == ModelFileKind::gguf) return convert_gguf_checkpoint(options);
        if (probe.kind == ModelFileKind::llama2c) return convert_llama2c_checkpoint(options);
        return convert_hf_checkpoint(options);
    });
}

}  // namespace qforge
