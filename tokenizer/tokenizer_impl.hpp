// Internal to tokenizer/*.cpp: the state behind Tokenizer, built once from the schema by
// tokenizer.cpp and read by the encoders (encode.cpp) and decode.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.hpp"
#include "tokenizer/bpe_merge.hpp"
#include "tokenizer/normalizer.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge {

// Lets string maps be searched with a string_view without building a std::string.
struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
// Words already tokenized during one encode call (text repeats words all the time).
using WordCache =
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>;

enum class TokenizerModel { llama2c, bpe_sentencepiece, bpe_byte_level };
enum class TokenType : uint8_t { normal, unknown, special, user_defined, byte, unused };

// Tokenizer::Impl is private to Tokenizer; the helpers in tokenizer/*.cpp work on this base.
struct TokenizerData {
    std::string source;  // where the schema came from, for errors
    TokenizerModel model = TokenizerModel::llama2c;
    std::vector<std::string> pieces;
    std::vector<TokenType> types;
    StringIdMap id_of;
    MergeTable merges;

    // Hugging Face BPE model options.
    bool byte_fallback = false;
    bool ignore_merges = false;  // a word that is itself a token skips the merges (Llama 3)
    bool fuse_unk = false;
    int32_t unk_id = -1;
    std::array<int32_t, 256> byte_piece_ids{};  // <0xXX> -> id, -1 when absent

    AddedTokenMatcher raw_added;         // matched in the raw text
    AddedTokenMatcher normalized_added;  // matched after normalization
    Normalizer normalizer;
    std::unique_ptr<Pretokenizer> pretokenizer;  // byte-level family only

    // The Metaspace pre-tokenizer (SentencePiece family, current `tokenizers` spelling).
    enum class Prepend { always, first, never };
    bool metaspace = false;
    std::string metaspace_char;
    Prepend metaspace_prepend = Prepend::always;
    bool metaspace_split = true;

    // A one-word text may be cut before every `chunk_marker` that follows another character when
    // no token produced by merges holds the marker after such a character: then no merge can
    // cross the cut, and each piece merges exactly as it would inside the whole text (and can
    // be cached). Checked against the vocabulary at load ("▁" for SentencePiece, " " for llama2.c).
    std::string chunk_marker;
    bool chunkable = false;

    // Decoding: per id, the bytes it stands for; byte pieces are resolved separately.
    std::vector<std::string> decoded;
    std::vector<int16_t> byte_value;  // the byte of a <0xXX> piece, -1 otherwise
    bool decode_byte_fallback = false;
    bool decode_byte_level = false;
    int strip_leading_spaces = 0;

    std::optional<int32_t> bos, eos;
    bool add_bos = false, add_eos = false;
    std::vector<int32_t> stop_ids;
    std::string chat_template;

    // Encoders (encode.cpp). `first` says whether the text segment starts the input.
    void encode_segment(std::string_view text, bool first, std::vector<int32_t>& out,
                        WordCache& cache) const;
    // A word (a whole text for SentencePiece and llama2.c), cut into chunks when chunkable.
    void encode_word(std::string_view word, std::vector<int32_t>& out, WordCache& cache) const;
    // One word through the model: initial symbols, then the merges.
    void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
};

struct Tokenizer::Impl : TokenizerData {};

}  // namespace qforge
