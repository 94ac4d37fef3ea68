// A persistent pool of worker threads for the CPU backend. Threads are created once; each
// parallel region wakes them through one atomic generation counter and ends at one barrier, so a
// region costs a few microseconds, not a thread creation (small models run ~5 regions per layer
// per token, PERFORMANCE.md).
//
// Determinism: the pool only says which thread runs which contiguous part of an index range
// (split_range). Callers give each output element to exactly one thread and never split a
// reduction, so results do not depend on the number of threads.
//
// Exceptions: a region's function may throw on any thread. The region still ends on every thread
// (in a chunked region a thread starts no further chunk once it has seen the failure), then the
// first exception is rethrown on the caller and the others are dropped; what the region wrote is
// then partial.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

namespace qforge {

// The part [begin, end) of [0, n) that part `index` of `parts` handles: contiguous, in order,
// sizes differing by at most one.
inline std::pair<size_t, size_t> split_range(size_t n, size_t parts, size_t index) {
    const size_t base = n / parts, extra = n % parts;
    const size_t begin = index * base + (index < extra ? index : extra);
    return {begin, begin + base + (index < extra ? 1 : 0)};
}

class ThreadPool {
  public:
    // `threads` >= 1 counts the calling thread: threads - 1 workers are started.
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }
    // Parallel regions dispatched to the workers so far (a pool of one thread dispatches none).
    // Read by the calling thread; tests count regions per step with it.
    uint64_t regions() const { return regions_; }

    // Calls fn(thread_index) once on every thread (the caller is thread 0) and returns when all
    // calls have returned (rethrowing the first exception one threw). `fn` must not call the pool
    // itself.
    template <class F>
    void run(F&& fn) {
        if (workers_.empty()) {
            fn(0);
            return;
        }
        using Fn = std::remove_reference_t<F>;
        dispatch(const_cast<void*>(static_cast<const void*>(&fn)),
                 [](void* f, int i) { (*static_cast<Fn*>(f))(i); });
    }

    // fn(begin, end) over contiguous parts of [0, n), one part per thread (empty parts skipped).
    template <class F>
    void parallel_for(size_t n, F&& fn) {
        const size_t parts = static_cast<size_t>(size());
        run([&](int t) {
            auto [b, e] = split_range(n, parts, static_cast<size_t>(t));
            if (b < e) fn(b, e);
        });
    }

    // fn(chunk, thread) once for every chunk in [0, chunks), each on whichever thread claims it
    // first (`thread` names the thread that runs it: 0 is the caller), returning when all have
    // returned. The caller starts claiming at once and never waits for a worker that has not
    // started: on a machine with more runnable threads than cores, a worker the scheduler has
    // set aside leaves its chunks to the threads that run, instead of holding every region up by
    // a time slice (static halves made 2 threads slower than 1 there: kernels/README.md). More
    // than kMaxChunks chunks (the claim word's field) run as successive regions of at most that
    // many. A chunk that throws ends the call as run() does: chunks already running finish, no
    // thread starts another once it has seen the failure, and no later region starts. `fn` must
    // not call the pool itself.
    static constexpr size_t kMaxChunks = (size_t{1} << 20) - 1;
    template <class F>
    void run_chunks(size_t chunks, F&& fn) {
        if (workers_.empty()) {
            for (size_t c = 0; c < chunks; ++c) fn(c, 0);
            return;
        }
        for (size_t base = 0; base < chunks; base += kMaxChunks) {
            auto part = [&](size_t c, int t) { fn(base + c, t); };
            using Part = decltype(part);
            dispatch_chunks(std::min(kMaxChunks, chunks - base), &part,
                            [](void* f, size_t c, int t) { (*static_cast<Part*>(f))(c, t); });
        }
    }

  private:
    using Trampoline = void (*)(void*, int);
    using ChunkTrampoline = void (*)(void*, size_t, int);
    void publish(bool chunked);
    void dispatch(void* fn, Trampoline call);
    void dispatch_chunks(size_t chunks, void* fn, ChunkTrampoline call);
    // Claims and runs chunks of the current chunked region until none is left.
    void run_claimed(int thread);
    void worker_loop(int index);
    // Keeps the first exception of the current region (called in a catch block).
    void record_failure();
    // After a region has ended on every thread: rethrows its first exception, if any.
    void rethrow_failure();

    std::vector<std::thread> workers_;
    void* job_ = nullptr;
    Trampoline call_ = nullptr;
    ChunkTrampoline chunk_call_ = nullptr;
    // Bumped once per region (32 bits: a native futex): the region's number times 2, plus 1 for
    // a run_chunks() region (publish).
    std::atomic<uint32_t> generation_{0};
    std::atomic<int> pending_{0};  // workers still running the current run() region
    // Chunked regions: one word holds (region serial : 24 | chunks : 20 | next chunk : 20), so a
    // claim (a compare-exchange of the whole word) succeeds only for an unclaimed chunk of the
    // region the claimer read, which cannot end before that chunk is done; the job pointers read
    // after a successful claim are therefore that region's.
    std::atomic<uint64_t> claim_{0};
    std::atomic<uint32_t> done_{0};  // chunks of the current chunked region finished
    uint64_t serial_ = 0;
    uint64_t regions_ = 0;  // the caller's: dispatch() and dispatch_chunks() calls
    std::atomic<bool> stop_{false};
    // The current region's first exception: written by the thread that sets failed_, read by
    // the caller after the region's end (pending_ / done_ order the two).
    std::atomic<bool> failed_{false};
    std::exception_ptr failure_;
};

// The two kinds of region where the pool is optional (null: the caller's thread alone).
// fn(begin, end) over ThreadPool::parallel_for's parts of [0, n); without a pool fn(0, n).
template <class F>
void parallel_for(ThreadPool* pool, size_t n, F&& fn) {
    if (pool)
        pool->parallel_for(n, fn);
    else
        fn(size_t{0}, n);
}

// fn(i) for every chunk i in [0, n), claimed by the pool's threads; without a pool in order.
template <class F>
void run_chunks(ThreadPool* pool, size_t n, F&& fn) {
    if (pool)
        pool->run_chunks(n, [&](size_t i, int) { fn(i); });
    else
        for (size_t i = 0; i < n; ++i) fn(i);
}

}  // namespace qforge
