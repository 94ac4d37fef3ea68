// The batched forward (Backend::forward_batch, runtime/batch_forward.cpp): sequences arriving at
// random steps, their prompts cut into random chunks, mixed in random order with other
// sequences' decode tokens, each give exactly the logits they give alone through forward().
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "core/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/paged_kv_cache.hpp"
#include "runtime/sampling.hpp"
#include "runtime/thread_pool.hpp"
#include "serve_models.hpp"

namespace batch_forward_test {

using namespace qforge;

namespace {

constexpr uint64_t kNew = 6;  // tokens generated per sequence

struct Sequence {
    std::vector<int32_t> prompt;
    uint64_t arrival = 0;                  // the step it joins
    std::vector<std::vector<float>> want;  // alone: logits after the prompt, then per token
    std::vector<int32_t> tokens;           // greedy choices alone
    // The batched run's state.
    std::unique_ptr<PagedKvCache> cache;
    uint64_t fed = 0;  // prompt tokens run
    std::vector<int32_t> got;
};

// Alone, as generate runs it: the prompt as one batch, then greedy decode.
void run_alone(Backend& b, Sequence& s) {
    const uint64_t v = b.model().config().vocab_size;
    auto cache = b.new_cache(s.prompt.size() + kNew);
    std::vector<float> logits(v);
    b.forward(s.prompt, *cache, s.prompt.size() - 1, logits);
    for (uint64_t i = 0; i < kNew; ++i) {
        s.want.push_back(logits);
        s.tokens.push_back(argmax(logits));
        if (i + 1 < kNew) b.forward({&s.tokens.back(), 1}, *cache, 0, logits);
    }
}

}  // namespace

TEST_CASE("batched forward: each sequence's logits are bit-identical alone and in any batch",
          "[batch]") {
    test::ScratchDir dir("batch-forward");
    // Alone on 2 threads with the default split threshold (short steps run on the calling
    // thread); batched on 1 or 3 threads with every region split, so the attention tasks of
    // several sequences share chunks and threads in ever different ways.
    const int batch_threads = GENERATE(1, 3);
    const KvType kv = GENERATE(KvType::f32, KvType::f16);
    INFO("batched on " << batch_threads << " threads, KV cache " << kv_type_name(kv));
    ThreadPool alone_threads(2), threads(batch_threads);
    CpuBackendOptions options;
    options.min_parallel_work = 0;
    options.kv_type = kv;
    std::mt19937_64 rng(11 + static_cast<uint64_t>(batch_threads));
    int checked = 0;
    for (const auto& m : test::serve_models(dir)) {
        INFO(m.name);
        Model model(m.path);
        const ModelConfig& c = model.config();
        const uint64_t v = c.vocab_size;
        auto alone = make_cpu_backend(model, alone_threads, {.kv_type = kv});
        auto backend = make_cpu_backend(model, threads, options);
        std::vector<Sequence> seqs(7);
        const uint64_t longest = std::min<uint64_t>(40, c.max_position_embeddings - kNew);
        for (auto& s : seqs) {
            s.prompt = test::random_ids(rng, 1 + rng() % longest, v);
            s.arrival = rng() % 6;
            run_alone(*alone, s);
        }
        KvBlockPool pool(c, seqs.size() * CpuKvCache::blocks_for(longest + kNew), kv);
        uint64_t step = 0, rows_max = 0;
        while (std::any_of(seqs.begin(), seqs.end(),
                           [](const Sequence& s) { return s.got.size() < kNew; })) {
            std::vector<BatchSequence> batch;
            std::vector<Sequence*> wants;
            for (auto& s : seqs) {
                if (s.arrival > step || s.got.size() == kNew) continue;
                if (!s.cache) {
                    s.cache = std::make_unique<PagedKvCache>(pool, s.prompt.size() + kNew);
                    REQUIRE(s.cache->reserve(s.prompt.size() + kNew));
                }
                if (s.fed < s.prompt.size()) {  // a random chunk of the prompt
                    const uint64_t left = s.prompt.size() - s.fed;
                    const uint64_t chunk = 1 + rng() % left;
                    batch.push_back(
                        {std::span(s.prompt).subspan(s.fed, chunk), s.cache.get(), chunk == left});
                    s.fed += chunk;
                } else {  // decode the last token chosen
                    batch.push_back({std::span(s.got).last(1), s.cache.get(), true});
                }
                if (batch.back().logits) wants.push_back(&s);
            }
            // Random order within the step (the logits rows follow it).
            std::vector<size_t> order(batch.size());
            for (size_t i = 0; i < order.size(); ++i) order[i] = i;
            std::shuffle(order.begin(), order.end(), rng);
            std::vector<BatchSequence> shuffled;
            std::vector<Sequence*> shuffled_wants;
            for (size_t i : order) shuffled.push_back(batch[i]);
            for (size_t i : order)
                if (batch[i].logits)
                    for (auto* s : wants)
                        if (s->cache.get() == batch[i].cache) shuffled_wants.push_back(s);
            std::vector<float> logits(shuffled_wants.size() * v);
            uint64_t rows = 0;
            for (const auto& b : shuffled) rows += b.tokens.size();
            rows_max = std::max(rows_max, rows);
            backend->forward_batch(shuffled, logits);
            for (size_t i = 0; i < shuffled_wants.size(); ++i) {
                Sequence& s = *shuffled_wants[i];
                const float* row = logits.data() + i * v;
                const auto& want = s.want[s.got.size()];
                REQUIRE(std::memcmp(row, want.data(), v * sizeof(float)) == 0);
                s.got.push_back(argmax({row, v}));
            }
            ++step;
        }
        for (const auto& s : seqs) CHECK(s.got == s.tokens);
        CHECK(rows_max > 1);  // some step did batch rows of several sequences
        seqs.clear();
        CHECK(pool.free_blocks() == pool.total_blocks());
        ++checked;
    }
    CHECK(checked >= 6);
}

TEST_CASE("batched forward: every row's logits (all_logits) are forward()'s rows, bit for bit",
          "[batch]") {
    test::ScratchDir dir("batch-all-logits");
    ThreadPool threads(2);
    std::mt19937_64 rng(23);
    for (const auto& m : test::serve_models(dir)) {
        INFO(m.name);
        Model model(m.path);
        const uint64_t v = model.config().vocab_size;
        auto alone = make_cpu_backend(model, threads);
        // The CPU backend's batched step, and Backend's default (each sequence through forward()).
        auto cpu = make_cpu_backend(model, threads);
        test::HookedBackend per_sequence(make_cpu_backend(model, threads), {}, true);
        for (Backend* b : {cpu.get(), static_cast<Backend*>(&per_sequence)}) {
            INFO((b == cpu.get() ? "batched" : "per sequence"));
            // A: 20 prompt tokens in chunks of 12 and 8, every row wanted; B: 9 tokens, its last
            // row, then a decode token beside A's second chunk.
            const auto a = test::random_ids(rng, 20, v), bp = test::random_ids(rng, 9, v);
            std::vector<float> want_a(20 * v), want_b(v), want_b2(v);
            {
                auto ca = alone->new_cache(32), cb = alone->new_cache(32);
                alone->forward(a, *ca, 0, want_a);
                alone->forward(bp, *cb, 8, want_b);
                const int32_t next[] = {7};
                alone->forward(next, *cb, 0, want_b2);
            }
            auto ca = b->new_cache(32), cb = b->new_cache(32);
            std::vector<float> got(13 * v);
            const BatchSequence step1[] = {{std::span(a).first(12), ca.get(), true, true},
                                           {bp, cb.get(), true}};
            b->forward_batch(step1, got);
            CHECK(std::memcmp(got.data(), want_a.data(), 12 * v * sizeof(float)) == 0);
            CHECK(std::memcmp(got.data() + 12 * v, want_b.data(), v * sizeof(float)) == 0);
            const int32_t next[] = {7};
            std::vector<float> got2(9 * v);
            const BatchSequence step2[] = {{next, cb.get(), true},
                                           {std::span(a).subspan(12), ca.get(), true, true}};
            b->forward_batch(step2, got2);
            CHECK(std::memcmp(got2.data(), want_b2.data(), v * sizeof(float)) == 0);
            CHECK(std::memcmp(got2.data() + v, want_a.data() + 12 * v, 8 * v * sizeof(float)) == 0);
            // The logits span must hold every wanted row.
            std::vector<float> short_rows(v);
            auto cc = b->new_cache(32);
            const BatchSequence bad[] = {{std::span(a).first(3), cc.get(), true, true}};
            CHECK_THROWS_AS(b->forward_batch(bad, short_rows), Error);
        }
    }
}

TEST_CASE("batched forward refuses bad batches before touching a cache", "[batch]") {
    test::ScratchDir dir("batch-forward-bad");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    ThreadPool threads(1);
    auto backend = make_cpu_backend(model, threads);
    const uint64_t v = model.config().vocab_size;
    auto a = backend->new_cache(8), b = backend->new_cache(2);
    const int32_t three[] = {1, 2, 3}, bad[] = {static_cast<int32_t>(v)};
    std::vector<float> one(v), two(2 * v);
    // The same cache twice; a sequence past its cache; an id outside the vocabulary; logits of
    // the wrong size: each an Error, and no cache grows.
    const BatchSequence twice[] = {{three, a.get(), true}, {three, a.get(), true}};
    CHECK_THROWS_AS(backend->forward_batch(twice, two), Error);
    const BatchSequence full[] = {{three, a.get(), true}, {three, b.get(), true}};
    CHECK_THROWS_AS(backend->forward_batch(full, two), Error);
    const BatchSequence oov[] = {{three, a.get(), true}, {bad, b.get(), true}};
    CHECK_THROWS_AS(backend->forward_batch(oov, two), Error);
    const BatchSequence ok[] = {{three, a.get(), true}};
    CHECK_THROWS_AS(backend->forward_batch(ok, two), Error);
    CHECK(a->size() == 0);
    CHECK(b->size() == 0);
    backend->forward_batch(ok, one);
    CHECK(a->size() == 3);
}

TEST_CASE("batched forward: a step's parallel regions do not grow with its sequences", "[batch]") {
    // Attention of every sequence in a step is one region (after the RoPE and cache-write region),
    // as are the norms, products and output head: a step of 6 decoding sequences wakes the pool
    // as often as a step of one.
    test::ScratchDir dir("batch-forward-regions");
    QF_REQUIRE_SHARED_DATA(data);
    Model model(test::convert_stories(data, "hf", dir).string());
    const uint64_t v = model.config().vocab_size;
    ThreadPool threads(2);
    CpuBackendOptions options;
    options.min_parallel_work = 0;
    auto backend = make_cpu_backend(model, threads, options);
    KvBlockPool pool(model.config(), 6 * CpuKvCache::blocks_for(16));
    std::vector<std::unique_ptr<PagedKvCache>> caches;
    std::vector<int32_t> ids(6);
    for (size_t i = 0; i < ids.size(); ++i) {
        caches.push_back(std::make_unique<PagedKvCache>(pool, 16));
        REQUIRE(caches.back()->reserve(16));
        ids[i] = static_cast<int32_t>(1 + i);
    }
    auto regions_of_step = [&](size_t n) {
        std::vector<BatchSequence> batch;
        for (size_t i = 0; i < n; ++i) batch.push_back({{&ids[i], 1}, caches[i].get(), true});
        std::vector<float> logits(n * v);
        const uint64_t before = threads.regions();
        backend->forward_batch(batch, logits);
        return threads.regions() - before;
    };
    const uint64_t one = regions_of_step(1);
    CHECK(one > 0);
    CHECK(regions_of_step(6) == one);
    CHECK(regions_of_step(3) == one);
}

}  // namespace batch_forward_test
