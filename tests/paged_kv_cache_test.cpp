// The paged KV cache (runtime/paged_kv_cache.hpp): the block pool's allocation, exhaustion and
// release, and the logits of sequences whose blocks are scattered over a fragmented pool against
// the contiguous cache's, bit for bit.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include <bit>
#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/float_dot.hpp"
#include "kernels/cuda/kv_layout.hpp"
#include "runtime/backend.hpp"
#include "runtime/paged_kv_cache.hpp"
#include "runtime/thread_pool.hpp"
#include "serve_models.hpp"

namespace paged_kv_cache_test {

using namespace qforge;

namespace {

ModelConfig tiny_config() {
    ModelConfig c;
    c.num_layers = 2;
    c.hidden_size = 8;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 4;
    return c;
}

// The first serve model with room for `positions` positions, its CPU backend (one thread) and a
// pool of `blocks` blocks of the backend's.
struct PoolOnModel {
    PoolOnModel(const char* scratch, uint64_t positions, uint64_t blocks)
        : dir(scratch), model(path_with_room(dir, positions)) {
        backend = make_cpu_backend(model, threads);
        pool = backend->new_kv_pool(blocks);
    }
    static std::string path_with_room(const test::ScratchDir& dir, uint64_t positions) {
        for (const auto& m : test::serve_models(dir))
            if (Model(m.path).config().max_position_embeddings >= positions) return m.path;
        throw Error("no serve model has room for " + std::to_string(positions) + " positions");
    }
    test::ScratchDir dir;
    ThreadPool threads{1};
    Model model;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<KvPool> pool;
};

}  // namespace

TEST_CASE("KV block pool: exhaustion takes nothing, release returns, double release refused",
          "[paged]") {
    KvBlockPool pool(tiny_config(), 5);
    CHECK(pool.block_bytes() == 2 * 2 * CpuKvCache::kBlockPositions * 4 * sizeof(float));
    auto a = pool.allocate(3);
    REQUIRE(a);
    CHECK(*a == std::vector<uint32_t>{0, 1, 2});
    CHECK(pool.free_blocks() == 2);
    CHECK_FALSE(pool.allocate(3));  // all or nothing
    CHECK(pool.free_blocks() == 2);
    auto b = pool.allocate(2);
    REQUIRE(b);
    CHECK_FALSE(pool.allocate(1));
    pool.release(*a);
    CHECK(pool.free_blocks() == 3);
    CHECK_THROWS_AS(pool.release(*a), Error);  // returned twice
    const uint32_t stray[] = {7};
    CHECK_THROWS_AS(pool.release(stray), Error);  // never in the pool
    pool.release(*b);
    CHECK(pool.free_blocks() == 5);
    CHECK_THROWS_AS(KvBlockPool(tiny_config(), 0), Error);
    CHECK(KvBlockPool(tiny_config(), 1, KvType::f16).block_bytes() * 2 == pool.block_bytes());
}

TEST_CASE(
    "KV cache rows: f32 kept exactly, f16 rounded to nearest even once (beyond its range "
    "clamped and counted)",
    "[paged]") {
    ModelConfig c = tiny_config();
    c.num_kv_heads = 2;
    c.num_heads = 4;
    c.head_dim = 20;  // two 8-wide vectors and a tail
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    const uint64_t kvd = c.kv_dim(), n = 2 * CpuKvCache::kBlockPositions + 3;
    std::vector<float> k(n * kvd), v(n * kvd);
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    k[5] = 70000.0f;  // past f16's range: clamped to 65504 (and counted), not made infinite
    v[9] = -1e30f;
    v[7] = 1e-7f;  // an f16 subnormal
    for (KvType type : {KvType::f32, KvType::f16}) {
        CpuKvCache cache(c, n, type);
        uint64_t clamped = 0;
        for (uint64_t layer = 0; layer < c.num_layers; ++layer)
            for (uint64_t p = 0; p < n; ++p)
                clamped += cache.store(layer, p, k.data() + p * kvd, v.data() + p * kvd);
        CHECK(clamped == (type == KvType::f16 ? 2 * c.num_layers : 0));
        auto want = [&](float x) {
            if (type == KvType::f32) return x;
            return std::fabs(x) > 65504.0f ? std::copysign(65504.0f, x) : f16_to_f32(f32_to_f16(x));
        };
        // Each run's stored rows (the bytes the attention kernels read), widened here.
        auto stored = [&](uint64_t layer, uint64_t which, uint64_t h, uint64_t p, uint64_t run) {
            const Ahead at = cache.stored(layer, which, h, p, run);
            std::vector<float> rows(run * c.head_dim);
            if (type == KvType::f32) {
                std::memcpy(rows.data(), at.at, at.bytes);
            } else {
                const auto* halves = static_cast<const uint16_t*>(at.at);
                for (size_t i = 0; i < rows.size(); ++i) rows[i] = f16_to_f32(halves[i]);
            }
            REQUIRE(at.bytes == rows.size() * (type == KvType::f32 ? 4 : 2));
            return rows;
        };
        for (uint64_t layer = 0; layer < c.num_layers; ++layer)
            for (uint64_t h = 0; h < c.num_kv_heads; ++h)
                for (uint64_t p = 0; p < n; p += CpuKvCache::run_from(p)) {
                    const uint64_t run = std::min(n - p, CpuKvCache::run_from(p));
                    // Rows read back, against the floats stored (`from`, kv_dim apart).
                    auto check = [&](const std::vector<float>& got,
                                     const std::vector<float>& from) {
                        for (uint64_t j = 0; j < run; ++j)
                            for (uint64_t i = 0; i < c.head_dim; ++i)
                                REQUIRE(std::bit_cast<uint32_t>(got[j * c.head_dim + i]) ==
                                        std::bit_cast<uint32_t>(
                                            want(from[(p + j) * kvd + h * c.head_dim + i])));
                    };
                    check(stored(layer, 0, h, p, run), k);
                    check(stored(layer, 1, h, p, run), v);
                }
    }
}

TEST_CASE("float_row_to_f32: every binary16 value at every level is core/half.hpp's float",
          "[paged]") {
    std::vector<uint16_t> all(65536 + 5);
    for (uint64_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);
    for (uint64_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    for (Isa isa : cpu_isa_levels()) {
        INFO(isa_name(isa));
        std::vector<float> out(all.size());
        float_row_to_f32(isa, QType::f16, reinterpret_cast<const uint8_t*>(all.data()), out.data(),
                         all.size());
        for (uint64_t i = 0; i < all.size(); ++i) {
            const float want = f16_to_f32(all[i]);
            if (std::isnan(want)) {
                REQUIRE(std::isnan(out[i]));
                continue;
            }
            REQUIRE(std::bit_cast<uint32_t>(out[i]) == std::bit_cast<uint32_t>(want));
        }
    }
}

TEST_CASE("paged KV cache: reserve all or none, blocks back on release and destruction",
          "[paged]") {
    constexpr uint64_t P = CpuKvCache::kBlockPositions;
    KvBlockPool pool(tiny_config(), 4);
    {
        PagedKvCache one(pool, 3 * P);
        CHECK(one.capacity() == 0);
        CHECK(one.reserve(P + 1));  // two blocks
        CHECK(one.blocks_held() == 2);
        CHECK(one.capacity() == 2 * P);
        CHECK(one.reserve(2 * P));  // already held
        CHECK(pool.free_blocks() == 2);
        CHECK_THROWS_AS(one.reserve(3 * P + 1), Error);  // past its limit

        PagedKvCache two(pool, 4 * P);
        CHECK_FALSE(two.reserve(3 * P));  // only two free: nothing taken
        CHECK(two.blocks_held() == 0);
        CHECK(pool.free_blocks() == 2);
        CHECK(two.reserve(2 * P));
        CHECK(pool.free_blocks() == 0);
        one.release();  // a finished or cancelled sequence
        CHECK(one.capacity() == 0);
        CHECK(pool.free_blocks() == 2);
        CHECK(one.reserve(P));
        // extend: a higher limit, within the blocks held (capacity follows), then past the free
        // ones (nothing changes), then with blocks taken.
        PagedKvCache grown(pool, P / 2);
        REQUIRE(grown.reserve(P / 2));
        CHECK(grown.capacity() == P / 2);
        CHECK(grown.extend(P));
        CHECK(grown.capacity() == P);
        CHECK(grown.blocks_held() == 1);
        CHECK(pool.free_blocks() == 0);
        CHECK_FALSE(grown.extend(P + 1));
        CHECK(grown.limit() == P);
        CHECK(grown.capacity() == P);
        two.release();
        CHECK(grown.extend(3 * P));
        CHECK(grown.capacity() == 3 * P);
        CHECK(grown.blocks_held() == 3);
    }
    CHECK(pool.free_blocks() == 4);  // no leak: the destructors returned the rest
    {
        // A destructor never throws, even over blocks someone else returned: an exception out
        // of it would terminate the process (as it did while a failing test unwound).
        PagedKvCache three(pool, 2 * P);
        REQUIRE(three.reserve(2 * P));
        auto others = pool.allocate(2);
        REQUIRE(others);
        std::vector<uint32_t> threes;  // the blocks not in `others`
        for (uint32_t id = 0; id < 4; ++id)
            if (std::find(others->begin(), others->end(), id) == others->end())
                threes.push_back(id);
        pool.release(*others);
        pool.release(threes);  // three's blocks, returned behind its back
        CHECK(pool.free_blocks() == 4);
    }
    CHECK(pool.free_blocks() == 4);  // nothing returned twice
}

TEST_CASE("KV block pool: shared ids go back with their last holder", "[paged]") {
    BlockIds ids(3);
    auto got = ids.allocate(2);
    REQUIRE(got);
    ids.share(*got);
    CHECK(ids.shared((*got)[0]));
    ids.release(*got);
    CHECK(ids.free() == 1);
    CHECK_FALSE(ids.shared((*got)[0]));
    ids.release(*got);
    CHECK(ids.free() == 3);
    CHECK_THROWS_AS(ids.release(*got), Error);
    CHECK_THROWS_AS(ids.share(*got), Error);  // never shared once free
}

TEST_CASE("cpu backend's KV pool: a cache on another's shared blocks gives the same logits",
          "[paged]") {
    const uint64_t P = CpuKvCache::kBlockPositions;
    PoolOnModel m("paged-share", 2 * P, 8);
    const uint64_t v = m.model.config().vocab_size;
    std::mt19937_64 rng(5);
    // a runs P + 5 positions; b starts on a's first block and runs its own rest of a different
    // sequence with the same start: b's logits are those of a fresh cache that ran it all, bit
    // for bit, before and after a is gone.
    const auto start = test::random_ids(rng, P + 5, v);
    auto tail = test::random_ids(rng, 9, v);
    std::vector<int32_t> b_ids(start.begin(), start.begin() + P);
    b_ids.insert(b_ids.end(), tail.begin(), tail.end());
    std::vector<float> logits(v), want(v), got(v);
    auto a = m.pool->take(2 * P);
    REQUIRE(a);
    m.backend->forward(start, *a, start.size() - 1, logits);
    CHECK_THROWS_AS(m.pool->share(*a, P + 5, 2 * P), Error);  // not whole blocks
    CHECK_THROWS_AS(m.pool->share(*a, 2 * P, 2 * P), Error);  // past a's positions
    auto b = m.pool->share(*a, P, 2 * P);
    REQUIRE(b);
    CHECK(b->size() == P);
    CHECK(m.pool->free_blocks() == 6);  // nothing taken yet
    CHECK(m.pool->shared_from(*a, P - 1));
    CHECK_FALSE(m.pool->shared_from(*a, P));  // a's second block is its own
    REQUIRE(m.pool->extend(*b, 2 * P));
    CHECK(m.pool->free_blocks() == 5);
    CHECK_FALSE(m.pool->shared_from(*b, P));
    auto whole = m.backend->new_cache(2 * P);
    m.backend->forward(b_ids, *whole, b_ids.size() - 1, want);
    m.backend->forward(tail, *b, tail.size() - 1, got);
    CHECK(std::memcmp(got.data(), want.data(), v * sizeof(float)) == 0);
    // a gone: its own block back, the shared one b's alone; b decodes on as the fresh cache.
    a.reset();
    CHECK(m.pool->free_blocks() == 6);
    CHECK_FALSE(m.pool->shared_from(*b, 0));
    const int32_t next[] = {static_cast<int32_t>(rng() % v)};
    m.backend->forward(next, *whole, 0, want);
    m.backend->forward(next, *b, 0, got);
    CHECK(std::memcmp(got.data(), want.data(), v * sizeof(float)) == 0);
    b.reset();
    CHECK(m.pool->free_blocks() == 8);
}

TEST_CASE("KV cache: positions copied from another cache give a fresh cache's logits bit for bit",
          "[paged]") {
    const uint64_t P = CpuKvCache::kBlockPositions;
    std::mt19937_64 rng(9);
    for (KvType type : {KvType::f32, KvType::f16}) {
        INFO(kv_type_name(type));
        test::ScratchDir dir("paged-copy");
        Model model(PoolOnModel::path_with_room(dir, 2 * P));
        ThreadPool threads(1);
        auto backend = make_cpu_backend(model, threads, {.kv_type = type});
        const uint64_t v = model.config().vocab_size;
        KvBlockPool pool(model.config(), 8, type);
        // a runs P + 20 positions; b shares its first block and copies 13 of the next (from a
        // partly filled block, into one of b's own), then runs a tail of its own: b's logits are
        // those of a fresh cache that ran it all, bit for bit, and a's are untouched.
        const auto start = test::random_ids(rng, P + 20, v);
        auto tail = test::random_ids(rng, 7, v);
        std::vector<int32_t> b_ids(start.begin(), start.begin() + P + 13);
        b_ids.insert(b_ids.end(), tail.begin(), tail.end());
        std::vector<float> want(v), got(v);
        auto a = std::make_unique<PagedKvCache>(pool, 2 * P);
        REQUIRE(a->reserve(2 * P));
        backend->forward(start, *a, start.size() - 1, got);
        auto b = share_paged(pool, *a, P, 2 * P);
        REQUIRE(b->extend(2 * P));
        CHECK_THROWS_AS(b->append_copy(*a, P + 21), Error);  // past a's positions
        CpuKvCache other_type(model.config(), 2 * P,
                              type == KvType::f32 ? KvType::f16 : KvType::f32);
        CHECK_THROWS_AS(b->append_copy(other_type, P), Error);
        CHECK(b->size() == P);  // nothing changed
        b->append_copy(*a, P + 13);
        CHECK(b->size() == P + 13);
        auto whole = backend->new_cache(2 * P);
        backend->forward(b_ids, *whole, b_ids.size() - 1, want);
        backend->forward(tail, *b, tail.size() - 1, got);
        CHECK(std::memcmp(got.data(), want.data(), v * sizeof(float)) == 0);
        // A cache of its own storage copies from the pooled one too (positions from 0), and a's
        // positions are as they were: its next token's logits are a fresh run's.
        CpuKvCache own(model.config(), 2 * P, type);
        own.append_copy(*a, P + 20);
        const int32_t next[] = {static_cast<int32_t>(rng() % v)};
        std::vector<int32_t> a_ids = start;
        a_ids.push_back(next[0]);
        auto fresh = backend->new_cache(2 * P);
        backend->forward(a_ids, *fresh, a_ids.size() - 1, want);
        backend->forward(next, own, 0, got);
        CHECK(std::memcmp(got.data(), want.data(), v * sizeof(float)) == 0);
        backend->forward(next, *a, 0, got);
        CHECK(std::memcmp(got.data(), want.data(), v * sizeof(float)) == 0);
    }
}

TEST_CASE("paged KV cache in a fragmented pool gives the contiguous cache's logits bit for bit",
          "[paged]") {
    test::ScratchDir dir("paged-kv");
    ThreadPool threads(2);
    CpuBackendOptions options;
    options.min_parallel_work = 0;  // split every region over both threads
    options.kv_type = GENERATE(KvType::f32, KvType::f16);
    INFO("KV cache " << kv_type_name(options.kv_type));
    std::mt19937_64 rng(7);
    int checked = 0;
    for (const auto& m : test::serve_models(dir)) {
        INFO(m.name);
        Model model(m.path);
        const ModelConfig& c = model.config();
        auto backend = make_cpu_backend(model, threads, options);
        const uint64_t n =
            std::min<uint64_t>(3 * CpuKvCache::kBlockPositions + 5, c.max_position_embeddings);
        const auto ids = test::random_ids(rng, n, c.vocab_size);
        const uint64_t prompt = n / 2, v = c.vocab_size;

        // Prefill half, decode the rest one token at a time, every position's logits kept.
        auto run = [&](KvCache& cache) {
            std::vector<float> logits(n * v);
            backend->forward(std::span(ids).first(prompt), cache, 0,
                             std::span(logits).first(prompt * v));
            for (uint64_t t = prompt; t < n; ++t)
                backend->forward(std::span(ids).subspan(t, 1), cache, 0,
                                 std::span(logits).subspan(t * v, v));
            return logits;
        };
        auto contiguous = backend->new_cache(n);
        const auto want = run(*contiguous);

        // Fragment the pool: interleave the sequence's blocks with another's, free the other's.
        KvBlockPool pool(c, 2 * CpuKvCache::blocks_for(n) + 1, options.kv_type);
        PagedKvCache seq(pool, n);
        {
            PagedKvCache other(pool, n);
            for (uint64_t p = 1; p <= n; p += CpuKvCache::kBlockPositions) {
                REQUIRE(other.reserve(p));
                REQUIRE(seq.reserve(p));
            }
            REQUIRE(seq.reserve(n));
        }
        const auto got = run(seq);
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        seq.release();
        CHECK(pool.free_blocks() == pool.total_blocks());
        ++checked;
    }
    CHECK(checked >= 6);
}

TEST_CASE("CUDA paged KV layout: a block's rows tile it in layer, keys-values, position order",
          "[paged]") {
    // kernels/cuda/kv_layout.hpp's offsets against the layout spelled out element by element:
    // block after block, in each its layers, in each the keys then the values, in each the
    // positions, each kv_dim halves.
    for (const uint32_t shift : {0u, 2u, 6u})
        for (const uint64_t kv_dim : {uint64_t{4}, uint64_t{192}}) {
            const uint64_t layers = 3, per = uint64_t{1} << shift;
            const uint64_t halves = cuda::paged_block_halves(layers, shift, kv_dim);
            REQUIRE(halves == layers * 2 * per * kv_dim);
            uint64_t next = 0;  // the next row's offset in the enumeration
            for (uint32_t block = 0; block < 3; ++block)
                for (uint32_t layer = 0; layer < layers; ++layer)
                    for (uint32_t which = 0; which < 2; ++which)
                        for (uint64_t i = 0; i < per; ++i) {
                            // A sequence whose block table puts `block` at table entry 5: its
                            // positions 5 * per + i.
                            const uint64_t pos = 5 * per + i;
                            INFO("shift " << shift << " kv_dim " << kv_dim << " block " << block
                                          << " layer " << layer << " which " << which << " i "
                                          << i);
                            REQUIRE(cuda::paged_row_offset(block, halves, layer, which, pos, shift,
                                                           kv_dim) == next);
                            next += kv_dim;
                        }
            REQUIRE(next == 3 * halves);
        }
}

TEST_CASE("cpu backend's KV pool: caches of the positions asked, all or none, blocks back",
          "[paged]") {
    const uint64_t per = CpuKvCache::kBlockPositions;
    PoolOnModel m("paged-pool", 2 * per, 3);
    auto& backend = m.backend;
    auto& pool = m.pool;
    const Model& model = m.model;
    CHECK(pool->total_blocks() == 3);
    auto a = pool->take(per + 1);  // two blocks
    REQUIRE(a);
    CHECK(a->capacity() == per + 1);
    CHECK(pool->free_blocks() == 1);
    CHECK_FALSE(pool->take(per + 1));  // all or none
    CHECK(pool->free_blocks() == 1);
    auto b = pool->take(per);
    REQUIRE(b);
    CHECK(pool->free_blocks() == 0);
    a.reset();
    CHECK(pool->free_blocks() == 2);
    b.reset();
    CHECK(pool->free_blocks() == 3);
    // Positions outside 1 .. max_position_embeddings: an Error, nothing taken (new_cache's
    // bounds, and the CUDA pool's).
    CHECK_THROWS_WITH(pool->take(0), Catch::Contains("outside 1 .. max_position_embeddings"));
    CHECK_THROWS_WITH(pool->take(model.config().max_position_embeddings + 1),
                      Catch::Contains("outside 1 .. max_position_embeddings"));
    CHECK(pool->free_blocks() == 3);
    // Its caches run as new_cache's do.
    auto paged = pool->take(per + 3);
    REQUIRE(paged);
    auto whole = backend->new_cache(per + 3);
    const uint64_t v = model.config().vocab_size;
    std::mt19937_64 rng(3);
    const auto ids = test::random_ids(rng, per + 3, v);
    std::vector<float> want(v), got(v);
    backend->forward(ids, *whole, per + 2, want);
    backend->forward(ids, *paged, per + 2, got);
    CHECK(std::memcmp(got.data(), want.data(), v * sizeof(float)) == 0);
}

}  // namespace paged_kv_cache_test
