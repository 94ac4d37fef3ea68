// HessianAccumulator: float32 products of fixed chunks of rows in fixed tiles (OpenBLAS ssyrk on
// the diagonal, sgemm elsewhere), summed in float64 (quant/hessian.hpp explains why this is
// deterministic and accurate enough).
#include "quant/hessian.hpp"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/checked_math.hpp"
#include "core/error.hpp"
#include "kernels/cpu/isa.hpp"
#include "runtime/thread_pool.hpp"

namespace qforge {

// OpenBLAS's run-time kernel choice (driver/others/dynamic.c), exported by DYNAMIC_ARCH builds
// only: weak, so that another build links and keeps its kernels.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace {

// The level of OpenBLAS's x86 kernel sets, by the names openblas_get_corename() gives; any other
// name counts as below avx2 (Prescott, Core2, Nehalem, Sandybridge, ...).
Isa blas_kernel_level(std::string_view name) {
    for (const char* n : {"SkylakeX", "Cooperlake", "SapphireRapids"})
        if (name == n) return Isa::avx512;
    for (const char* n : {"Haswell", "Zen"})
        if (name == n) return Isa::avx2;
    return Isa::scalar;
}

std::string choose_blas_kernels() {
    const char* chosen = openblas_get_corename();
    const std::string name = chosen ? chosen : "";
    const Isa want = cpu_isa();
    if (std::getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit ||
        blas_kernel_level(name) >= want)
        return name;
    // dynamic.c reads OPENBLAS_CORETYPE when it chooses; the variable is removed again so that
    // child processes choose for themselves.
    setenv("OPENBLAS_CORETYPE", want == Isa::avx512 ? "SkylakeX" : "Haswell", 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    chosen = openblas_get_corename();
    return chosen ? chosen : "";
}

}  // namespace

std::string blas_kernels() {
    static const std::string name = choose_blas_kernels();
    return name;
}

std::string blas_kernels_notice() {
    const char* forced = std::getenv("OPENBLAS_CORETYPE");
    const std::string name = blas_kernels();
    if (!forced || blas_kernel_level(name) >= cpu_isa()) return {};
    return "OPENBLAS_CORETYPE=" + std::string(forced) + " keeps OpenBLAS on its " + name +
           " kernels, below this CPU's " + std::string(isa_name(cpu_isa())) +
           " level: calibration runs slower (unset it to let qforge choose)";
}

BlasSingleThread::BlasSingleThread() : saved_(openblas_get_num_threads()) {
    blas_kernels();
    openblas_set_num_threads(1);
}
BlasSingleThread::~BlasSingleThread() { openblas_set_num_threads(saved_); }

HessianAccumulator::HessianAccumulator(uint64_t k, ThreadPool* pool, CalibProducts products,
                                       bool mean_abs)
    : k_(k),
      chunk_rows_(products == CalibProducts::bf16 && bf16_dot_available() &&
                          bf16_kernel() == Bf16Kernel::amx
                      ? kHessianChunkAmx
                      : kHessianChunk),
      pool_(pool),
      products_(products) {
    if (products == CalibProducts::bf16 && !bf16_dot_available())
        throw Error(
            "Hessian: bf16 products need the avx512 level and AVX-512 BF16; this process "
            "runs " +
            cpu_isa_description());
    if (k == 0) throw Error("Hessian: a layer with no inputs");
    const auto kk = checked_mul(k, k);
    const auto chunk = checked_mul(chunk_rows_, k);
    if (!kk || !chunk || k > static_cast<uint64_t>(std::numeric_limits<int>::max()))
        throw Error("Hessian: " + std::to_string(k) + " inputs are too many for BLAS");
    chunk_.assign(*chunk, 0.0f);
    sum_.assign(*kk, 0.0);
    if (mean_abs) abs_sum_.assign(k, 0.0);
}

void HessianAccumulator::add(const float* x, uint64_t n) {
    if (finished_) throw Error("Hessian: rows added after finish()");
    // Each channel's sum over the rows in order, the channels in a few contiguous parts (each
    // streams along the rows) that threads claim.
    const uint64_t parts = abs_sum_.empty() ? 0
                           : pool_ ? std::min<uint64_t>(static_cast<uint64_t>(pool_->size()), k_)
                                   : 1;
    auto part = [&](size_t p) {
        const uint64_t c0 = k_ * p / parts, c1 = k_ * (p + 1) / parts;
        double* acc = abs_sum_.data();
        for (uint64_t r = 0; r < n; ++r) {
            const float* row = x + r * k_;
            for (uint64_t c = c0; c < c1; ++c) acc[c] += std::fabs(static_cast<double>(row[c]));
        }
    };
    run_chunks(pool_, parts, part);
    // Whole chunks are multiplied where the caller holds them, the rest goes through the chunk
    // buffer; the products pack their operands first, so a chunk's product does not depend on
    // where its rows are (the test of split add() calls checks it).
    while (n > 0) {
        if (buffered_ == 0 && n >= chunk_rows_) {
            const uint64_t chunks = n / chunk_rows_;
            multiply_chunks(x, chunks, chunk_rows_);
            count_ += chunks * chunk_rows_;
            x += chunks * chunk_rows_ * k_;
            n -= chunks * chunk_rows_;
            continue;
        }
        const uint64_t take = std::min(n, chunk_rows_ - buffered_);
        std::memcpy(chunk_.data() + buffered_ * k_, x, take * k_ * sizeof(float));
        buffered_ += take;
        count_ += take;
        x += take * k_;
        n -= take;
        if (buffered_ == chunk_rows_) flush_chunk();
    }
}

void HessianAccumulator::flush_chunk() {
    if (buffered_ == 0) return;
    multiply_chunks(chunk_.data(), 1, buffered_);
    buffered_ = 0;
}

namespace {

// Tile p of the upper triangle's tiles of `side` inputs a side, in row order: (bi, bj), bj >= bi.
std::pair<uint64_t, uint64_t> upper_tile(uint64_t p, uint64_t tiles) {
    uint64_t bi = 0, first = 0;  // pair index of (bi, bi)
    while (p >= first + (tiles - bi)) first += tiles - bi++;
    return {bi, bi + (p - first)};
}

// Adds to tile (bi, bj) of sum (k x k, float64, row-major) the float32 products product(c, out)
// writes into out ([ni][nj], row i0 + i, column j0 + j) for chunks c = 0 .. chunks - 1 in order,
// their upper triangle only on the diagonal; the tile's float64 sum stays in cache meanwhile.
template <class Product>
void add_tile_products(std::vector<double>& sum, uint64_t k, uint64_t side, uint64_t bi,
                       uint64_t bj, uint64_t chunks, Product&& product) {
    const uint64_t i0 = bi * side, j0 = bj * side;
    const uint64_t ni = std::min(side, k - i0), nj = std::min(side, k - j0);
    thread_local std::vector<float> tile;
    thread_local std::vector<double> acc;
    tile.resize(ni * nj);
    acc.resize(ni * nj);
    for (uint64_t i = 0; i < ni; ++i)
        std::copy_n(sum.data() + (i0 + i) * k + j0, nj, acc.data() + i * nj);
    for (uint64_t c = 0; c < chunks; ++c) {
        product(c, i0, ni, j0, nj, tile.data());
        for (uint64_t i = 0; i < ni; ++i) {
            double* s = acc.data() + i * nj;
            const float* t = tile.data() + i * nj;
            for (uint64_t j = bi == bj ? i : 0; j < nj; ++j) s[j] += static_cast<double>(t[j]);
        }
    }
    for (uint64_t i = 0; i < ni; ++i)
        std::copy_n(acc.data() + i * nj, nj, sum.data() + (i0 + i) * k + j0);
}

}  // namespace

// Tile by tile (the tiles spread over the threads), the chunks' float32 products added to the
// tile's float64 sum in chunk order, as one chunk at a time would.
void HessianAccumulator::multiply_chunks(const float* x, uint64_t chunks, uint64_t rows) {
    if (products_ == CalibProducts::bf16) {
        multiply_chunks_bf16(x, chunks, rows);
        return;
    }
    const uint64_t tiles = (k_ + kHessianTile - 1) / kHessianTile;
    const uint64_t pairs = tiles * (tiles + 1) / 2;  // tiles (bi, bj) with bj >= bi
    const int k = static_cast<int>(k_), n = static_cast<int>(rows);
    auto product = [&](uint64_t c, uint64_t i0, uint64_t ni, uint64_t j0, uint64_t nj,
                       float* tile) {
        const float* a = x + c * rows * k_ + i0;
        if (i0 == j0)
            cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(ni), n, 1.0f, a, k,
                        0.0f, tile, static_cast<int>(nj));
        else
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(ni),
                        static_cast<int>(nj), n, 1.0f, a, k, x + c * rows * k_ + j0, k, 0.0f, tile,
                        static_cast<int>(nj));
    };
    auto run = [&](size_t begin, size_t end) {
        for (size_t p = begin; p < end; ++p) {
            const auto [bi, bj] = upper_tile(p, tiles);
            add_tile_products(sum_, k_, kHessianTile, bi, bj, chunks, product);
        }
    };
    BlasSingleThread single;
    parallel_for(pool_, pairs, run);
}

// bf16: runs of chunks (their packed columns within about 32 MB): each chunk's columns packed
// once (channels as rows, the chunk's rows as pairs), then tile by tile, as above, the chunks'
// Gram products added to the tile's float64 sum in chunk order. Every task's outputs depend on
// the rows alone, so threads claim tasks as they come free.
void HessianAccumulator::multiply_chunks_bf16(const float* x, uint64_t chunks, uint64_t rows) {
    const uint64_t tiles = (k_ + kHessianTileBf16 - 1) / kHessianTileBf16;
    const uint64_t pairs = tiles * (tiles + 1) / 2;
    const uint64_t run = std::clamp<uint64_t>((uint64_t{32} << 20) / (k_ * rows * 2), 1, 64);
    for (uint64_t c0 = 0; c0 < chunks; c0 += run) {
        const uint64_t nc = std::min(run, chunks - c0);
        // The chunks' buffers outlive the accumulator, one set a thread (the next layer's H
        // reuses them: fresh ones faulted in 70 MB of pages each time).
        thread_local std::vector<Bf16PackedRows> buffers;
        std::vector<Bf16PackedRows>& packed = buffers;  // this thread's, in the tasks too
        if (packed.size() < nc) packed.resize(nc);
        for (uint64_t c = 0; c < nc; ++c)
            if (packed[c].rows() != k_ || packed[c].k() != rows)  // AMX reads rows in place
                packed[c].reshape(k_, rows, bf16_kernel() == Bf16Kernel::amx);
        run_chunks(pool_, nc, [&](size_t c) {
            packed[c].pack_columns(x + (c0 + c) * rows * k_, k_, 0, packed[c].tiles());
        });
        run_chunks(pool_, pairs, [&](size_t p) {
            const auto [bi, bj] = upper_tile(p, tiles);
            add_tile_products(
                sum_, k_, kHessianTileBf16, bi, bj, nc,
                [&](uint64_t c, uint64_t i0, uint64_t ni, uint64_t j0, uint64_t nj, float* tile) {
                    // tile[i][j] = column j0 + j . column i0 + i
                    bf16_gram(packed[c], j0, j0 + nj, i0, i0 + ni, tile, nj);
                });
        });
    }
}

HessianStats HessianAccumulator::finish() {
    if (finished_) throw Error("Hessian: finish() called twice");
    if (count_ == 0) throw Error("Hessian: no calibration rows were added");
    flush_chunk();
    finished_ = true;
    HessianStats st;
    st.k = k_;
    st.count = count_;
    const double scale = 2.0 / static_cast<double>(count_);
    st.h = std::move(sum_);
    // The upper triangle scaled row by row, each row's first non-finite entry noted; then the
    // lower triangle mirrored from it in square blocks (a column-wise copy of a 1536-wide H
    // missed the cache on every write: 1 s of GPTQ's main thread on SmolLM2-135M).
    double* h = st.h.data();
    const uint64_t k = k_;
    std::vector<uint64_t> bad(k, UINT64_MAX);
    constexpr uint64_t kMirror = 64;
    const uint64_t blocks = (k + kMirror - 1) / kMirror;
    auto scale_rows = [&](size_t b) {  // the upper triangle's rows of block row b
        for (uint64_t i = b * kMirror; i < std::min(k, (b + 1) * kMirror); ++i)
            for (uint64_t j = i; j < k; ++j) {
                h[i * k + j] *= scale;
                if (!std::isfinite(h[i * k + j]) && bad[i] == UINT64_MAX) bad[i] = j;
            }
    };
    auto mirror = [&](size_t bi) {  // block row bi of the lower triangle
        for (uint64_t bj = 0; bj <= bi; ++bj)
            for (uint64_t i = bi * kMirror; i < std::min(k, (bi + 1) * kMirror); ++i)
                for (uint64_t j = bj * kMirror; j < std::min(i, (bj + 1) * kMirror); ++j)
                    h[i * k + j] = h[j * k + i];
    };
    // Block rows claimed as threads come free (the triangle's rows differ in length).
    run_chunks(pool_, blocks, scale_rows);
    for (uint64_t i = 0; i < k; ++i)
        if (bad[i] != UINT64_MAX)
            throw Error("Hessian: calibration inputs " + std::to_string(i) + " and " +
                        std::to_string(bad[i]) + " give a non-finite product");
    run_chunks(pool_, blocks, mirror);
    st.mean_abs.resize(abs_sum_.size());
    for (uint64_t c = 0; c < abs_sum_.size(); ++c)
        st.mean_abs[c] = abs_sum_[c] / static_cast<double>(count_);
    chunk_ = {};
    return st;
}

namespace {

void symm_right_lower(int m, int k, const double* h, const double* s, double* hs) {
    cblas_dsymm(CblasRowMajor, CblasRight, CblasLower, m, k, 1.0, h, k, s, k, 0.0, hs, k);
}
void symm_right_lower(int m, int k, const float* h, const float* s, float* hs) {
    cblas_ssymm(CblasRowMajor, CblasRight, CblasLower, m, k, 1.0f, h, k, s, k, 0.0f, hs, k);
}

template <class T>
std::vector<double> quadratic_forms_of(const T* h, uint64_t k, uint64_t rows, uint64_t forms,
                                       ThreadPool* pool,
                                       const std::function<void(uint64_t, T*)>& fill) {
    const uint64_t batches = (rows + kQuadraticRows - 1) / kQuadraticRows;
    std::vector<double> per_row(rows * forms);
    auto run = [&](size_t bb, size_t be) {
        std::vector<T> s, hs;
        for (uint64_t b = bb; b < be; ++b) {
            const uint64_t r0 = b * kQuadraticRows, m = std::min(kQuadraticRows, rows - r0) * forms;
            s.resize(m * k);
            hs.resize(m * k);
            for (uint64_t r = r0; r < r0 + m / forms; ++r) fill(r, s.data() + (r - r0) * forms * k);
            symm_right_lower(static_cast<int>(m), static_cast<int>(k), h, s.data(), hs.data());
            for (uint64_t i = 0; i < m; ++i) {
                double acc = 0.0;
                for (uint64_t j = 0; j < k; ++j)
                    acc += static_cast<double>(s[i * k + j]) * static_cast<double>(hs[i * k + j]);
                per_row[r0 * forms + i] = acc;
            }
        }
    };
    parallel_for(pool, batches, run);
    std::vector<double> total(forms, 0.0);
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t f = 0; f < forms; ++f) total[f] += per_row[r * forms + f];
    return total;
}

}  // namespace

std::vector<double> quadratic_forms(const double* h, uint64_t k, uint64_t rows, uint64_t forms,
                                    ThreadPool* pool,
                                    const std::function<void(uint64_t, double*)>& fill) {
    return quadratic_forms_of(h, k, rows, forms, pool, fill);
}

std::vector<double> quadratic_forms_f32(const float* h, uint64_t k, uint64_t rows, uint64_t forms,
                                        ThreadPool* pool,
                                        const std::function<void(uint64_t, float*)>& fill) {
    return quadratic_forms_of(h, k, rows, forms, pool, fill);
}

// ---------------------------------------------------------------------------------------------
// inverse_cholesky_upper
//
// GPTQ needs U, upper with H^-1 = U^T U. The usual route (Cholesky of H, its inverse, Cholesky of
// the inverse) costs k^3 * 4/3 flops. Cheaper and without forming H^-1: with J the order-reversing
// permutation, factor M = J H J = L L^T (L lower); then H = (J L J)(J L J)^T with J L J upper, so
// H^-1 = U^T U for U = (J L J)^-1 = J L^-1 J, upper with a positive diagonal: the same unique
// factor, for k^3 * 2/3 flops. Reversing a row-major array's elements maps (i, j) to
// (k-1-i, k-1-j): it is J . J, and it turns the untouched lower triangle into an upper one. So
// the array is reversed, M's lower triangle is factored and inverted in place, and the array is
// reversed back, leaving U in the upper triangle and H in the lower one.
//
// Both steps run on fixed kFactorTile x kFactorTile tiles (row-major, leading dimension k), each
// tile operation one single-threaded BLAS/LAPACK call, tiles of a step spread over the threads
// round-robin; every tile sees the same sequence of operations whatever the thread count.
// LAPACK is called column-major: a row-major lower tile is a column-major upper one.
// ---------------------------------------------------------------------------------------------

namespace {

// Calls f(task) for task in [0, n), round-robin over the pool's threads (or on the caller).
template <class F>
void for_each_task(ThreadPool* pool, size_t n, F&& f) {
    if (!pool || n <= 1) {
        for (size_t i = 0; i < n; ++i) f(i);
        return;
    }
    const auto threads = static_cast<size_t>(pool->size());
    pool->run([&](int t) {
        for (size_t i = static_cast<size_t>(t); i < n; i += threads) f(i);
    });
}

struct Tiles {
    double* a;
    uint64_t k, n;  // matrix size, tiles per side
    double* at(uint64_t i, uint64_t j) const { return a + i * kFactorTile * k + j * kFactorTile; }
    int size(uint64_t i) const {
        return static_cast<int>(std::min(kFactorTile, k - i * kFactorTile));
    }
    int ld() const { return static_cast<int>(k); }
};

// Right-looking tiled Cholesky of the row-major lower triangle: M = L L^T, L in its place.
bool tiled_cholesky(const Tiles& t, ThreadPool* pool) {
    for (uint64_t kk = 0; kk < t.n; ++kk) {
        const int nk = t.size(kk);
        if (LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', nk, t.at(kk, kk), t.ld()) != 0) return false;
        const uint64_t below = t.n - kk - 1;
        for_each_task(pool, below, [&](size_t task) {  // L_ik = A_ik L_kk^-T
            const uint64_t i = kk + 1 + task;
            cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, t.size(i),
                        nk, 1.0, t.at(kk, kk), t.ld(), t.at(i, kk), t.ld());
        });
        // A_ij -= L_ik L_jk^T for kk < j <= i: pairs (i, j) numbered row by row.
        for_each_task(pool, below * (below + 1) / 2, [&](size_t task) {
            uint64_t i = kk + 1, first = 0;
            while (task >= first + (i - kk)) first += i++ - kk;
            const uint64_t j = kk + 1 + (task - first);
            if (i == j)
                cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, t.size(i), nk, -1.0,
                            t.at(i, kk), t.ld(), 1.0, t.at(i, i), t.ld());
            else
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t.size(i), t.size(j), nk, -1.0,
                            t.at(i, kk), t.ld(), t.at(j, kk), t.ld(), 1.0, t.at(i, j), t.ld());
        });
    }
    return true;
}

// Tiled inverse of the row-major lower triangle, in place, column of tiles by column of tiles
// from the last (LAPACK dtrtri's order): X_jj = L_jj^-1, then for i > j
// X_ij = -(sum_{m=j+1..i} X_im L_mj) X_jj, which reads the already inverted columns m > j and
// this column's L, so the new column goes to `scratch` first and is copied in afterwards.
bool tiled_inverse(const Tiles& t, ThreadPool* pool) {
    std::vector<double> scratch(t.k * kFactorTile);
    for (uint64_t jj = t.n; jj-- > 0;) {
        const int nj = t.size(jj);
        if (LAPACKE_dtrtri(LAPACK_COL_MAJOR, 'U', 'N', nj, t.at(jj, jj), t.ld()) != 0) return false;
        const uint64_t below = t.n - jj - 1;
        auto slot = [&](uint64_t i) {
            return scratch.data() + (i - jj - 1) * kFactorTile * kFactorTile;
        };
        for_each_task(pool, below, [&](size_t task) {
            const uint64_t i = jj + 1 + task;
            const int ni = t.size(i);
            double* y = slot(i);  // [ni][nj], leading dimension nj
            for (int r = 0; r < ni; ++r)
                std::memcpy(y + static_cast<size_t>(r) * nj,
                            t.at(i, jj) + static_cast<uint64_t>(r) * t.k,
                            static_cast<size_t>(nj) * sizeof(double));
            cblas_dtrmm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, ni, nj,
                        1.0, t.at(i, i), t.ld(), y, nj);  // X_ii L_ij
            for (uint64_t m = jj + 1; m < i; ++m)
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, nj, t.size(m), 1.0,
                            t.at(i, m), t.ld(), t.at(m, jj), t.ld(), 1.0, y, nj);
            cblas_dtrmm(CblasRowMajor, CblasRight, CblasLower, CblasNoTrans, CblasNonUnit, ni, nj,
                        -1.0, t.at(jj, jj), t.ld(), y, nj);
        });
        for (uint64_t i = jj + 1; i < t.n; ++i) {
            const int ni = t.size(i);
            for (int r = 0; r < ni; ++r)
                std::memcpy(t.at(i, jj) + static_cast<uint64_t>(r) * t.k,
                            slot(i) + static_cast<size_t>(r) * nj,
                            static_cast<size_t>(nj) * sizeof(double));
        }
    }
    return true;
}

}  // namespace

bool inverse_cholesky_upper(double* a, uint64_t k, const std::vector<double>& diag, double add,
                            ThreadPool* pool) {
    if (k > static_cast<uint64_t>(std::numeric_limits<int>::max()))
        throw Error("GPTQ: " + std::to_string(k) + " inputs are too many for LAPACK");
    for (uint64_t i = 0; i < k; ++i) {
        a[i * k + i] = diag[i] + add;
        for (uint64_t j = i + 1; j < k; ++j) a[i * k + j] = a[j * k + i];
    }
    const BlasSingleThread single;
    const Tiles t{a, k, (k + kFactorTile - 1) / kFactorTile};
    std::reverse(a, a + k * k);
    const bool ok = tiled_cholesky(t, pool) && tiled_inverse(t, pool);
    std::reverse(a, a + k * k);
    if (!ok) return false;
    for (uint64_t i = 0; i < k; ++i) {
        const double d = a[i * k + i];
        if (!std::isfinite(d) || !(d > 0.0)) return false;
    }
    return true;
}

}  // namespace qforge
