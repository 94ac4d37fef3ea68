// GGUF tokenizer metadata -> the normalized schema. The values llama.cpp assumes when a key is
// absent are llama.cpp's (src/llama-vocab.cpp, llama_vocab::impl::load); the shape of the schema
// is what `tokenizers` would build for the same model, which is what the tokenizer module runs.
#include "tokenizer/source_gguf.hpp"

#include <algorithm>
#include <unordered_map>

#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "tokenizer/jinja_subset.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/source_hf.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge {

using nlohmann::json;

namespace {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class GgufTokenType : int64_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6,
};

size_t utf8_chars(const std::string& s) {
    size_t n = 0;
    for (size_t at = 0; at < s.size(); at += std::max<size_t>(1, utf8_sequence_length(s, at))) ++n;
    return n;
}

struct Vocab {
    std::vector<std::string> pieces;
    std::vector<GgufTokenType> types;
    std::unordered_map<std::string, int64_t> id_of;
    std::vector<bool> respelled;  // a Gemma whitespace token written with meta spaces
};

// Gemma's GGUF files (convert_hf_to_gguf.py) write the tokens made of two or more spaces with
// real spaces ("  "), where the SentencePiece model spells them "▁▁": the normalizer turns every
// space into "▁" before the model sees the text, so only the "▁" spelling can ever match or be
// merged into. transformers' GGUF loader (integrations/gguf, gemma_tokenizer) spells them back,
// every character of a token that holds a space and nothing but whitespace becoming one "▁";
// llama.cpp reaches the same ids by matching those tokens in the raw text. Only ASCII whitespace
// is looked for: Gemma's vocabulary has no such token with other whitespace in it.
bool is_gemma_space_token(const std::string& p) {
    if (p.find(' ') == std::string::npos) return false;
    return std::all_of(p.begin(), p.end(), [](char c) {
        return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
    });
}

Vocab read_vocab(const GgufFile& f, bool gemma) {
    const std::string& file = f.path();
    const auto* tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (!tokens || tokens->empty())
        throw Error(file, {},
                    "no tokenizer: metadata key 'tokenizer.ggml.tokens' is absent or empty");
    Vocab v;
    v.pieces = *tokens;
    const std::vector<int64_t> raw_types = f.get_int_array("tokenizer.ggml.token_type");
    if (!raw_types.empty() && raw_types.size() != v.pieces.size())
        throw Error(file, {},
                    "tokenizer.ggml.token_type has " + std::to_string(raw_types.size()) +
                        " entries for " + std::to_string(v.pieces.size()) + " tokens");
    v.types.reserve(v.pieces.size());
    v.respelled.assign(v.pieces.size(), false);
    for (size_t id = 0; id < v.pieces.size(); ++id) {
        const int64_t t = raw_types.empty() ? 1 : raw_types[id];
        if (t < 0 || t > static_cast<int64_t>(GgufTokenType::byte))
            throw Error(
                file, {},
                "token " + std::to_string(id) + " has unknown token type " + std::to_string(t));
        v.types.push_back(static_cast<GgufTokenType>(t));
        std::string& p = v.pieces[id];
        // llama.cpp keeps empty tokens under a placeholder name, with a warning.
        if (p.empty()) p = "[EMPTY_" + std::to_string(id) + "]";
        if (gemma && is_gemma_space_token(p)) {
            std::string meta;
            for (size_t k = 0; k < p.size(); ++k) meta += kMetaSpace;
            p = std::move(meta);
            v.respelled[id] = true;
        }
        if (!is_valid_utf8(p))
            throw Error(file, {}, "token " + std::to_string(id) + " is not valid UTF-8");
        if (!v.id_of.emplace(p, static_cast<int64_t>(id)).second)
            throw Error(file, {},
                        "token " + std::to_string(id) + " " + quoted_excerpt(p) +
                            " duplicates token " + std::to_string(v.id_of.at(p)));
    }
    return v;
}

const char* schema_type(GgufTokenType t) {
    switch (t) {
        case GgufTokenType::unknown:
            return "unknown";
        case GgufTokenType::control:
            return "special";
        case GgufTokenType::user_defined:
            return "user_defined";
        case GgufTokenType::unused:
            return "unused";
        case GgufTokenType::byte:
            return "byte";
        case GgufTokenType::undefined:
        case GgufTokenType::normal:
            break;
    }
    return "normal";
}

// A special-token id key: absent -> `fallback`; out of range -> an Error naming the key.
json token_id(const GgufFile& f, const char* key, const Vocab& v, json fallback = nullptr) {
    const auto id = f.get_uint(key);
    if (!id) return fallback;
    if (*id >= v.pieces.size())
        throw Error(f.path(), {},
                    std::string(key) + " = " + std::to_string(*id) + " is not a token id (" +
                        std::to_string(v.pieces.size()) + " tokens)");
    return *id;
}

// Control, unknown and user-defined tokens are matched in the raw text before anything else, as
// `tokenizers` does with a model's added tokens and llama.cpp with its special tokens. Gemma's
// loader in transformers adds the user-defined ones unnormalized and leaves out the respelled
// whitespace tokens (vocabulary entries that merges build, see is_gemma_space_token).
json added_tokens(const Vocab& v, bool gemma) {
    json out = json::array();
    for (size_t id = 0; id < v.pieces.size(); ++id) {
        const GgufTokenType t = v.types[id];
        if (t != GgufTokenType::control && t != GgufTokenType::unknown &&
            t != GgufTokenType::user_defined)
            continue;
        if (v.respelled[id]) continue;
        const bool special = t != GgufTokenType::user_defined;
        out.push_back({{"id", id},
                       {"content", v.pieces[id]},
                       {"special", special},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"single_word", false},
                       {"normalized", !special && !gemma}});
    }
    return out;
}

// tokenizer.ggml.merges: "left right", split at the first space after the first byte (as
// llama.cpp splits them); both sides and their concatenation must be tokens.
json gpt2_merges(const GgufFile& f, const Vocab& v) {
    const auto* merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges)
        throw Error(f.path(), {},
                    "tokenizer.ggml.model is gpt2 but tokenizer.ggml.merges is absent");
    json out = json::array();
    for (size_t i = 0; i < merges->size(); ++i) {
        const std::string& m = (*merges)[i];
        if (!is_valid_utf8(m))
            throw Error(f.path(), {}, "merge " + std::to_string(i) + " is not valid UTF-8");
        const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
        if (space == std::string::npos || m.find(' ', space + 1) != std::string::npos)
            throw Error(f.path(), {},
                        "merge " + std::to_string(i) + " " + quoted_excerpt(m) +
                            " is not two tokens separated by one space");
        const std::string a = m.substr(0, space), b = m.substr(space + 1);
        for (const std::string& piece : {a, b, a + b})
            if (!v.id_of.count(piece))
                throw Error(f.path(), {},
                            "merge " + std::to_string(i) + " " + quoted_excerpt(m) + " names " +
                                quoted_excerpt(piece) + ", which is not a token");
        out.push_back(m);
    }
    return out;
}

// SentencePiece's scores as BPE merges, the way `tokenizers` converts a SentencePiece model
// (transformers' SentencePieceExtractor): every token that splits at a character boundary into
// two tokens is the merge of that pair; merges are ordered by the merged token's score, highest
// first (stable in token order), and the splits of one token by the ids of (left, right).
// Gemma (transformers' gemma_tokenizer, generate_merges): the merged token's position in the
// vocabulary ranks the merges instead, earliest first (its control, byte and whitespace tokens
// carry scores 0 and -1000 that say nothing of merge order), and the splits of one token by
// the left side's length in characters, longest first.
json spm_merges(const GgufFile& f, const Vocab& v, bool gemma) {
    const GgufValue* raw = f.find("tokenizer.ggml.scores");
    std::vector<double> scores(v.pieces.size(), 0.0);
    if (raw) {
        if (!raw->is_array() || raw->element_type != GgufValueType::float32 ||
            raw->floats.size() != v.pieces.size())
            throw Error(f.path(), {},
                        "tokenizer.ggml.scores must be an array of one float32 per token");
        scores = raw->floats;
    }
    if (gemma)
        for (size_t id = 0; id < scores.size(); ++id) scores[id] = -static_cast<double>(id);
    struct Merge {
        int64_t left, right;
        size_t piece;
        size_t left_chars = 0;
    };
    std::vector<Merge> merges;
    for (size_t id = 0; id < v.pieces.size(); ++id) {
        const std::string& p = v.pieces[id];
        const size_t first = merges.size();
        for (size_t at = utf8_sequence_length(p, 0); at > 0 && at < p.size();
             at += utf8_sequence_length(p, at)) {
            const auto l = v.id_of.find(p.substr(0, at)), r = v.id_of.find(p.substr(at));
            if (l == v.id_of.end() || r == v.id_of.end()) continue;
            // The schema writes a merge as "left right": a side holding a space cannot be written.
            if (l->first.find(' ') != std::string::npos || r->first.find(' ') != std::string::npos)
                continue;
            merges.push_back({l->second, r->second, id, utf8_chars(l->first)});
        }
        std::sort(merges.begin() + static_cast<std::ptrdiff_t>(first), merges.end(),
                  [gemma](const Merge& x, const Merge& y) {
                      if (gemma) return x.left_chars > y.left_chars;
                      return std::pair(x.left, x.right) < std::pair(y.left, y.right);
                  });
    }
    std::stable_sort(merges.begin(), merges.end(), [&](const Merge& x, const Merge& y) {
        return scores[x.piece] > scores[y.piece];
    });
    json out = json::array();
    for (const Merge& m : merges)
        out.push_back(v.pieces[static_cast<size_t>(m.left)] + " " +
                      v.pieces[static_cast<size_t>(m.right)]);
    return out;
}

}  // namespace

json tokenizer_schema_from_gguf(const GgufFile& f) {
    const std::string& file = f.path();
    const std::string* model = f.get_string("tokenizer.ggml.model");
    if (!model)
        throw Error(file, {}, "no tokenizer: metadata key 'tokenizer.ggml.model' is absent");
    if (*model != "gpt2" && *model != "llama")
        throw Error(file, {},
                    "tokenizer.ggml.model '" + gguf_excerpt(*model) +
                        "' is not supported (supported: gpt2, byte-level BPE; llama, "
                        "SentencePiece)");
    const bool spm = *model == "llama";
    const std::string* arch = f.get_string("general.architecture");
    const bool gemma = spm && arch && (*arch == "gemma" || *arch == "gemma2" || *arch == "gemma3");
    const Vocab v = read_vocab(f, gemma);

    json s;
    s["schema_version"] = kTokenizerSchemaVersion;
    s["source"] = "gguf";
    s["pieces"] = v.pieces;
    json types = json::array();
    for (GgufTokenType t : v.types) types.push_back(schema_type(t));
    s["token_types"] = std::move(types);
    s["added_tokens"] = added_tokens(v, gemma);
    s["metaspace"] = nullptr;

    bool add_bos = false;
    if (spm) {
        // llama.cpp's SentencePiece defaults: a dummy-prefix space, BOS added.
        const bool prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
        s["model"] = "bpe_sentencepiece";
        s["merges"] = spm_merges(f, v, gemma);
        s["normalizer"] = json::array();
        if (prefix) s["normalizer"].push_back({{"type", "prepend"}, {"prepend", kMetaSpace}});
        s["normalizer"].push_back({{"type", "replace"}, {"pattern", " "}, {"content", kMetaSpace}});
        s["pre_tokenizer"] = nullptr;
        s["bpe"] = {{"byte_fallback", true}, {"ignore_merges", false}, {"fuse_unk", true}};
        s["decoder"] = {{"byte_level", false},
                        {"byte_fallback", true},
                        {"metaspace", kMetaSpace},
                        {"strip_leading_spaces", prefix ? 1 : 0}};
        s["unk_id"] = token_id(f, "tokenizer.ggml.unknown_token_id", v, 0);
        add_bos = true;
    } else {
        const std::string* pre = f.get_string("tokenizer.ggml.pre");
        std::string names;
        for (const auto& n : gguf_pre_names()) names += (names.empty() ? "" : ", ") + n;
        if (!pre)
            throw Error(file, {},
                        "tokenizer.ggml.pre is absent: llama.cpp then guesses a generic "
                        "pre-tokenizer and warns that quality degrades; qforge refuses (known "
                        "names: " +
                            names + ")");
        const auto spec = pretokenizer_spec_for_gguf_pre(*pre);
        const auto defaults = gguf_pre_defaults(*pre);
        if (!spec || !defaults)
            throw Error(file, {},
                        "tokenizer.ggml.pre '" + gguf_excerpt(*pre) +
                            "' is not a pre-tokenizer qforge knows "
                            "(known: " +
                            names + ")");
        s["model"] = "bpe_byte_level";
        s["merges"] = gpt2_merges(f, v);
        s["normalizer"] = json::array();
        s["pre_tokenizer"] = pretokenizer_spec_to_json(*spec);
        s["bpe"] = {{"byte_fallback", false},
                    {"ignore_merges", defaults->ignore_merges},
                    {"fuse_unk", false}};
        s["decoder"] = {{"byte_level", true},
                        {"byte_fallback", false},
                        {"metaspace", ""},
                        {"strip_leading_spaces", 0}};
        // Byte-level vocabularies have no unknown token unless one is typed as such.
        json unk = nullptr;
        for (size_t id = 0; id < v.types.size() && unk.is_null(); ++id)
            if (v.types[id] == GgufTokenType::unknown) unk = id;
        s["unk_id"] = unk;
        add_bos = defaults->add_bos;
    }

    s["bos_id"] = token_id(f, "tokenizer.ggml.bos_token_id", v);
    s["eos_id"] = token_id(f, "tokenizer.ggml.eos_token_id", v);
    s["add_bos"] = f.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos);
    s["add_eos"] = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
    if (s["add_bos"] == true && s["bos_id"].is_null())
        throw Error(file, {}, "the tokenizer adds BOS but tokenizer.ggml.bos_token_id is absent");
    if (s["add_eos"] == true && s["eos_id"].is_null())
        throw Error(file, {}, "the tokenizer adds EOS but tokenizer.ggml.eos_token_id is absent");
    const std::string* chat = f.get_string("tokenizer.chat_template");
    if (chat && !is_valid_utf8(*chat))
        throw Error(file, {}, "tokenizer.chat_template is not valid UTF-8");
    if (chat) {
        try {
            jinja::check_nesting(*chat);
        } catch (const Error& e) {
            throw Error(file, {}, "tokenizer.chat_template: " + e.detail());
        }
    }
    s["chat_template"] = chat ? *chat : "";

    // Generation stops at EOS, at the end-of-turn and end-of-message tokens the file names, and
    // at the end-of-turn markers its chat template writes.
    std::vector<int64_t> stops;
    auto add_stop = [&](const json& id) {
        if (id.is_number_integer() &&
            std::find(stops.begin(), stops.end(), id.get<int64_t>()) == stops.end())
            stops.push_back(id.get<int64_t>());
    };
    add_stop(s["eos_id"]);
    add_stop(token_id(f, "tokenizer.ggml.eot_token_id", v));
    add_stop(token_id(f, "tokenizer.ggml.eom_token_id", v));
    for (const char* turn_end : kChatTurnEnds) {
        const auto it = v.id_of.find(turn_end);
        if (chat && chat->find(turn_end) != std::string::npos && it != v.id_of.end())
            add_stop(it->second);
    }
    s["stop_ids"] = stops;
    validate_tokenizer_schema(s, file);
    return s;
}

}  // namespace qforge
