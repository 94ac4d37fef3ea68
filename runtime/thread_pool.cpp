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
    publish(false);
    for (auto& w : workers_) w.join();
}

void ThreadPool::publish(bool chunked) {
    // Only the caller writes the counter: the next region's number, its kind in the low bit.
    const uint32_t g = generation_.load(std::memory_order_relaxed);
    generation_.store(((g >> 1) + 1) << 1 | (chunked ? 1u : 0u), std::memory_order_release);
    generation_.notify_all();
}

void ThreadPool::dispatch(void* fn, Trampoline call) {
    ++regions_;
    job_ = fn;
    call_ = call;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    publish(false);  // publishes job_ and call_
    try {
        call(fn, 0);
    } catch (...) {
        record_failure();
    }
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
    rethrow_failure();
}

void ThreadPool::record_failure() {
    if (!failed_.exchange(true, std::memory_order_acq_rel)) failure_ = std::current_exception();
}

void ThreadPool::rethrow_failure() {
    if (!failed_.load(std::memory_order_acquire)) return;
    std::exception_ptr e = std::move(failure_);
    failure_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
    std::rethrow_exception(e);
}

namespace {
constexpr uint64_t kFieldBits = 20;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;
uint64_t claim_next(uint64_t word) { return word & kFieldMask; }
uint64_t claim_chunks(uint64_t word) { return (word >> kFieldBits) & kFieldMask; }
}  // namespace

void ThreadPool::dispatch_chunks(size_t chunks, void* fn, ChunkTrampoline call) {
    if (chunks == 0) return;
    ++regions_;
    job_ = fn;
    chunk_call_ = call;
    done_.store(0, std::memory_order_relaxed);
    serial_ = (serial_ + 1) & ((uint64_t{1} << (64 - 2 * kFieldBits)) - 1);
    claim_.store((serial_ << (2 * kFieldBits)) | (uint64_t{chunks} << kFieldBits),
                 std::memory_order_release);  // publishes job_, chunk_call_ and done_ = 0
    publish(true);
    run_claimed(0);
    // Every chunk is claimed; wait for the ones other threads still run (spin briefly, then
    // sleep, as dispatch does).
    const auto total = static_cast<uint32_t>(chunks);
    int spins = 0;
    for (uint32_t now; (now = done_.load(std::memory_order_acquire)) != total;) {
        if (++spins < kSpinRounds)
            QF_CPU_RELAX();
        else
            done_.wait(now, std::memory_order_acquire);
    }
    rethrow_failure();
}

void ThreadPool::run_claimed(int thread) {
    uint64_t word = claim_.load(std::memory_order_acquire);
    for (;;) {
        const uint64_t chunks = claim_chunks(word), next = claim_next(word);
        if (next >= chunks) return;
        if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel,
                                          std::memory_order_acquire))
            continue;  // word now holds the current value
        // Claimed: the region cannot end before this chunk is done, so job_ is its job. Once a
        // chunk has thrown, the rest are claimed and counted but not run.
        if (!failed_.load(std::memory_order_relaxed)) {
            try {
                chunk_call_(job_, next, thread);
            } catch (...) {
                record_failure();
            }
        }
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_one();
        word = claim_.load(std::memory_order_acquire);
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
        // The kind comes with the number, in one read: a chunked region may end (and another
        // begin) without this worker, so a second read could pair one region's number with
        // another's kind. A run() region cannot end without this worker, so its job stays put.
        if (g & 1u) {
            run_claimed(index);  // claims only what is left; none may be
            continue;
        }
        try {
            call_(job_, index);
        } catch (...) {
            record_failure();
        }
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}
}  // namespace qforge
