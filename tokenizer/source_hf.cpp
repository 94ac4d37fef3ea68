// tokenizer.json (Hugging Face `tokenizers`) mapped into the normalized schema. Only BPE models
// are supported, in the two families real checkpoints use: byte-level (a ByteLevel pre-tokenizer)
// and SentencePiece-style (the "▁" meta space from a Prepend/Replace normalizer or a Metaspace
// pre-tokenizer). Everything else is refused by name rather than approximated.
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "tokenizer/jinja_subset.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/source_hf.hpp"

namespace qforge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A value for messages: its JSON text, cut short (a whole vocabulary must not end up in one line).
std::string excerpt(const JsonView& v) {
    if (!v.raw()) return "(absent)";
    std::string text = v.raw()->dump();
    return text.size() <= 100 ? text : text.substr(0, 97) + "...";
}

// tokenizer_config.json writes special tokens as "<s>" or {"content": "<s>", ...}; null is none.
std::optional<std::string> token_content(const JsonView& t) {
    if (!t.is_set()) return std::nullopt;
    if (t.is_string()) return t.string();
    if (t.is_object()) return t["content"].string();
    t.expected("a token string or an object with \"content\"");
}

// HF writes string patterns as {"String": " "}; regex patterns are not used by these families.
std::string string_pattern(const JsonView& pattern, const char* what) {
    if (pattern.is_object() && pattern["String"].is_string()) return pattern["String"].string();
    pattern.fail(std::string(what) + " pattern " + excerpt(pattern) +
                 " is not supported (only {\"String\": ...} patterns)");
}

// The steps of a (possibly nested) Sequence, in order. The recursion is bounded by the
// document's nesting limit (formats/json_io.hpp), two JSON levels per Sequence.
void flatten_sequence(const JsonView& j, const char* list_key, std::vector<JsonView>& out) {
    if (!j.is_set()) return;
    if (j["type"].string_or("") == "Sequence") {
        j[list_key].for_each_element(
            [&](const JsonView& item) { flatten_sequence(item, list_key, out); });
        return;
    }
    out.push_back(j);
}

std::vector<JsonView> flatten_sequence(const JsonView& j, const char* list_key) {
    std::vector<JsonView> out;
    flatten_sequence(j, list_key, out);
    return out;
}

json map_normalizer(const JsonView& normalizer) {
    json out = json::array();
    for (const JsonView& n : flatten_sequence(normalizer, "normalizers")) {
        const std::string type = n["type"].string_or("");
        if (type == "NFC")
            out.push_back({{"type", "nfc"}});
        else if (type == "Prepend")
            out.push_back({{"type", "prepend"}, {"prepend", n["prepend"].string()}});
        else if (type == "Replace")
            out.push_back({{"type", "replace"},
                           {"pattern", string_pattern(n["pattern"], "Replace normalizer")},
                           {"content", n["content"].string()}});
        else
            n.fail("unsupported normalizer " + excerpt(n) + " (supported: NFC, Prepend, Replace)");
    }
    return out;
}

// Metaspace settings from either the current (prepend_scheme) or the older (add_prefix_space)
// spelling of the Metaspace pre-tokenizer/decoder.
std::string metaspace_prepend_scheme(const JsonView& m) {
    if (m.has("prepend_scheme")) return m["prepend_scheme"].string();
    return m["add_prefix_space"].boolean_or(true) ? "always" : "never";
}

json map_decoder(const JsonView& decoder) {
    json out = {{"byte_level", false},
                {"byte_fallback", false},
                {"metaspace", ""},
                {"strip_leading_spaces", 0}};
    for (const JsonView& d : flatten_sequence(decoder, "decoders")) {
        const std::string type = d["type"].string_or("");
        const bool space_content = d["content"].is_string() && d["content"].string() == " ";
        if (type == "ByteLevel") {
            out["byte_level"] = true;
        } else if (type == "ByteFallback") {
            out["byte_fallback"] = true;
        } else if (type == "Fuse") {
            // Joins the token strings; decode always produces one string.
        } else if (type == "Replace" && space_content &&
                   string_pattern(d["pattern"], "Replace decoder") == kMetaSpace) {
            out["metaspace"] = kMetaSpace;
        } else if (type == "Strip" && space_content && d["stop"].integer_or(0, 0, kMaxStrip) == 0) {
            out["strip_leading_spaces"] = d["start"].integer_or(0, 0, kMaxStrip);
        } else if (type == "Metaspace") {
            out["metaspace"] = d["replacement"].string_or(kMetaSpace);
            if (metaspace_prepend_scheme(d) != "never") out["strip_leading_spaces"] = 1;
        } else {
            d.fail(
                "unsupported decoder " + excerpt(d) +
                " (supported: ByteLevel, ByteFallback, Fuse, Replace(▁, ' '), Strip, Metaspace)");
        }
    }
    return out;
}

// The vocabulary and added tokens as pieces in id order; ids must be dense and each piece unique.
json collect_pieces(const JsonView& vocab, const JsonView& added, const std::string& file) {
    const size_t limit = vocab.object_size() + added.array_size();
    std::vector<std::optional<std::string>> pieces;
    std::map<std::string, int64_t> id_of;
    auto put = [&](const std::string& piece, const JsonView& id_json, bool from_added) {
        const json* raw = id_json.raw();
        if (!raw || !raw->is_number_integer() ||
            (!raw->is_number_unsigned() && raw->get<int64_t>() < 0) ||
            raw->get<uint64_t>() >= limit)
            id_json.fail("token " + quoted_excerpt(piece) + " has id " + excerpt(id_json) +
                         ", out of range 0.." + std::to_string(limit - 1));
        if (!is_valid_utf8(piece)) id_json.fail("token id " + raw->dump() + " is not valid UTF-8");
        const auto id = raw->get<size_t>();
        if (pieces.size() <= id) pieces.resize(id + 1);
        if (pieces[id] && (*pieces[id] != piece || !from_added))
            throw Error(file, {},
                        "id " + std::to_string(id) + " is used by both " +
                            quoted_excerpt(*pieces[id]) + " and " + quoted_excerpt(piece));
        auto [it, fresh] = id_of.emplace(piece, static_cast<int64_t>(id));
        if (!fresh && it->second != static_cast<int64_t>(id))
            throw Error(file, {},
                        "duplicate piece " + quoted_excerpt(piece) + " (ids " +
                            std::to_string(it->second) + " and " + std::to_string(id) + ")");
        pieces[id] = piece;
    };
    vocab.for_each_member(
        [&](const std::string& piece, const JsonView& id) { put(piece, id, false); });
    added.for_each_element([&](const JsonView& t) { put(t["content"].string(), t["id"], true); });
    json out = json::array();
    for (size_t id = 0; id < pieces.size(); ++id) {
        if (!pieces[id])
            throw Error(file, {}, "no token has id " + std::to_string(id) + " (ids must be dense)");
        out.push_back(*pieces[id]);
    }
    return out;
}

json map_merges(const JsonView& merges, const json& vocab) {
    json out = json::array();
    if (!merges.is_set()) return out;
    merges.for_each_element([&](const JsonView& m) {
        std::string a, b;
        if (m.is_string()) {  // "a b" (tokenizers < 0.20)
            const std::string s = m.string();
            const size_t space = s.find(' ');
            if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
                m.fail("merge " + excerpt(m) + " is not two tokens separated by one space");
            a = s.substr(0, space), b = s.substr(space + 1);
        } else if (m.is_array() && m.array_size() == 2 && m[0].is_string() && m[1].is_string()) {
            a = m[0].string(), b = m[1].string();  // ["a", "b"] (tokenizers >= 0.20)
        } else {
            m.fail("merge " + excerpt(m) + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        for (const std::string& name : {a, b, a + b}) {
            if (!vocab.contains(name))
                m.fail("merge " + excerpt(m) + " names " + quoted_excerpt(name) +
                       ", absent from the vocabulary");
        }
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
            m.fail("merge " + excerpt(m) +
                   " has a token with a space, which the schema's \"a b\" form cannot hold");
        out.push_back(a + " " + b);
    });
    return out;
}

bool contains_type(const JsonView& j, const char* type, const char* list_key) {
    for (const JsonView& item : flatten_sequence(j, list_key))
        if (item["type"].string_or("") == type) return true;
    return false;
}

// Token ids live in int32 everywhere downstream.
constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;

// The special tokens a TemplateProcessing post-processor puts around a single sequence.
struct Template {
    std::vector<int64_t> before, after;
};
std::optional<Template> template_of(const JsonView& post) {
    for (const JsonView& p : flatten_sequence(post, "processors")) {
        if (p["type"].string_or("") != "TemplateProcessing") continue;
        Template t;
        bool seen_sequence = false;
        if (p["single"].is_set())
            p["single"].for_each_element([&](const JsonView& piece) {
                if (piece.has("Sequence")) {
                    seen_sequence = true;
                    return;
                }
                const std::string name = piece["SpecialToken"]["id"].string();
                const JsonView ids = p["special_tokens"][name]["ids"];
                if (!ids.is_array() || ids.array_size() != 1)
                    ids.fail("post_processor special token \"" + name +
                             "\" must have exactly one id");
                (seen_sequence ? t.after : t.before).push_back(ids[0].integer(0, kMaxTokenId));
            });
        if (t.before.size() > 1 || t.after.size() > 1)
            p.fail(
                "post_processor adds more than one token before or after the text (unsupported)");
        return t;
    }
    return std::nullopt;
}

// A companion file beside tokenizer.json (null when absent), checked to be an object: errors in
// it name that file, not tokenizer.json.
json optional_json_beside(const std::string& companion) {
    if (!fs::exists(companion)) return nullptr;
    json j = read_json_file(companion);
    JsonView(j, companion).object();
    return j;
}

// Gemma's tokenizer.json (transformers' GemmaTokenizer) splits at " " after a normalizer that
// has replaced every " " with "▁": pre-tokenizers see normalized text, so the split never
// finds a space and the text stays one word, as with no pre-tokenizer. Only that exact case is
// accepted (a literal " ", not inverted, and no normalizer step that writes a space back).
bool splits_only_spaces_normalized_away(const JsonView& pre, const json& normalizer) {
    if (!pre.is_object() || pre["type"].string_or("") != "Split" ||
        pre["invert"].boolean_or(false) || !pre["pattern"].is_object() ||
        pre["pattern"]["String"].string_or("") != " ")
        return false;
    bool replaced = false;
    for (const json& n : normalizer) {
        const std::string written = n.value("content", "") + n.value("prepend", "");
        if (written.find(' ') != std::string::npos) return false;
        replaced = replaced || (n.value("type", "") == "replace" && n.value("pattern", "") == " ");
    }
    return replaced;
}

// tokenizer.json -> schema.
json map_hf_tokenizer(const std::string& path) {
    const json root = read_json_file(path);
    const JsonView tok(root, path);
    if (!tok.is_object() || !tok["model"].is_object())
        throw Error(path, {}, "tokenizer.json has no \"model\" object");
    const JsonView model = tok["model"];
    if (!model["type"].is_string() || model["type"].string() != "BPE")
        model["type"].fail("unsupported tokenizer model type " + excerpt(model["type"]) +
                           " (supported: BPE)");
    model["vocab"].object();
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (model[key].string_or("") != "") model[key].fail("not supported");
    const json& vocab = model["vocab"].value();
    static const json kNoTokens = json::array();
    const JsonView added = tok["added_tokens"].is_set() ? tok["added_tokens"]
                                                        : JsonView(kNoTokens, path, "added_tokens");
    added.array();

    json s;
    s["schema_version"] = kTokenizerSchemaVersion;
    s["source"] = "tokenizer.json";
    s["pieces"] = collect_pieces(model["vocab"], added, path);
    s["merges"] = map_merges(model["merges"], vocab);
    s["normalizer"] = map_normalizer(tok["normalizer"]);
    s["decoder"] = map_decoder(tok["decoder"]);

    // The family: byte-level BPE has a ByteLevel pre-tokenizer; SentencePiece-style BPE has the
    // meta space, from a Metaspace pre-tokenizer or a normalizer that writes "▁".
    const JsonView pre = tok["pre_tokenizer"];
    bool sentencepiece = false;
    s["pre_tokenizer"] = nullptr;
    s["metaspace"] = nullptr;
    if (contains_type(pre, "ByteLevel", "pretokenizers")) {
        s["model"] = "bpe_byte_level";
        // Normalized: known split patterns by name, Digits and ByteLevel as flags.
        s["pre_tokenizer"] =
            pretokenizer_spec_to_json(pretokenizer_spec_from_hf(pre.value(), path));
    } else if (pre.is_object() && pre["type"].string_or("") == "Metaspace") {
        sentencepiece = true;
        s["metaspace"] = {{"replacement", pre["replacement"].string_or(kMetaSpace)},
                          {"prepend_scheme", metaspace_prepend_scheme(pre)},
                          {"split", pre["split"].boolean_or(true)}};
    } else if (pre.is_set() && !splits_only_spaces_normalized_away(pre, s["normalizer"])) {
        pre.fail("unsupported pre_tokenizer " + excerpt(pre) +
                 " (supported: ByteLevel with Split/Digits, Metaspace, a Split at \" \" after "
                 "a normalizer that replaces every space, none)");
    } else {
        for (const json& n : s["normalizer"])
            if (n.value("content", "") == kMetaSpace || n.value("prepend", "") == kMetaSpace)
                sentencepiece = true;
    }
    if (sentencepiece) s["model"] = "bpe_sentencepiece";
    if (!s.contains("model"))
        throw Error(path, {},
                    "BPE tokenizer is neither byte-level (ByteLevel pre-tokenizer) nor "
                    "SentencePiece-style (▁ normalizer or Metaspace); not supported");

    // collect_pieces checked every added token (an object with a string content and an id in
    // range) and every vocabulary id, so the raw reads below cannot meet another type.
    const json& added_json = added.value();
    const json pieces = s["pieces"];
    auto id_of = [&](const std::string& content) -> json {
        for (const json& t : added_json)
            if (t["content"] == content) return t["id"];
        return vocab.contains(content) ? vocab[content] : json();
    };
    const JsonView unk = model["unk_token"];
    s["unk_id"] = unk.is_set() ? id_of(unk.string()) : json();
    if (unk.is_set() && s["unk_id"].is_null())
        unk.fail("unk_token " + excerpt(unk) + " is not in the vocabulary");
    s["bpe"] = {{"byte_fallback", model["byte_fallback"].boolean_or(false)},
                {"ignore_merges", model["ignore_merges"].boolean_or(false)},
                {"fuse_unk", model["fuse_unk"].boolean_or(false)}};

    json added_out = json::array();
    json types = json::array();
    for (size_t id = 0; id < pieces.size(); ++id) {
        const std::string& p = pieces[id].get_ref<const std::string&>();
        const bool byte =
            s["bpe"]["byte_fallback"] && p.size() == 6 && p.rfind("<0x", 0) == 0 && p[5] == '>';
        types.push_back(s["unk_id"] == id ? "unknown" : byte ? "byte" : "normal");
    }
    added.for_each_element([&](const JsonView& t) {
        const bool special = t["special"].boolean_or(false);
        added_out.push_back({{"id", t["id"].value()},
                             {"content", t["content"].value()},
                             {"special", special},
                             {"lstrip", t["lstrip"].boolean_or(false)},
                             {"rstrip", t["rstrip"].boolean_or(false)},
                             {"single_word", t["single_word"].boolean_or(false)},
                             {"normalized", t["normalized"].boolean_or(!special)}});
        types[t["id"].value().get<size_t>()] = special ? "special" : "user_defined";
    });
    s["added_tokens"] = std::move(added_out);
    s["token_types"] = std::move(types);

    // BOS/EOS and whether encode adds them: the post-processor template is what `tokenizers`
    // runs, so it decides; tokenizer_config.json names the tokens and fills in the rest.
    const fs::path dir = fs::path(path).parent_path();
    const std::string config_path = (dir / "tokenizer_config.json").string();
    const std::string gen_path = (dir / "generation_config.json").string();
    const json config_json = optional_json_beside(config_path);
    const json gen_json = optional_json_beside(gen_path);
    const JsonView config(config_json, config_path);
    const JsonView gen(gen_json, gen_path);
    auto config_id = [&](const char* key) -> json {
        const auto content = token_content(config[key]);
        return content ? id_of(*content) : json();
    };
    s["bos_id"] = config_id("bos_token");
    s["eos_id"] = config_id("eos_token");
    s["add_bos"] = config["add_bos_token"].boolean_or(false);
    s["add_eos"] = config["add_eos_token"].boolean_or(false);
    if (const auto t = template_of(tok["post_processor"])) {
        s["add_bos"] = !t->before.empty();
        s["add_eos"] = !t->after.empty();
        if (!t->before.empty()) s["bos_id"] = t->before[0];
        if (!t->after.empty() && s["eos_id"].is_null()) s["eos_id"] = t->after[0];
    }
    // A list of named templates (tool use, RAG) is not kept: only the default string form.
    const JsonView chat = config["chat_template"];
    if (chat.is_set() && !chat.is_string() && !chat.is_array())
        chat.expected("a template string or a list of named templates");
    s["chat_template"] = chat.is_string() ? chat.string() : "";
    try {
        jinja::check_nesting(s["chat_template"].get_ref<const std::string&>());
    } catch (const Error& e) {
        chat.fail(e.detail());
    }

    // Stop ids: EOS, generation_config.json's eos_token_id (Llama 3 Instruct lists several), and
    // the end-of-turn tokens the chat template emits.
    std::vector<int64_t> stops;
    auto add_stop = [&](const json& id) {
        if (id.is_number_integer() &&
            std::find(stops.begin(), stops.end(), id.get<int64_t>()) == stops.end())
            stops.push_back(id.get<int64_t>());
    };
    add_stop(s["eos_id"]);
    const JsonView gen_eos = gen["eos_token_id"];
    if (gen_eos.is_array())
        gen_eos.for_each_element([&](const JsonView& id) { add_stop(id.integer(0, kMaxTokenId)); });
    else if (gen_eos.is_set())
        add_stop(gen_eos.integer(0, kMaxTokenId));
    const std::string chat_text = s["chat_template"];
    for (const char* turn_end : kChatTurnEnds)
        if (chat_text.find(turn_end) != std::string::npos) add_stop(id_of(turn_end));
    s["stop_ids"] = stops;
    return s;
}

}  // namespace

json load_hf_tokenizer(const std::string& path) {
    // Every value above is read through JsonView, which names the file and key; the backstop
    // turns anything missed into an Error naming tokenizer.json rather than a library exception.
    return with_json_errors(path, [&] { return map_hf_tokenizer(path); });
}

}  // namespace qforge
