// runtime/thread_pool: run() calls its function once per thread; run_chunks() calls its function
// once per chunk, on threads whose indices are in range, and returns only when every chunk has
// returned, also when the two kinds of region alternate quickly (a worker late for a chunked
// region must neither run a chunk twice nor miss the run() region after it) and when the pool
// has more threads than the machine has cores (workers the OS sets aside); an exception thrown on
// any thread reaches the caller after the region has ended everywhere.
#include <atomic>
#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/thread_pool.hpp"

using namespace qforge;

namespace {

// Chunked regions of varying sizes alternating with run() regions; every count checked after
// each region returns.
void alternate(ThreadPool& pool, int regions) {
    const int threads = pool.size();
    std::vector<std::atomic<int>> hits(64);
    std::vector<std::atomic<int>> per_thread(static_cast<size_t>(threads));
    for (int r = 0; r < regions; ++r) {
        const size_t chunks = static_cast<size_t>(r % 37);  // 0 .. 36, zero included
        for (auto& h : hits) h.store(0);
        std::atomic<int> bad_thread{0};
        pool.run_chunks(chunks, [&](size_t c, int t) {
            if (t < 0 || t >= threads) bad_thread.fetch_add(1);
            hits[c].fetch_add(1, std::memory_order_relaxed);
        });
        REQUIRE(bad_thread.load() == 0);
        for (size_t c = 0; c < hits.size(); ++c) REQUIRE(hits[c].load() == (c < chunks ? 1 : 0));
        for (auto& p : per_thread) p.store(0);
        pool.run([&](int t) { per_thread[static_cast<size_t>(t)].fetch_add(1); });
        for (auto& p : per_thread) REQUIRE(p.load() == 1);
    }
}

}  // namespace

TEST_CASE("thread pool: run_chunks runs every chunk once, between run() regions",
          "[runtime][thread_pool]") {
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        alternate(pool, 400);
    }
}

TEST_CASE("thread pool: more threads than cores (workers set aside) still finish every region",
          "[runtime][thread_pool]") {
    ThreadPool pool(8);
    alternate(pool, 200);
}

TEST_CASE("thread pool: more chunks than one region holds run as successive regions",
          "[runtime][thread_pool]") {
    ThreadPool pool(2);
    const size_t chunks = ThreadPool::kMaxChunks + 5;
    std::atomic<uint64_t> count{0}, sum{0};
    pool.run_chunks(chunks, [&](size_t c, int) {
        count.fetch_add(1, std::memory_order_relaxed);
        sum.fetch_add(c, std::memory_order_relaxed);
    });
    REQUIRE(count.load() == chunks);
    REQUIRE(sum.load() == static_cast<uint64_t>(chunks) * (chunks - 1) / 2);
}

TEST_CASE("thread pool: an exception on any thread ends the region and reaches the caller",
          "[runtime][thread_pool]") {
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int thrower = 0; thrower < threads; ++thrower) {
            // run(): one thread throws, every thread's call still returns before the rethrow.
            std::atomic<int> calls{0};
            REQUIRE_THROWS_WITH(pool.run([&](int t) {
                calls.fetch_add(1);
                if (t == thrower) throw std::runtime_error("thread " + std::to_string(t));
            }),
                                "thread " + std::to_string(thrower));
            REQUIRE(calls.load() == threads);
        }
        // run_chunks(): the chunk that throws is reported; no chunk runs twice, and every chunk
        // claimed before the failure has returned when the call does.
        for (size_t bad : {size_t{0}, size_t{7}, size_t{35}}) {
            std::vector<std::atomic<int>> hits(36);
            std::atomic<int> running{0};
            REQUIRE_THROWS_WITH(pool.run_chunks(hits.size(),
                                                [&](size_t c, int) {
                                                    running.fetch_add(1);
                                                    hits[c].fetch_add(1);
                                                    if (c == bad) {
                                                        running.fetch_sub(1);
                                                        throw std::runtime_error("chunk");
                                                    }
                                                    running.fetch_sub(1);
                                                }),
                                "chunk");
            REQUIRE(running.load() == 0);
            REQUIRE(hits[bad].load() == 1);
            for (auto& h : hits) REQUIRE(h.load() <= 1);
        }
        // The pool works on afterwards, with no failure left over.
        alternate(pool, 40);
    }
}
