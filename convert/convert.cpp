#include "convert/convert.hpp"

#include "convert/convert_common.hpp"
#include "core/alloc.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "formats/qf.hpp"
#include "sources/detect.hpp"
#include "sources/model_source.hpp"
#include "sources/tensor_cast.hpp"

namespace qforge {

namespace {

// Every tensor of the source into the writer: float tensors cast to the stored type with every
// value checked, packed ones (GPTQ/AWQ imports, GGUF --keep-quant rows) as they are.
void write_tensors(const ModelSource& src, const std::optional<QType>& dtype, QfWriter& writer,
                   ConvertReport& report) {
    uint64_t total_bytes = 0;
    for (size_t i = 0; i < src.tensors().size(); ++i) total_bytes += src.source_bytes(i);
    Progress progress("convert", total_bytes);
    std::vector<uint8_t> scratch, buffer;
    for (size_t i = 0; i < src.tensors().size(); ++i) {
        const SourceTensor& t = src.tensors()[i];
        const std::span<const uint8_t> bytes = src.bytes(i, scratch);
        if (qtype_is_quantized(t.qtype)) {
            writer.add_tensor(t.name, t.qtype, t.shape, bytes, t.col_perm);
        } else {
            const TensorView view{src.label(i), qtype_traits(t.qtype).dtype, t.shape, bytes};
            const QType target = target_qtype(t.shape, t.qtype, dtype);
            writer.add_tensor(t.name, target, t.shape,
                              cast_tensor(view, t.qtype, target, src.file_of(i), buffer));
        }
        src.release(i);
        report.tensors += 1;
        report.parameters += *checked_product(t.shape);
        progress.advance(src.source_bytes(i));
    }
    progress.finish();
}

}  // namespace

ConvertReport convert_source(const ModelSource& src, const ConvertOptions& options) {
    ConvertReport report;
    report.tokenizer = src.tokenizer_file();
    report.warnings = src.warnings();
    ConvertOptions recorded = options;
    if (!recorded.dtype) recorded.dtype = src.default_dtype();
    QfWriter writer(options.output, {.compress = options.compress});
    writer.set_model(src.model_json());
    writer.set_tokenizer(src.tokenizer());
    writer.set_provenance(convert_provenance(src.sources(), recorded, src.recipe_extra()));
    write_tensors(src, recorded.dtype, writer, report);
    writer.finish();
    report.bytes_written = writer.bytes_written();
    return report;
}

ConvertReport convert_checkpoint(const ConvertOptions& options) {
    const ModelFileProbe probe = detect_model_file(options.input);
    if (probe.kind == ModelFileKind::qf)
        throw Error(options.input, {},
                    "already a .qf model: nothing to convert (use `qforge quantize` to change "
                    "its qtypes, `qforge inspect` to read it)");
    return naming_file_on_bad_alloc(options.input, [&] {
        const auto src = open_model_source(
            options.input,
            SourceOptions{.tokenizer = options.tokenizer, .keep_quant = options.keep_quant});
        return convert_source(*src, options);
    });
}

}  // namespace qforge
