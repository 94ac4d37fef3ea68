#include "core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace qforge {

namespace {

std::atomic<bool> g_enabled{std::getenv("QFORGE_NO_PROGRESS") == nullptr};

std::string format_duration(double s) {
    char buf[32];
    if (s < 0 || s > 1e7) return "?";
    const auto t = static_cast<long>(s + 0.5);
    if (t >= 3600)
        std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else
        std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
    return buf;
}

std::string format_amount(uint64_t n, Progress::Unit unit) {
    if (unit == Progress::Unit::bytes) return human_bytes(n);
    return std::to_string(n) + (unit == Progress::Unit::tokens ? " tok" : "");
}

}  // namespace

std::string human_bytes(uint64_t n) {
    const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1000.0 && u < 4) {
        v /= 1000.0;
        ++u;
    }
    char buf[32];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
    else
        std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    return buf;
}

void Progress::set_enabled(bool on) { g_enabled = on; }

Progress::Progress(std::string label, uint64_t total, Unit unit)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      start_(Clock::now()),
      last_draw_(start_),
      tty_(::isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() { finish(); }

void Progress::update(uint64_t done) {
    done_ = done;
    if (!g_enabled || finished_) return;
    const auto now = Clock::now();
    const double since_start = std::chrono::duration<double>(now - start_).count();
    const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
    if (since_start < 1.0) return;
    if (since_draw < (tty_ ? 0.1 : 5.0) && drawn_) return;
    last_draw_ = now;
    draw(false);
}

void Progress::finish() {
    if (finished_) return;
    finished_ = true;
    if (drawn_ && g_enabled) draw(true);
}

void Progress::draw(bool final_line) {
    drawn_ = true;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total_ - std::min(done_, total_)) / rate : -1;
    constexpr int kWidth = 30;
    std::string bar(kWidth, ' ');
    for (int i = 0; i < static_cast<int>(frac * kWidth) && i < kWidth; ++i) bar[i] = '=';
    // Fewer than one item a second (a slow step per item): the seconds each takes instead.
    std::string rate_text;
    if (unit_ != Unit::bytes && rate > 0.0 && rate < 1.0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f s each", 1.0 / rate);
        rate_text = buf;
    } else {
        rate_text = format_amount(static_cast<uint64_t>(rate), unit_) + "/s";
    }
    std::fprintf(stderr, "%s%s [%s] %5.1f%% %s/%s %s %s %s%s", tty_ ? "\r" : "", label_.c_str(),
                 bar.c_str(), 100.0 * frac, format_amount(done_, unit_).c_str(),
                 format_amount(total_, unit_).c_str(), rate_text.c_str(), final_line ? "in" : "ETA",
                 format_duration(final_line ? elapsed : eta).c_str(), tty_ ? "\x1b[K" : "\n");
    if (tty_ && final_line) std::fputc('\n', stderr);
    std::fflush(stderr);
}

}  // namespace qforge
