// Dispatch by file kind, the llama2.c vocabulary reader, the schema check every consumer relies
// on, and the search for a checkpoint's tokenizer. tokenizer.json lives in
// source_hf.cpp.
#include "tokenizer/source.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "formats/json_io.hpp"
#include "tokenizer/source_gguf.hpp"
#include "tokenizer/source_hf.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama2.c fixes its special ids (run.c): 0 <unk>, 1 BOS, 2 EOS, and 3..258 are the byte
// fallback pieces <0x00>..<0xFF> (run.c's encode uses id = byte + 3 without looking them up).
constexpr int kLlama2cBos = 1;
constexpr int kLlama2cEos = 2;
constexpr int kLlama2cFirstByte = 3;
constexpr int kLlama2cMaxTokenLength = 1024;

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
    if (size < 4)
        throw Error(path, {},
                    "truncated llama2.c vocabulary: " + std::to_string(size) +
                        " bytes, it starts with a 4-byte max_token_length");
    const int32_t max_len = read_i32(0);
    if (max_len <= 0 || max_len > kLlama2cMaxTokenLength)
        throw Error(path, {},
                    "llama2.c vocabulary: max_token_length " + std::to_string(max_len) +
                        " at byte 0 is not in 1..1024");
    json pieces = json::array(), scores = json::array();
    std::unordered_set<std::string> seen;
    uint64_t at = 4;
    while (at < size) {
        // Records are named by index and byte offset: they are vocabulary entries, not tensors.
        const std::string where = "llama2.c vocabulary record " + std::to_string(pieces.size()) +
                                  " at byte " + std::to_string(at);
        const auto bad = [&](const std::string& what) {
            return Error(path, {}, where + ": " + what);
        };
        if (size - at < 8)
            throw bad("truncated: " + std::to_string(size - at) +
                      " bytes left, a record needs 8 (a float32 score and an int32 length)");
        float score;
        std::memcpy(&score, p + at, 4);
        const int32_t len = read_i32(at + 4);
        at += 8;
        if (len < 0 || len > max_len)
            throw bad("length " + std::to_string(len) + " outside 0..max_token_length " +
                      std::to_string(max_len));
        if (size - at < static_cast<uint64_t>(len))
            throw bad("truncated: the piece needs " + std::to_string(len) +
                      " bytes, the file has " + std::to_string(size - at) + " left");
        std::string piece(reinterpret_cast<const char*>(p + at), static_cast<size_t>(len));
        at += static_cast<uint64_t>(len);
        if (!is_valid_utf8(piece)) throw bad("piece is not valid UTF-8");
        if (!std::isfinite(score)) throw bad("score " + std::to_string(score) + " is not finite");
        // run.c looks pieces up by binary search, so a duplicate would make encoding ambiguous.
        if (!seen.insert(piece).second) throw bad("duplicate piece " + quoted_excerpt(piece));
        pieces.push_back(std::move(piece));
        scores.push_back(score);
    }
    if (pieces.size() < kLlama2cFirstByte + 256)
        throw Error(path, {},
                    "llama2.c tokenizer has " + std::to_string(pieces.size()) +
                        " tokens; it needs at least 259 (<unk>, BOS, EOS, 256 bytes)");
    json types = json::array();
    for (size_t id = 0; id < pieces.size(); ++id) {
        const char* t = id == 0                                             ? "unknown"
                        : id < kLlama2cFirstByte                            ? "special"
                        : id < static_cast<size_t>(kLlama2cFirstByte + 256) ? "byte"
                                                                            : "normal";
        types.push_back(t);
    }
    return {{"schema_version", kTokenizerSchemaVersion},
            {"model", "llama2c"},
            {"source", "llama2c"},
            {"pieces", std::move(pieces)},
            {"scores", std::move(scores)},
            {"token_types", std::move(types)},
            {"max_token_length", max_len},
            {"added_tokens", json::array()},
            {"normalizer", json::array()},
            {"pre_tokenizer", nullptr},
            {"bos_id", kLlama2cBos},
            {"eos_id", kLlama2cEos},
            {"unk_id", 0},
            {"add_bos", true},
            {"add_eos", false},
            // run.c ends generation when the model emits BOS (and only then).
            {"stop_ids", json::array({kLlama2cBos})},
            {"chat_template", ""}};
}

void require(bool ok, const std::string& source, const std::string& what) {
    if (!ok) throw Error(source, {}, "tokenizer schema: " + what);
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        const size_t n = c < 0x80           ? 1
                         : (c >> 5) == 0x6  ? 2
                         : (c >> 4) == 0xe  ? 3
                         : (c >> 3) == 0x1e ? 4
                                            : 0;
        if (n == 0 || i + n > s.size()) return false;
        uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
        for (size_t k = 1; k < n; ++k) {
            const auto b = static_cast<unsigned char>(s[i + k]);
            if ((b >> 6) != 0x2) return false;
            cp = (cp << 6) | (b & 0x3fu);
        }
        // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
        static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMinForLength[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += n;
    }
    return true;
}

json load_tokenizer_source(const std::string& path) {
    if (fs::is_directory(path))
        throw Error(path, {}, "expected a tokenizer file, found a directory");
    const std::string ext = fs::path(path).extension().string();
    json schema;
    if (ext == ".json")
        schema = load_hf_tokenizer(path);
    else if (ext == ".bin")
        schema = load_llama2c(path);
    else if (ext == ".gguf")
        schema = tokenizer_schema_from_gguf(GgufFile(path));
    else if (ext == ".model")
        throw Error(path, {},
                    "SentencePiece .model files are not supported; use the model's tokenizer.json");
    else
        throw Error(path, {},
                    "unrecognised tokenizer file (expected tokenizer.json, a llama2.c .bin or a "
                    ".gguf model)");
    validate_tokenizer_schema(schema, path);
    return schema;
}

void validate_tokenizer_schema(const json& s, const std::string& source) {
    require(s.is_object(), source, "not an object");
    const json& version = s.value("schema_version", json());
    if (version != kTokenizerSchemaVersion)
        throw Error(source, {},
                    "tokenizer schema_version " + version.dump() + " is not " +
                        std::to_string(kTokenizerSchemaVersion) +
                        " (the version this qforge reads): reconvert the model with this qforge");
    const std::string model = JsonView(s, source, "tokenizer")["model"].string_or("");
    require(model == "llama2c" || model == "bpe_sentencepiece" || model == "bpe_byte_level", source,
            "unknown model " + s.value("model", json()).dump());
    require(s.contains("pieces") && s["pieces"].is_array() && !s["pieces"].empty(), source,
            "\"pieces\" must be a non-empty array");
    const size_t n = s["pieces"].size();
    for (const json& p : s["pieces"])
        require(p.is_string(), source, "every piece must be a string");
    require(
        s.contains("token_types") && s["token_types"].is_array() && s["token_types"].size() == n,
        source, "\"token_types\" must have one entry per piece");
    if (model == "llama2c")
        require(s.contains("scores") && s["scores"].is_array() && s["scores"].size() == n, source,
                "\"scores\" must have one number per piece");
    else
        require(s.contains("merges") && s["merges"].is_array(), source,
                "\"merges\" must be an array");
    auto check_id = [&](const json& id, const char* key) {
        require(id.is_null() ||
                    (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<uint64_t>() < n),
                source,
                std::string(key) + " " + id.dump() + " is not a token id (vocabulary " +
                    std::to_string(n) + ")");
    };
    for (const char* key : {"bos_id", "eos_id", "unk_id"}) check_id(s.value(key, json()), key);
    require(s.value("stop_ids", json()).is_array(), source, "\"stop_ids\" must be an array");
    for (const json& id : s["stop_ids"]) check_id(id, "stop id");
    require(s.value("added_tokens", json()).is_array(), source,
            "\"added_tokens\" must be an array");
    for (const json& t : s["added_tokens"]) {
        require(t.is_object() && t.value("content", json()).is_string(), source,
                "added token without content");
        check_id(t.value("id", json(-1)), "added token id");
    }
}

std::optional<std::string> find_tokenizer(const std::string& model_path) {
    fs::path dir = fs::absolute(model_path).lexically_normal();
    if (!dir.has_filename()) dir = dir.parent_path();  // "hf/" -> "hf"
    if (!fs::is_directory(dir)) dir = dir.parent_path();
    if (fs::exists(dir / "tokenizer.json")) return (dir / "tokenizer.json").string();
    // llama2.c names its vocabulary tokenizer.bin (Llama 2's 32000) or tok<vocab>.bin.
    for (const fs::path& d : {dir, dir.parent_path()}) {
        if (d.empty() || !fs::is_directory(d)) continue;
        if (fs::is_regular_file(d / "tokenizer.bin")) return (d / "tokenizer.bin").string();
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
