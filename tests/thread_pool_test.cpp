// runtime/thread_pool: run() calls its function once per thread; run_chunks() calls its function
// once per chunk, on threads whose indices are in range, and returns only when every chunk has
// returned, also when the two kinds of region alternate quickly (a worker late for a chunked
// region must neither run a chunk twice nor miss the run() region after it) and when the pool
// has more threads than the machine has cores (workers the OS sets aside); an exception thrown on
// any thread reaches the caller after the region has ended everywhere.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/thread_pool.hpp"

namespace thread_pool_test {

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

// Waits (up to a second) until `flag` is set, then a few milliseconds more: a call that is still
// running well after the thrower threw.
static void wait_then_linger(const std::atomic<bool>& flag) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!flag.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TEST_CASE("thread pool: an exception on any thread ends the region and reaches the caller",
          "[runtime][thread_pool]") {
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int thrower = 0; thrower < threads; ++thrower) {
            // run(): one thread throws while the others are still running; the exception
            // arrives only after every other call has returned.
            std::atomic<bool> thrown{false};
            std::atomic<int> returned{0};
            REQUIRE_THROWS_WITH(pool.run([&](int t) {
                if (t == thrower) {
                    thrown.store(true);
                    throw std::runtime_error("thread " + std::to_string(t));
                }
                wait_then_linger(thrown);
                returned.fetch_add(1);
            }),
                                "thread " + std::to_string(thrower));
            REQUIRE(returned.load() == threads - 1);
        }
        // Every thread throws at once: one exception arrives, the others are dropped.
        REQUIRE_THROWS_WITH(pool.run([](int) { throw std::runtime_error("all"); }), "all");

        // run_chunks(): the chunk that throws is reported; no chunk runs twice; a chunk that was
        // running when another threw has returned when the call does; run serially, no chunk
        // after the one that threw runs.
        for (size_t bad : {size_t{1}, size_t{7}, size_t{35}}) {
            std::vector<std::atomic<int>> hits(36);
            std::atomic<bool> thrown{false};
            std::atomic<int> slow_returned{0};
            REQUIRE_THROWS_WITH(pool.run_chunks(hits.size(),
                                                [&](size_t c, int) {
                                                    hits[c].fetch_add(1);
                                                    if (c == bad) {
                                                        thrown.store(true);
                                                        throw std::runtime_error("chunk");
                                                    }
                                                    if (c == 0) {  // claimed first
                                                        if (threads > 1) wait_then_linger(thrown);
                                                        slow_returned.fetch_add(1);
                                                    }
                                                }),
                                "chunk");
            REQUIRE(slow_returned.load() == 1);
            REQUIRE(hits[bad].load() == 1);
            for (size_t c = 0; c < hits.size(); ++c) {
                INFO("threads " << threads << ", chunk " << c << ", the failing one " << bad);
                REQUIRE(hits[c].load() <= 1);
                if (threads == 1 && c > bad) REQUIRE(hits[c].load() == 0);
            }
        }
        // More chunks than one region holds: a failure in the first region starts no later one.
        std::atomic<uint64_t> late{0};
        REQUIRE_THROWS_WITH(pool.run_chunks(ThreadPool::kMaxChunks + 5,
                                            [&](size_t c, int) {
                                                if (c == 0) throw std::runtime_error("first");
                                                if (c >= ThreadPool::kMaxChunks) late.fetch_add(1);
                                            }),
                            "first");
        REQUIRE(late.load() == 0);
        // The pool works on afterwards, with no failure left over.
        alternate(pool, 40);
    }
}

}  // namespace thread_pool_test
