// The text normalizers the supported families use, applied in order: NFC (Qwen2), Prepend and
// Replace (Llama 2 / Mistral / TinyLlama write "▁" for spaces and before the text).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qforge {

class Normalizer {
  public:
    Normalizer() = default;
    // From the schema's "normalizer" array; unknown steps are an Error naming `source`.
    Normalizer(const nlohmann::json& steps, const std::string& source);
    bool empty() const { return steps_.empty(); }
    std::string apply(std::string text) const;

  private:
    struct Step {
        enum class Kind { nfc, prepend, replace } kind;
        std::string a, b;  // prepend: a; replace: pattern a -> content b
    };
    std::vector<Step> steps_;
};

// Unicode NFC (ICU's Normalizer2, the Unicode data files' decompositions and compositions).
std::string nfc(const std::string& text);

}  // namespace qforge
