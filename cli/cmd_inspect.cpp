// qforge inspect: what is in a .qf, a .safetensors file or a Hugging Face directory.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "core/progress.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/qf_validate.hpp"
#include "formats/safetensors.hpp"
#include "sources/detect.hpp"

namespace qforge::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Row {
    std::string name, type;
    std::vector<uint64_t> shape;
    uint64_t bytes;
    std::string encoding;
    double bits_per_weight;  // decoded bytes per parameter: scales, zeros and row padding included
};

double bits_per_weight(uint64_t bytes, const std::vector<uint64_t>& shape) {
    const uint64_t n = checked_product(shape).value_or(0);
    return n ? 8.0 * static_cast<double>(bytes) / static_cast<double>(n) : 0.0;
}

std::string model_summary(const ModelConfig& c) {
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "%s, %llu layers, hidden %llu, heads %llu (kv %llu, head_dim %llu), intermediate %llu, "
        "vocab %llu, context %llu, rope_theta %g%s%s%s",
        std::string(architecture_name(c.arch)).c_str(), (unsigned long long)c.num_layers,
        (unsigned long long)c.hidden_size, (unsigned long long)c.num_heads,
        (unsigned long long)c.num_kv_heads, (unsigned long long)c.head_dim,
        (unsigned long long)c.intermediate_size, (unsigned long long)c.vocab_size,
        (unsigned long long)c.max_position_embeddings, c.rope_theta,
        c.rope_scaling.type == "none" ? "" : (", rope_scaling " + c.rope_scaling.type).c_str(),
        c.tie_word_embeddings ? ", tied embeddings" : "", c.attention_bias ? ", qkv bias" : "");
    std::string s = buf;
    if (architecture_has_qk_norm(c.arch)) s += ", qk-norm";
    if (c.sliding_window) {
        s += ", sliding_window " + std::to_string(*c.sliding_window);
        if (c.max_window_layers > 0) s += " from layer " + std::to_string(c.max_window_layers);
        if (c.sliding_window_pattern > 0)
            s += ", 1 full layer in " + std::to_string(c.sliding_window_pattern);
    }
    char extra[96];
    if (c.rope_local_theta > 0.0) {
        std::snprintf(extra, sizeof extra, ", local rope_theta %g", c.rope_local_theta);
        s += extra;
    }
    if (c.attn_logit_softcapping > 0.0 || c.final_logit_softcapping > 0.0) {
        std::snprintf(extra, sizeof extra, ", softcap %g / %g", c.attn_logit_softcapping,
                      c.final_logit_softcapping);
        s += extra;
    }
    return s;
}

// A string member of a header object, or "?": the header is input, so nothing is assumed.
std::string text_of(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : "?";
}

std::string tokenizer_summary(const json& t) {
    if (t.is_null()) return "none";
    const std::string model = text_of(t, "model");
    const size_t n = t.contains("pieces") && t["pieces"].is_array() ? t["pieces"].size() : 0;
    std::string s = model + ", " + std::to_string(n) + " tokens";
    if (model == "llama2c") s = "llama2.c vocabulary, " + std::to_string(n) + " tokens";
    if (t.contains("chat_template") && t["chat_template"].is_string() &&
        !t["chat_template"].get_ref<const std::string&>().empty())
        s += ", chat template";
    return s;
}

void print_rows(const std::vector<Row>& rows) {
    size_t w = 4;
    for (const auto& r : rows) w = std::max(w, r.name.size());
    std::printf("  %-*s  %-8s  %-18s  %12s  %6s  %s\n", static_cast<int>(w), "name", "type",
                "shape", "bytes", "bpw", "encoding");
    for (const auto& r : rows)
        std::printf("  %-*s  %-8s  %-18s  %12llu  %6.2f  %s\n", static_cast<int>(w), r.name.c_str(),
                    r.type.c_str(), shape_to_string(r.shape).c_str(),
                    static_cast<unsigned long long>(r.bytes), r.bits_per_weight,
                    r.encoding.c_str());
}

json totals(const std::vector<Row>& rows) {
    uint64_t params = 0, bytes = 0;
    for (const auto& r : rows) {
        params += checked_product(r.shape).value_or(0);
        bytes += r.bytes;
    }
    return {{"tensors", rows.size()},
            {"parameters", params},
            {"bytes", bytes},
            {"bits_per_weight",
             params ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0}};
}

// Per stored type: tensors, parameters and bits per weight (decoded bytes), in table order.
json qtype_totals(const std::vector<Row>& rows) {
    json out = json::array();
    for (const auto& q : kQTypes) {
        uint64_t tensors = 0, params = 0;
        double bits = 0.0;
        for (const auto& r : rows) {
            if (r.type != q.name) continue;
            const uint64_t n = checked_product(r.shape).value_or(0);
            tensors += 1;
            params += n;
            bits += r.bits_per_weight * static_cast<double>(n);
        }
        if (tensors)
            out.push_back({{"qtype", q.name},
                           {"tensors", tensors},
                           {"parameters", params},
                           {"bits_per_weight", params ? bits / static_cast<double>(params) : 0.0}});
    }
    return out;
}

void print_qtype_totals(const json& by_type) {
    for (const auto& t : by_type)
        std::printf("  %-8s %4llu tensor%s %12llu parameters, %.2f bits per weight\n",
                    t["qtype"].get<std::string>().c_str(),
                    (unsigned long long)t["tensors"].get<uint64_t>(),
                    t["tensors"].get<uint64_t>() == 1 ? ", " : "s,",
                    (unsigned long long)t["parameters"].get<uint64_t>(),
                    t["bits_per_weight"].get<double>());
}

// The recipe `qforge quantize` recorded: method, default type, overrides and each class's type.
void print_quantization(const json& q) {
    std::printf("quantization: %s, default %s", text_of(q, "method").c_str(),
                text_of(q, "qtype").c_str());
    if (q.contains("overrides") && q["overrides"].is_array())
        for (const auto& o : q["overrides"])
            if (o.is_string())
                std::printf(", --tensor-type %s", o.get_ref<const std::string&>().c_str());
    std::printf("\n");
    if (!q.contains("classes") || !q["classes"].is_array()) return;
    for (const auto& c : q["classes"]) {
        if (!c.is_object()) continue;
        const std::string n = c.contains("tensors") ? c["tensors"].dump() : "?";
        std::printf("  %-10s %4s tensor%s -> %-8s %s\n", text_of(c, "class").c_str(), n.c_str(),
                    n == "1" ? " " : "s", text_of(c, "qtype").c_str(),
                    text_of(c, "reason").c_str());
    }
}

void print_totals(const json& t) {
    std::printf("tensors: %llu, parameters %llu, %s, %.2f bits per weight\n",
                (unsigned long long)t["tensors"].get<uint64_t>(),
                (unsigned long long)t["parameters"].get<uint64_t>(),
                human_bytes(t["bytes"].get<uint64_t>()).c_str(),
                t["bits_per_weight"].get<double>());
}

// A file whose model fails validation (formats/qf_validate.hpp) is still shown, since seeing
// its table is how one finds what is wrong with it; the output then says it is invalid and the
// command fails with the same error every other command gives.
int inspect_qf(const std::string& path, bool as_json) {
    const QfFile qf(path, {.check_model = false});
    std::optional<ModelConfig> cfg;
    std::optional<Error> invalid;
    try {
        cfg = validate_qf_model(path, qf.model(), qf.header().at("tokenizer"), qf.tensors());
    } catch (const Error& e) {
        invalid = e;
    }
    std::vector<Row> rows;
    for (const auto& t : qf.tensors())
        rows.push_back({t.name, std::string(qtype_traits(t.qtype).name), t.shape, t.stored_length,
                        std::string(qf_encoding_name(t.encoding)),
                        bits_per_weight(t.length, t.shape)});
    // Bits per weight counting every byte of the file (header, alignment padding included).
    const uint64_t params = totals(rows)["parameters"].get<uint64_t>();
    const double file_bits =
        params ? 8.0 * static_cast<double>(qf.file_size()) / static_cast<double>(params) : 0.0;
    const json& tok = qf.header().at("tokenizer");
    const json& prov = qf.header().at("provenance");
    const json quantization =
        prov.is_object() ? prov.value("quantization", json(nullptr)) : json(nullptr);
    if (as_json) {
        json tensors = json::array();
        for (size_t i = 0; i < qf.tensors().size(); ++i) {
            tensors.push_back(qf_tensor_to_json(qf.tensors()[i]));
            tensors.back()["bits_per_weight"] = rows[i].bits_per_weight;
        }
        json j = {{"file", path},
                  {"kind", "qf"},
                  {"format_version", qf.version()},
                  {"file_bytes", qf.file_size()},
                  {"file_bits_per_weight", file_bits},
                  {"model", qf.model()},
                  {"tokenizer", tokenizer_summary(tok)},
                  {"provenance", qf.header().at("provenance")},
                  {"tensors", tensors},
                  {"totals", totals(rows)},
                  {"qtypes", qtype_totals(rows)},
                  {"quantization", quantization},
                  {"valid", !invalid},
                  {"error", invalid ? json(invalid->what()) : json(nullptr)}};
        std::printf("%s\n", j.dump(2).c_str());
        std::fflush(stdout);  // the table before the error line
        if (invalid) throw *invalid;
        return 0;
    }
    std::printf("file: %s (qforge format version %u, %s, %.3f bits per weight)\n", path.c_str(),
                qf.version(), human_bytes(qf.file_size()).c_str(), file_bits);
    if (invalid)
        std::printf("INVALID: %s\n", invalid->what());
    else
        std::printf("model: %s\n", model_summary(*cfg).c_str());
    std::printf("tokenizer: %s\n", tokenizer_summary(tok).c_str());
    if (prov.contains("recipe")) std::printf("recipe: %s\n", prov["recipe"].dump().c_str());
    if (prov.contains("sources") && prov["sources"].is_array())
        for (const auto& s : prov["sources"])
            if (s.is_object())
                std::printf("source: %s (%s bytes, %s)\n", text_of(s, "file").c_str(),
                            s.value("bytes", json(0)).dump().c_str(), text_of(s, "hash").c_str());
    if (quantization.is_object()) print_quantization(quantization);
    print_rows(rows);
    print_totals(totals(rows));
    print_qtype_totals(qtype_totals(rows));
    std::fflush(stdout);  // the table before the error line
    if (invalid) throw *invalid;
    return 0;
}

int inspect_safetensors(const std::string& path, bool as_json) {
    SafetensorsCheckpoint ckpt(path);
    const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
    std::optional<ModelConfig> cfg;
    json cfg_json = nullptr;
    if (fs::exists(dir / "config.json")) {
        cfg = read_model_config((dir / "config.json").string());
        cfg_json = model_config_to_json(*cfg);
    }
    std::vector<Row> rows;
    for (const auto& name : ckpt.tensor_names()) {
        TensorView v = ckpt.tensor(name);
        rows.push_back({name, std::string(dtype_info(v.dtype).name), v.shape, v.data.size(), "raw",
                        bits_per_weight(v.data.size(), v.shape)});
    }
    if (as_json) {
        json tensors = json::array();
        for (const auto& r : rows)
            tensors.push_back({{"name", r.name},
                               {"dtype", r.type},
                               {"shape", r.shape},
                               {"bytes", r.bytes},
                               {"file", fs::path(ckpt.file_of(r.name)).filename().string()}});
        json j = {{"file", path},      {"kind", "safetensors"}, {"files", ckpt.files()},
                  {"model", cfg_json}, {"tensors", tensors},    {"totals", totals(rows)}};
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("checkpoint: %s (%zu safetensors file%s)\n", path.c_str(), ckpt.files().size(),
                ckpt.files().size() == 1 ? "" : "s");
    std::printf("model: %s\n", cfg ? model_summary(*cfg).c_str() : "no config.json");
    print_rows(rows);
    print_totals(totals(rows));
    return 0;
}

}  // namespace

Runner register_inspect(CLI::App& app, CommonOptions& common) {
    auto path = std::make_shared<std::string>();
    add_input_option(app, "file", *path,
                     ".qf file, .safetensors file or Hugging Face directory; a GGUF or llama2.c "
                     "file is shown as the .qf it converts to",
                     true)
        ->required();
    add_json_option(app, common);
    return [path, &common]() {
        const ModelFileKind kind = detect_model_file(*path).kind;
        if (kind == ModelFileKind::qf) return inspect_qf(*path, common.json);
        if (kind == ModelFileKind::gguf || kind == ModelFileKind::llama2c)
            return inspect_qf(open_qf_input(*path)->path(), common.json);
        return inspect_safetensors(*path, common.json);
    };
}

}  // namespace qforge::cli
