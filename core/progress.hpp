// A progress bar with rate and ETA on stderr. It stays silent for work that finishes within a
// second; on a terminal it redraws one line (at most 10 times a second), otherwise it prints a
// plain line every few seconds so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace qforge {

class Progress {
  public:
    enum class Unit { bytes, items, tokens };

    Progress(std::string label, uint64_t total, Unit unit = Unit::bytes);
    ~Progress();  // finishes the line if one was drawn

    void advance(uint64_t n) { update(done_ + n); }
    void update(uint64_t done);
    void finish();

    // Process-wide switch (the CLI's --quiet); off also when QFORGE_NO_PROGRESS is set.
    static void set_enabled(bool on);

  private:
    using Clock = std::chrono::steady_clock;
    void draw(bool final_line);

    std::string label_;
    uint64_t total_;
    uint64_t done_ = 0;
    Unit unit_;
    Clock::time_point start_;
    Clock::time_point last_draw_;
    bool drawn_ = false;
    bool finished_ = false;
    bool tty_;
};

// "1.23 GB", "512 B": decimal units, as disk sizes are quoted.
std::string human_bytes(uint64_t n);

}  // namespace qforge
