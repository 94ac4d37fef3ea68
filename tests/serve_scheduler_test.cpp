// The continuous-batching scheduler (serve/scheduler.hpp), in-process: requests arriving at
// random steps give exactly `generate`'s tokens (greedy and seeded sampling); admission waits for
// blocks, the queue bound refuses, cancelled and finished sequences free their blocks at once.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/error.hpp"
#include "kernels/device_info.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/generate.hpp"
#include "runtime/thread_pool.hpp"
#include "serve/scheduler.hpp"
#include "serve_check.hpp"
#include "serve_models.hpp"

namespace serve_scheduler_test {

using namespace qforge;
using serve::FinishReason;
using serve::Scheduler;
using test::check_random_arrivals;
using test::Collected;
using test::drain;
using test::request;

namespace {

// Serving as a backend without a batched step does (the CUDA backend): `inner` wrapped so each
// step runs every sequence through forward() (Backend::forward_batch's default), caches made by
// the backend under a budget of about three requests' blocks, whole prompts. 16 requests at
// random arrival give generate()'s tokens on `inner`; each sequence's first step carries its
// whole prompt, later steps one token; the budget is whole at the end.
void check_per_sequence_serving(std::unique_ptr<Backend> inner, uint64_t seed) {
    const ModelConfig& c = inner->model().config();
    uint64_t cut_prompts = 0, steps = 0, rows = 0, sampled = 0;
    test::HookedBackend backend(
        std::move(inner),
        [&](std::span<const BatchSequence> batch) {
            ++steps;
            for (const BatchSequence& b : batch) {
                if (b.cache->size() > 0 ? b.tokens.size() != 1 : !b.logits) ++cut_prompts;
                rows += b.tokens.size();
                sampled += b.logits ? 1 : 0;
            }
        },
        true);
    std::mt19937_64 rng(seed);
    serve::BackendCacheSource caches(backend, 3 * CpuKvCache::blocks_for(34));
    serve::SchedulerOptions so{8, std::min<uint64_t>(64, c.max_position_embeddings), 64, 3};
    so.whole_prompts = true;
    so.kept_caches = 4;  // ignored with whole prompts: a row's keys depend on the cut there
    Scheduler sched(backend, caches, so);
    CHECK(check_random_arrivals(backend, sched, 16, rng) < 16 * 11);  // requests shared steps
    CHECK(cut_prompts == 0);
    // The step counters /health reports are the batches the backend was given.
    CHECK(sched.stats().steps == steps);
    CHECK(sched.stats().step_rows == rows);
    CHECK(sched.stats().step_tokens == sampled);
    CHECK(sched.stats().kept == 0);
    CHECK(sched.stats().reused_positions == 0);
    CHECK(caches.free_blocks() == caches.total_blocks());
}

// fn(backend, config, threads) on stories260K (f32 and q4_g128) and one GQA checkpoint (the rest
// is batch_forward_test's), each under its name, on a pool of two threads; at least one runs.
template <class F>
void on_serve_models(const char* scratch, F&& fn) {
    test::ScratchDir dir(scratch);
    ThreadPool threads(2);
    int checked = 0;
    for (const auto& m : test::serve_models(dir, {"llama_gqa_untied"})) {
        INFO(m.name);
        Model model(m.path);
        auto backend = make_cpu_backend(model, threads);
        fn(*backend, model.config(), threads);
        ++checked;
    }
    CHECK(checked >= 1);
}

// One greedy request (request()'s sampling) alone on `sched` until it finishes: its tokens,
// checked against generate()'s on `backend`.
std::vector<int32_t> run_alone(Backend& backend, Scheduler& sched, std::vector<int32_t> prompt,
                               uint64_t max_tokens) {
    GenerateOptions o;
    o.sampling = {0.0f, 0, 1.0f, 1};
    o.max_new_tokens = max_tokens;
    const auto want = generate(backend, prompt, o).tokens;
    auto sub = sched.submit(request(std::move(prompt), max_tokens));
    REQUIRE(sub.stream);
    Collected got;
    while (sched.step()) drain(*sub.stream, got);
    drain(*sub.stream, got);
    CHECK(got.finished);
    CHECK(got.tokens == want);
    return got.tokens;
}

// 32 requests at random arrival (check_random_arrivals, prompts after `starts` when given) on a
// pool for about five sequences, eight slots, chunks of 7 prompt tokens: some requests wait for
// blocks, most steps mix prefill and decode; rows sampled on both threads, as `serve` does. The
// scheduler's stats at the end (kept caches still held); the pool is whole once it is gone.
serve::SchedulerStats random_arrivals_on_pool(Backend& backend, const ModelConfig& c,
                                              ThreadPool& threads, std::mt19937_64& rng,
                                              uint64_t kept_caches,
                                              const std::vector<std::vector<int32_t>>& starts = {},
                                              uint64_t max_prompt = 24) {
    KvBlockPool pool(c, 5 * CpuKvCache::blocks_for(34));
    serve::SchedulerOptions so{8, std::min<uint64_t>(64, c.max_position_embeddings), 64, 7};
    so.threads = &threads;
    so.kept_caches = kept_caches;
    serve::SchedulerStats st;
    {
        Scheduler sched(backend, pool, so);
        const uint64_t steps = check_random_arrivals(backend, sched, 32, rng, max_prompt, starts);
        CHECK(steps < 32 * 12);  // requests shared steps
        st = sched.stats();
    }
    CHECK(pool.free_blocks() == pool.total_blocks());
    return st;
}

}  // namespace

TEST_CASE("scheduler: 32 requests at random arrival give generate's tokens, greedy and sampled",
          "[scheduler]") {
    std::mt19937_64 rng(5);
    on_serve_models(
        "serve-scheduler", [&](Backend& backend, const ModelConfig& c, ThreadPool& threads) {
            const auto st = random_arrivals_on_pool(backend, c, threads, rng, 0);
            CHECK(st.free_blocks == st.total_blocks);  // every cache back as its sequence ended
        });
}

// A float of the same float64 value (the logits are the batch's bits): within float rounding.
bool near_float(float got, double want) {
    return std::abs(static_cast<double>(got) - want) <= 0x1p-23 * std::max(1.0, std::abs(want));
}

TEST_CASE("scheduler: logprobs are each token's log-softmax, its top ones ranked, in a batch",
          "[scheduler]") {
    std::mt19937_64 rng(17);
    on_serve_models(
        "serve-logprobs", [&](Backend& backend, const ModelConfig& c, ThreadPool& threads) {
            KvBlockPool pool(c, 4 * CpuKvCache::blocks_for(40));
            serve::SchedulerOptions so{4, std::min<uint64_t>(64, c.max_position_embeddings), 8, 5};
            so.threads = &threads;
            Scheduler sched(backend, pool, so);
            // Four requests together (prompts cut into chunks, decode beside prefill): greedy
            // and sampled, the chosen token alone and 1, 5 or 20 alternatives; one without.
            struct Case {
                serve::SequenceRequest req;
                std::shared_ptr<serve::SequenceStream> stream;
                Collected got;
            };
            const uint32_t tops[] = {0, 1, 5, 20};
            std::vector<Case> cases;
            for (size_t i = 0; i < 5; ++i) {
                const SamplingParams sp = i % 2 ? SamplingParams{1.0f, 0, 1.0f, 40 + i}
                                                : SamplingParams{0.0f, 0, 1.0f, 1};
                cases.push_back(
                    {request(test::random_ids(rng, 3 + 4 * i, c.vocab_size), 6, sp), nullptr, {}});
                if (i < 4) cases.back().req.logprobs = tops[i];
            }
            for (auto& k : cases) {
                auto sub = sched.submit(k.req);
                REQUIRE(sub.stream);
                k.stream = sub.stream;
            }
            while (sched.step())
                for (auto& k : cases) drain(*k.stream, k.got);
            for (auto& k : cases) drain(*k.stream, k.got);
            for (size_t i = 0; i < cases.size(); ++i) {
                const Case& k = cases[i];
                INFO("request " << i);
                REQUIRE(k.got.finished);
                REQUIRE(k.got.tokens.size() == 6);
                if (!k.req.logprobs) {
                    CHECK(k.got.logprobs.empty());
                    continue;
                }
                REQUIRE(k.got.logprobs.size() == k.got.tokens.size());
                std::vector<int32_t> seen = k.req.prompt;
                for (size_t t = 0; t < k.got.tokens.size(); ++t) {
                    INFO("token " << t);
                    const test::RowLogprobs want = test::reference_logprobs(backend, seen);
                    const int32_t id = k.got.tokens[t];
                    const TokenLogprobs& got = k.got.logprobs[t];
                    CHECK(near_float(got.logprob, want.logprob[static_cast<size_t>(id)]));
                    if (k.req.sampling.temperature == 0.0f) CHECK(id == want.ranked[0]);
                    REQUIRE(got.top.size() == *k.req.logprobs);
                    for (size_t j = 0; j < got.top.size(); ++j) {
                        CHECK(got.top[j].first == want.ranked[j]);
                        CHECK(near_float(got.top[j].second,
                                         want.logprob[static_cast<size_t>(want.ranked[j])]));
                    }
                    seen.push_back(id);
                }
            }
            CHECK(pool.free_blocks() == pool.total_blocks());
        });
}

TEST_CASE("scheduler: prompt logprobs score each prompt position, in chunks, on a fresh cache",
          "[scheduler]") {
    std::mt19937_64 rng(19);
    on_serve_models("serve-prompt-logprobs", [&](Backend& backend, const ModelConfig& c,
                                                 ThreadPool& threads) {
        KvBlockPool pool(c, 6 * CpuKvCache::blocks_for(24));
        serve::SchedulerOptions so{4, std::min<uint64_t>(64, c.max_position_embeddings), 8, 5};
        so.threads = &threads;
        so.kept_caches = 4;
        so.share_prefixes = true;
        Scheduler sched(backend, pool, so);
        auto run = [&](std::vector<serve::SequenceRequest> reqs) {
            std::vector<std::shared_ptr<serve::SequenceStream>> streams;
            for (auto& r : reqs) {
                auto sub = sched.submit(r);
                REQUIRE(sub.stream);
                streams.push_back(sub.stream);
            }
            std::vector<Collected> got(reqs.size());
            std::vector<std::vector<TokenLogprobs>> prompt(reqs.size());
            for (bool more = true; more;) {
                more = sched.step();
                for (size_t i = 0; i < reqs.size(); ++i) {
                    auto e = streams[i]->wait(std::chrono::milliseconds(0));
                    // Every prompt score comes before the first token.
                    if (!e.prompt_logprobs.empty()) CHECK(got[i].tokens.empty());
                    prompt[i].insert(prompt[i].end(), e.prompt_logprobs.begin(),
                                     e.prompt_logprobs.end());
                    got[i].tokens.insert(got[i].tokens.end(), e.tokens.begin(), e.tokens.end());
                    got[i].logprobs.insert(got[i].logprobs.end(), e.logprobs.begin(),
                                           e.logprobs.end());
                    if (e.finished) got[i].finished = true;
                }
            }
            return std::pair{got, prompt};
        };
        // A plain request first: its cache is kept, and the next prompt starts like it.
        const auto p = test::random_ids(rng, 17, c.vocab_size);
        run({request(p, 3)});
        REQUIRE(sched.stats().kept == 1);
        // Three together: p again with its positions scored (2 alternatives; 17 prompt
        // tokens in chunks of at most 5 beside the others), q's alone (max_tokens 0), and
        // a plain one decoding beside them.
        serve::SequenceRequest e1 = request(p, 4),
                               e2 = request(test::random_ids(rng, 11, c.vocab_size), 0),
                               plain = request(test::random_ids(rng, 6, c.vocab_size), 8);
        e1.logprobs = 2;
        e1.prompt_logprobs = true;
        e2.logprobs = 0;
        e2.prompt_logprobs = true;
        const auto [got, prompt] = run({e1, e2, plain});
        CHECK(sched.stats().reused_positions == 0);  // p's kept cache not taken over
        CHECK(sched.stats().shared_positions == 0);
        for (size_t i = 0; i < 3; ++i) CHECK(got[i].finished);
        GenerateOptions o;
        o.sampling = e1.sampling;
        o.max_new_tokens = 4;
        CHECK(got[0].tokens == generate(backend, p, o).tokens);
        CHECK(got[0].logprobs.size() == 4);
        CHECK(got[1].tokens.empty());
        CHECK(prompt[2].empty());
        for (size_t i = 0; i < 2; ++i) {
            const serve::SequenceRequest& r = i == 0 ? e1 : e2;
            INFO("request " << i);
            REQUIRE(prompt[i].size() == r.prompt.size() - 1);
            for (size_t pos = 0; pos + 1 < r.prompt.size(); ++pos) {
                INFO("position " << pos);
                const test::RowLogprobs want = test::reference_logprobs(
                    backend,
                    {r.prompt.begin(), r.prompt.begin() + static_cast<std::ptrdiff_t>(pos + 1)});
                const TokenLogprobs& lp = prompt[i][pos];
                CHECK(near_float(lp.logprob, want.logprob[static_cast<size_t>(r.prompt[pos + 1])]));
                REQUIRE(lp.top.size() == *r.logprobs);
                for (size_t j = 0; j < lp.top.size(); ++j) CHECK(lp.top[j].first == want.ranked[j]);
            }
        }
        // Refused: max_tokens 0 without prompt logprobs, prompt logprobs without logprobs.
        CHECK_THROWS_AS(sched.submit(request(p, 0)), Error);
        serve::SequenceRequest bad = request(p, 2);
        bad.prompt_logprobs = true;
        CHECK_THROWS_AS(sched.submit(bad), Error);
        // A scheduler of whole prompts does not serve them.
        serve::SchedulerOptions whole = so;
        whole.whole_prompts = true;
        KvBlockPool other(c, 4);
        Scheduler w(backend, other, whole);
        CHECK(w.submit(e1).refusal == Scheduler::Refusal::unsupported);
    });
}

TEST_CASE("scheduler: prefix reuse gives generate's tokens, at random arrival and across turns",
          "[scheduler]") {
    std::mt19937_64 rng(11);
    on_serve_models("serve-prefix", [&](Backend& backend, const ModelConfig& c,
                                        ThreadPool& threads) {
        {
            // Each prompt one of three starts and a random tail: most take over a kept cache
            // (up to 4); the small pool makes kept caches go back whenever admission needs
            // blocks.
            std::vector<std::vector<int32_t>> starts;
            for (int i = 0; i < 3; ++i) starts.push_back(test::random_ids(rng, 9, c.vocab_size));
            const auto st = random_arrivals_on_pool(backend, c, threads, rng, 4, starts, 12);
            CHECK(st.reused_positions > 0);
            CHECK(st.kept >= 1);
            CHECK(st.kept <= 4);
            CHECK(st.free_blocks < st.total_blocks);  // the kept caches' blocks
        }
        {
            // A conversation's next turn on the backend's own pool (as `serve` runs): the first
            // answer's prompt and tokens, then more. The kept cache holds the first prompt and
            // every answer token but the last (never fed), and takes a second block for the
            // longer sequence.
            constexpr uint64_t P = CpuKvCache::kBlockPositions;
            const uint64_t ctx2 = std::min<uint64_t>(2 * P, c.max_position_embeddings);
            serve::PoolCacheSource caches(backend.new_kv_pool(CpuKvCache::blocks_for(ctx2)));
            serve::SchedulerOptions so{2, ctx2, 8, 16};
            so.kept_caches = 2;
            Scheduler sched(backend, caches, so);
            const auto first = test::random_ids(rng, 5, c.vocab_size);
            const auto answer = run_alone(backend, sched, first, 6);
            REQUIRE(answer.size() == 6);
            CHECK(sched.stats().kept == 1);
            std::vector<int32_t> second = first;
            second.insert(second.end(), answer.begin(), answer.end());
            second.push_back(7);
            const bool two_blocks = caches.total_blocks() == 2;
            run_alone(backend, sched, second, two_blocks ? P : 4);  // 12 + P positions: two blocks
            CHECK(sched.stats().reused_positions == first.size() + answer.size() - 1);
            CHECK(sched.stats().kept == 1);
            if (two_blocks) CHECK(caches.free_blocks() == 0);  // the kept cache holds both
            // A prompt that starts otherwise (one block, where the kept cache holds two) takes
            // a fresh cache, the kept one given back for its block.
            std::vector<int32_t> third = {static_cast<int32_t>(second[0] % (c.vocab_size - 1) + 1),
                                          3, 4};
            run_alone(backend, sched, third, 2);
            CHECK(sched.stats().reused_positions == first.size() + answer.size() - 1);
            CHECK(sched.stats().kept == 1);
        }
        {
            // The next turn's kept cache must grow by a block another kept cache holds: that
            // one goes back, not the one the turn reuses.
            constexpr uint64_t P = CpuKvCache::kBlockPositions;
            if (c.max_position_embeddings < 2 * P) return;
            serve::PoolCacheSource caches(backend.new_kv_pool(2));
            serve::SchedulerOptions so{2, 2 * P, 8, 16};
            so.kept_caches = 2;
            Scheduler sched(backend, caches, so);
            const auto first = test::random_ids(rng, 5, c.vocab_size);
            const auto answer = run_alone(backend, sched, first, 6);
            std::vector<int32_t> other = {static_cast<int32_t>(first[0] % (c.vocab_size - 1) + 1),
                                          5};
            run_alone(backend, sched, other, 2);
            REQUIRE(sched.stats().kept == 2);
            REQUIRE(caches.free_blocks() == 0);  // one block each
            std::vector<int32_t> second = first;
            second.insert(second.end(), answer.begin(), answer.end());
            second.push_back(7);
            run_alone(backend, sched, second, P);  // 12 + P positions: two blocks
            CHECK(sched.stats().reused_positions == first.size() + answer.size() - 1);
            CHECK(sched.stats().kept == 1);
            CHECK(caches.free_blocks() == 0);  // the grown turn's cache, kept
        }
    });
}

TEST_CASE("scheduler: prefix sharing gives generate's tokens, and no shared block is rewritten",
          "[scheduler]") {
    constexpr uint64_t P = CpuKvCache::kBlockPositions;
    std::mt19937_64 rng(13);
    int ran = 0;  // models with room for two blocks' positions (every one here)
    on_serve_models("serve-share", [&](Backend& backend, const ModelConfig& c,
                                       ThreadPool& threads) {
        if (c.max_position_embeddings < 2 * P) return;
        ++ran;
        {
            // 32 requests at random arrival, each prompt one of two starts of P + 12 tokens and
            // a random tail, no kept caches: most start on a running sequence's whole first
            // block; a pool for about three unshared sequences makes some wait.
            std::vector<std::vector<int32_t>> starts;
            for (int i = 0; i < 2; ++i)
                starts.push_back(test::random_ids(rng, P + 12, c.vocab_size));
            KvBlockPool pool(c, 3 * CpuKvCache::blocks_for(P + 12 + 24 + 10));
            serve::SchedulerOptions so{8, 2 * P, 64, 48};
            so.threads = &threads;
            so.share_prefixes = true;
            {
                Scheduler sched(backend, pool, so);
                check_random_arrivals(backend, sched, 32, rng, 24, starts);
                CHECK(sched.stats().shared_positions >= 8 * P);
                CHECK(sched.stats().reused_positions == 0);
            }
            CHECK(pool.free_blocks() == pool.total_blocks());
        }
        {
            // Six requests with one start of P + 12 tokens, submitted together: the first runs
            // its prompt, the others wait for its first block and start on it (the start run
            // once, not six times), each giving generate's tokens.
            const auto start = test::random_ids(rng, P + 12, c.vocab_size);
            KvBlockPool pool(c, 16);
            serve::SchedulerOptions so{8, 2 * P, 64, 16};
            so.share_prefixes = true;
            Scheduler sched(backend, pool, so);
            std::vector<serve::SequenceRequest> reqs;
            std::vector<std::shared_ptr<serve::SequenceStream>> streams;
            for (int i = 0; i < 6; ++i) {
                std::vector<int32_t> prompt = start;
                prompt.push_back(static_cast<int32_t>(1 + i));
                reqs.push_back(request(prompt, 8));
                streams.push_back(sched.submit(reqs.back()).stream);
                REQUIRE(streams.back());
            }
            std::vector<Collected> got(6);
            auto all_done = [&] {
                return std::all_of(got.begin(), got.end(), [](auto& g) { return g.finished; });
            };
            while (!all_done()) {
                sched.step();
                for (size_t i = 0; i < 6; ++i) drain(*streams[i], got[i]);
            }
            CHECK(sched.stats().shared_positions == 5 * P);
            CHECK(sched.stats().step_rows <= (P + 13) + 5 * 13 + 6 * 8);  // prompts' rest, decode
            for (size_t i = 0; i < 6; ++i) {
                GenerateOptions o;
                o.sampling = reqs[i].sampling;
                o.max_new_tokens = 8;
                CHECK(got[i].tokens == generate(backend, reqs[i].prompt, o).tokens);
            }
        }
        {
            // A kept cache whose first block a running sequence shares is not taken over below
            // it: writing there would change that sequence's keys. A's cache (kept) is taken over
            // by B (P + 20 of its positions); C starts on B's first block while B runs (and
            // copies the rest of its start from B's second); B ends (kept, its first block still
            // C's); D's prompt shares 30 positions with B's: it must take a fresh cache (and copy
            // them), and C's tokens stay generate's.
            KvBlockPool pool(c, 16);
            serve::SchedulerOptions so{4, 2 * P, 8, 256};
            so.kept_caches = 4;
            so.share_prefixes = true;
            Scheduler sched(backend, pool, so);
            const auto base = test::random_ids(rng, P + 40, c.vocab_size);
            auto with_tail = [&](uint64_t n) {
                std::vector<int32_t> p(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(n));
                const auto tail = test::random_ids(rng, 5, c.vocab_size);
                p.insert(p.end(), tail.begin(), tail.end());
                return p;
            };
            struct Run {
                serve::SequenceRequest req;
                std::vector<int32_t> want;
                std::shared_ptr<serve::SequenceStream> stream;
                Collected got;
            };
            auto start = [&](std::vector<int32_t> prompt, uint64_t max_tokens) {
                Run r;
                r.req = request(std::move(prompt), max_tokens);
                GenerateOptions o;
                o.sampling = r.req.sampling;
                o.max_new_tokens = max_tokens;
                r.want = generate(backend, r.req.prompt, o).tokens;
                auto sub = sched.submit(r.req);
                REQUIRE(sub.stream);
                r.stream = sub.stream;
                return r;
            };
            auto step = [&](std::vector<Run*> runs) {
                sched.step();
                for (Run* r : runs) drain(*r->stream, r->got);
            };
            Run a = start(base, 4);
            while (!a.got.finished) step({&a});
            CHECK(sched.stats().kept == 1);
            Run b = start(with_tail(P + 20), 30);  // two blocks
            step({&b});
            CHECK(sched.stats().reused_positions == P + 20);  // A taken over
            while (b.got.tokens.empty()) step({&b});
            Run cc = start(with_tail(P + 10), 30);
            step({&b, &cc});
            // B's first block shared, the 10 positions of its second that C's prompt starts
            // with copied into one of C's own.
            CHECK(sched.stats().shared_positions == P + 10);
            while (!b.got.finished) step({&b, &cc});
            REQUIRE_FALSE(cc.got.finished);
            CHECK(sched.stats().kept == 1);    // B's cache, its first block C's too
            Run d = start(with_tail(30), 90);  // as many blocks as B's cache holds
            step({&cc, &d});
            CHECK(sched.stats().reused_positions == P + 20);  // not taken over
            // but its 30 positions copied (no whole block: a fresh cache, then the copy).
            CHECK(sched.stats().shared_positions == P + 10 + 30);
            while (!cc.got.finished || !d.got.finished) step({&cc, &d});
            for (Run* r : {&a, &b, &cc, &d}) CHECK(r->got.tokens == r->want);
        }
        {
            // Caches the backend makes whole (no pool, so nothing to share or extend): a start
            // shorter than a block is still copied from the running sequence, and the request
            // runs at once (it used to wait on an extend such a source cannot do).
            serve::BackendCacheSource caches(backend, 4 * CpuKvCache::blocks_for(P));
            serve::SchedulerOptions so{4, P, 8, 64};
            so.share_prefixes = true;
            Scheduler sched(backend, caches, so);
            const auto base = test::random_ids(rng, 20, c.vocab_size);
            auto first = sched.submit(request(base, 12));
            REQUIRE(first.stream);
            sched.step();  // its prompt
            auto tail = base;
            tail.resize(14);
            tail.push_back(3);
            auto second = sched.submit(request(tail, 6));
            REQUIRE(second.stream);
            Collected g1, g2;
            for (int i = 0; i < 40 && !(g1.finished && g2.finished); ++i) {
                sched.step();
                drain(*first.stream, g1);
                drain(*second.stream, g2);
            }
            REQUIRE(g2.finished);
            CHECK(sched.stats().shared_positions == 14);
            GenerateOptions o;
            o.sampling = {0.0f, 0, 1.0f, 1};
            o.max_new_tokens = 6;
            CHECK(g2.tokens == generate(backend, tail, o).tokens);
        }
    });
    CHECK(ran >= 1);
}

TEST_CASE("scheduler: admission waits for blocks, the queue bound refuses, cancel frees at once",
          "[scheduler]") {
    test::ScratchDir dir("serve-admission");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(1);
    auto backend = make_cpu_backend(model, threads);
    constexpr uint64_t P = CpuKvCache::kBlockPositions;
    KvBlockPool pool(model.config(), 4);  // 4 P positions
    constexpr uint64_t ctx = 5 * P;       // more than the pool: `huge` is refused for the pool
    static_assert(ctx <= 512, "stories260K's context");
    Scheduler sched(*backend, pool, {4, ctx, 3, 16});

    // Too large for the whole pool, or a prompt longer than the context: refused for good.
    auto huge = sched.submit(request(std::vector<int32_t>(10, 1), 4 * P));
    CHECK(huge.refusal == Scheduler::Refusal::too_large);
    auto long_prompt = sched.submit(request(std::vector<int32_t>(ctx + 1, 1), 1));
    CHECK(long_prompt.refusal == Scheduler::Refusal::too_large);
    CHECK_THROWS_AS(sched.submit(request({}, 1)), Error);
    CHECK_THROWS_AS(sched.submit(request({1}, 0)), Error);

    // Several at once (an API request's prompts): all or none. More than the queue's bound is
    // refused for good; one that submit would refuse refuses them all, its index named; nothing
    // is queued then.
    auto many = sched.submit_all(std::vector<serve::SequenceRequest>(4, request({1}, 1)));
    CHECK(many.refusal == Scheduler::Refusal::too_many);
    CHECK(many.streams.empty());
    std::vector<serve::SequenceRequest> mixed{request({1}, 1), request({2}, 1),
                                              request(std::vector<int32_t>(ctx + 1, 1), 1)};
    auto bad = sched.submit_all(std::move(mixed));
    CHECK(bad.refusal == Scheduler::Refusal::too_large);
    CHECK(bad.refused == 2);
    CHECK(bad.streams.empty());
    CHECK(sched.stats().queued == 0);

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
    auto two = sched.submit_all({request({8}, 1), request({9}, 1)});
    CHECK(two.refusal == Scheduler::Refusal::queue_full);
    CHECK(two.streams.empty());
    CHECK(sched.stats().queued == 3);
    {
        // Where one request would be taken, several are, all of them, past the bound: a stream
        // of single requests never starves them. Then the queue is full.
        KvBlockPool other_pool(model.config(), 4);
        Scheduler other(*backend, other_pool, {4, ctx, 3, 16});
        REQUIRE(other.submit(request({1}, 1)).stream);
        REQUIRE(other.submit(request({2}, 1)).stream);
        auto three = other.submit_all({request({3}, 1), request({4}, 1), request({5}, 1)});
        CHECK(three.refusal == Scheduler::Refusal::none);
        CHECK(three.streams.size() == 3);
        CHECK(other.stats().queued == 5);
        CHECK(other.submit(request({6}, 1)).refusal == Scheduler::Refusal::queue_full);
    }
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
    test::HookedBackend backend(make_cpu_backend(model, threads), [&](auto) {
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

TEST_CASE("scheduler: a non-finite logits row ends its request alone, sampled on two threads",
          "[scheduler]") {
    test::ScratchDir dir("serve-nonfinite");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(2);
    // b's tokens alone, then a and b together with a's third row NaN.
    const std::vector<int32_t> pa{1, 2, 3}, pb{4, 5, 6, 7};
    auto run = [&](bool with_a) {
        const KvCache* a_cache = nullptr;
        int a_rows = 0;
        test::HookedBackend backend(
            make_cpu_backend(model, threads), [&](std::span<const BatchSequence> batch) {
                for (const BatchSequence& b : batch)
                    if (std::equal(b.tokens.begin(), b.tokens.end(), pa.begin(), pa.end()))
                        a_cache = b.cache;
            });
        backend.set_after_step([&](std::span<const BatchSequence> batch, std::span<float> rows) {
            const uint64_t vocab = model.config().vocab_size;
            uint64_t row = 0;
            for (const BatchSequence& b : batch) {
                if (!b.logits) continue;
                if (b.cache == a_cache && ++a_rows == 3)
                    std::fill_n(rows.begin() + static_cast<std::ptrdiff_t>(row * vocab), vocab,
                                std::numeric_limits<float>::quiet_NaN());
                ++row;
            }
        });
        KvBlockPool pool(model.config(), 16);
        serve::SchedulerOptions so{4, 64, 8, 16};
        so.threads = &threads;
        Scheduler sched(backend, pool, so);
        auto b = sched.submit(request(pb, 8));
        auto a = with_a ? sched.submit(request(pa, 8)) : Scheduler::Submitted{};
        while (sched.step()) {
        }
        Collected got_a, got_b;
        if (a.stream) drain(*a.stream, got_a);
        drain(*b.stream, got_b);
        CHECK(pool.free_blocks() == pool.total_blocks());
        return std::pair{got_a, got_b};
    };
    const auto [none, alone] = run(false);
    const auto [a, b] = run(true);
    CHECK(a.finished);
    CHECK(a.reason == FinishReason::error);
    CHECK(a.error.find("not finite") != std::string::npos);
    CHECK(a.tokens.size() == 2);
    CHECK(b.reason == FinishReason::length);
    CHECK(b.tokens == alone.tokens);
}

TEST_CASE("scheduler over per-sequence backend caches, whole prompts: generate's tokens (CPU)",
          "[scheduler]") {
    // The host side of CUDA serving, on the CPU backend.
    test::ScratchDir dir("serve-per-sequence");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(2);
    check_per_sequence_serving(make_cpu_backend(model, threads), 21);

    // The budget: a request needing more blocks than it holds is refused for good, one that fits
    // waits until blocks come back.
    auto backend = make_cpu_backend(model, threads);
    serve::BackendCacheSource caches(*backend, 2);
    CHECK(caches.take(3 * CpuKvCache::kBlockPositions) == nullptr);
    auto a = caches.take(CpuKvCache::kBlockPositions + 1);
    REQUIRE(a);
    CHECK(caches.free_blocks() == 0);
    CHECK(caches.take(1) == nullptr);
    caches.give_back(std::move(a));
    CHECK(caches.free_blocks() == 2);
    constexpr uint64_t P = CpuKvCache::kBlockPositions;
    Scheduler sched(*backend, caches, {4, 4 * P, 8, 16});
    // Within the context, but three blocks against the source's two.
    CHECK(sched.submit(request({1, 2}, 2 * P)).refusal == Scheduler::Refusal::too_large);

    // A source that fails (a device out of memory): that request ends with an error at
    // admission, the one behind it runs.
    struct FailingOnce final : serve::KvCacheSource {
        explicit FailingOnce(serve::KvCacheSource& source) : inner(source) {}
        std::unique_ptr<KvCache> take(uint64_t positions) override {
            if (!failed) {
                failed = true;
                throw Error("out of device memory");
            }
            return inner.take(positions);
        }
        void give_back(std::unique_ptr<KvCache> c) override { inner.give_back(std::move(c)); }
        uint64_t free_blocks() const override { return inner.free_blocks(); }
        uint64_t total_blocks() const override { return inner.total_blocks(); }
        serve::KvCacheSource& inner;
        bool failed = false;
    } failing(caches);
    Scheduler sched2(*backend, failing, {4, 64, 8, 16});
    auto x = sched2.submit(request({1, 2}, 3));
    auto y = sched2.submit(request({1, 2}, 3));
    REQUIRE(x.stream);
    REQUIRE(y.stream);
    Collected got_x, got_y;
    while (sched2.step()) drain(*y.stream, got_y);
    drain(*x.stream, got_x);
    drain(*y.stream, got_y);
    CHECK(got_x.reason == FinishReason::error);
    CHECK(got_x.tokens.empty());
    CHECK(got_y.reason == FinishReason::length);
    CHECK(got_y.tokens.size() == 3);
    CHECK(caches.free_blocks() == caches.total_blocks());
}

TEST_CASE("scheduler on the CUDA backend (per-sequence caches, whole prompts): generate's tokens",
          "[scheduler][cuda]") {
#ifndef QFORGE_HAVE_CUDA
    QF_SKIP("no CUDA device: qforge was built without CUDA");
#else
    std::string why;
    if (list_gpus(&why).empty()) QF_SKIP("no CUDA device: " + why);
    test::ScratchDir dir("serve-cuda");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    check_per_sequence_serving(make_cuda_backend(model), 22);
#endif
}

}  // namespace serve_scheduler_test
