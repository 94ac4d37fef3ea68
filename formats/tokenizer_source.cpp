#include "formats/tokenizer_source.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "core/mapped_file.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kTokenizerSchemaVersion = 1;

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
        i += n;
    }
    return true;
}

json read_json_file(const std::string& path) {
    MappedFile f(path);
    const auto* p = reinterpret_cast<const char*>(f.data());
    try {
        return json::parse(p, p + f.size());
    } catch (const json::exception& e) {
        throw Error(path, {}, std::string("not valid JSON: ") + e.what());
    }
}

// llama2.c tokenizer: int32 max_token_length, then per token: float32 score, int32 len, bytes.
// The vocabulary size is not stored: it is the number of records until the end of the file.
json load_llama2c(const std::string& path) {
    MappedFile f(path);
    const uint8_t* p = f.data();
    const uint64_t size = f.size();
    auto read_i32 = [&](uint64_t at) {
        int32_t v;
        std::memcpy(&v, p + at, 4);
        return v;
    };
    if (size < 4) throw Error(path, {}, "truncated llama2.c tokenizer: no max_token_length");
    const int32_t max_len = read_i32(0);
    if (max_len <= 0 || max_len > 1024)
        throw Error(path, {}, "max_token_length " + std::to_string(max_len) + " is not in 1..1024");
    json pieces = json::array(), scores = json::array();
    uint64_t at = 4;
    while (at < size) {
        const std::string where = "token " + std::to_string(pieces.size());
        if (size - at < 8) throw Error(path, where, "truncated record (needs score and length)");
        float score;
        std::memcpy(&score, p + at, 4);
        const int32_t len = read_i32(at + 4);
        at += 8;
        if (len < 0 || len > max_len)
            throw Error(path, where, "length " + std::to_string(len) + " outside 0..max_token_length " +
                                         std::to_string(max_len));
        if (size - at < static_cast<uint64_t>(len))
            throw Error(path, where, "truncated piece bytes");
        std::string piece(reinterpret_cast<const char*>(p + at), static_cast<size_t>(len));
        at += static_cast<uint64_t>(len);
        if (!valid_utf8(piece)) throw Error(path, where, "piece is not valid UTF-8");
        if (!std::isfinite(score)) throw Error(path, where, "score is not finite");
        pieces.push_back(std::move(piece));
        scores.push_back(score);
    }
    if (pieces.size() < 3) throw Error(path, {}, "llama2.c tokenizer has fewer than 3 tokens");
    // llama2.c fixes the special ids: 0 <unk>, 1 BOS, 2 EOS (run.c).
    return {{"source", "llama2c"},   {"schema_version", kTokenizerSchemaVersion},
            {"pieces", pieces},      {"scores", scores},
            {"max_token_length", max_len}, {"bos_id", 1},
            {"eos_id", 2}};
}

json load_hf(const std::string& path) {
    json tok = read_json_file(path);
    if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object())
        throw Error(path, {}, "tokenizer.json has no \"model\" object");
    const json& type = tok["model"].value("type", json());
    if (type != "BPE")
        throw Error(path, {}, "unsupported tokenizer model type " + type.dump() + " (supported: BPE)");
    json config = nullptr;
    const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg_path)) {
        config = read_json_file(cfg_path.string());
        if (!config.is_object()) throw Error(cfg_path.string(), {}, "not a JSON object");
    }
    return {{"source", "hf"},
            {"schema_version", kTokenizerSchemaVersion},
            {"tokenizer_json", std::move(tok)},
            {"tokenizer_config", std::move(config)}};
}

}  // namespace

json load_tokenizer_source(const std::string& path) {
    if (fs::is_directory(path)) throw Error(path, {}, "expected a tokenizer file, found a directory");
    const std::string ext = fs::path(path).extension().string();
    if (ext == ".json") return load_hf(path);
    if (ext == ".bin") return load_llama2c(path);
    if (ext == ".model")
        throw Error(path, {}, "SentencePiece .model files are not supported; use the model's tokenizer.json");
    throw Error(path, {}, "unrecognised tokenizer file (expected tokenizer.json or a llama2.c .bin)");
}

std::optional<std::string> find_tokenizer(const std::string& model_path) {
    fs::path dir = fs::absolute(model_path).lexically_normal();
    if (!dir.has_filename()) dir = dir.parent_path();  // "hf/" -> "hf"
    if (!fs::is_directory(dir)) dir = dir.parent_path();
    if (fs::exists(dir / "tokenizer.json")) return (dir / "tokenizer.json").string();
    for (const fs::path& d : {dir, dir.parent_path()}) {
        if (d.empty() || !fs::is_directory(d)) continue;
        std::vector<std::string> found;
        for (const auto& e : fs::directory_iterator(d)) {
            const std::string name = e.path().filename().string();
            if (e.is_regular_file() && name.rfind("tok", 0) == 0 && e.path().extension() == ".bin")
                found.push_back(e.path().string());
        }
        std::sort(found.begin(), found.end());
        if (!found.empty()) return found.front();
    }
    return std::nullopt;
}

}  // namespace qforge
