#include "convert/convert.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <map>

#include "convert/tensor_cast.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/progress.hpp"
#include "formats/architectures.hpp"
#include "formats/model_config.hpp"
#include "formats/qf.hpp"
#include "formats/safetensors.hpp"
#include "formats/tokenizer_source.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Hashes a source file with read() rather than through a mapping, so provenance hashing of a
// large checkpoint does not add its pages to our resident memory.
json source_entry(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path, {}, "cannot open: " + errno_text(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    Xxh3Stream128 h;
    std::vector<uint8_t> buf(4 << 20);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            throw Error(path, {}, "read failed: " + errno_text(err));
        }
        if (n == 0) break;
        h.update({buf.data(), static_cast<size_t>(n)});
        total += static_cast<uint64_t>(n);
    }
    ::close(fd);
    // Only the file name: absolute paths would make identical inputs give different files.
    return {{"file", fs::path(path).filename().string()}, {"bytes", total}, {"hash", h.digest()}};
}

std::string config_path_for(const std::string& input) {
    fs::path p(input);
    fs::path dir = fs::is_directory(p) ? p : p.parent_path();
    fs::path cfg = dir / "config.json";
    if (!fs::exists(cfg))
        throw Error(input, {}, "no config.json " + std::string(fs::is_directory(p) ? "in" : "beside") +
                                   " the checkpoint (needed for the model's architecture)");
    return cfg.string();
}

// The dtype a tensor is stored as. Without --dtype, the source's. With --dtype, matrices take
// it and 1-D tensors (norms, biases) are stored as f32, which holds f16/bf16 values exactly.
QType target_qtype(const TensorSpec& spec, QType source, const std::optional<QType>& requested) {
    if (!requested) return source;
    if (spec.shape.size() < 2) return QType::f32;
    return *requested;
}

}  // namespace

ConvertReport convert_hf_checkpoint(const ConvertOptions& options) {
    ConvertReport report;
    const std::string cfg_path = config_path_for(options.input);
    const ModelConfig cfg = read_model_config(cfg_path);
    const SafetensorsCheckpoint ckpt(options.input);

    // Match checkpoint tensors to the architecture table before writing anything.
    const std::vector<TensorSpec> specs = expected_tensors(cfg);
    std::map<std::string, const TensorSpec*> by_hf_name;
    for (const auto& s : specs) by_hf_name[s.hf_name] = &s;
    for (const std::string& name : ckpt.tensor_names()) {
        if (by_hf_name.count(name) || is_ignorable_hf_tensor(name)) continue;
        if (name == "lm_head.weight" && cfg.tie_word_embeddings) {
            report.warnings.push_back("lm_head.weight ignored: config.json ties it to the embeddings");
            continue;
        }
        throw Error(ckpt.file_of(name), name,
                    "unexpected tensor for architecture '" + std::string(architecture_name(cfg.arch)) +
                        "' (not in the architecture table)");
    }
    uint64_t total_bytes = 0;
    for (const auto& s : specs) {
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
    std::string tok_path = options.tokenizer;
    if (tok_path.empty()) tok_path = find_tokenizer(options.input).value_or("");
    json tokenizer = nullptr;
    if (!tok_path.empty()) {
        tokenizer = load_tokenizer_source(tok_path);
        report.tokenizer = tok_path;
    } else {
        report.warnings.push_back("no tokenizer found beside " + options.input +
                                  "; the .qf will have none (pass --tokenizer FILE)");
    }

    json sources = json::array();
    sources.push_back(source_entry(cfg_path));
    for (const auto& f : ckpt.files()) sources.push_back(source_entry(f));
    if (!tok_path.empty()) sources.push_back(source_entry(tok_path));

    QfWriter writer(options.output, {.compress = options.compress});
    writer.set_model(model_config_to_json(cfg));
    writer.set_tokenizer(std::move(tokenizer));
    writer.set_provenance({
        {"generator", {{"name", "qforge"}, {"version", QFORGE_VERSION}}},
        {"sources", std::move(sources)},
        {"recipe",
         {{"command", "convert"},
          {"dtype", options.dtype ? std::string(qtype_traits(*options.dtype).name) : "source"},
          {"compress", options.compress}}},
    });

    Progress progress("convert", total_bytes);
    std::vector<uint8_t> buffer;
    for (const auto& s : specs) {
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

}  // namespace qforge
