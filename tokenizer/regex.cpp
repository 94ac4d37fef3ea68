// Oniguruma behind qforge::Regex. The options mirror the `onig` crate as `tokenizers` uses it:
// Oniguruma's default syntax (ONIG_SYNTAX_ONIGURUMA), UTF-8, ONIG_OPTION_NONE for compiling and
// searching, and the engine's default match limits.
#include "tokenizer/regex.hpp"

#include <oniguruma.h>

#include <mutex>
#include <utility>

#include "core/error.hpp"

namespace qforge {

namespace {

void initialize_oniguruma() {
    static std::once_flag once;
    std::call_once(once, [] {
        OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
        onig_initialize(encodings, 1);
    });
}

std::string onig_message(int code, OnigErrorInfo* info) {
    OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
    const int n =
        info ? onig_error_code_to_str(buf, code, info) : onig_error_code_to_str(buf, code);
    return std::string(reinterpret_cast<const char*>(buf), n > 0 ? static_cast<size_t>(n) : 0);
}

const OnigUChar* bytes(std::string_view s) { return reinterpret_cast<const OnigUChar*>(s.data()); }

// Length of the UTF-8 sequence that starts with `lead` (1 for a stray byte, as the crate's
// fallback does; the text is valid UTF-8 so that case does not arise).
size_t utf8_length(unsigned char lead) {
    if (lead < 0xC0) return 1;
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    return 4;
}

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
    initialize_oniguruma();
    regex_t* re = nullptr;
    OnigErrorInfo info{};
    const int rc = onig_new(&re, bytes(pattern), bytes(pattern) + pattern.size(), ONIG_OPTION_NONE,
                            ONIG_ENCODING_UTF8, ONIG_SYNTAX_ONIGURUMA, &info);
    if (rc != ONIG_NORMAL) {
        throw Error("regex /" + pattern + "/: " + onig_message(rc, &info));
    }
    regex_ = re;
}

Regex::Regex(Regex&& other) noexcept
    : pattern_(std::move(other.pattern_)), regex_(std::exchange(other.regex_, nullptr)) {}

Regex& Regex::operator=(Regex&& other) noexcept {
    if (this != &other) {
        if (regex_) onig_free(static_cast<regex_t*>(regex_));
        pattern_ = std::move(other.pattern_);
        regex_ = std::exchange(other.regex_, nullptr);
    }
    return *this;
}

Regex::~Regex() {
    if (regex_) onig_free(static_cast<regex_t*>(regex_));
}

Regex::Search::Search(const Regex& re, std::string_view text)
    : re_(re), text_(text), region_(onig_region_new()) {
    if (!region_) throw Error("regex /" + re.pattern_ + "/: out of memory");
}

Regex::Search::~Search() { onig_region_free(static_cast<OnigRegion*>(region_), 1); }

bool Regex::Search::next(size_t& begin, size_t& end) {
    auto* region = static_cast<OnigRegion*>(region_);
    const OnigUChar* str = bytes(text_);
    const OnigUChar* str_end = str + text_.size();
    while (from_ <= text_.size()) {
        onig_region_clear(region);
        const int rc = onig_search(static_cast<regex_t*>(re_.regex_), str, str_end, str + from_,
                                   str_end, region, ONIG_OPTION_NONE);
        if (rc == ONIG_MISMATCH) return false;
        if (rc < 0) throw Error("regex /" + re_.pattern_ + "/: " + onig_message(rc, nullptr));
        const auto b = static_cast<size_t>(region->beg[0]);
        const auto e = static_cast<size_t>(region->end[0]);
        if (b == e && have_last_ && last_end_ == e) {
            // An empty match where the last one ended: step over one code point and retry.
            from_ +=
                from_ < text_.size() ? utf8_length(static_cast<unsigned char>(text_[from_])) : 1;
            continue;
        }
        from_ = e;
        last_end_ = e;
        have_last_ = true;
        begin = b;
        end = e;
        return true;
    }
    return false;
}

UnicodeProperty::UnicodeProperty(const std::string& name) {
    initialize_oniguruma();
    const int ctype =
        ONIGENC_PROPERTY_NAME_TO_CTYPE(ONIG_ENCODING_UTF8, const_cast<OnigUChar*>(bytes(name)),
                                       const_cast<OnigUChar*>(bytes(name)) + name.size());
    if (ctype < 0) throw Error("unknown Unicode property '" + name + "'");
    ctype_ = static_cast<unsigned>(ctype);
}

bool UnicodeProperty::contains(uint32_t code_point) const {
    return ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, code_point, ctype_) != 0;
}

}  // namespace qforge
