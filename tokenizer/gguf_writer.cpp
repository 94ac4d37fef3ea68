#include "tokenizer/gguf_writer.hpp"

#include <unordered_map>

#include "core/error.hpp"
#include "formats/gguf_writer.hpp"
#include "formats/json_io.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/source.hpp"

namespace qforge {

using nlohmann::json;

namespace {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type) of the schema's names.
int64_t gguf_token_type(const std::string& t) {
    if (t == "unknown") return 2;
    if (t == "special") return 3;
    if (t == "user_defined") return 4;
    if (t == "unused") return 5;
    if (t == "byte") return 6;
    return 1;  // normal
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
        s.replace(at, from.size(), to);
    return s;
}

// The first GGUF pre name whose pre-tokenizer and ignore_merges are the schema's.
std::string gguf_pre_name(const json& schema, const std::string& source) {
    const PretokenizerSpec spec = pretokenizer_spec_from_json(schema.at("pre_tokenizer"), source);
    const bool ignore_merges = schema.at("bpe").at("ignore_merges");
    for (const std::string& name : gguf_pre_names())
        if (pretokenizer_spec_for_gguf_pre(name) == spec &&
            gguf_pre_defaults(name)->ignore_merges == ignore_merges)
            return name;
    throw Error(source, {},
                "the byte-level pre-tokenizer " + schema.at("pre_tokenizer").dump() +
                    " (ignore_merges " + (ignore_merges ? "true" : "false") +
                    ") is none that llama.cpp names in tokenizer.ggml.pre: cannot be exported "
                    "to GGUF");
}

// Scores that rank merges as the schema does (see the header).
std::vector<double> scores_from_merges(const json& schema) {
    const json& pieces = schema.at("pieces");
    std::unordered_map<std::string, size_t> id_of;
    for (size_t id = 0; id < pieces.size(); ++id) id_of.emplace(pieces[id].get<std::string>(), id);
    const json& merges = schema.at("merges");
    const double unranked = -static_cast<double>(merges.size()) - 1;
    std::vector<double> scores(pieces.size(), unranked);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        std::string m = merges[rank];
        m.erase(m.find(' '), 1);
        const auto it = id_of.find(m);
        if (it != id_of.end() && scores[it->second] == unranked)
            scores[it->second] = -static_cast<double>(rank);
    }
    return scores;
}

// Whether SentencePiece's dummy-prefix space is added: a Prepend normalizer, or a Metaspace
// pre-tokenizer that prepends.
bool adds_space_prefix(const json& schema) {
    for (const json& n : schema.at("normalizer"))
        if (n.at("type") == "prepend" && n.at("prepend") == kMetaSpace) return true;
    const json& m = schema.at("metaspace");
    return !m.is_null() && m.at("prepend_scheme") != "never";
}

void add_special_ids(std::vector<GgufKeyValue>& kv, const json& schema) {
    for (const auto& [schema_key, gguf_key] :
         {std::pair{"bos_id", "tokenizer.ggml.bos_token_id"},
          std::pair{"eos_id", "tokenizer.ggml.eos_token_id"},
          std::pair{"unk_id", "tokenizer.ggml.unknown_token_id"}}) {
        const json& id = schema.at(schema_key);
        if (id.is_number_integer()) kv.push_back({gguf_key, gguf_u32(id.get<uint32_t>())});
    }
    kv.push_back({"tokenizer.ggml.add_bos_token", gguf_bool(schema.at("add_bos"))});
    kv.push_back({"tokenizer.ggml.add_eos_token", gguf_bool(schema.at("add_eos"))});
    const std::string chat = schema.at("chat_template");
    if (!chat.empty()) kv.push_back({"tokenizer.chat_template", gguf_string(chat)});
}

GgufTokenizerMetadata build_metadata(const json& schema, const std::string& source,
                                     uint64_t vocab_size) {
    const std::string model = schema.at("model");
    if (model != "bpe_byte_level" && model != "bpe_sentencepiece" && model != "llama2c")
        throw Error(source, {}, "tokenizer model '" + model + "' has no GGUF form in qforge");
    std::vector<std::string> pieces = schema.at("pieces").get<std::vector<std::string>>();
    std::vector<int64_t> types;
    for (const json& t : schema.at("token_types")) types.push_back(gguf_token_type(t));
    const size_t tokens = pieces.size();
    constexpr int64_t kUnused = 5;
    for (size_t id = tokens; id < vocab_size; ++id) {
        pieces.push_back("[PAD" + std::to_string(id) + "]");
        types.push_back(kUnused);
    }

    GgufTokenizerMetadata out;
    std::vector<GgufKeyValue>& kv = out.keys;
    if (pieces.size() > tokens)
        out.warnings.push_back("the vocabulary has " + std::to_string(tokens) + " tokens for " +
                               std::to_string(vocab_size) +
                               " embedding rows: padded with [PAD<id>] tokens, as llama.cpp's "
                               "converter does");
    if (model == "bpe_byte_level") {
        if (!schema.at("normalizer").empty())
            out.warnings.push_back("the tokenizer's normalizer " + schema.at("normalizer").dump() +
                                   " has no GGUF form: llama.cpp does not normalize, so text it "
                                   "would change tokenizes differently");
        kv.push_back({"tokenizer.ggml.model", gguf_string("gpt2")});
        kv.push_back({"tokenizer.ggml.pre", gguf_string(gguf_pre_name(schema, source))});
        kv.push_back({"tokenizer.ggml.tokens", gguf_string_array(std::move(pieces))});
        kv.push_back({"tokenizer.ggml.token_type", gguf_i32_array(std::move(types))});
        kv.push_back({"tokenizer.ggml.merges",
                      gguf_string_array(schema.at("merges").get<std::vector<std::string>>())});
    } else {
        std::vector<double> scores;
        bool prefix = true;
        if (model == "llama2c") {
            for (const json& s : schema.at("scores"))
                scores.push_back(static_cast<double>(s.get<float>()));
            scores.resize(pieces.size(), 0.0);
            for (size_t id = 0; id < pieces.size(); ++id)
                if (types[id] == 1) pieces[id] = replace_all(pieces[id], " ", kMetaSpace);
            out.warnings.push_back(
                "llama.cpp matches the llama2.c vocabulary's <s>, </s> and <unk> written in the "
                "text as special tokens, and U+2581 as a space; run.c does neither");
        } else {
            scores = scores_from_merges(schema);
            scores.resize(pieces.size(), 0.0);
            prefix = adds_space_prefix(schema);
            if (!schema.at("metaspace").is_null())
                out.warnings.push_back(
                    "the Metaspace pre-tokenizer becomes GGUF's add_space_prefix, which prepends "
                    "U+2581 even to text that starts with a space: such text tokenizes "
                    "differently");
        }
        kv.push_back({"tokenizer.ggml.model", gguf_string("llama")});
        kv.push_back({"tokenizer.ggml.tokens", gguf_string_array(std::move(pieces))});
        kv.push_back({"tokenizer.ggml.scores", gguf_f32_array(std::move(scores))});
        kv.push_back({"tokenizer.ggml.token_type", gguf_i32_array(std::move(types))});
        kv.push_back({"tokenizer.ggml.add_space_prefix", gguf_bool(prefix)});
    }
    add_special_ids(kv, schema);
    return out;
}

}  // namespace

// The schema comes from a .qf header (validated there); a value of an unexpected JSON type is
// an Error naming the file.
GgufTokenizerMetadata gguf_tokenizer_metadata(const json& schema, const std::string& source,
                                              uint64_t vocab_size) {
    return with_json_errors(source, [&] { return build_metadata(schema, source, vocab_size); });
}

}  // namespace qforge
