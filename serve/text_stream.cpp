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
    // one would have been found above).
    size_t keep = 0;
    for (const auto& s : stops_)
        for (size_t k = std::min(held_.size(), s.size() - 1); k > keep; --k)
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
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
