// Tokenizer construction from the normalized schema (docs/FORMAT.md, "tokenizer"), loading from
// files, and the accessors. Encoding is in encode.cpp, decoding in decode.cpp.
#include "tokenizer/tokenizer.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "formats/json_io.hpp"
#include "formats/qf.hpp"
#include "tokenizer/source.hpp"
#include "tokenizer/tokenizer_impl.hpp"

namespace qforge {

namespace {

using nlohmann::json;

// run.c merges only pairs whose merged score beats its initial best_score of -1e10.
constexpr double kLlama2cMinScore = -1e10;

TokenType token_type(const std::string& name, const std::string& source) {
    if (name == "normal") return TokenType::normal;
    if (name == "unknown") return TokenType::unknown;
    if (name == "special") return TokenType::special;
    if (name == "user_defined") return TokenType::user_defined;
    if (name == "byte") return TokenType::byte;
    if (name == "unused") return TokenType::unused;
    throw Error(source, {}, "tokenizer schema: unknown token type \"" + name + "\"");
}

std::optional<int32_t> optional_id(const json& j) {
    if (j.is_null()) return std::nullopt;
    return j.get<int32_t>();
}

// "<0xAB>" -> 0xAB, or -1.
int byte_piece_value(const std::string& p) {
    if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
    auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    };
    const int hi = hex(p[3]), lo = hex(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A byte trie over the pieces, read forwards or backwards, so that every prefix (suffix) of a
// piece that is itself a piece is found in one walk along it. Hashing each of a piece's splits
// instead costs its length squared, which a hostile vocabulary makes hours. The edges live in
// one open-addressing table (node, byte) -> child sized for the vocabulary's bytes: a node-based
// map would spend more time allocating than the walks take.
class PieceTrie {
  public:
    PieceTrie(const std::vector<std::string>& pieces, bool reversed) {
        size_t bytes = 0;
        for (const std::string& p : pieces) bytes += p.size();
        size_t capacity = 16;
        while (capacity < bytes + bytes / 2 + 2) capacity *= 2;  // load at most 2/3
        keys_.assign(capacity, kEmpty);
        children_.resize(capacity);
        ids_.push_back(-1);
        for (size_t id = 0; id < pieces.size(); ++id) {
            const std::string& p = pieces[id];
            uint32_t node = 0;
            for (size_t i = 0; i < p.size(); ++i)
                node = insert(node, static_cast<uint8_t>(reversed ? p[p.size() - 1 - i] : p[i]));
            ids_[node] = static_cast<int32_t>(id);
        }
    }
    // ids[k] = the piece spelled by the first (last) k bytes of s, -1 when none; k < s.size().
    void walk(std::string_view s, bool reversed, std::vector<int32_t>& ids) const {
        ids.assign(s.size(), -1);
        uint32_t node = 0;
        for (size_t k = 1; k < s.size(); ++k) {
            const auto byte = static_cast<uint8_t>(reversed ? s[s.size() - k] : s[k - 1]);
            const size_t slot = find(key(node, byte));
            if (keys_[slot] == kEmpty) return;
            node = children_[slot];
            ids[k] = ids_[node];
        }
    }

  private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t key(uint32_t node, uint8_t byte) { return uint64_t{node} << 8 | byte; }
    size_t find(uint64_t k) const {  // the slot holding k, or the empty slot where it would go
        const size_t mask = keys_.size() - 1;
        size_t slot = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;
        while (keys_[slot] != kEmpty && keys_[slot] != k) slot = (slot + 1) & mask;
        return slot;
    }
    uint32_t insert(uint32_t node, uint8_t byte) {
        const size_t slot = find(key(node, byte));
        if (keys_[slot] == kEmpty) {  // at most one node per byte of the vocabulary: never full
            keys_[slot] = key(node, byte);
            children_[slot] = static_cast<uint32_t>(ids_.size());
            ids_.push_back(-1);
        }
        return children_[slot];
    }
    std::vector<uint64_t> keys_;
    std::vector<uint32_t> children_;
    std::vector<int32_t> ids_;  // per node, the piece that ends there
};

// llama2.c merges by score: every piece that splits (at any byte) into two pieces is the merge
// of that pair, ranked by its own score, exactly the pairs run.c's string lookup would find.
// Linear in the vocabulary's bytes: one trie walk per piece from each end.
void build_llama2c_merges(TokenizerData& t, const JsonView& scores) {
    const PieceTrie forward(t.pieces, false), backward(t.pieces, true);
    std::vector<int32_t> prefix, suffix;
    for (size_t m = 0; m < t.pieces.size(); ++m) {
        const std::string& s = t.pieces[m];
        const double score = scores[m].number();
        if (score <= kLlama2cMinScore || s.size() < 2) continue;
        forward.walk(s, false, prefix);
        backward.walk(s, true, suffix);
        for (size_t k = 1; k < s.size(); ++k) {
            const int32_t l = prefix[k], r = suffix[s.size() - k];
            if (l >= 0 && r >= 0) t.merges.add(l, r, -score, static_cast<int32_t>(m));
        }
    }
}

void build_rank_merges(TokenizerData& t, const JsonView& merges) {
    double rank = 0;
    merges.for_each_element([&](const JsonView& mv) {
        const json& m = mv.value();
        const std::string s = mv.string();
        const size_t space = s.find(' ');
        if (space == std::string::npos)
            throw Error(t.source, {}, "tokenizer schema: merge " + m.dump() + " has no space");
        const std::string a = s.substr(0, space), b = s.substr(space + 1);
        auto ia = t.id_of.find(a), ib = t.id_of.find(b), im = t.id_of.find(a + b);
        if (ia == t.id_of.end() || ib == t.id_of.end() || im == t.id_of.end())
            throw Error(
                t.source, {},
                "tokenizer schema: merge " + m.dump() + " names a token absent from the pieces");
        t.merges.add(ia->second, ib->second, rank, im->second);
        rank += 1;
    });
}

// See TokenizerData::chunk_marker: the cut is exact when no merged token holds the marker right
// after another character and the marker itself is a token.
bool marker_is_cut_point(const TokenizerData& t, const std::string& marker) {
    if (!t.id_of.count(marker)) return false;
    for (size_t id = 0; id < t.pieces.size(); ++id) {
        if (t.types[id] == TokenType::special || t.types[id] == TokenType::user_defined) continue;
        const std::string& p = t.pieces[id];
        for (size_t at = p.find(marker, 1); at != std::string::npos; at = p.find(marker, at + 1))
            if (at < marker.size() || p.compare(at - marker.size(), marker.size(), marker) != 0)
                return false;
    }
    return true;
}

void load_decoder(TokenizerData& t, const JsonView& d) {
    t.decode_byte_fallback =
        t.model == TokenizerModel::llama2c || d["byte_fallback"].boolean_or(false);
    t.decode_byte_level = d["byte_level"].boolean_or(false);
    t.strip_leading_spaces = static_cast<decltype(t.strip_leading_spaces)>(
        d["strip_leading_spaces"].integer_or(0, 0, kMaxStrip));
    const std::string meta = d["metaspace"].string_or("");
    t.decoded.resize(t.pieces.size());
    t.byte_value.assign(t.pieces.size(), -1);
    for (size_t id = 0; id < t.pieces.size(); ++id) {
        std::string s = t.pieces[id];
        const int b = t.decode_byte_fallback ? byte_piece_value(s) : -1;
        if (b >= 0) t.byte_value[id] = static_cast<int16_t>(b);
        if (t.decode_byte_level) {
            // `tokenizers`' ByteLevel decoder: a token whose characters are all in the byte
            // alphabet becomes those bytes; any other token (an added one) stays as written.
            try {
                s = byte_level_decode(s);
            } catch (const Error&) {
            }
        } else if (!meta.empty()) {
            // Rebuilt rather than replaced in place: a piece of many meta spaces would be
            // quadratic.
            std::string spaced;
            size_t from = 0;
            for (size_t at = s.find(meta); at != std::string::npos; at = s.find(meta, from)) {
                spaced.append(s, from, at - from).push_back(' ');
                from = at + meta.size();
            }
            s = spaced.append(s, from);
        }
        t.decoded[id] = std::move(s);
    }
}

}  // namespace

Tokenizer Tokenizer::from_schema(const json& schema, const std::string& source) {
    // The schema may come from a .qf header, so it is input: every value is read through
    // JsonView (key paths under "tokenizer"), and the backstop names the file for anything else.
    return with_json_errors(source, [&] { return from_checked_schema(schema, source); });
}

Tokenizer Tokenizer::from_checked_schema(const json& schema, const std::string& source) {
    validate_tokenizer_schema(schema, source);
    const JsonView sv(schema, source, "tokenizer");
    auto t = std::make_unique<Impl>();
    t->source = source;
    const std::string model = schema["model"];
    t->model = model == "llama2c"             ? TokenizerModel::llama2c
               : model == "bpe_sentencepiece" ? TokenizerModel::bpe_sentencepiece
                                              : TokenizerModel::bpe_byte_level;
    for (const json& p : schema["pieces"]) t->pieces.push_back(p.get<std::string>());
    sv["token_types"].for_each_element(
        [&](const JsonView& ty) { t->types.push_back(token_type(ty.string(), source)); });
    for (size_t id = 0; id < t->pieces.size(); ++id)
        if (!t->id_of.emplace(t->pieces[id], static_cast<int32_t>(id)).second)
            throw Error(source, {},
                        "tokenizer schema: duplicate piece " + quoted_excerpt(t->pieces[id]));
    t->bos = optional_id(schema.value("bos_id", json()));
    t->eos = optional_id(schema.value("eos_id", json()));
    t->add_bos = sv["add_bos"].boolean_or(false);
    t->add_eos = sv["add_eos"].boolean_or(false);
    for (const json& id : schema["stop_ids"]) t->stop_ids.push_back(id.get<int32_t>());
    t->chat_template = sv["chat_template"].string_or("");
    t->unk_id = optional_id(schema.value("unk_id", json())).value_or(-1);

    if (t->model == TokenizerModel::llama2c) {
        build_llama2c_merges(*t, sv["scores"]);
        t->chunk_marker = " ";
        static const json kNoDecoder = json::object();
        load_decoder(*t, JsonView(kNoDecoder, source));
    } else {
        build_rank_merges(*t, sv["merges"]);
        const JsonView bpe = sv["bpe"];
        t->byte_fallback = bpe["byte_fallback"].boolean_or(false);
        t->ignore_merges = bpe["ignore_merges"].boolean_or(false);
        t->fuse_unk = bpe["fuse_unk"].boolean_or(false);
        t->byte_piece_ids.fill(-1);
        for (size_t id = 0; id < t->pieces.size(); ++id)
            if (const int b = byte_piece_value(t->pieces[id]); b >= 0)
                t->byte_piece_ids[static_cast<size_t>(b)] = static_cast<int32_t>(id);
        std::vector<AddedToken> raw, normalized;
        sv["added_tokens"].for_each_element([&](const JsonView& a) {
            AddedToken at{static_cast<int32_t>(a["id"].integer(0, INT32_MAX)),
                          a["content"].string(),
                          a["special"].boolean_or(false),
                          a["lstrip"].boolean_or(false),
                          a["rstrip"].boolean_or(false),
                          a["single_word"].boolean_or(false),
                          a["normalized"].boolean_or(false)};
            (at.normalized ? normalized : raw).push_back(std::move(at));
        });
        t->raw_added = AddedTokenMatcher(raw);
        t->normalized_added = AddedTokenMatcher(normalized);
        t->normalizer = Normalizer(schema.value("normalizer", json::array()), source);
        if (t->model == TokenizerModel::bpe_byte_level) {
            t->pretokenizer = std::make_unique<Pretokenizer>(
                pretokenizer_spec_from_json(schema.value("pre_tokenizer", json()), source));
        } else {
            const JsonView ms = sv["metaspace"];
            if (ms.is_set()) {
                ms.object();
                t->metaspace = true;
                t->metaspace_char = ms["replacement"].string_or(kMetaSpace);
                const std::string scheme = ms["prepend_scheme"].string_or("always");
                t->metaspace_prepend = scheme == "first"   ? TokenizerData::Prepend::first
                                       : scheme == "never" ? TokenizerData::Prepend::never
                                                           : TokenizerData::Prepend::always;
                t->metaspace_split = ms["split"].boolean_or(true);
            }
            t->chunk_marker = t->metaspace ? t->metaspace_char : kMetaSpace;
        }
        static const json kNoDecoder = json::object();
        load_decoder(*t, sv["decoder"].is_set() ? sv["decoder"] : JsonView(kNoDecoder, source));
    }
    // ignore_merges looks at a whole word, so a word must not be cut into chunks then.
    t->chunkable =
        !t->chunk_marker.empty() && !t->ignore_merges && marker_is_cut_point(*t, t->chunk_marker);
    return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::load(const std::string& path) {
    if (std::filesystem::path(path).extension() == ".qf") {
        QfFile qf(path);
        return from_schema(qf.tokenizer(), path);
    }
    return from_schema(load_tokenizer_source(path), path);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

size_t Tokenizer::vocab_size() const { return impl_->pieces.size(); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
std::vector<int32_t> Tokenizer::stop_ids() const { return impl_->stop_ids; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::source() const { return impl_->source; }

std::string_view Tokenizer::piece(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= impl_->pieces.size())
        throw Error(impl_->source, {}, "token id " + std::to_string(id) + " is out of range");
    return impl_->pieces[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < impl_->types.size() &&
           impl_->types[static_cast<size_t>(id)] == TokenType::special;
}

}  // namespace qforge
