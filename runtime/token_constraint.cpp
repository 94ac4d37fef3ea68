#include "runtime/token_constraint.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/utf8.hpp"

namespace qforge {

namespace {
// Whether `t` is string content a JSON string takes as it stands.
bool plain_string_content(std::string_view t) {
    for (size_t i = 0; i < t.size();) {
        const auto c = static_cast<uint8_t>(t[i]);
        if (c == '"' || c == '\\' || c < 0x20) return false;
        if (c < 0x80) {
            ++i;
            continue;
        }
        const size_t len = utf8_sequence_length(t, i);  // a whole RFC 3629 character, or 0
        if (len < 2) return false;
        i += len;
    }
    return true;
}
}  // namespace

TokenTexts::TokenTexts(const Tokenizer& tok) {
    const auto n = static_cast<int32_t>(tok.vocab_size());
    text.resize(static_cast<size_t>(n));
    plain.assign(static_cast<size_t>(n), 0);
    // Any id but BOS as the one before: the text a token adds inside a stream.
    const int32_t before = tok.bos_id() && *tok.bos_id() == 0 ? 1 : 0;
    for (int32_t id = 0; id < n; ++id) {
        if (tok.is_special(id)) continue;
        std::string t = tok.decode_piece(before, id);
        if (t.empty()) continue;
        by_first[static_cast<uint8_t>(t[0])].push_back(id);
        plain[static_cast<size_t>(id)] = plain_string_content(t);
        text[static_cast<size_t>(id)] = std::move(t);
        sorted.push_back(id);
    }
    std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
        return text[static_cast<size_t>(a)] < text[static_cast<size_t>(b)];
    });
    for (size_t k = 0, b = 0; b <= 256; ++b) {  // std::string orders bytes as unsigned char
        while (k < sorted.size() &&
               static_cast<uint8_t>(text[static_cast<size_t>(sorted[k])][0]) < b)
            ++k;
        first_begin[b] = static_cast<uint32_t>(k);
    }
    offsets.push_back(0);
    for (int32_t id : sorted) {
        sorted_bytes += text[static_cast<size_t>(id)];
        offsets.push_back(static_cast<uint32_t>(sorted_bytes.size()));
    }
    shared.assign(sorted.size(), 0);
    for (size_t i = 1; i < sorted.size(); ++i) {
        const std::string& a = text[static_cast<size_t>(sorted[i - 1])];
        const std::string& b = text[static_cast<size_t>(sorted[i])];
        uint32_t same = 0;
        while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
        shared[i] = same;
    }
}

TokenMatcher::TokenMatcher(std::shared_ptr<const TokenGrammar> g) : g_(std::move(g)) {
    if (const auto* dfa = std::get_if<RegexDfa>(&g_->grammar)) {
        dfa_ = dfa;
        dfa_state_ = dfa->start();
    } else {
        state_.emplace(std::get<JsonGrammar>(g_->grammar));
        scratch_.emplace(*state_);
    }
}

bool TokenMatcher::is_stop(int32_t id) const {
    return std::find(g_->stop_ids.begin(), g_->stop_ids.end(), id) != g_->stop_ids.end();
}

bool TokenMatcher::allows(int32_t id) {
    if (is_stop(id)) return complete();
    const auto& text = g_->texts->text;
    if (id < 0 || static_cast<size_t>(id) >= text.size() || text[static_cast<size_t>(id)].empty())
        return false;
    bool fits = false;
    if (dfa_) {
        dfa_scratch_ = dfa_->walk(dfa_state_, text[static_cast<size_t>(id)]);
        fits = dfa_scratch_ != RegexDfa::kDead;
    } else {
        *scratch_ = *state_;
        fits = scratch_->feed(text[static_cast<size_t>(id)]);
    }
    fed_ = fits ? id : -1;
    return fits;
}

size_t TokenMatcher::mask(std::span<float> logits) {
    allowed_.assign(logits.size(), 0);
    fed_ = -1;  // the scratch state is reused below
    size_t count = dfa_ ? mask_pattern(logits) : mask_json(logits);
    if (complete())
        for (int32_t id : g_->stop_ids)
            if (id >= 0 && static_cast<size_t>(id) < logits.size() &&
                !allowed_[static_cast<size_t>(id)]) {
                allowed_[static_cast<size_t>(id)] = 1;
                ++count;
            }
    for (size_t i = 0; i < logits.size(); ++i)
        if (!allowed_[i]) logits[i] = -std::numeric_limits<float>::infinity();
    return count;
}

// The texts in byte order, each walked on from the state after the prefix it shares with the
// one before (states_[d]: after d bytes; `filled`: how deep they hold for the last text, whose
// walk stopped there if that state is dead, and so does every text that shares more).
size_t TokenMatcher::mask_pattern(std::span<float> logits) {
    size_t count = 0;
    const TokenTexts& tt = *g_->texts;
    std::vector<uint32_t>& states = depth_states_;
    states.assign(1, dfa_state_);
    size_t filled = 0;
    for (size_t k = 0; k < tt.sorted.size(); ++k) {
        const size_t common = tt.shared[k];
        if (common == 0) {  // a new first byte: its texts skipped at once when it is refused
            const auto first = static_cast<uint8_t>(tt.sorted_bytes[tt.offsets[k]]);
            if (dfa_->next(dfa_state_, first) == RegexDfa::kDead) {
                k = tt.first_begin[first + 1] - 1;
                filled = 0;
                continue;
            }
        }
        if (common > filled) continue;  // through the dead state the last walk stopped at
        const char* t = tt.sorted_bytes.data() + tt.offsets[k];
        const size_t len = tt.offsets[k + 1] - tt.offsets[k];
        size_t d = common;
        uint32_t s = states[d];
        if (states.size() < len + 1) states.resize(len + 1);
        while (s != RegexDfa::kDead && d < len) {
            s = dfa_->next(s, static_cast<uint8_t>(t[d]));
            states[++d] = s;
        }
        const int32_t id = tt.sorted[k];
        filled = d;
        if (s == RegexDfa::kDead || static_cast<size_t>(id) >= logits.size() || is_stop(id))
            continue;
        allowed_[static_cast<size_t>(id)] = 1;
        ++count;
    }
    return count;
}

size_t TokenMatcher::mask_json(std::span<float> logits) {
    size_t count = 0;
    JsonMatcher& scratch = *scratch_;
    const auto& texts = g_->texts->text;
    const auto& plain = g_->texts->plain;
    const bool in_string = state_->in_string_content();
    for (int first = 0; first < 256; ++first) {
        const auto& ids = g_->texts->by_first[static_cast<size_t>(first)];
        if (ids.empty()) continue;
        JsonMatcher after_first = *state_;  // most bytes end here: one try for all their ids
        if (!after_first.feed(static_cast<uint8_t>(first))) continue;
        for (int32_t id : ids) {
            if (static_cast<size_t>(id) >= logits.size() || is_stop(id)) continue;
            const std::string& t = texts[static_cast<size_t>(id)];
            if (in_string && plain[static_cast<size_t>(id)]) {
                allowed_[static_cast<size_t>(id)] = 1;
                ++count;
                continue;
            }
            scratch = after_first;
            if (scratch.feed(std::string_view(t).substr(1))) {
                allowed_[static_cast<size_t>(id)] = 1;
                ++count;
            }
        }
    }
    return count;
}

void TokenMatcher::accept(int32_t id) {
    if (is_stop(id)) return;
    if (fed_ != id && !allows(id))  // (allows() just took it: its state is in scratch_)
        throw Error("constrained generation: token " + std::to_string(id) +
                    " does not continue the constrained text");
    if (dfa_)
        dfa_state_ = dfa_scratch_;
    else
        std::swap(state_, scratch_);
    fed_ = -1;
}

}  // namespace qforge
