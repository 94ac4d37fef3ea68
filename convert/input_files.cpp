#include "convert/input_files.hpp"

#include <filesystem>
#include <span>
#include <system_error>

namespace qforge {

namespace {

namespace fs = std::filesystem;

// Files the Hugging Face readers (formats/safetensors_reader, formats/model_config,
// tokenizer/source_hf, sources/hf_quantized) open beside a checkpoint or a tokenizer.json.
constexpr const char* kCheckpointCompanions[] = {
    "config.json",
    "quantize_config.json",
    "quant_config.json",
    "model.safetensors.index.json",
};
constexpr const char* kTokenizerCompanions[] = {
    "tokenizer.json",          "tokenizer_config.json", "generation_config.json",
    "special_tokens_map.json", "tokenizer.model",
};

enum class Beside { checkpoint, tokenizer_json, llama2c_vocab };

void add_beside(const fs::path& dir, Beside what, std::vector<std::string>& out) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) return;
    auto add_names = [&](std::span<const char* const> names) {
        for (const char* name : names)
            if (fs::exists(dir / name, ec)) out.push_back((dir / name).string());
    };
    if (what == Beside::checkpoint) add_names(kCheckpointCompanions);
    if (what != Beside::llama2c_vocab) add_names(kTokenizerCompanions);
    if (what == Beside::tokenizer_json) return;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const fs::path& p = it->path();
        const std::string name = p.filename().string();
        const bool shard = what == Beside::checkpoint && p.extension() == ".safetensors";
        // llama2.c vocabularies: tokenizer.bin, tok<N>.bin.
        if (shard || (name.starts_with("tok") && p.extension() == ".bin"))
            out.push_back(p.string());
    }
}

}  // namespace

std::vector<std::string> checkpoint_input_files(const std::string& input,
                                                const std::string& tokenizer) {
    std::vector<std::string> files;
    std::error_code ec;
    if (!input.empty() && fs::exists(input, ec)) {
        files.push_back(input);
        const fs::path p(input);
        const std::string ext = p.extension().string();
        if (!fs::is_directory(p, ec) && ext != ".qf" && ext != ".gguf") {
            const fs::path dir = fs::absolute(p, ec).parent_path();
            add_beside(dir, Beside::checkpoint, files);
            add_beside(dir.parent_path(), Beside::llama2c_vocab, files);
        } else if (fs::is_directory(p, ec)) {
            // Its files by name too, so an output that is a hard link to one is recognised.
            for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
                if (it->is_regular_file(ec)) files.push_back(it->path().string());
            // find_tokenizer looks one directory up for a llama2.c vocabulary.
            fs::path dir = fs::absolute(p, ec).lexically_normal();
            if (!dir.has_filename()) dir = dir.parent_path();  // "hf/" -> "hf"
            add_beside(dir.parent_path(), Beside::llama2c_vocab, files);
        }
    }
    if (!tokenizer.empty() && fs::exists(tokenizer, ec)) {
        files.push_back(tokenizer);
        if (fs::path(tokenizer).extension() == ".json")
            add_beside(fs::absolute(fs::path(tokenizer), ec).parent_path(), Beside::tokenizer_json,
                       files);
    }
    return files;
}

}  // namespace qforge
