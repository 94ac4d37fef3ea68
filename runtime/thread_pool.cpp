#include "runtime/thread_pool.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QF_CPU_RELAX() _mm_pause()
#else
#define QF_CPU_RELAX() ((void)0)
#endif

namespace qforge {

namespace {
// Spin this many rounds before sleeping in the kernel: long enough to cover the gap between the
// regions of one forward pass (microseconds), short enough that an idle pool sleeps.
constexpr int kSpinRounds = 1 << 11;
}  // namespace

ThreadPool::ThreadPool(int threads) {
    const int workers = threads > 1 ? threads - 1 : 0;
    workers_.reserve(static_cast<size_t>(workers));
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::dispatch(void* fn, Trampoline call) {
    job_ = fn;
    call_ = call;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);  // publishes job_ and call_
    generation_.notify_all();
    call(fn, 0);
    // Spin briefly (the workers usually finish within microseconds of the caller), then sleep on
    // the counter: on a machine with more runnable threads than cores, spinning would take the
    // core from the very worker being waited for.
    int spins = 0;
    for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;) {
        if (++spins < kSpinRounds)
            QF_CPU_RELAX();
        else
            pending_.wait(left, std::memory_order_acquire);
    }
}

void ThreadPool::worker_loop(int index) {
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = generation_.load(std::memory_order_acquire)) == seen) {
            if (++spins < kSpinRounds) {
                QF_CPU_RELAX();
            } else {
                generation_.wait(seen, std::memory_order_acquire);
            }
        }
        seen = g;
        if (stop_.load(std::memory_order_relaxed)) return;
        call_(job_, index);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

}  // namespace qforge
