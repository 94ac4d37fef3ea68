#include "sources/llama2c.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

#include "core/alloc.hpp"
#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "formats/architectures.hpp"
#include "sources/detect.hpp"
#include "sources/source_common.hpp"
#include "sources/source_kinds.hpp"
#include "sources/tensor_cast.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What run.c hard-codes for every llama2.c model (and what the HF configs of these models say).
constexpr double kRmsNormEps = 1e-5;
constexpr double kRopeTheta = 10000.0;
constexpr int64_t kBosId = 1, kEosId = 2;

// The legacy (version 0) file, in file order, as llama2.c's legacy_export writes it and run.c's
// memory_map_weights reads it: run.c's TransformerWeights fields. Each is one of our tensors (the
// architecture table's row with that llama2c_field gives its name, shape, presence and RoPE
// reordering) except the two RoPE tables, which the runtime computes from rope_theta. Per-layer
// arrays hold n_layers consecutive blocks, every layer of one kind stored together.
constexpr std::string_view kFileOrder[] = {
    "token_embedding_table",
    "rms_att_weight",
    "wq",
    "wk",
    "wv",
    "wo",
    "rms_ffn_weight",
    "w1",
    "w2",
    "w3",
    "rms_final_weight",
    "freq_cis_real",
    "freq_cis_imag",
    "wcls",
};

constexpr uint64_t kHeaderBytes = sizeof(Llama2cHeader);
constexpr uint64_t kFloatBytes = 4;

// Where one array of the file starts and how big each of its layers is.
struct ArrayPlacement {
    std::string_view field;  // run.c's name
    const TensorRow* row;    // our tensor kind; nullptr for the unused RoPE tables
    bool per_layer;
    uint64_t offset;              // absolute, in bytes
    uint64_t layer_bytes;         // one layer's bytes (the whole array's when not per layer)
    std::vector<uint64_t> shape;  // one layer's shape, ours: [rows] for vectors
};

// Where one of our tensors lies in the file.
struct Llama2cTensor {
    const ArrayPlacement* array;
    uint64_t layer;
    uint64_t offset;  // absolute, in bytes
    uint64_t bytes;
    std::vector<uint64_t> shape;
};

// The table row of a file field; nullptr for freq_cis_real/imag ([seq_len, head_dim / 2]).
const TensorRow* row_of_field(std::string_view field) {
    for (const TensorRow& row : tensor_rows(Architecture::llama))
        if (row.llama2c_field == field) return &row;
    return nullptr;
}

// Every array of the file and the byte count the header implies for the whole file. Sizes use
// overflow-checked arithmetic and no per-layer loop: the header is untrusted and is checked
// against the file's length before anything is built per layer.
struct FilePlan {
    std::vector<ArrayPlacement> arrays;
    uint64_t expected_bytes = 0;
};

FilePlan plan_file(const ModelConfig& c, const std::string& file) {
    const auto overflow = [&]() {
        return Error(file, {}, "llama2.c header implies a file larger than 2^64 bytes");
    };
    FilePlan plan;
    uint64_t at = kHeaderBytes;
    for (std::string_view field : kFileOrder) {
        const TensorRow* row = row_of_field(field);
        if (row && !tensor_row_present(*row, c)) continue;  // wcls of a shared classifier
        std::vector<uint64_t> shape =
            row ? tensor_row_shape(*row, c)
                : std::vector<uint64_t>{c.max_position_embeddings, c.head_dim / 2};
        const bool per_layer = row && tensor_row_per_layer(*row);
        const auto elems = checked_product(shape);
        const auto layer_bytes = elems ? checked_mul(*elems, kFloatBytes) : std::nullopt;
        const auto bytes =
            layer_bytes ? checked_mul(*layer_bytes, per_layer ? c.num_layers : 1) : std::nullopt;
        const auto next = bytes ? checked_add(at, *bytes) : std::nullopt;
        if (!next) throw overflow();
        plan.arrays.push_back({field, row, per_layer, at, *layer_bytes, std::move(shape)});
        at = *next;
    }
    plan.expected_bytes = at;
    return plan;
}

// Our tensors by name; only for a plan whose size matched the file (which bounds the layers).
std::map<std::string, Llama2cTensor> source_tensors(const FilePlan& plan, uint64_t num_layers) {
    std::map<std::string, Llama2cTensor> tensors;
    for (const ArrayPlacement& p : plan.arrays) {
        if (!p.row) continue;
        const uint64_t layers = p.per_layer ? num_layers : 1;
        for (uint64_t layer = 0; layer < layers; ++layer)
            tensors[tensor_name_for_layer(p.row->name_pattern, layer)] = {
                &p, layer, p.offset + layer * p.layer_bytes, p.layer_bytes, p.shape};
    }
    return tensors;
}

std::string header_text(const Llama2cHeader& h) {
    return "dim " + std::to_string(h.dim) + ", hidden_dim " + std::to_string(h.hidden_dim) +
           ", n_layers " + std::to_string(h.n_layers) + ", n_heads " + std::to_string(h.n_heads) +
           ", n_kv_heads " + std::to_string(h.n_kv_heads) + ", vocab_size " +
           std::to_string(h.vocab_size) + ", seq_len " + std::to_string(h.seq_len);
}

// Whether the bytes start like a PyTorch checkpoint (pytorch_model.bin): a zip archive, or a
// pickle (protocol 2..5). Only a hint for a file whose header did not validate: a genuine
// llama2.c header can start with the same two bytes (dim 640 is 0x80 0x02).
bool looks_like_pytorch(const MappedFile& f) {
    const uint8_t* p = f.data();
    if (f.size() < 4) return false;
    return std::memcmp(p, "PK\x03\x04", 4) == 0 || (p[0] == 0x80 && p[1] >= 2 && p[1] <= 5);
}

// Refuses the newer "ak42" exports with the reason; then reads the legacy header.
Llama2cHeader read_header(const MappedFile& f) {
    const std::string& path = f.path();
    const uint8_t* p = f.data();
    const uint64_t size = f.size();
    if (size >= 4) {
        uint32_t magic;
        std::memcpy(&magic, p, 4);
        if (magic == kLlama2cMagic) {
            std::string version = "unknown";
            if (size >= 8) {
                int32_t v;
                std::memcpy(&v, p + 4, 4);
                version = std::to_string(v);
            }
            throw Error(path, {},
                        "llama2.c export version " + version +
                            " (magic \"ak42\") is not supported: only the legacy version-0 "
                            "format is (llama2.c export.py --version 0), or convert the Hugging "
                            "Face checkpoint");
        }
    }
    if (size < kHeaderBytes)
        throw Error(path, {},
                    "truncated: " + std::to_string(size) +
                        " bytes, a llama2.c checkpoint starts with a 28-byte header");
    Llama2cHeader h;
    std::memcpy(&h, p, kHeaderBytes);
    return h;
}

// tok<vocab>.bin, then tokenizer.bin beside the checkpoint (llama2.c's naming), then whatever
// find_tokenizer finds.
std::optional<std::string> find_llama2c_tokenizer(const std::string& input, uint64_t vocab) {
    const fs::path dir = fs::absolute(input).parent_path();
    for (const std::string& name :
         {"tok" + std::to_string(vocab) + ".bin", std::string("tokenizer.bin")})
        if (fs::is_regular_file(dir / name)) return (dir / name).string();
    return find_tokenizer(input);
}

}  // namespace

ModelConfig llama2c_model_config(const Llama2cHeader& h, const std::string& file) {
    auto bad = [&](const std::string& what) {
        return Error(file, {}, "llama2.c header (" + header_text(h) + "): " + what);
    };
    const std::pair<const char*, int32_t> counts[] = {
        {"dim", h.dim},         {"hidden_dim", h.hidden_dim}, {"n_layers", h.n_layers},
        {"n_heads", h.n_heads}, {"n_kv_heads", h.n_kv_heads}, {"seq_len", h.seq_len}};
    for (const auto& [name, value] : counts)
        if (value < 1) throw bad(std::string(name) + " must be at least 1");
    if (h.vocab_size == 0 || h.vocab_size == std::numeric_limits<int32_t>::min())
        throw bad("vocab_size must be non-zero (negative: an unshared classifier)");
    if (h.dim % h.n_heads != 0) throw bad("dim is not a multiple of n_heads");
    if ((h.dim / h.n_heads) % 2 != 0)
        throw bad("head_dim = dim / n_heads is odd (RoPE rotates pairs)");
    if (h.n_kv_heads > h.n_heads || h.n_heads % h.n_kv_heads != 0)
        throw bad("n_heads is not a multiple of n_kv_heads");

    ModelConfig c;
    c.arch = Architecture::llama;
    c.vocab_size = static_cast<uint64_t>(h.vocab_size < 0 ? -static_cast<int64_t>(h.vocab_size)
                                                          : h.vocab_size);
    c.hidden_size = static_cast<uint64_t>(h.dim);
    c.intermediate_size = static_cast<uint64_t>(h.hidden_dim);
    c.num_layers = static_cast<uint64_t>(h.n_layers);
    c.num_heads = static_cast<uint64_t>(h.n_heads);
    c.num_kv_heads = static_cast<uint64_t>(h.n_kv_heads);
    c.head_dim = c.hidden_size / c.num_heads;
    c.max_position_embeddings = static_cast<uint64_t>(h.seq_len);
    c.rms_norm_eps = kRmsNormEps;
    c.rope_theta = kRopeTheta;
    c.tie_word_embeddings = h.vocab_size > 0;
    c.attention_bias = false;
    c.bos_token_id = kBosId;
    c.eos_token_ids = {kEosId};
    c.torch_dtype = "float32";
    return c;
}

bool llama2c_header_implies_size(const std::string& path, uint64_t size) {
    std::ifstream f(path, std::ios::binary);
    Llama2cHeader h{};
    f.read(reinterpret_cast<char*>(&h), sizeof h);
    if (f.gcount() != sizeof h) return false;
    try {
        return plan_file(llama2c_model_config(h, path), path).expected_bytes == size;
    } catch (const Error&) {
        return false;
    }
}

bool is_llama2c_checkpoint(const std::string& path) {
    return detect_model_file(path).kind == ModelFileKind::llama2c;
}

namespace {

// A llama2.c checkpoint as a source: every array of the file cut into our tensors, f32, with wq
// and wk reordered to rotate-half RoPE.
class Llama2cSource final : public ModelSource {
  public:
    Llama2cSource(const std::string& path, const SourceOptions& options) : file_(path) {
        path_ = path;
        format_ = "llama2c";
        read_plan();
        model_json_ = model_config_to_json(config_);
        // Our tensors, in canonical order, each found in the plan with the shape the table
        // expects.
        const std::vector<TensorSpec> specs = expected_tensors(config_);
        const std::map<std::string, Llama2cTensor> by_name =
            source_tensors(plan_, config_.num_layers);
        if (specs.size() != by_name.size())
            throw std::logic_error(
                "llama2.c layout and architecture table disagree on the tensor count");
        for (const TensorSpec& s : specs) {
            const auto it = by_name.find(s.name);
            if (it == by_name.end() || it->second.shape != s.shape)
                throw std::logic_error("llama2.c layout has no tensor " + s.name + " of shape " +
                                       shape_to_string(s.shape));
            tensors_.push_back({s.name, QType::f32, s.shape});
            parts_.push_back(it->second);
        }
        tokenizer_ = resolve_tokenizer(options.tokenizer,
                                       options.tokenizer.empty()
                                           ? find_llama2c_tokenizer(path, config_.vocab_size)
                                           : std::nullopt,
                                       path, config_, tokenizer_file_, warnings_);
        if (tokenizer_.is_object() && tokenizer_.value("source", "") == "llama2c" &&
            tokenizer_.contains("pieces") && tokenizer_["pieces"].size() != config_.vocab_size)
            throw Error(tokenizer_file_, {},
                        "tokenizer has " + std::to_string(tokenizer_["pieces"].size()) +
                            " tokens but the model's vocab_size is " +
                            std::to_string(config_.vocab_size));
        recipe_extra_ = {{"source_format", "llama2c-v0"}};
        sources_.push_back(source_entry(path));
        if (!tokenizer_file_.empty()) sources_.push_back(source_entry(tokenizer_file_));
    }

    std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const override {
        const Llama2cTensor& src = parts_[i];
        const std::span<const uint8_t> stored = file_.bytes().subspan(src.offset, src.bytes);
        const RopeRows rope = src.array->row->rope;
        if (rope == RopeRows::none) return stored;
        // Check the values in file order first, so an error's element index is the file's.
        std::vector<uint8_t> unused;
        cast_tensor({label(i), DType::f32, src.shape, stored}, QType::f32, QType::f32, path_,
                    unused);
        const uint64_t heads = rope == RopeRows::q_heads ? config_.num_heads : config_.num_kv_heads;
        resize_for(scratch, src.bytes, path_, tensors_[i].name);
        permute_rope_pairs_to_halves(stored, scratch, heads, config_.head_dim,
                                     src.shape[1] * kFloatBytes);
        return {scratch.data(), src.bytes};
    }
    const std::string& file_of(size_t) const override { return path_; }
    void release(size_t i) const override { file_.release(parts_[i].offset, parts_[i].bytes); }
    std::string label(size_t i) const override {
        const Llama2cTensor& src = parts_[i];
        std::string label = tensors_[i].name + " (llama2.c " + std::string(src.array->field);
        label += src.array->per_layer ? ", layer " + std::to_string(src.layer) + ")" : ")";
        return label;
    }
    uint64_t source_bytes(size_t i) const override { return parts_[i].bytes; }

  private:
    // The header, the model it describes and the file's layout, which must match its length.
    void read_plan() {
        try {
            const Llama2cHeader header = read_header(file_);
            config_ = llama2c_model_config(header, path_);
            plan_ = plan_file(config_, path_);
            if (plan_.expected_bytes != file_.size())
                throw Error(path_, {},
                            "file is " + std::to_string(file_.size()) +
                                " bytes but its llama2.c header (" + header_text(header) +
                                ") implies " + std::to_string(plan_.expected_bytes) +
                                (file_.size() < plan_.expected_bytes ? " (truncated)"
                                                                     : " (trailing bytes)"));
        } catch (const Error&) {
            if (looks_like_pytorch(file_))
                throw Error(path_, {},
                            "this is a PyTorch checkpoint (zip or pickle), not a llama2.c file: "
                            "convert the model's safetensors instead");
            throw;
        }
    }

    MappedFile file_;
    FilePlan plan_;
    std::vector<Llama2cTensor> parts_;  // parallel to tensors_
};

}  // namespace

std::unique_ptr<ModelSource> open_llama2c_source(const std::string& path,
                                                 const SourceOptions& options) {
    return std::make_unique<Llama2cSource>(path, options);
}

}  // namespace qforge
