#include "core/hash.hpp"

#include <xxhash.h>

#include <cstdio>

namespace qforge {

namespace {

std::string hex64(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace

std::string xxh3_64_tag(std::span<const uint8_t> bytes) {
    return "xxh3-64:" + hex64(XXH3_64bits(bytes.data(), bytes.size()));
}

struct Xxh3Stream128::State {
    XXH3_state_t* s = XXH3_createState();
    ~State() { XXH3_freeState(s); }
};

Xxh3Stream128::Xxh3Stream128() : state_(std::make_unique<State>()) {
    XXH3_128bits_reset(state_->s);
}
Xxh3Stream128::~Xxh3Stream128() = default;
void Xxh3Stream128::update(std::span<const uint8_t> bytes) {
    XXH3_128bits_update(state_->s, bytes.data(), bytes.size());
}
std::string Xxh3Stream128::digest() const {
    XXH128_hash_t h = XXH3_128bits_digest(state_->s);
    return "xxh3-128:" + hex64(h.high64) + hex64(h.low64);
}

struct Xxh3Stream64::State {
    XXH3_state_t* s = XXH3_createState();
    ~State() { XXH3_freeState(s); }
};

Xxh3Stream64::Xxh3Stream64() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->s); }
Xxh3Stream64::~Xxh3Stream64() = default;
void Xxh3Stream64::update(std::span<const uint8_t> bytes) {
    XXH3_64bits_update(state_->s, bytes.data(), bytes.size());
}
std::string Xxh3Stream64::digest() const {
    return "xxh3-64:" + hex64(XXH3_64bits_digest(state_->s));
}

}  // namespace qforge
