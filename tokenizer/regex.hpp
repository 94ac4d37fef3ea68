// A compiled Oniguruma regular expression, searched the way Hugging Face `tokenizers` searches
// its pre-tokenizer patterns. `tokenizers` itself runs these patterns with Oniguruma (the Rust
// `onig` crate, which bundles Oniguruma 6.9.8, the version Debian ships), so using the same engine
// with the same syntax, encoding and options gives the same matches, including \p{L}/\p{N}, \s,
// case-insensitive groups and lookaheads, with Unicode tables generated from the Unicode data
// files by Oniguruma's own build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qforge {

class Regex {
  public:
    // Compiles `pattern` (UTF-8, Oniguruma syntax); a syntax error is a qforge::Error quoting
    // Oniguruma's message and the pattern.
    explicit Regex(const std::string& pattern);
    Regex(Regex&& other) noexcept;
    Regex& operator=(Regex&& other) noexcept;
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;
    ~Regex();

    const std::string& pattern() const { return pattern_; }

    // Calls on_match(begin, end) (byte offsets into `text`) for every match, left to right,
    // with the `onig` crate's find_iter rule: the next search starts at the previous match's
    // end, and an empty match right where the previous match ended is skipped by advancing one
    // code point. Lookarounds see all of `text` but nothing outside it. `text` must be valid
    // UTF-8. An engine failure (e.g. its backtracking limit) is a qforge::Error.
    template <class OnMatch>
    void for_each_match(std::string_view text, OnMatch&& on_match) const {
        Search search(*this, text);
        size_t begin = 0, end = 0;
        while (search.next(begin, end)) on_match(begin, end);
    }

  private:
    // The iteration state of one for_each_match call; owns Oniguruma's match region.
    class Search {
      public:
        Search(const Regex& re, std::string_view text);
        Search(const Search&) = delete;
        Search& operator=(const Search&) = delete;
        ~Search();
        bool next(size_t& begin, size_t& end);

      private:
        const Regex& re_;
        std::string_view text_;
        void* region_;            // OnigRegion*, kept out of this header
        size_t from_ = 0;         // where the next search starts
        size_t last_end_ = 0;     // end of the previous match
        bool have_last_ = false;  // whether there was a previous match
    };

    std::string pattern_;
    void* regex_ = nullptr;  // regex_t*, kept out of this header
};

// Membership of one Unicode property (e.g. "N") from Oniguruma's tables: the same answer as
// \p{N} inside a Regex, for scanning loops that need no regex engine.
class UnicodeProperty {
  public:
    explicit UnicodeProperty(const std::string& name);  // an unknown name is a qforge::Error
    bool contains(uint32_t code_point) const;

  private:
    unsigned ctype_;
};

}  // namespace qforge
