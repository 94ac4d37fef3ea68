// Pre-tokenization as Hugging Face tokenizers does it for the byte-level BPE families: regex
// splits (GPT-2, Llama 3, Qwen2 patterns, ...), Digits, and the ByteLevel byte -> printable
// character mapping.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

struct PretokenizerSpec {
    // Regex splits applied in order, each with HF's "Isolated" behaviour (matches become words,
    // the text between them becomes words too). Stored by name when the pattern is a known one.
    std::vector<std::string> split_regexes;
    bool individual_digits = false;  // Digits(individual_digits = true)
    bool byte_level = false;         // map each byte to GPT-2's printable alphabet
    bool add_prefix_space = false;   // ByteLevel(add_prefix_space = true)
    bool operator==(const PretokenizerSpec&) const = default;
};

// From tokenizer.json's "pre_tokenizer" object (null allowed: no splitting). Unsupported
// pre-tokenizer types are an Error naming `file` and the type.
PretokenizerSpec pretokenizer_spec_from_hf(const nlohmann::json& pre_tokenizer,
                                           const std::string& file);
nlohmann::json pretokenizer_spec_to_json(const PretokenizerSpec& spec);
PretokenizerSpec pretokenizer_spec_from_json(const nlohmann::json& j, const std::string& source);

class Pretokenizer {
  public:
    explicit Pretokenizer(const PretokenizerSpec& spec);  // compiles the regexes
    Pretokenizer(Pretokenizer&&) noexcept;
    Pretokenizer& operator=(Pretokenizer&&) noexcept;
    ~Pretokenizer();
    // Appends the words of `text` (valid UTF-8) to `words`, byte-level mapped when the spec says
    // so.
    void split(std::string_view text, std::vector<std::string>& words) const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// GPT-2's byte <-> unicode mapping: every byte to one printable code point (as UTF-8).
std::string byte_level_encode(std::string_view bytes);
// Inverse; characters outside the alphabet are an Error.
std::string byte_level_decode(std::string_view mapped);

// Known regex patterns by name ("gpt2", "llama3", "qwen2", ...), for the schema and GGUF's
// tokenizer.ggml.pre names.
std::optional<std::string> pretokenizer_regex_by_name(std::string_view name);
std::optional<std::string> pretokenizer_regex_name(std::string_view pattern);
// Every canonical pattern name, in table order (for tests and listings).
std::vector<std::string> pretokenizer_regex_names();
// The pre-tokenizer llama.cpp means by a GGUF `tokenizer.ggml.pre` name ("gpt-2", "llama-bpe",
// "qwen2", "smollm", ...); nullopt for names that are not one of the byte-level regex splits.
std::optional<PretokenizerSpec> pretokenizer_spec_for_gguf_pre(std::string_view gguf_name);
// llama.cpp's other settings for a GGUF pre name: ignore_merges (a word that is a token is not
// merged: the Llama 3 group, Tekken) and whether BOS is added by default (a file's
// tokenizer.ggml.add_bos_token overrides it). nullopt for the same names as above.
struct GgufPreDefaults {
    bool ignore_merges = false;
    bool add_bos = false;
};
std::optional<GgufPreDefaults> gguf_pre_defaults(std::string_view gguf_name);
// Every GGUF pre name mapped above, in table order (for messages and tests).
std::vector<std::string> gguf_pre_names();

}  // namespace qforge
