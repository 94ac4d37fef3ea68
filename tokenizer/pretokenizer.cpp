// The regex pre-tokenizer: tokenizer.json's pre_tokenizer -> PretokenizerSpec (and the .qf
// schema's JSON form), the named patterns real families use, and the split itself.
//
// Pipeline of one text, in the order Hugging Face `tokenizers` applies the steps it supports:
//   1. ByteLevel(add_prefix_space): a space is prepended to a non-empty text that lacks one;
//   2. Digits(individual_digits) when it is the first step: every \p{N} character is a word;
//   3. each split regex in order, with HF's "Isolated" behaviour on every current word;
//   4. ByteLevel: every byte of every word becomes GPT-2's printable character.
// Empty words are dropped, as HF drops them. Other orders of these steps are expressed in this
// form (a later Digits is a regex) or rejected with an error naming the step.
#include "tokenizer/pretokenizer.hpp"

#include <array>
#include <utility>

#include "core/error.hpp"
#include "tokenizer/regex.hpp"

namespace qforge {

namespace {

// Patterns as they appear in real tokenizer.json files (byte for byte: the name is found by
// comparing strings). Names are llama.cpp's `tokenizer.ggml.pre` names where one exists; the
// originals are the "original regex from tokenizer.json" that llama.cpp quotes for each.
struct NamedRegex {
    std::string_view name;
    std::string_view pattern;
};
constexpr std::array kNamedRegexes{
    // GPT-2: also the pattern of ByteLevel(use_regex = true).
    NamedRegex{"gpt-2",
               R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re"},
    // Llama 3 (tiktoken cl100k style: digits in groups of up to three).
    NamedRegex{
        "llama-bpe",
        R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    // Qwen2 / Qwen2.5 / Qwen3: as Llama 3 but one digit per word.
    NamedRegex{
        "qwen2",
        R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    // Qwen3.5: combining marks stay with their letters.
    NamedRegex{
        "qwen35",
        R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    // GPT-4o (o200k): case-aware words with optional contraction suffixes.
    NamedRegex{
        "gpt-4o",
        R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    // Mistral Tekken: as GPT-4o without contractions, one digit per word.
    NamedRegex{
        "tekken",
        R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"},
    // HF's Digits step as a regex split (qforge's names; llama.cpp has none): a run of numeric
    // characters (individual_digits = false) or each one alone. Rust's char::is_numeric, which
    // Digits uses, is the general category N, as \p{N} is.
    NamedRegex{"digits", R"re(\p{N}+)re"},
    NamedRegex{"digits-individual", R"re(\p{N})re"},
};

// Other spellings accepted by pretokenizer_regex_by_name.
constexpr std::array<std::pair<std::string_view, std::string_view>, 3> kRegexAliases{{
    {"gpt2", "gpt-2"},
    {"llama3", "llama-bpe"},
    {"llama-v3", "llama-bpe"},
}};

// llama.cpp's tokenizer.ggml.pre names whose pre-tokenizer is one of ours, as
// src/llama-vocab.cpp groups them by the regexes it runs; all are byte-level without a prefix
// space. The patterns are the tokenizer.json originals llama.cpp quotes for each group (its own
// strings are rewrites for its regex engine: the GPT-2 group drops the final `|\s+`, which
// matches nothing the isolated split does not already make a word; the Llama 3 group spells
// (?i:'s|...) as (?:'[sS]|...)). `ignore_merges` and `add_bos` are llama.cpp's settings for the
// name; a file's tokenizer.ggml.add_bos_token overrides add_bos.
struct GgufPre {
    std::string_view gguf_name;
    bool individual_digits;
    std::string_view regex;
    bool ignore_merges;
    bool add_bos;
};
// clang-format off
constexpr std::array kGgufPres{
    GgufPre{"gpt-2",      false, "gpt-2",     false, false},
    GgufPre{"phi-2",      false, "gpt-2",     false, false},
    GgufPre{"mpt",        false, "gpt-2",     false, false},
    GgufPre{"olmo",       false, "gpt-2",     false, false},
    GgufPre{"jais",       false, "gpt-2",     false, false},
    GgufPre{"exaone4",    false, "gpt-2",     false, false},
    GgufPre{"llama-bpe",  false, "llama-bpe", true,  true},
    GgufPre{"llama3",     false, "llama-bpe", true,  true},
    GgufPre{"llama-v3",   false, "llama-bpe", true,  true},
    GgufPre{"falcon3",    false, "llama-bpe", true,  true},
    GgufPre{"pixtral",    false, "llama-bpe", true,  true},
    GgufPre{"dbrx",       false, "llama-bpe", false, false},
    GgufPre{"smaug-bpe",  false, "llama-bpe", false, false},
    GgufPre{"qwen2",      false, "qwen2",     false, false},
    GgufPre{"deepseek-r1-qwen", false, "qwen2", false, false},
    GgufPre{"megrez",     false, "qwen2",     false, false},
    GgufPre{"stablelm2",  false, "qwen2",     false, false},
    GgufPre{"qwen35",     false, "qwen35",    false, false},
    GgufPre{"gpt-4o",     false, "gpt-4o",    false, false},
    GgufPre{"llama4",     false, "gpt-4o",    false, false},
    GgufPre{"tekken",     false, "tekken",    true,  true},
    GgufPre{"smollm",     true,  "gpt-2",     false, false},
    GgufPre{"starcoder",  true,  "gpt-2",     false, false},
    GgufPre{"refact",     true,  "gpt-2",     false, false},
    GgufPre{"command-r",  true,  "gpt-2",     false, false},
    GgufPre{"codeshell",  true,  "gpt-2",     false, false},
    GgufPre{"exaone",     true,  "gpt-2",     false, false},
    GgufPre{"minerva-7b", true,  "gpt-2",     false, false},
    GgufPre{"mellum2",    true,  "gpt-2",     false, false},
};
// clang-format on

// The `regex` crate's escape(), which HF applies to a Split's {"String": ...} pattern before
// handing it to Oniguruma; reproduced so that the same pattern string reaches the same engine.
std::string escape_literal(std::string_view s) {
    std::string out;
    for (char c : s) {
        if (std::string_view("\\.+*?()|[]{}^$#&-~").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out;
}

// A split entry: the name of a known pattern, else the pattern itself. A pattern that happens to
// spell a name is wrapped in a non-capturing group, which matches the same text.
std::string split_entry(const std::string& pattern) {
    if (auto name = pretokenizer_regex_name(pattern)) return *name;
    if (pretokenizer_regex_by_name(pattern)) return "(?:" + pattern + ")";
    return pattern;
}

std::string resolve_entry(const std::string& entry) {
    if (auto pattern = pretokenizer_regex_by_name(entry)) return *pattern;
    return entry;
}

const nlohmann::json& require(const nlohmann::json& step, const char* key, const std::string& type,
                              const std::string& file) {
    auto it = step.find(key);
    if (it == step.end()) {
        throw Error(file, "", "pre_tokenizer " + type + ": missing field '" + key + "'");
    }
    return *it;
}

bool require_bool(const nlohmann::json& step, const char* key, const std::string& type,
                  const std::string& file) {
    const auto& v = require(step, key, type, file);
    if (!v.is_boolean()) {
        throw Error(file, "", "pre_tokenizer " + type + ": field '" + key + "' must be a boolean");
    }
    return v.get<bool>();
}

// The steps of a (possibly nested) Sequence, in order.
void flatten(const nlohmann::json& node, const std::string& file,
             std::vector<const nlohmann::json*>& steps) {
    if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
        throw Error(file, "",
                    "pre_tokenizer: expected an object with a string 'type', found " +
                        node.dump().substr(0, 80));
    }
    if (node["type"] == "Sequence") {
        const auto& list = require(node, "pretokenizers", "Sequence", file);
        if (!list.is_array()) {
            throw Error(file, "", "pre_tokenizer Sequence: 'pretokenizers' must be an array");
        }
        for (const auto& child : list) flatten(child, file, steps);
        return;
    }
    steps.push_back(&node);
}

void add_split(PretokenizerSpec& spec, const nlohmann::json& step, const std::string& file) {
    const auto& pattern = require(step, "pattern", "Split", file);
    std::string regex;
    if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") &&
        pattern["Regex"].is_string()) {
        regex = pattern["Regex"].get<std::string>();
    } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") &&
               pattern["String"].is_string()) {
        regex = escape_literal(pattern["String"].get<std::string>());
    } else {
        throw Error(file, "",
                    "pre_tokenizer Split: 'pattern' must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const auto& behavior = require(step, "behavior", "Split", file);
    if (behavior != "Isolated") {
        throw Error(file, "",
                    "pre_tokenizer Split: behavior " + behavior.dump() +
                        " is not supported (only \"Isolated\")");
    }
    if (require_bool(step, "invert", "Split", file)) {
        throw Error(file, "", "pre_tokenizer Split: invert = true is not supported");
    }
    try {
        Regex compiled(regex);  // reject a bad pattern here, where the file is known
    } catch (const Error& e) {
        throw Error(file, "", "pre_tokenizer Split: " + e.detail());
    }
    spec.split_regexes.push_back(split_entry(regex));
}

}  // namespace

std::optional<std::string> pretokenizer_regex_by_name(std::string_view name) {
    for (const auto& [alias, canonical] : kRegexAliases) {
        if (alias == name) name = canonical;
    }
    for (const auto& r : kNamedRegexes) {
        if (r.name == name) return std::string(r.pattern);
    }
    return std::nullopt;
}

std::optional<std::string> pretokenizer_regex_name(std::string_view pattern) {
    for (const auto& r : kNamedRegexes) {
        if (r.pattern == pattern) return std::string(r.name);
    }
    return std::nullopt;
}

std::vector<std::string> pretokenizer_regex_names() {
    std::vector<std::string> names;
    for (const auto& r : kNamedRegexes) names.emplace_back(r.name);
    return names;
}

std::optional<GgufPreDefaults> gguf_pre_defaults(std::string_view gguf_name) {
    for (const auto& g : kGgufPres)
        if (g.gguf_name == gguf_name) return GgufPreDefaults{g.ignore_merges, g.add_bos};
    return std::nullopt;
}

std::vector<std::string> gguf_pre_names() {
    std::vector<std::string> names;
    for (const auto& g : kGgufPres) names.emplace_back(g.gguf_name);
    return names;
}

std::optional<PretokenizerSpec> pretokenizer_spec_for_gguf_pre(std::string_view gguf_name) {
    for (const auto& g : kGgufPres) {
        if (g.gguf_name != gguf_name) continue;
        PretokenizerSpec spec;
        spec.individual_digits = g.individual_digits;
        spec.split_regexes.emplace_back(g.regex);
        spec.byte_level = true;
        return spec;
    }
    return std::nullopt;
}

PretokenizerSpec pretokenizer_spec_from_hf(const nlohmann::json& pre_tokenizer,
                                           const std::string& file) {
    PretokenizerSpec spec;
    if (pre_tokenizer.is_null()) return spec;
    std::vector<const nlohmann::json*> steps;
    flatten(pre_tokenizer, file, steps);
    for (size_t i = 0; i < steps.size(); ++i) {
        const auto& step = *steps[i];
        const std::string type = step["type"].get<std::string>();
        if (spec.byte_level) {
            // ByteLevel rewrites the words into its alphabet; a later step would split that.
            throw Error(file, "",
                        "pre_tokenizer: a " + type + " step after ByteLevel is not supported");
        }
        if (type == "Split") {
            add_split(spec, step, file);
        } else if (type == "Digits") {
            const bool individual = require_bool(step, "individual_digits", type, file);
            if (individual && i == 0) {
                spec.individual_digits = true;
            } else {
                spec.split_regexes.emplace_back(individual ? "digits-individual" : "digits");
            }
        } else if (type == "ByteLevel") {
            const bool prefix = require_bool(step, "add_prefix_space", type, file);
            require_bool(step, "trim_offsets", type, file);  // offsets only; required as HF does
            const bool use_regex = step.contains("use_regex")
                                       ? require_bool(step, "use_regex", type, file)
                                       : true;  // HF's default
            if (prefix && i != 0) {
                // HF adds the space to every word the earlier steps made; only supported when
                // there are none, which is how every known family uses it.
                throw Error(file, "",
                            "pre_tokenizer: ByteLevel with add_prefix_space = true "
                            "after another step is not supported");
            }
            spec.byte_level = true;
            spec.add_prefix_space = prefix;
            if (use_regex) spec.split_regexes.emplace_back("gpt-2");
        } else if (type == "Metaspace") {
            throw Error(file, "",
                        "pre_tokenizer type 'Metaspace' is handled by the SentencePiece "
                        "path of the Tokenizer, not by the regex Pretokenizer");
        } else {
            throw Error(file, "",
                        "pre_tokenizer type '" + type +
                            "' is not supported (supported: Split, Digits, ByteLevel, "
                            "Sequence; Metaspace through the SentencePiece path)");
        }
    }
    return spec;
}

nlohmann::json pretokenizer_spec_to_json(const PretokenizerSpec& spec) {
    return {{"split_regexes", spec.split_regexes},
            {"individual_digits", spec.individual_digits},
            {"byte_level", spec.byte_level},
            {"add_prefix_space", spec.add_prefix_space}};
}

PretokenizerSpec pretokenizer_spec_from_json(const nlohmann::json& j, const std::string& source) {
    auto fail = [&](const std::string& what) {
        return Error(source, "", "pre_tokenizer: " + what);
    };
    if (!j.is_object()) throw fail("expected an object");
    for (const auto& [key, value] : j.items()) {
        if (key != "split_regexes" && key != "individual_digits" && key != "byte_level" &&
            key != "add_prefix_space") {
            throw fail("unknown key '" + key + "'");
        }
    }
    PretokenizerSpec spec;
    auto flag = [&](const char* key) {
        auto it = j.find(key);
        if (it == j.end() || !it->is_boolean())
            throw fail(std::string("'") + key + "' must be a boolean");
        return it->get<bool>();
    };
    spec.individual_digits = flag("individual_digits");
    spec.byte_level = flag("byte_level");
    spec.add_prefix_space = flag("add_prefix_space");
    auto it = j.find("split_regexes");
    if (it == j.end() || !it->is_array()) throw fail("'split_regexes' must be an array");
    for (const auto& entry : *it) {
        if (!entry.is_string() || entry.get<std::string>().empty()) {
            throw fail("'split_regexes' entries must be non-empty strings");
        }
        try {
            Regex compiled(resolve_entry(entry.get<std::string>()));
        } catch (const Error& e) {
            throw fail(e.detail());
        }
        spec.split_regexes.push_back(entry.get<std::string>());
    }
    if (spec.add_prefix_space && !spec.byte_level) throw fail("add_prefix_space needs byte_level");
    return spec;
}

struct Pretokenizer::Impl {
    PretokenizerSpec spec;
    std::optional<UnicodeProperty> numeric;  // \p{N}, when individual_digits
    std::vector<Regex> regexes;
};

Pretokenizer::Pretokenizer(const PretokenizerSpec& spec) : impl_(std::make_unique<Impl>()) {
    impl_->spec = spec;
    if (spec.individual_digits) impl_->numeric.emplace("N");
    for (const auto& entry : spec.split_regexes) impl_->regexes.emplace_back(resolve_entry(entry));
}

Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;
Pretokenizer::~Pretokenizer() = default;

namespace {

struct Piece {
    size_t begin, end;
};

// HF's Split with "Isolated": each match is a word, and so is the text between matches.
void split_isolated(const Regex& re, std::string_view text, const std::vector<Piece>& pieces,
                    std::vector<Piece>& out) {
    out.clear();
    for (const Piece& p : pieces) {
        size_t prev = 0;
        re.for_each_match(text.substr(p.begin, p.end - p.begin), [&](size_t b, size_t e) {
            if (b > prev) out.push_back({p.begin + prev, p.begin + b});
            if (e > b) out.push_back({p.begin + b, p.begin + e});
            prev = e;
        });
        if (p.begin + prev < p.end) out.push_back({p.begin + prev, p.end});
    }
}

// Digits(individual_digits = true): every \p{N} character is a word, and so is the text between
// them. The same words as split_isolated with the regex \p{N} (the fixtures check both), by a
// plain scan: a regex search per digit costs more than the rest of the pre-tokenizer.
void split_digits(const UnicodeProperty& numeric, std::string_view text,
                  const std::vector<Piece>& pieces, std::vector<Piece>& out) {
    out.clear();
    for (const Piece& p : pieces) {
        size_t start = p.begin;  // of the pending non-digit run
        size_t i = p.begin;
        while (i < p.end) {
            const auto lead = static_cast<unsigned char>(text[i]);
            size_t len = 1;
            bool digit = false;
            if (lead < 0x80) {
                digit = lead >= '0' && lead <= '9';  // the only \p{N} characters in ASCII
            } else {
                len = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
                uint32_t cp = lead & (0x7Fu >> len);
                for (size_t k = 1; k < len; ++k)
                    cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3Fu);
                digit = numeric.contains(cp);
            }
            if (digit) {
                if (i > start) out.push_back({start, i});
                out.push_back({i, i + len});
                start = i + len;
            }
            i += len;
        }
        if (p.end > start) out.push_back({start, p.end});
    }
}

}  // namespace

void Pretokenizer::split(std::string_view text, std::vector<std::string>& words) const {
    if (text.empty()) return;
    const PretokenizerSpec& spec = impl_->spec;
    std::string prefixed;
    if (spec.add_prefix_space && text.front() != ' ') {
        prefixed.reserve(text.size() + 1);
        prefixed += ' ';
        prefixed += text;
        text = prefixed;
    }
    std::vector<Piece> pieces{{0, text.size()}};
    std::vector<Piece> next;
    if (impl_->numeric) {
        split_digits(*impl_->numeric, text, pieces, next);
        pieces.swap(next);
    }
    for (const Regex& re : impl_->regexes) {
        split_isolated(re, text, pieces, next);
        pieces.swap(next);
    }
    words.reserve(words.size() + pieces.size());
    for (const Piece& p : pieces) {
        const std::string_view word = text.substr(p.begin, p.end - p.begin);
        words.push_back(spec.byte_level ? byte_level_encode(word) : std::string(word));
    }
}

}  // namespace qforge
