// Generated text released as it becomes final: a streamed piece is held back while it could
// still be the start of a stop string (the API's "stop": generation ends before the first
// occurrence, which is never sent) or while it ends inside a UTF-8 sequence (a byte-fallback
// token can be one byte of a character; JSON strings must be whole characters).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qforge::serve {

class TextStream {
  public:
    explicit TextStream(std::vector<std::string> stops);
    // Adds a token's text; returns the text now final. After a stop string is found, stopped()
    // is true and the text before it has been returned; later pieces are ignored.
    std::string add(std::string_view piece);
    // At the end of generation: the rest held back.
    std::string finish();
    bool stopped() const { return stopped_; }

  private:
    std::vector<std::string> stops_;
    // Per stop string, its prefix function (KMP's): border_[i][j] is the length of the longest
    // proper prefix of stops_[i] that ends its first j + 1 bytes.
    std::vector<std::vector<size_t>> border_;
    std::string held_;
    bool stopped_ = false;
};

// The length of the longest prefix of `s` that does not end inside a UTF-8 sequence (a
// malformed byte counts as complete: it is replaced when the text is written as JSON).
size_t utf8_complete_prefix(std::string_view s);

}  // namespace qforge::serve
