#include "tokenizer/normalizer.hpp"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "core/error.hpp"
#include "formats/json_io.hpp"

namespace qforge {

Normalizer::Normalizer(const nlohmann::json& steps, const std::string& source) {
    const JsonView list(steps, source, "tokenizer.normalizer");
    if (!list.is_array())
        throw Error(source, {}, "tokenizer schema: \"normalizer\" must be an array");
    list.for_each_element([&](const JsonView& s) {
        const std::string type = s["type"].string_or("");
        if (type == "nfc")
            steps_.push_back({Step::Kind::nfc, {}, {}});
        else if (type == "prepend")
            steps_.push_back({Step::Kind::prepend, s["prepend"].string_or(""), {}});
        else if (type == "replace" && !s["pattern"].string_or("").empty())
            steps_.push_back(
                {Step::Kind::replace, s["pattern"].string(), s["content"].string_or("")});
        else
            s.fail("tokenizer schema: unknown normalizer step " + s.value().dump());
    });
}

std::string Normalizer::apply(std::string text) const {
    for (const Step& s : steps_) {
        switch (s.kind) {
            case Step::Kind::nfc:
                text = nfc(text);
                break;
            case Step::Kind::prepend:
                // `tokenizers` prepends only to non-empty text.
                if (!text.empty()) text.insert(0, s.a);
                break;
            case Step::Kind::replace: {
                if (text.find(s.a) == std::string::npos) break;
                std::string out;
                out.reserve(text.size() + text.size() / 2);
                size_t at = 0;
                for (size_t hit; (hit = text.find(s.a, at)) != std::string::npos;
                     at = hit + s.a.size())
                    out.append(text, at, hit - at).append(s.b);
                out.append(text, at, std::string::npos);
                text = std::move(out);
                break;
            }
        }
    }
    return text;
}

std::string nfc(const std::string& text) {
    bool ascii = true;  // ASCII is always NFC; skip ICU for it
    for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return text;
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status))
        throw Error(std::string("ICU NFC normalizer unavailable: ") + u_errorName(status));
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    n->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink,
                     nullptr, status);
    if (U_FAILURE(status))
        throw Error(std::string("NFC normalization failed: ") + u_errorName(status));
    return out;
}

}  // namespace qforge
