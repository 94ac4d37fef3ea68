// A persistent pool of worker threads for the CPU backend. Threads are created once; each
// parallel region wakes them through one atomic generation counter and ends at one barrier, so a
// region costs a few microseconds, not a thread creation (small models run ~5 regions per layer
// per token, PERFORMANCE.md).
//
// Determinism: the pool only says which thread runs which contiguous part of an index range
// (split_range). Callers give each output element to exactly one thread and never split a
// reduction, so results do not depend on the number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
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

    // Calls fn(thread_index) once on every thread (the caller is thread 0) and returns when all
    // calls have returned. `fn` must not throw and must not call run() itself.
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

  private:
    using Trampoline = void (*)(void*, int);
    void dispatch(void* fn, Trampoline call);
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    void* job_ = nullptr;
    Trampoline call_ = nullptr;
    std::atomic<uint32_t> generation_{0};  // bumped once per region (32 bits: a native futex)
    std::atomic<int> pending_{0};          // workers still running the current region
    std::atomic<bool> stop_{false};
};

}  // namespace qforge
