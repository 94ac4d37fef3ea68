#include "quant/calibration.hpp"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "core/hash.hpp"

namespace qforge {

namespace {

// Far more text than any calibration set draws from (nsamples * seqlen tokens); a larger file
// is refused before it is read into memory.
constexpr uint64_t kMaxCalibrationTextBytes = uint64_t{1} << 30;

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path, {}, "cannot read the calibration text");
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxCalibrationTextBytes)
        throw Error(path, {},
                    "calibration text is " + std::to_string(size) + " bytes, above the limit of " +
                        std::to_string(kMaxCalibrationTextBytes) + " (1 GiB); give a sample of it");
    std::ostringstream s;
    s << in.rdbuf();
    if (in.bad()) throw Error(path, {}, "read error in the calibration text");
    return s.str();
}

}  // namespace

CalibrationSet make_calibration_set(const Tokenizer& tokenizer, const CalibrationOptions& o) {
    if (o.files.empty()) throw Error("calibration: no text file given (--calib FILE)");
    if (o.nsamples == 0 || o.seqlen < 2)
        throw Error("calibration: --nsamples must be >= 1 and --seqlen >= 2");
    std::string text;
    for (const auto& f : o.files) {
        if (!text.empty()) text += "\n\n";
        text += read_text(f);
    }
    const std::vector<int32_t> ids = tokenizer.encode(text, /*add_special=*/false);
    const bool with_bos = tokenizer.add_bos() && tokenizer.bos_id().has_value();
    const int32_t bos = with_bos ? *tokenizer.bos_id() : -1;
    const uint64_t body = with_bos ? o.seqlen - 1 : o.seqlen;  // text tokens per window
    if (ids.size() < body) {
        // Every file with its own count, so the user knows which one to lengthen.
        std::string names, counts;
        for (const auto& f : o.files) {
            names += (names.empty() ? "" : ", ") + f;
            counts += (counts.empty() ? "" : ", ") + std::filesystem::path(f).filename().string() +
                      " " + std::to_string(tokenizer.encode(read_text(f), false).size());
        }
        throw Error(names, {},
                    "calibration text too short: " + std::to_string(ids.size()) + " tokens (" +
                        counts + (o.files.size() > 1 ? ", joined by blank lines" : "") +
                        "), one window of --seqlen " + std::to_string(o.seqlen) + " needs " +
                        std::to_string(body) + " (give more text, or a smaller --seqlen)");
    }

    CalibrationSet set;
    set.nsamples = o.nsamples;
    set.seqlen = o.seqlen;
    set.text_tokens = ids.size();
    set.tokens.reserve(o.nsamples * o.seqlen);
    // mt19937_64 is specified bit for bit, and the modulo keeps the draw portable (its bias,
    // below positions / 2^64, does not matter here).
    std::mt19937_64 rng(o.seed);
    const uint64_t positions = ids.size() - body + 1;
    for (uint64_t s = 0; s < o.nsamples; ++s) {
        const uint64_t start = rng() % positions;
        if (with_bos) set.tokens.push_back(bos);
        set.tokens.insert(set.tokens.end(), ids.begin() + static_cast<std::ptrdiff_t>(start),
                          ids.begin() + static_cast<std::ptrdiff_t>(start + body));
    }
    set.tokens_hash = xxh3_64_tag(
        {reinterpret_cast<const uint8_t*>(set.tokens.data()), set.tokens.size() * sizeof(int32_t)});
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : o.files) files.push_back(std::filesystem::path(f).filename().string());
    set.recipe = {{"files", files},
                  {"nsamples", o.nsamples},
                  {"seqlen", o.seqlen},
                  {"seed", o.seed},
                  {"bos", with_bos}};
    return set;
}

nlohmann::json CalibrationSet::to_json() const {
    nlohmann::json j = recipe;
    j["text_tokens"] = text_tokens;
    j["tokens_hash"] = tokens_hash;
    return j;
}

}  // namespace qforge
