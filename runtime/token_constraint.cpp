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

// Each token's bytes walked from the state after its first byte (one step for all the ids that
// start with it).
size_t TokenMatcher::mask_pattern(std::span<float> logits) {
    size_t count = 0;
    const auto& texts = g_->texts->text;
    for (int first = 0; first < 256; ++first) {
        const auto& ids = g_->texts->by_first[static_cast<size_t>(first)];
        if (ids.empty()) continue;
        const uint32_t after_first = dfa_->next(dfa_state_, static_cast<uint8_t>(first));
        if (after_first == RegexDfa::kDead) continue;
        for (int32_t id : ids) {
            if (static_cast<size_t>(id) >= logits.size() || is_stop(id)) continue;
            const std::string_view t = texts[static_cast<size_t>(id)];
            if (dfa_->walk(after_first, t.substr(1)) != RegexDfa::kDead) {
                allowed_[static_cast<size_t>(id)] = 1;
                ++count;
            }
        }
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
