// Text -> ids for the three families. The order of steps is that of the reference
// implementations: Hugging Face `tokenizers` (added tokens on the raw text, normalizer, added
// tokens on the normalized text, pre-tokenizer, BPE per word, post-processor BOS/EOS) and
// llama2.c run.c's encode() (BOS, dummy-prefix space, code points or bytes + 3, score merges).
#include "core/error.hpp"
#include "tokenizer/tokenizer_impl.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge {

namespace {

// Longer words are rare and would only bloat the cache.
constexpr size_t kMaxCachedWord = 256;
// run.c: a code point missing from the vocabulary becomes its bytes, each as id byte + 3.
constexpr int32_t kLlama2cByteOffset = 3;

size_t char_length(std::string_view s, size_t i) {
    const size_t n = utf8_sequence_length(s, i);
    return n ? n : 1;  // input is sanitized; this only guards against misuse
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
    const Impl& t = *impl_;
    const std::string clean = sanitize_utf8(text);
    std::vector<int32_t> out;
    out.reserve(clean.size() / 3 + 2);
    WordCache cache;
    if (add_special && t.add_bos && t.bos) out.push_back(*t.bos);
    if (t.model == TokenizerModel::llama2c) {
        if (!clean.empty()) t.encode_word(" " + clean, out, cache);  // run.c's dummy prefix
    } else {
        std::vector<AddedTokenMatcher::Segment> raw, normalized;
        t.raw_added.split(clean, raw);
        for (const auto& seg : raw) {
            if (seg.id >= 0) {
                out.push_back(seg.id);
                continue;
            }
            // `first`: the segment starts at the input's offset 0 (Metaspace prepend_scheme
            // "first").
            const bool first = seg.begin == 0;
            const std::string text_norm =
                t.normalizer.apply(clean.substr(seg.begin, seg.end - seg.begin));
            normalized.clear();
            t.normalized_added.split(text_norm, normalized);
            for (const auto& sub : normalized) {
                if (sub.id >= 0)
                    out.push_back(sub.id);
                else
                    t.encode_segment(
                        std::string_view(text_norm).substr(sub.begin, sub.end - sub.begin),
                        first && sub.begin == 0, out, cache);
            }
        }
    }
    if (add_special && t.add_eos && t.eos) out.push_back(*t.eos);
    return out;
}

void TokenizerData::encode_segment(std::string_view text, bool first, std::vector<int32_t>& out,
                                   WordCache& cache) const {
    if (text.empty()) return;
    if (model == TokenizerModel::bpe_byte_level) {
        std::vector<std::string> words;
        pretokenizer->split(text, words);
        for (const std::string& w : words) encode_word(w, out, cache);
        return;
    }
    if (!metaspace) {  // the normalizer already wrote the meta spaces: the text is one word
        encode_word(text, out, cache);
        return;
    }
    // Metaspace pre-tokenizer: spaces become the meta space, the prefix is added as the scheme
    // says (unless already there), and with `split` each meta space starts a new word.
    std::string s;
    s.reserve(text.size() + text.size() / 4 + 3);
    for (char c : text) {
        if (c == ' ')
            s.append(metaspace_char);
        else
            s.push_back(c);
    }
    const bool prepend =
        metaspace_prepend == Prepend::always || (metaspace_prepend == Prepend::first && first);
    if (prepend && s.compare(0, metaspace_char.size(), metaspace_char) != 0)
        s.insert(0, metaspace_char);
    if (!metaspace_split) {
        encode_word(s, out, cache);
        return;
    }
    size_t start = 0;
    for (size_t at = s.find(metaspace_char, 1); at != std::string::npos;
         at = s.find(metaspace_char, at + 1)) {
        encode_word(std::string_view(s).substr(start, at - start), out, cache);
        start = at;
    }
    encode_word(std::string_view(s).substr(start), out, cache);
}

void TokenizerData::encode_word(std::string_view word, std::vector<int32_t>& out,
                                WordCache& cache) const {
    auto cached = [&](std::string_view w) {
        if (w.size() > kMaxCachedWord) return bpe_word(w, out);
        if (auto it = cache.find(w); it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
        std::vector<int32_t> ids;
        bpe_word(w, ids);
        out.insert(out.end(), ids.begin(), ids.end());
        cache.emplace(std::string(w), std::move(ids));
    };
    if (!chunkable) return cached(word);
    // Cut before each marker that follows a non-marker character (see TokenizerData::chunk_marker).
    const std::string& m = chunk_marker;
    size_t start = 0;
    for (size_t at = word.find(m, 1); at != std::string_view::npos;
         at = word.find(m, at + m.size())) {
        if (at >= m.size() && word.compare(at - m.size(), m.size(), m) == 0) continue;
        cached(word.substr(start, at - start));
        start = at;
    }
    cached(word.substr(start));
}

void TokenizerData::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges)
        if (auto it = id_of.find(word); it != id_of.end()) return out.push_back(it->second);
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    if (model == TokenizerModel::llama2c) {
        for (size_t i = 0; i < word.size();) {
            const size_t n = char_length(word, i);
            if (auto it = id_of.find(word.substr(i, n)); it != id_of.end())
                symbols.push_back(it->second);
            else
                for (size_t k = 0; k < n; ++k)
                    symbols.push_back(static_cast<uint8_t>(word[i + k]) + kLlama2cByteOffset);
            i += n;
        }
    } else {
        // `tokenizers` BPE::merge_word: each character is a token, else its <0xXX> byte tokens
        // (when all exist), else <unk> (consecutive ones fused when fuse_unk). A pending <unk> is
        // flushed before the next found character but not before byte tokens, as there.
        int32_t pending_unk = -1;
        for (size_t i = 0; i < word.size();) {
            const size_t n = char_length(word, i);
            const std::string_view ch = word.substr(i, n);
            i += n;
            if (auto it = id_of.find(ch); it != id_of.end()) {
                if (pending_unk >= 0) symbols.push_back(pending_unk), pending_unk = -1;
                symbols.push_back(it->second);
                continue;
            }
            if (byte_fallback) {
                bool all = true;
                for (char c : ch) all &= byte_piece_ids[static_cast<uint8_t>(c)] >= 0;
                if (all) {
                    for (char c : ch) symbols.push_back(byte_piece_ids[static_cast<uint8_t>(c)]);
                    continue;
                }
            }
            if (unk_id < 0) continue;  // no unk token: the character is dropped, as there
            if (pending_unk >= 0 && !fuse_unk) symbols.push_back(pending_unk);
            pending_unk = unk_id;
        }
        if (pending_unk >= 0) symbols.push_back(pending_unk);
    }
    bpe_merge(symbols, merges);
    out.insert(out.end(), symbols.begin(), symbols.end());
}

}  // namespace qforge
