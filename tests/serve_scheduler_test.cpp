// The continuous-batching scheduler (serve/scheduler.hpp), in-process: requests arriving at
// random steps give exactly `generate`'s tokens (greedy and seeded sampling); admission waits for
// blocks, the queue bound refuses, cancelled and finished sequences free their blocks at once.
#include <atomic>
#include <catch2/catch.hpp>
#include <random>
#include <stdexcept>

#include "core/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/thread_pool.hpp"
#include "serve/scheduler.hpp"
#include "serve_models.hpp"

using namespace qforge;
using serve::FinishReason;
using serve::Scheduler;

namespace {

// Every token of a stream, until it ends (the scheduler runs on this thread: step() drives it).
struct Collected {
    std::vector<int32_t> tokens;
    bool finished = false;
    FinishReason reason = FinishReason::length;
};
void drain(serve::SequenceStream& s, Collected& c) {
    auto e = s.wait(std::chrono::milliseconds(0));
    c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.finished) {
        c.finished = true;
        c.reason = e.reason;
    }
}

serve::SequenceRequest request(std::vector<int32_t> prompt, uint64_t max_tokens,
                               SamplingParams sampling = {0.0f, 0, 1.0f, 1}) {
    serve::SequenceRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling = sampling;
    return r;
}

}  // namespace

TEST_CASE("scheduler: 32 requests at random arrival give generate's tokens, greedy and sampled",
          "[scheduler]") {
    test::ScratchDir dir("serve-scheduler");
    ThreadPool threads(2);
    std::mt19937_64 rng(5);
    int checked = 0;
    // stories260K (f32 and q4_g128) and one GQA checkpoint: the rest is batch_forward_test's.
    for (const auto& m : test::serve_models(dir, {"llama_gqa_untied"})) {
        INFO(m.name);
        Model model(m.path);
        const ModelConfig& c = model.config();
        auto backend = make_cpu_backend(model, threads);
        const uint64_t ctx = std::min<uint64_t>(64, c.max_position_embeddings);
        struct Case {
            serve::SequenceRequest req;
            std::vector<int32_t> want;
            std::shared_ptr<serve::SequenceStream> stream;
            Collected got;
        };
        std::vector<Case> cases(32);
        for (size_t i = 0; i < cases.size(); ++i) {
            // Even: greedy; odd: sampled with the request's own seed.
            const SamplingParams sp =
                i % 2 ? SamplingParams{0.9f, 20, 0.9f, 100 + i} : SamplingParams{0.0f, 0, 1.0f, 1};
            cases[i].req =
                request(test::random_ids(rng, 1 + rng() % 24, c.vocab_size), 1 + rng() % 10, sp);
            cases[i].req.stop_ids = {static_cast<int32_t>(rng() % c.vocab_size)};
            GenerateOptions o;
            o.sampling = sp;
            o.max_new_tokens = cases[i].req.max_tokens;
            o.stop_ids = cases[i].req.stop_ids;
            cases[i].want = generate(*backend, cases[i].req.prompt, o).tokens;
        }
        // A pool for about five sequences at once, eight slots, chunks of 7 prompt tokens: some
        // requests wait for blocks, most steps mix prefill and decode.
        KvBlockPool pool(c, 5 * CpuKvCache::blocks_for(34));
        Scheduler sched(*backend, pool, {8, ctx, 64, 7});
        size_t next = 0;
        while (next < cases.size() ||
               std::any_of(cases.begin(), cases.end(), [](auto& k) { return !k.got.finished; })) {
            for (uint64_t arrivals = rng() % 3; arrivals > 0 && next < cases.size(); --arrivals) {
                auto sub = sched.submit(cases[next].req);
                REQUIRE(sub.stream);
                cases[next++].stream = sub.stream;
            }
            sched.step();
            for (auto& k : cases)
                if (k.stream && !k.got.finished) drain(*k.stream, k.got);
        }
        for (size_t i = 0; i < cases.size(); ++i) {
            INFO("request " << i);
            CHECK(cases[i].got.tokens == cases[i].want);
        }
        CHECK(sched.stats().steps < 32 * 12);  // requests did share steps
        CHECK(pool.free_blocks() == pool.total_blocks());
        ++checked;
    }
    CHECK(checked >= 1);
}

TEST_CASE("scheduler: admission waits for blocks, the queue bound refuses, cancel frees at once",
          "[scheduler]") {
    test::ScratchDir dir("serve-admission");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(1);
    auto backend = make_cpu_backend(model, threads);
    constexpr uint64_t P = CpuKvCache::kBlockPositions;
    KvBlockPool pool(model.config(), 4);  // 64 positions
    Scheduler sched(*backend, pool, {4, 128, 3, 16});

    // Too large for the whole pool, or a prompt longer than the context: refused for good.
    auto huge = sched.submit(request(std::vector<int32_t>(10, 1), 4 * P));
    CHECK(huge.refusal == Scheduler::Refusal::too_large);
    auto long_prompt = sched.submit(request(std::vector<int32_t>(129, 1), 1));
    CHECK(long_prompt.refusal == Scheduler::Refusal::too_large);
    CHECK_THROWS_AS(sched.submit(request({}, 1)), Error);
    CHECK_THROWS_AS(sched.submit(request({1}, 0)), Error);

    // Three blocks for the first; the second needs two, waits; the third queues behind it; the
    // fourth is past the queue bound of 3 (nothing has run yet: all three wait).
    auto a = sched.submit(request(std::vector<int32_t>(8, 5), 2 * P + 8));
    auto b = sched.submit(request(std::vector<int32_t>(8, 6), P + 8));
    auto c = sched.submit(request({7}, 1));
    auto d = sched.submit(request({8}, 1));
    REQUIRE(a.stream);
    REQUIRE(b.stream);
    REQUIRE(c.stream);
    CHECK(d.refusal == Scheduler::Refusal::queue_full);
    CHECK(sched.step());
    CHECK(sched.stats().running == 1);
    CHECK(sched.stats().queued == 2);  // b waits for blocks, c behind it (first come, first served)
    CHECK(pool.free_blocks() == 1);

    // Cancel the running one: its blocks return within the next step, b and c are admitted.
    a.stream->cancel();
    CHECK(sched.step());
    CHECK(sched.stats().queued == 0);
    Collected got_a, got_c;
    drain(*a.stream, got_a);
    CHECK(got_a.finished);
    CHECK(got_a.reason == FinishReason::cancelled);
    // A queued request cancelled before it runs leaves without running.
    auto e = sched.submit(request({9}, 1));
    REQUIRE(e.stream);
    e.stream->cancel();
    while (sched.step()) drain(*c.stream, got_c);
    drain(*c.stream, got_c);
    CHECK(got_c.finished);
    CHECK(got_c.tokens.size() == 1);
    Collected got_e;
    drain(*e.stream, got_e);
    CHECK(got_e.reason == FinishReason::cancelled);
    CHECK(got_e.tokens.empty());
    CHECK(pool.free_blocks() == pool.total_blocks());
}

TEST_CASE("scheduler thread: streams as tokens come, stops cleanly with requests in flight",
          "[scheduler]") {
    test::ScratchDir dir("serve-thread");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(1);
    auto backend = make_cpu_backend(model, threads);
    KvBlockPool pool(model.config(), 64);
    auto want = generate(*backend, std::vector<int32_t>{1, 20, 30},
                         [] {
                             GenerateOptions o;
                             o.sampling = {0.0f, 0, 1.0f, 1};
                             o.max_new_tokens = 20;
                             return o;
                         }())
                    .tokens;
    std::shared_ptr<serve::SequenceStream> left_running;
    {
        Scheduler sched(*backend, pool, {4, 256, 8, 64});
        sched.start();
        auto s = sched.submit(request({1, 20, 30}, 20));
        REQUIRE(s.stream);
        Collected got;
        for (int i = 0; i < 1000 && !got.finished; ++i) {
            auto ev = s.stream->wait(std::chrono::milliseconds(100));
            got.tokens.insert(got.tokens.end(), ev.tokens.begin(), ev.tokens.end());
            got.finished = ev.finished;
        }
        CHECK(got.tokens == want);
        left_running = sched.submit(request({1, 2}, 200)).stream;
        REQUIRE(left_running);
    }  // destroyed with a request in flight
    auto ev = left_running->wait(std::chrono::milliseconds(0));
    CHECK(ev.finished);
    CHECK(pool.free_blocks() == pool.total_blocks());
}

TEST_CASE("scheduler thread: a step that throws fails its requests and frees them, and goes on",
          "[scheduler]") {
    // Not a qforge::Error (out of memory, say): it used to leave step() and end the thread,
    // and with it the server.
    test::ScratchDir dir("serve-throw");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(1);
    std::atomic<bool> fail{true};
    test::HookedBackend backend(make_cpu_backend(model, threads), [&] {
        if (fail) throw std::runtime_error("no memory today");
    });
    KvBlockPool pool(model.config(), 16);
    Scheduler sched(backend, pool, {4, 64, 8, 16});
    sched.start();
    auto wait_end = [](serve::SequenceStream& s) {
        Collected got;
        for (int i = 0; i < 200 && !got.finished; ++i) {
            auto e = s.wait(std::chrono::milliseconds(50));
            got.tokens.insert(got.tokens.end(), e.tokens.begin(), e.tokens.end());
            if (e.finished) {
                got.finished = true;
                got.reason = e.reason;
            }
        }
        return got;
    };
    auto a = sched.submit(request({1, 2, 3}, 8));
    REQUIRE(a.stream);
    const Collected failed = wait_end(*a.stream);
    CHECK(failed.finished);
    CHECK(failed.reason == FinishReason::error);
    CHECK(failed.tokens.empty());
    fail = false;
    auto b = sched.submit(request({1, 2, 3}, 4));
    REQUIRE(b.stream);
    const Collected ok = wait_end(*b.stream);
    CHECK(ok.reason == FinishReason::length);
    CHECK(ok.tokens.size() == 4);
    sched.stop();
    CHECK(sched.stats().running == 0);
    CHECK(pool.free_blocks() == pool.total_blocks());
}
