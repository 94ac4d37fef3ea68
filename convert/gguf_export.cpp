#include "convert/gguf_export.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "core/output_path.hpp"
#include "core/progress.hpp"
#include "formats/architectures.hpp"
#include "formats/gguf_writer.hpp"
#include "formats/qf.hpp"
#include "sources/gguf.hpp"
#include "sources/gguf_keep_quant.hpp"
#include "sources/source_common.hpp"
#include "tokenizer/gguf_writer.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace fs = std::filesystem;

namespace {

// llama.cpp's general.file_type (enum llama_ftype) of the type most matrix weights have.
struct FileType {
    GgmlType type;
    uint32_t id;
    const char* name;
};
constexpr FileType kFileTypes[] = {
    {GgmlType::f32, 0, "ALL_F32"},       {GgmlType::f16, 1, "MOSTLY_F16"},
    {GgmlType::q4_0, 2, "MOSTLY_Q4_0"},  {GgmlType::q8_0, 7, "MOSTLY_Q8_0"},
    {GgmlType::bf16, 32, "MOSTLY_BF16"},
};
constexpr uint32_t kQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION, Q4_0/Q8_0 as today

// Every tensor's ggml type, or an Error naming the first one GGUF cannot hold.
GgmlType export_type(const QfFile& qf, const QfTensorInfo& t) {
    if (!t.col_perm.empty())
        throw Error(qf.path(), t.name,
                    "has a column permutation (an act-order GPTQ import): GGUF rows are in input "
                    "order; export it as GPTQ (--format gptq writes its g_idx)");
    if (const auto g = gguf_export_type(t.qtype)) {
        if (!qtype_is_quantized(t.qtype)) return *g;
        if (t.shape.size() == 2 && t.shape[1] % ggml_type_traits(*g).block_elems == 0) return *g;
        throw Error(qf.path(), t.name,
                    "rows of " + std::to_string(t.shape.back()) + " weights are not whole " +
                        std::string(ggml_type_traits(*g).name) + " blocks of " +
                        std::to_string(ggml_type_traits(*g).block_elems) +
                        ": store it as f16 (quantize --tensor-type) to export to GGUF");
    }
    const std::string name(qtype_traits(t.qtype).name);
    const std::string nearest(qtype_traits(gguf_nearest_exportable(t.qtype)).name);
    throw Error(qf.path(), t.name,
                "type " + name +
                    " has no bit-exact GGUF form (GGUF export writes q4s_g32 as Q4_0, q8_g32 as "
                    "Q8_0 and f32/f16/bf16 as such); quantize with --qtype " +
                    nearest + " instead (with --method gptq or awq for their quality)");
}

void add_model_metadata(GgufWriter& w, const ModelConfig& c, const GgufArchitecture& a,
                        const std::string& name, uint32_t file_type) {
    const std::string arch(a.name);
    auto u32 = [&](const std::string& key, uint64_t v) {
        w.add(arch + "." + key, gguf_u32(static_cast<uint32_t>(v)));
    };
    w.add("general.architecture", gguf_string(arch));
    w.add("general.name", gguf_string(name));
    w.add("general.file_type", gguf_u32(file_type));
    w.add("general.quantization_version", gguf_u32(kQuantizationVersion));
    u32("vocab_size", c.vocab_size);
    u32("context_length", c.max_position_embeddings);
    u32("embedding_length", c.hidden_size);
    u32("block_count", c.num_layers);
    u32("feed_forward_length", c.intermediate_size);
    u32("attention.head_count", c.num_heads);
    u32("attention.head_count_kv", c.num_kv_heads);
    if (c.head_dim * c.num_heads != c.hidden_size) {
        u32("attention.key_length", c.head_dim);
        u32("attention.value_length", c.head_dim);
    }
    u32("rope.dimension_count", c.head_dim);
    w.add(arch + ".rope.freq_base", gguf_f32(static_cast<float>(c.rope_theta)));
    w.add(arch + ".attention.layer_norm_rms_epsilon", gguf_f32(static_cast<float>(c.rms_norm_eps)));
    // Gemma's keys (convert_hf_to_gguf.py Gemma2Model / Gemma3Model); the rest llama.cpp
    // hard-codes (sources/gguf.hpp, gguf_gemma_mismatch).
    if (c.sliding_window && architecture_features(c.arch).sandwich_norms)
        u32("attention.sliding_window", *c.sliding_window);
    if (c.attn_logit_softcapping > 0.0)
        w.add(arch + ".attn_logit_softcapping",
              gguf_f32(static_cast<float>(c.attn_logit_softcapping)));
    if (c.final_logit_softcapping > 0.0)
        w.add(arch + ".final_logit_softcapping",
              gguf_f32(static_cast<float>(c.final_logit_softcapping)));
    if (c.rope_scaling.type == "linear") {
        w.add(arch + ".rope.scaling.type", gguf_string("linear"));
        w.add(arch + ".rope.scaling.factor", gguf_f32(static_cast<float>(c.rope_scaling.factor)));
    }
}

// Special ids from the config when there is no tokenizer to carry them.
void add_config_token_ids(GgufWriter& w, const ModelConfig& c) {
    if (c.bos_token_id)
        w.add("tokenizer.ggml.bos_token_id", gguf_u32(static_cast<uint32_t>(*c.bos_token_id)));
    if (!c.eos_token_ids.empty())
        w.add("tokenizer.ggml.eos_token_id",
              gguf_u32(static_cast<uint32_t>(c.eos_token_ids.front())));
}

struct Planned {
    const QfTensorInfo* t;
    GgmlType type;
    uint64_t rope_heads;  // q/k rows to reorder to adjacent pairs per this many heads; 0: none
};

// One tensor's bytes in llama.cpp's layout: rows reordered for RoPE, then repacked to blocks.
std::span<const uint8_t> gguf_bytes(const QfFile& qf, const Planned& p, const ModelConfig& c,
                                    std::vector<uint8_t>& scratch, std::vector<uint8_t>& rows,
                                    std::vector<uint8_t>& blocks) {
    const QfTensorInfo& t = *p.t;
    std::span<const uint8_t> bytes = qf.tensor_bytes(t, scratch, true);
    if (p.rope_heads) {
        rows.resize(bytes.size());
        permute_rope_halves_to_pairs(bytes, rows, p.rope_heads, c.head_dim,
                                     bytes.size() / t.shape[0]);
        bytes = rows;
    }
    if (!qtype_is_quantized(t.qtype)) return bytes;
    const GgmlTypeTraits& tr = ggml_type_traits(p.type);
    blocks.resize(t.shape[0] * t.shape[1] / tr.block_elems * tr.block_bytes);
    pack_gguf_rows(t.qtype, bytes, t.shape[0], t.shape[1], blocks);
    return blocks;
}

}  // namespace

GgufExportReport export_gguf(const GgufExportOptions& o) {
    check_output_path(o.output, {o.input}, OutputKind::file);
    const QfFile qf(o.input);
    const ModelConfig& c = qf.config();
    const GgufArchitecture* a = gguf_architecture_of(c.arch);
    if (!a) {
        std::string names;
        for (const GgufArchitecture& g : gguf_architectures())
            if (!architecture_has_fused_tensors(g.arch))
                names += (names.empty() ? "" : ", ") + std::string(g.name);
        throw Error(qf.path(), {},
                    "architecture '" + std::string(architecture_name(c.arch)) +
                        "' has no GGUF form qforge reads back (supported: " + names + ")");
    }
    // llama.cpp's phi3 needs ffn_up fused with the gate (and reads attention.sliding_window),
    // which this writer does not produce; the converter reads such files.
    if (architecture_has_fused_tensors(c.arch))
        throw Error(qf.path(), {},
                    "GGUF export of a " + std::string(architecture_name(c.arch)) +
                        " model is not supported: llama.cpp stores its gate/up (and q/k/v) "
                        "projections fused, which this writer does not write");
    if (const std::string why = gguf_gemma_mismatch(c); !why.empty())
        throw Error(qf.path(), {},
                    "this Gemma model has no GGUF form llama.cpp reads back: " + why);
    // Gemma 3's linear scaling has keys of its own; Llama 3's needs rope_freqs.
    const bool linear_ok = c.rope_scaling.type == "linear" && c.arch == Architecture::gemma3;
    if (c.rope_scaling.type != "none" && !linear_ok)
        throw Error(qf.path(), {},
                    "RoPE scaling '" + c.rope_scaling.type +
                        "' cannot be exported to GGUF (llama.cpp stores it as rope_freqs, which "
                        "qforge does not write)");
    if (qf.has_tokenizer()) validate_tokenizer_schema(qf.tokenizer(), qf.path());

    GgufExportReport report;
    std::vector<Planned> plan;
    std::map<GgmlType, uint64_t> matrix_elements;
    const std::vector<TensorSpec> specs = expected_tensors(c);
    for (const TensorSpec& s : specs) {
        const QfTensorInfo& t = qf.at(s.name);
        const GgmlType type = export_type(qf, t);
        const RopeRows rope = a->adjacent_pair_rope ? s.row->rope : RopeRows::none;
        plan.push_back({&t, type,
                        rope == RopeRows::none      ? 0
                        : rope == RopeRows::q_heads ? c.num_heads
                                                    : c.num_kv_heads});
        if (t.shape.size() == 2) matrix_elements[type] += t.shape[0] * t.shape[1];
        ++report.ggml_types[std::string(ggml_type_traits(type).name)];
    }
    const FileType* file_type = &kFileTypes[0];
    uint64_t most = 0;
    for (const FileType& f : kFileTypes)
        if (matrix_elements[f.type] > most) {
            most = matrix_elements[f.type];
            file_type = &f;
        }
    report.file_type = file_type->name;

    GgufWriter w(o.output);
    add_model_metadata(w, c, *a, o.name.empty() ? fs::path(o.input).stem().string() : o.name,
                       file_type->id);
    if (qf.has_tokenizer()) {
        GgufTokenizerMetadata tok =
            gguf_tokenizer_metadata(qf.tokenizer(), qf.path(), c.vocab_size);
        for (GgufKeyValue& kv : tok.keys) w.add(std::move(kv.key), std::move(kv.value));
        for (std::string& warning : tok.warnings) report.warnings.push_back(std::move(warning));
    } else {
        // llama.cpp's marker for a model without a vocabulary: it loads the file with
        // <arch>.vocab_size (written above) placeholder tokens, so llama-bench runs it; text cannot
        // be tokenized.
        report.warnings.push_back(
            "the .qf has no tokenizer: the GGUF says tokenizer.ggml.model = none (llama.cpp loads "
            "it for benchmarks, but cannot tokenize text with it)");
        w.add("tokenizer.ggml.model", gguf_string("none"));
        add_config_token_ids(w, c);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
        w.add_tensor(tensor_name_for_layer(specs[i].row->gguf_pattern, specs[i].layer),
                     plan[i].type, specs[i].shape);
        total += plan[i].t->length;
    }
    report.tensors = plan.size();

    Progress progress("export", total);
    std::vector<uint8_t> scratch, rows, blocks;
    for (const Planned& p : plan) {
        w.write_tensor(gguf_bytes(qf, p, c, scratch, rows, blocks));
        qf.release(*p.t);
        progress.advance(p.t->length);
    }
    w.finish();
    progress.finish();
    report.bytes = w.bytes_written();
    return report;
}

}  // namespace qforge
