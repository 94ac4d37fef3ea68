// Checksums: XXH3 (libxxhash). 64-bit for each tensor's bytes, 128-bit for whole source files.
// XXH3 runs at memory speed, so `qforge verify` is bound by the disk, not the hash.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace qforge {

// "xxh3-64:" followed by 16 lowercase hex digits.
std::string xxh3_64_tag(std::span<const uint8_t> bytes);

// Streaming 128-bit hash for files larger than memory; digest() gives "xxh3-128:" + 32 hex digits.
class Xxh3Stream128 {
  public:
    Xxh3Stream128();
    ~Xxh3Stream128();
    void update(std::span<const uint8_t> bytes);
    std::string digest() const;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// Streaming 64-bit hash; digest() gives the same tag as xxh3_64_tag over the concatenation.
class Xxh3Stream64 {
  public:
    Xxh3Stream64();
    ~Xxh3Stream64();
    void update(std::span<const uint8_t> bytes);
    std::string digest() const;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace qforge
