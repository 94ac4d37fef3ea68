// tokenizer.json (Hugging Face `tokenizers`) mapped into the normalized schema. Only BPE models
// are supported, in the two families real checkpoints use: byte-level (a ByteLevel pre-tokenizer)
// and SentencePiece-style (the "▁" meta space from a Prepend/Replace normalizer or a Metaspace
// pre-tokenizer). Everything else is refused by name rather than approximated.
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/source_hf.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kMetaSpace = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's space

json read_json_file(const std::string& path) {
    MappedFile f(path);
    const auto* p = reinterpret_cast<const char*>(f.data());
    try {
        return json::parse(p, p + f.size());
    } catch (const json::exception& e) {
        throw Error(path, {}, std::string("not valid JSON: ") + e.what());
    }
}

// tokenizer_config.json writes special tokens as "<s>" or {"content": "<s>", ...}.
std::optional<std::string> token_content(const json& t) {
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.value("content", json()).is_string()) return t["content"].get<std::string>();
    return std::nullopt;
}

// HF writes string patterns as {"String": " "}; regex patterns are not used by these families.
std::string string_pattern(const json& pattern, const std::string& file, const char* what) {
    if (pattern.is_object() && pattern.value("String", json()).is_string())
        return pattern["String"].get<std::string>();
    throw Error(file, {}, std::string(what) + " pattern " + pattern.dump() +
                              " is not supported (only {\"String\": ...} patterns)");
}

std::vector<json> flatten_sequence(const json& j, const char* list_key) {
    if (j.is_null()) return {};
    if (j.value("type", "") == "Sequence") {
        std::vector<json> out;
        for (const json& item : j.value(list_key, json::array())) {
            auto sub = flatten_sequence(item, list_key);
            out.insert(out.end(), sub.begin(), sub.end());
        }
        return out;
    }
    return {j};
}

json map_normalizer(const json& normalizer, const std::string& file) {
    json out = json::array();
    for (const json& n : flatten_sequence(normalizer, "normalizers")) {
        const std::string type = n.value("type", "");
        if (type == "NFC")
            out.push_back({{"type", "nfc"}});
        else if (type == "Prepend" && n.value("prepend", json()).is_string())
            out.push_back({{"type", "prepend"}, {"prepend", n["prepend"]}});
        else if (type == "Replace" && n.value("content", json()).is_string())
            out.push_back({{"type", "replace"},
                           {"pattern", string_pattern(n.value("pattern", json()), file, "Replace normalizer")},
                           {"content", n["content"]}});
        else
            throw Error(file, {}, "unsupported normalizer " + n.dump() + " (supported: NFC, Prepend, Replace)");
    }
    return out;
}

// Metaspace settings from either the current (prepend_scheme) or the older (add_prefix_space)
// spelling of the Metaspace pre-tokenizer/decoder.
std::string metaspace_prepend_scheme(const json& m) {
    if (m.value("prepend_scheme", json()).is_string()) return m["prepend_scheme"].get<std::string>();
    return m.value("add_prefix_space", true) ? "always" : "never";
}

json map_decoder(const json& decoder, const std::string& file) {
    json out = {{"byte_level", false}, {"byte_fallback", false}, {"metaspace", ""}, {"strip_leading_spaces", 0}};
    for (const json& d : flatten_sequence(decoder, "decoders")) {
        const std::string type = d.value("type", "");
        if (type == "ByteLevel") {
            out["byte_level"] = true;
        } else if (type == "ByteFallback") {
            out["byte_fallback"] = true;
        } else if (type == "Fuse") {
            // Joins the token strings; decode always produces one string.
        } else if (type == "Replace" && d.value("content", json()) == " " &&
                   string_pattern(d.value("pattern", json()), file, "Replace decoder") == kMetaSpace) {
            out["metaspace"] = kMetaSpace;
        } else if (type == "Strip" && d.value("content", json()) == " " && d.value("stop", 0) == 0) {
            out["strip_leading_spaces"] = d.value("start", 0);
        } else if (type == "Metaspace") {
            out["metaspace"] = d.value("replacement", kMetaSpace);
            if (metaspace_prepend_scheme(d) != "never") out["strip_leading_spaces"] = 1;
        } else {
            throw Error(file, {}, "unsupported decoder " + d.dump() +
                                      " (supported: ByteLevel, ByteFallback, Fuse, Replace(▁, ' '), Strip, Metaspace)");
        }
    }
    return out;
}

// The vocabulary and added tokens as pieces in id order; ids must be dense and each piece unique.
json collect_pieces(const json& vocab, const json& added, const std::string& file) {
    const size_t limit = vocab.size() + added.size();
    std::vector<std::optional<std::string>> pieces;
    std::map<std::string, int64_t> id_of;
    auto put = [&](const std::string& piece, const json& id_json, bool from_added) {
        if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<uint64_t>() >= limit)
            throw Error(file, {}, "token " + json(piece).dump() + " has id " + id_json.dump() +
                                      ", out of range 0.." + std::to_string(limit - 1));
        if (!is_valid_utf8(piece)) throw Error(file, {}, "token id " + id_json.dump() + " is not valid UTF-8");
        const auto id = id_json.get<size_t>();
        if (pieces.size() <= id) pieces.resize(id + 1);
        if (pieces[id] && (*pieces[id] != piece || !from_added))
            throw Error(file, {}, "id " + std::to_string(id) + " is used by both " + json(*pieces[id]).dump() +
                                      " and " + json(piece).dump());
        auto [it, fresh] = id_of.emplace(piece, static_cast<int64_t>(id));
        if (!fresh && it->second != static_cast<int64_t>(id))
            throw Error(file, {}, "duplicate piece " + json(piece).dump() + " (ids " +
                                      std::to_string(it->second) + " and " + std::to_string(id) + ")");
        pieces[id] = piece;
    };
    for (const auto& [piece, id] : vocab.items()) put(piece, id, false);
    for (const json& t : added) {
        if (!t.is_object() || !t.value("content", json()).is_string())
            throw Error(file, {}, "added token " + t.dump() + " has no \"content\"");
        put(t["content"].get<std::string>(), t.value("id", json()), true);
    }
    json out = json::array();
    for (size_t id = 0; id < pieces.size(); ++id) {
        if (!pieces[id]) throw Error(file, {}, "no token has id " + std::to_string(id) + " (ids must be dense)");
        out.push_back(*pieces[id]);
    }
    return out;
}

json map_merges(const json& merges, const json& vocab, const std::string& file) {
    if (!merges.is_array()) throw Error(file, {}, "model.merges must be an array");
    json out = json::array();
    for (const json& m : merges) {
        std::string a, b;
        if (m.is_string()) {  // "a b" (tokenizers < 0.20)
            const std::string s = m.get<std::string>();
            const size_t space = s.find(' ');
            if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
                throw Error(file, {}, "merge " + m.dump() + " is not two tokens separated by one space");
            a = s.substr(0, space), b = s.substr(space + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            a = m[0].get<std::string>(), b = m[1].get<std::string>();  // ["a", "b"] (tokenizers >= 0.20)
        } else {
            throw Error(file, {}, "merge " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        for (const std::string& name : {a, b, a + b}) {
            if (!vocab.contains(name))
                throw Error(file, {}, "merge " + m.dump() + " names " + json(name).dump() + ", absent from the vocabulary");
        }
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
            throw Error(file, {}, "merge " + m.dump() + " has a token with a space, which the schema's \"a b\" form cannot hold");
        out.push_back(a + " " + b);
    }
    return out;
}

bool contains_type(const json& j, const char* type, const char* list_key) {
    for (const json& item : flatten_sequence(j, list_key))
        if (item.value("type", "") == type) return true;
    return false;
}

// The special tokens a TemplateProcessing post-processor puts around a single sequence.
struct Template {
    std::vector<int64_t> before, after;
};
std::optional<Template> template_of(const json& post, const std::string& file) {
    for (const json& p : flatten_sequence(post, "processors")) {
        if (p.value("type", "") != "TemplateProcessing") continue;
        Template t;
        bool seen_sequence = false;
        for (const json& piece : p.value("single", json::array())) {
            if (piece.contains("Sequence")) {
                seen_sequence = true;
                continue;
            }
            const std::string name = piece.value("SpecialToken", json::object()).value("id", "");
            const json& ids = p.value("special_tokens", json::object()).value(name, json::object()).value("ids", json());
            if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_integer())
                throw Error(file, {}, "post_processor special token \"" + name + "\" must have exactly one id");
            (seen_sequence ? t.after : t.before).push_back(ids[0].get<int64_t>());
        }
        if (t.before.size() > 1 || t.after.size() > 1)
            throw Error(file, {}, "post_processor adds more than one token before or after the text (unsupported)");
        return t;
    }
    return std::nullopt;
}

json optional_json_beside(const std::string& path, const char* name) {
    const fs::path p = fs::path(path).parent_path() / name;
    if (!fs::exists(p)) return nullptr;
    json j = read_json_file(p.string());
    if (!j.is_object()) throw Error(p.string(), {}, "not a JSON object");
    return j;
}

// tokenizer.json -> schema; JSON type errors are turned into an Error by load_hf_tokenizer.
json map_hf_tokenizer(const std::string& path) {
    const json tok = read_json_file(path);
    if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object())
        throw Error(path, {}, "tokenizer.json has no \"model\" object");
    const json& model = tok["model"];
    if (model.value("type", json()) != "BPE")
        throw Error(path, {}, "unsupported tokenizer model type " + model.value("type", json()).dump() +
                                  " (supported: BPE)");
    if (!model.value("vocab", json()).is_object()) throw Error(path, {}, "model.vocab must be an object");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (!model.value(key, json()).is_null() && model[key] != "")
            throw Error(path, {}, std::string("model.") + key + " is not supported");
    const json& vocab = model["vocab"];
    const json added = tok.value("added_tokens", json::array());
    if (!added.is_array()) throw Error(path, {}, "\"added_tokens\" must be an array");

    json s;
    s["schema_version"] = kTokenizerSchemaVersion;
    s["source"] = "tokenizer.json";
    s["pieces"] = collect_pieces(vocab, added, path);
    s["merges"] = map_merges(model.value("merges", json::array()), vocab, path);
    s["normalizer"] = map_normalizer(tok.value("normalizer", json()), path);
    s["decoder"] = map_decoder(tok.value("decoder", json()), path);

    // The family: byte-level BPE has a ByteLevel pre-tokenizer; SentencePiece-style BPE has the
    // meta space, from a Metaspace pre-tokenizer or a normalizer that writes "▁".
    const json pre = tok.value("pre_tokenizer", json());
    bool sentencepiece = false;
    s["pre_tokenizer"] = nullptr;
    s["metaspace"] = nullptr;
    if (contains_type(pre, "ByteLevel", "pretokenizers")) {
        s["model"] = "bpe_byte_level";
        // Normalized: known split patterns by name, Digits and ByteLevel as flags.
        s["pre_tokenizer"] = pretokenizer_spec_to_json(pretokenizer_spec_from_hf(pre, path));
    } else if (pre.is_object() && pre.value("type", "") == "Metaspace") {
        sentencepiece = true;
        s["metaspace"] = {{"replacement", pre.value("replacement", kMetaSpace)},
                          {"prepend_scheme", metaspace_prepend_scheme(pre)},
                          {"split", pre.value("split", true)}};
    } else if (!pre.is_null()) {
        throw Error(path, {}, "unsupported pre_tokenizer " + pre.dump() +
                                  " (supported: ByteLevel with Split/Digits, Metaspace, none)");
    } else {
        for (const json& n : s["normalizer"])
            if (n.value("content", "") == kMetaSpace || n.value("prepend", "") == kMetaSpace) sentencepiece = true;
    }
    if (sentencepiece) s["model"] = "bpe_sentencepiece";
    if (!s.contains("model"))
        throw Error(path, {}, "BPE tokenizer is neither byte-level (ByteLevel pre-tokenizer) nor "
                              "SentencePiece-style (▁ normalizer or Metaspace); not supported");

    const json pieces = s["pieces"];
    auto id_of = [&](const std::string& content) -> json {
        for (const json& t : added)
            if (t.value("content", "") == content) return t["id"];
        return vocab.contains(content) ? vocab[content] : json();
    };
    const json unk = model.value("unk_token", json());
    s["unk_id"] = unk.is_string() ? id_of(unk.get<std::string>()) : json();
    if (unk.is_string() && s["unk_id"].is_null())
        throw Error(path, {}, "unk_token " + unk.dump() + " is not in the vocabulary");
    s["bpe"] = {{"byte_fallback", model.value("byte_fallback", false)},
                {"ignore_merges", model.value("ignore_merges", false)},
                {"fuse_unk", model.value("fuse_unk", false)}};

    json added_out = json::array();
    json types = json::array();
    for (size_t id = 0; id < pieces.size(); ++id) {
        const std::string& p = pieces[id].get_ref<const std::string&>();
        const bool byte = s["bpe"]["byte_fallback"] && p.size() == 6 && p.rfind("<0x", 0) == 0 && p[5] == '>';
        types.push_back(s["unk_id"] == id ? "unknown" : byte ? "byte" : "normal");
    }
    for (const json& t : added) {
        const bool special = t.value("special", false);
        added_out.push_back({{"id", t["id"]},
                             {"content", t["content"]},
                             {"special", special},
                             {"lstrip", t.value("lstrip", false)},
                             {"rstrip", t.value("rstrip", false)},
                             {"single_word", t.value("single_word", false)},
                             {"normalized", t.value("normalized", !special)}});
        types[t["id"].get<size_t>()] = special ? "special" : "user_defined";
    }
    s["added_tokens"] = std::move(added_out);
    s["token_types"] = std::move(types);

    // BOS/EOS and whether encode adds them: the post-processor template is what `tokenizers`
    // runs, so it decides; tokenizer_config.json names the tokens and fills in the rest.
    const json config = optional_json_beside(path, "tokenizer_config.json");
    const json gen = optional_json_beside(path, "generation_config.json");
    auto config_id = [&](const char* key) -> json {
        if (config.is_null()) return nullptr;
        const auto content = token_content(config.value(key, json()));
        return content ? id_of(*content) : json();
    };
    s["bos_id"] = config_id("bos_token");
    s["eos_id"] = config_id("eos_token");
    s["add_bos"] = !config.is_null() && config.value("add_bos_token", false) == true;
    s["add_eos"] = !config.is_null() && config.value("add_eos_token", false) == true;
    if (const auto t = template_of(tok.value("post_processor", json()), path)) {
        s["add_bos"] = !t->before.empty();
        s["add_eos"] = !t->after.empty();
        if (!t->before.empty()) s["bos_id"] = t->before[0];
        if (!t->after.empty() && s["eos_id"].is_null()) s["eos_id"] = t->after[0];
    }
    s["chat_template"] = config.is_null() ? "" : config.value("chat_template", json(""));
    if (!s["chat_template"].is_string()) s["chat_template"] = "";  // a list of named templates: not kept

    // Stop ids: EOS, generation_config.json's eos_token_id (Llama 3 Instruct lists several), and
    // the end-of-turn tokens the chat template emits.
    std::vector<int64_t> stops;
    auto add_stop = [&](const json& id) {
        if (id.is_number_integer() && std::find(stops.begin(), stops.end(), id.get<int64_t>()) == stops.end())
            stops.push_back(id.get<int64_t>());
    };
    add_stop(s["eos_id"]);
    if (!gen.is_null()) {
        const json ids = gen.value("eos_token_id", json());
        if (ids.is_array())
            for (const json& id : ids) add_stop(id);
        else
            add_stop(ids);
    }
    const std::string chat = s["chat_template"];
    for (const char* turn_end : kChatTurnEnds)
        if (chat.find(turn_end) != std::string::npos) add_stop(id_of(turn_end));
    s["stop_ids"] = stops;
    return s;
}

}  // namespace

json load_hf_tokenizer(const std::string& path) {
    // Checks above name what they expect; a value of an unexpected JSON type anywhere else still
    // becomes one Error naming the file rather than a bare library exception.
    try {
        return map_hf_tokenizer(path);
    } catch (const json::exception& e) {
        throw Error(path, {}, std::string("malformed tokenizer.json: ") + e.what());
    }
}

}  // namespace qforge
