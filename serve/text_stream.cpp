#include "serve/text_stream.hpp"

#include <algorithm>

namespace qforge::serve {

size_t utf8_complete_prefix(std::string_view s) {
    // Look back at most 3 bytes for the lead byte of the last sequence.
    for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
        const auto c = static_cast<unsigned char>(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte
        const size_t len = c < 0x80             ? 1
                           : (c & 0xE0) == 0xC0 ? 2
                           : (c & 0xF0) == 0xE0 ? 3
                           : (c & 0xF8) == 0xF0 ? 4
                                                : 1;
        return len > back ? s.size() - back : s.size();
    }
    return s.size();
}

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });  // would match at once
    for (const std::string& s : stops_) {
        std::vector<size_t> b(s.size(), 0);
        for (size_t j = 1, k = 0; j < s.size(); ++j) {
            while (k > 0 && s[j] != s[k]) k = b[k - 1];
            if (s[j] == s[k]) ++k;
            b[j] = k;
        }
        border_.push_back(std::move(b));
    }
}

std::string TextStream::add(std::string_view piece) {
    if (stopped_) return {};
    held_ += piece;
    // The earliest stop string in the held text. One cannot begin in text already released:
    // every tail that could still start one was held back.
    size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // Hold back the longest tail that is the start of some stop string (shorter than it: a whole
    // one would have been found above): per stop string, its matcher run over the held text's
    // last |s| - 1 bytes ends in the length of the longest start of s they end with. Linear in
    // |s| (trying each length in turn was quadratic: a long stop string held a thread per token).
    size_t keep = 0;
    for (size_t i = 0; i < stops_.size(); ++i) {
        const std::string& s = stops_[i];
        const std::vector<size_t>& b = border_[i];
        size_t q = 0;  // bytes of s matched so far, always fewer than all of them
        for (size_t at = held_.size() - std::min(held_.size(), s.size() - 1); at < held_.size();
             ++at) {
            while (q > 0 && held_[at] != s[q]) q = b[q - 1];
            if (held_[at] == s[q]) ++q;
            if (q == s.size()) q = b[q - 1];  // not reachable: no whole one is held
        }
        keep = std::max(keep, q);
    }
    size_t release = utf8_complete_prefix(std::string_view(held_).substr(0, held_.size() - keep));
    std::string out = held_.substr(0, release);
    held_.erase(0, release);
    return out;
}

std::string TextStream::finish() {
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace qforge::serve
