#include "tokenizer/hf_writer.hpp"

#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "tokenizer/pretokenizer.hpp"

namespace qforge {

using nlohmann::json;

namespace {

json sequence_or_single(json items, const char* type_key, const char* list_key) {
    if (items.empty()) return nullptr;
    if (items.size() == 1) return items[0];
    return {{"type", type_key}, {list_key, std::move(items)}};
}

json normalizer_json(const json& schema) {
    json out = json::array();
    for (const json& n : schema.at("normalizer")) {
        const std::string type = n.at("type");
        if (type == "nfc")
            out.push_back({{"type", "NFC"}});
        else if (type == "prepend")
            out.push_back({{"type", "Prepend"}, {"prepend", n.at("prepend")}});
        else
            out.push_back({{"type", "Replace"},
                           {"pattern", {{"String", n.at("pattern")}}},
                           {"content", n.at("content")}});
    }
    return sequence_or_single(std::move(out), "Sequence", "normalizers");
}

// Byte level: Digits (individual) first when set, each split regex as an Isolated Split (by
// pattern), then ByteLevel without its own regex; source_hf.cpp reads each back by name.
json pre_tokenizer_json(const json& schema, const std::string& source) {
    if (schema.at("model") == "bpe_sentencepiece") {
        const json& m = schema.at("metaspace");
        if (m.is_null()) return nullptr;
        return {{"type", "Metaspace"},
                {"replacement", m.at("replacement")},
                {"prepend_scheme", m.at("prepend_scheme")},
                {"split", m.at("split")}};
    }
    const PretokenizerSpec spec = pretokenizer_spec_from_json(schema.at("pre_tokenizer"), source);
    json steps = json::array();
    if (spec.individual_digits) steps.push_back({{"type", "Digits"}, {"individual_digits", true}});
    for (const std::string& r : spec.split_regexes) {
        if (r == "digits" || r == "digits-individual") {
            steps.push_back({{"type", "Digits"}, {"individual_digits", r == "digits-individual"}});
            continue;
        }
        const auto pattern = pretokenizer_regex_by_name(r);
        steps.push_back({{"type", "Split"},
                         {"pattern", {{"Regex", pattern ? *pattern : r}}},
                         {"behavior", "Isolated"},
                         {"invert", false}});
    }
    if (spec.byte_level)
        steps.push_back({{"type", "ByteLevel"},
                         {"add_prefix_space", spec.add_prefix_space},
                         {"trim_offsets", true},
                         {"use_regex", false}});
    return sequence_or_single(std::move(steps), "Sequence", "pretokenizers");
}

json decoder_json(const json& schema) {
    const json& d = schema.at("decoder");
    json steps = json::array();
    if (d.at("byte_level") == true)
        steps.push_back({{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", true},
                         {"use_regex", true}});
    if (d.at("metaspace") != "")
        steps.push_back(
            {{"type", "Replace"}, {"pattern", {{"String", d.at("metaspace")}}}, {"content", " "}});
    if (d.at("byte_fallback") == true) steps.push_back({{"type", "ByteFallback"}});
    if (!steps.empty()) steps.push_back({{"type", "Fuse"}});
    if (d.at("strip_leading_spaces") != 0)
        steps.push_back({{"type", "Strip"},
                         {"content", " "},
                         {"start", d.at("strip_leading_spaces")},
                         {"stop", 0}});
    return sequence_or_single(std::move(steps), "Sequence", "decoders");
}

// A TemplateProcessing that adds BOS and/or EOS around the text, as tokenizers runs it.
json post_processor_json(const json& schema, const json& pieces, const std::string& source) {
    const bool bos = schema.at("add_bos"), eos = schema.at("add_eos");
    if (!bos && !eos) return nullptr;
    json single = json::array(), pair = json::array(), special = json::object();
    auto add = [&](const char* key, json& seq, int type_id) {
        const json& id = schema.at(key);
        if (!id.is_number_integer())
            throw Error(source, {}, std::string("tokenizer adds ") + key + " but has none");
        const std::string content = pieces.at(id.get<size_t>());
        seq.push_back({{"SpecialToken", {{"id", content}, {"type_id", type_id}}}});
        special[content] = {{"id", content}, {"ids", {id}}, {"tokens", {content}}};
    };
    if (bos) add("bos_id", single, 0);
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (eos) add("eos_id", single, 0);
    // pair: A then B, each framed as single is.
    pair = single;
    if (bos) add("bos_id", pair, 1);
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    if (eos) add("eos_id", pair, 1);
    return {{"type", "TemplateProcessing"},
            {"single", single},
            {"pair", pair},
            {"special_tokens", special}};
}

HfTokenizerFiles build_hf_tokenizer_files(const json& schema, const std::string& source) {
    const std::string model = schema.at("model");
    if (model != "bpe_byte_level" && model != "bpe_sentencepiece")
        throw Error(source, {},
                    "tokenizer model '" + model +
                        "' has no tokenizer.json form in qforge (supported: bpe_byte_level, "
                        "bpe_sentencepiece)");
    const json& pieces = schema.at("pieces");
    json vocab = json::object();
    for (size_t id = 0; id < pieces.size(); ++id) vocab[pieces[id].get<std::string>()] = id;
    json merges = json::array();
    for (const json& m : schema.at("merges")) {
        const std::string s = m;
        const size_t space = s.find(' ');
        merges.push_back({s.substr(0, space), s.substr(space + 1)});
    }
    auto piece_or_null = [&](const char* key) -> json {
        const json& id = schema.at(key);
        return id.is_number_integer() ? pieces.at(id.get<size_t>()) : json(nullptr);
    };
    const json& bpe = schema.at("bpe");
    json added = json::array();
    json added_decoder = json::object();
    for (const json& t : schema.at("added_tokens")) {
        added.push_back({{"id", t.at("id")},
                         {"content", t.at("content")},
                         {"single_word", t.at("single_word")},
                         {"lstrip", t.at("lstrip")},
                         {"rstrip", t.at("rstrip")},
                         {"normalized", t.at("normalized")},
                         {"special", t.at("special")}});
        added_decoder[std::to_string(t.at("id").get<int64_t>())] = {
            {"content", t.at("content")},       {"single_word", t.at("single_word")},
            {"lstrip", t.at("lstrip")},         {"rstrip", t.at("rstrip")},
            {"normalized", t.at("normalized")}, {"special", t.at("special")}};
    }

    HfTokenizerFiles f;
    f.tokenizer = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", normalizer_json(schema)},
                   {"pre_tokenizer", pre_tokenizer_json(schema, source)},
                   {"post_processor", post_processor_json(schema, pieces, source)},
                   {"decoder", decoder_json(schema)},
                   {"model",
                    {{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", piece_or_null("unk_id")},
                     {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr},
                     {"fuse_unk", bpe.at("fuse_unk")},
                     {"byte_fallback", bpe.at("byte_fallback")},
                     {"ignore_merges", bpe.at("ignore_merges")},
                     {"vocab", vocab},
                     {"merges", merges}}}};
    f.tokenizer_config = {
        {"tokenizer_class", "PreTrainedTokenizerFast"}, {"bos_token", piece_or_null("bos_id")},
        {"eos_token", piece_or_null("eos_id")},         {"unk_token", piece_or_null("unk_id")},
        {"add_bos_token", schema.at("add_bos")},        {"add_eos_token", schema.at("add_eos")},
        {"clean_up_tokenization_spaces", false},        {"added_tokens_decoder", added_decoder}};
    if (schema.at("chat_template") != "")
        f.tokenizer_config["chat_template"] = schema.at("chat_template");
    f.generation_config = {{"bos_token_id", schema.at("bos_id")}};
    const json& stops = schema.at("stop_ids");
    if (stops.size() == 1)
        f.generation_config["eos_token_id"] = stops[0];
    else if (!stops.empty())
        f.generation_config["eos_token_id"] = stops;
    return f;
}

}  // namespace

// The schema comes from a .qf header; Tokenizer::from_schema checks it value by value, and this
// backstop names the file for a value of a type the writer did not expect.
HfTokenizerFiles hf_tokenizer_files(const json& schema, const std::string& source) {
    return with_json_errors(source, [&] { return build_hf_tokenizer_files(schema, source); });
}

}  // namespace qforge
