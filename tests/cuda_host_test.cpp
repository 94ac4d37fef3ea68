// The host side of the CUDA kernels, on the CPU (no GPU needed, built with or without CUDA): the
// qtype support table, the GPU row layout and repack, the __host__ __device__ dequantization
// helpers against dequantize_row_ref (bit for bit, exhaustively where the domain is small), and
// the tiling and dispatch plans.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "formats/qtype.hpp"
#include "kernels/cuda/dequant.hpp"
#include "kernels/cuda/gpu_format.hpp"
#include "kernels/cuda/plans.hpp"
#include "runtime/backend_factory.hpp"

namespace cuda_host_test {

using namespace qforge;
using namespace qforge::cuda;

namespace {

// The qtypes the CUDA kernels read (kCudaQTypes' supported rows), all or the quantized ones.
std::vector<QType> supported_types(bool quantized_only = false) {
    std::vector<QType> v;
    for (const auto& row : kQTypes)
        if (cuda_qtype_row(row.type).supported && !(quantized_only && row.is_float))
            v.push_back(row.type);
    return v;
}

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Weights of mixed magnitude, some exactly zero, so groups see every kind of range.
std::vector<float> some_weights(uint64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> w(n);
    for (uint64_t i = 0; i < n; ++i) {
        w[i] = dist(rng) * (i % 7 == 0 ? 10.0f : 0.5f);
        if (i % 13 == 5) w[i] = 0.0f;
    }
    return w;
}

constexpr uint64_t kLengths[] = {1, 31, 32, 33, 45, 100, 128, 200, 576, 1000, 4096};

}  // namespace

TEST_CASE("every qtype has a CUDA row consistent with the qtype table", "[cuda_host]") {
    for (const auto& tr : kQTypes) {
        const CudaQTypeRow& row = cuda_qtype_row(tr.type);
        INFO(tr.name);
        REQUIRE(row.type == tr.type);
        if (!row.supported) continue;
        if (tr.is_float) {
            REQUIRE_FALSE(row.tensor_core_gemm);
            REQUIRE(row.kind == (tr.dtype == DType::f32   ? WeightKind::f32
                                 : tr.dtype == DType::f16 ? WeightKind::f16
                                                          : WeightKind::bf16));
        } else {
            // A carried qtype takes its carrier's family; the carrier carries itself.
            const QTypeTraits& held = qtype_traits(row.carrier);
            REQUIRE(row.kind == (held.bits == 4 ? WeightKind::q4 : WeightKind::q8));
            REQUIRE(cuda_qtype_row(row.carrier).carrier == row.carrier);
            REQUIRE(row.tensor_core_gemm == cuda_qtype_row(row.carrier).tensor_core_gemm);
            REQUIRE(held.group == tr.group);
        }
    }
}

// Rows the GPU does not hold as the file's bytes: carried qtypes (3-bit as 4-bit, level types as
// 8-bit codes) and super rows (q4k, and q3k carried as q4k; f32 scales and mins). Rows from the
// reference quantizer, repacked, dequantize chunk by chunk as the kernels do (dequant_quant_chunk)
// to dequantize_row_ref's floats bit for bit; past k a super row holds -min (code 0, which meets
// zero activations only), the others zero.
TEST_CASE("carried qtypes and super rows hold the file's values exactly", "[cuda_host]") {
    int carried = 0, super = 0;
    for (const auto& tr : kQTypes) {
        const CudaQTypeRow& row = cuda_qtype_row(tr.type);
        if (!row.supported || tr.is_float) continue;
        const bool is_super = qtype_has_super_blocks(tr.type);
        if (row.carrier == tr.type && !is_super) continue;
        carried += row.carrier != tr.type;
        super += is_super;
        for (uint64_t k : kLengths) {
            INFO(tr.name << " k " << k);
            const GpuMatrixFormat f = gpu_matrix_format(tr.type, k);
            REQUIRE(f.qtype == row.carrier);
            REQUIRE(f.source == tr.type);
            REQUIRE(f.repacked());
            REQUIRE(f.super_rows == is_super);
            REQUIRE(f.file_row_bytes == *qtype_row_bytes(tr.type, k));
            REQUIRE(f.row_bytes % 64 == 0);
            const auto w = some_weights(k, static_cast<uint32_t>(k) + 3);
            std::vector<uint8_t> src(*qtype_row_bytes(tr.type, k));
            REQUIRE(quantize_row_ref(tr.type, w.data(), k, src.data()) == QuantStatus::ok);
            std::vector<uint8_t> gpu(2 * f.row_bytes, 0xee);
            repack_rows_for_gpu(f, src.data(), src.size(), 1, gpu.data());
            REQUIRE(gpu[f.row_bytes] == 0xee);  // nothing past the row is written
            std::vector<float> want(k);
            dequantize_row_ref(tr.type, src.data(), k, want.data());
            for (uint64_t c = 0; c < f.chunks; ++c) {
                float out[32];
                dequant_quant_chunk(gpu.data(), qtype_traits(f.qtype).bits, c, f.chunks_per_group,
                                    f.scales_offset, f.zeros_offset, f.has_zeros, f.zero, out,
                                    f.super_rows ? f.mins_offset : 0);
                for (uint64_t i = 0; i < 32; ++i) {
                    const uint64_t j = 32 * c + i;
                    if (j < k)
                        REQUIRE(bits_of(out[i]) == bits_of(want[j]));
                    else if (is_super)
                        REQUIRE(out[i] == -row_group_min(tr.type, src.data(), k, c));
                    else
                        REQUIRE(out[i] == 0.0f);
                }
            }
            if (is_super) continue;
            // Carried rows are the carrier's .qf rows: the integers the int8 products use are
            // the code levels and zeros.
            const int8_t* levels = row_levels(tr.type, src.data(), k);
            for (uint64_t j = 0; j < k; ++j)
                REQUIRE(row_code(row.carrier, gpu.data(), j) ==
                        qtype_code_level(tr.type, row_code(tr.type, src.data(), j), levels));
            for (uint64_t b = *qtype_row_bytes(row.carrier, k); b < f.row_bytes; ++b)
                REQUIRE(gpu[b] == 0);
            REQUIRE_THROWS_AS(transcode_row(tr.type, src.data(), k, tr.type, gpu.data()), Error);
        }
    }
    REQUIRE(carried == 5);  // q3_g32, q3_g128, q3k_g32, q4nl_g32, q4t_g32
    REQUIRE(super == 2);    // q4k_g32, q3k_g32
    // A matrix large enough to be repacked on several threads equals its rows repacked alone.
    for (QType t : {QType::q4k_g32, QType::q3_g32}) {
        const uint64_t k = 4096, rows = 600;
        const GpuMatrixFormat f = gpu_matrix_format(t, k);
        std::vector<uint8_t> src(rows * f.file_row_bytes);
        for (uint64_t r = 0; r < rows; ++r) {
            const auto w = some_weights(k, static_cast<uint32_t>(r) + 11);
            REQUIRE(quantize_row_ref(t, w.data(), k, src.data() + r * f.file_row_bytes) ==
                    QuantStatus::ok);
        }
        std::vector<uint8_t> all(rows * f.row_bytes), one(f.row_bytes);
        repack_rows_for_gpu(f, src.data(), f.file_row_bytes, rows, all.data());
        for (uint64_t r = 0; r < rows; r += 37) {
            repack_rows_for_gpu(f, src.data() + r * f.file_row_bytes, f.file_row_bytes, 1,
                                one.data());
            REQUIRE(std::memcmp(one.data(), all.data() + r * f.row_bytes, f.row_bytes) == 0);
        }
    }
}

// Every qtype of formats/qtype.hpp runs on CUDA now (some carried, kCudaQTypes); a row marked
// unsupported would be refused by name.
TEST_CASE("qtypes without CUDA kernels throw UnsupportedOnCuda naming the qtype", "[cuda_host]") {
    uint64_t unsupported = 0;
    for (const auto& tr : kQTypes) {
        if (cuda_qtype_row(tr.type).supported) continue;
        ++unsupported;
        INFO(tr.name);
        REQUIRE_FALSE(cuda_qtype_row(tr.type).tensor_core_gemm);
        for (uint64_t k : {uint64_t{1}, uint64_t{128}, uint64_t{4096}})
            REQUIRE_THROWS_WITH(
                gpu_matrix_format(tr.type, k),
                "unsupported on CUDA: qtype " + std::string(tr.name) + " has no CUDA kernels");
    }
    REQUIRE(unsupported == 0);
}

TEST_CASE("GPU row layout follows the .qf layout, float rows pad to whole chunks", "[cuda_host]") {
    for (QType t : supported_types()) {
        const QTypeTraits& tr = qtype_traits(t);
        for (uint64_t k : kLengths) {
            INFO(tr.name << " k " << k);
            const GpuMatrixFormat f = gpu_matrix_format(tr.type, k);
            REQUIRE(f.kpad % 32 == 0);
            REQUIRE(f.kpad >= k);
            REQUIRE(f.kpad < k + 32);
            REQUIRE(f.chunks * 32 == f.kpad);
            REQUIRE(f.row_bytes % 64 == 0);
            REQUIRE(f.file_row_bytes == *qtype_row_bytes(tr.type, k));
            REQUIRE(f.chunks * f.chunk_bytes() <= f.row_bytes);
            // carried or super rows: the carrier's layout (the test below)
            if (f.source != f.qtype || f.super_rows) continue;
            if (tr.is_float) {
                REQUIRE(f.row_bytes == round_up(f.kpad * tr.bits / 8, 64));
                REQUIRE(f.repacked() == (f.row_bytes != k * tr.bits / 8));
            } else {
                const QRowLayout l = *qtype_row_layout(tr.type, k);
                // .qf rows are packed tight; the GPU stride pads them to 64 bytes.
                REQUIRE(f.row_bytes == round_up(l.row_bytes, 64));
                REQUIRE(f.repacked() == (f.row_bytes != l.row_bytes));
                REQUIRE(f.scales_offset == l.scales_offset);
                REQUIRE(f.chunks * f.chunk_bytes() == l.codes_bytes);
                REQUIRE(f.has_zeros == !tr.symmetric);
                if (f.has_zeros) REQUIRE(f.zeros_offset == l.zeros_offset);
                REQUIRE(f.chunks_per_group * 32 == (tr.group ? tr.group : f.kpad));
            }
        }
    }
}

TEST_CASE("unsupported shapes throw UnsupportedOnCuda", "[cuda_host]") {
    REQUIRE_THROWS_AS(gpu_matrix_format(QType::q4_g128, 0), UnsupportedOnCuda);
    REQUIRE_THROWS_AS(gpu_matrix_format(QType::f16, kMaxGpuDim + 1), UnsupportedOnCuda);
    REQUIRE_THROWS_WITH(gpu_matrix_format(QType::q8, 0), Catch::Contains("unsupported on CUDA"));
    REQUIRE_THROWS_AS(check_attention_config(7, 8, 8), UnsupportedOnCuda);
    REQUIRE_THROWS_AS(check_attention_config(258, 8, 8), UnsupportedOnCuda);
    REQUIRE_THROWS_AS(check_attention_config(64, 6, 4), UnsupportedOnCuda);
    REQUIRE_THROWS_AS(check_attention_config(64, 6, 0), UnsupportedOnCuda);
    REQUIRE_NOTHROW(check_attention_config(128, 32, 8));
    REQUIRE_NOTHROW(check_attention_config(8, 8, 8));
    REQUIRE_NOTHROW(check_attention_config(256, 8, 1));
}

TEST_CASE("repack copies rows and zero-pads float rows to the GPU stride", "[cuda_host]") {
    for (QType t : supported_types()) {
        const QTypeTraits& tr = qtype_traits(t);
        for (uint64_t k : {uint64_t{1}, uint64_t{45}, uint64_t{64}, uint64_t{200}}) {
            INFO(tr.name << " k " << k);
            const uint64_t rows = 3;
            const GpuMatrixFormat f = gpu_matrix_format(tr.type, k);
            if (f.source != f.qtype || f.super_rows) continue;  // transcoded (the test above)
            const uint64_t src_stride = f.file_row_bytes;
            std::vector<uint8_t> src(rows * src_stride);
            for (uint64_t r = 0; r < rows; ++r) {
                const auto w = some_weights(k, static_cast<uint32_t>(r + 1));
                REQUIRE(quantize_row_ref(tr.type, w.data(), k, src.data() + r * src_stride) ==
                        QuantStatus::ok);
            }
            std::vector<uint8_t> dst(rows * f.row_bytes, 0xab);  // poisoned
            repack_rows_for_gpu(f, src.data(), src_stride, rows, dst.data());
            for (uint64_t r = 0; r < rows; ++r) {
                const uint8_t* d = dst.data() + r * f.row_bytes;
                REQUIRE(std::memcmp(d, src.data() + r * src_stride, src_stride) == 0);
                for (uint64_t b = src_stride; b < f.row_bytes; ++b) REQUIRE(d[b] == 0);
                // Dequantized from the GPU row, the weights are the file's, then zeros to kpad.
                std::vector<float> a(k), b(f.kpad, 1.0f);
                dequantize_row_ref(tr.type, src.data() + r * src_stride, k, a.data());
                if (tr.is_float) {
                    dequantize_row_ref(tr.type, d, f.kpad, b.data());
                    for (uint64_t j = 0; j < f.kpad; ++j)
                        REQUIRE(bits_of(b[j]) == (j < k ? bits_of(a[j]) : 0u));
                }
            }
        }
    }
}

TEST_CASE("host f16 decode equals core/half on every half value", "[cuda_host]") {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float a = f16_bits_to_float(static_cast<uint16_t>(h));
        const float b = f16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(b))
            REQUIRE(std::isnan(a));
        else
            REQUIRE(bits_of(a) == bits_of(b));
        REQUIRE(bits_of(bf16_bits_to_float(static_cast<uint16_t>(h))) ==
                bits_of(bf16_to_f32(static_cast<uint16_t>(h))));
    }
}

TEST_CASE("byte_perm emulates CUDA's __byte_perm", "[cuda_host]") {
    const uint32_t a = 0x33221100u, b = 0x77665544u;
    REQUIRE(byte_perm(a, b, 0x3210) == a);
    REQUIRE(byte_perm(a, b, 0x7654) == b);
    REQUIRE(byte_perm(a, b, 0x0123) == 0x00112233u);
    REQUIRE(byte_perm(a, b, 0x7650 | 2) == 0x77665522u);
    REQUIRE(byte_perm(a, b, 0xfedc) == b);  // only the low 3 bits of each selector count
}

TEST_CASE("magic-number code extraction is exact for every code and zero", "[cuda_host]") {
    // 4-bit: every byte value in every position of a word, every zero point.
    for (int32_t zero = 0; zero < 16; ++zero) {
        const float zm = zero_magic(false, zero);
        for (uint32_t byte = 0; byte < 256; ++byte)
            for (uint32_t pos = 0; pos < 4; ++pos) {
                const uint32_t w = byte << (8 * pos);
                float lo[4], hi[4];
                q4_word_codes(w, zm, lo, hi);
                for (uint32_t i = 0; i < 4; ++i) {
                    const int32_t b = i == pos ? static_cast<int32_t>(byte) : 0;
                    REQUIRE(lo[i] == static_cast<float>((b & 15) - zero));
                    REQUIRE(hi[i] == static_cast<float>((b >> 4) - zero));
                }
            }
    }
    // 8-bit signed codes (symmetric: zero 0).
    const float zm8 = zero_magic(true, 0);
    for (uint32_t byte = 0; byte < 256; ++byte) {
        float v[4];
        q8_word_codes(byte << 16, zm8, v);
        REQUIRE(v[2] == static_cast<float>(static_cast<int8_t>(byte)));
        REQUIRE(v[0] == 0.0f);
        REQUIRE(v[1] == 0.0f);
        REQUIRE(v[3] == 0.0f);
    }
}

TEST_CASE("fp16 code pairs for the tensor-core path are exact", "[cuda_host]") {
    auto lo_half = [](uint32_t bits) { return f16_to_f32(static_cast<uint16_t>(bits & 0xffffu)); };
    auto hi_half = [](uint32_t bits) { return f16_to_f32(static_cast<uint16_t>(bits >> 16)); };
    for (uint32_t u = 0; u < 65536; ++u) {
        const uint32_t b0 = u & 0xffu, b1 = u >> 8;
        for (int32_t zero : {0, 3, 8, 15}) {
            const float z = f16_to_f32(pair_zero_bits(false, zero));
            REQUIRE(z == 1024.0f + static_cast<float>(zero));
            // (1024 + code) - (1024 + zero) is exact in fp16, as __hsub2 computes it.
            REQUIRE(lo_half(q4_pair_low(u)) - z ==
                    static_cast<float>(static_cast<int32_t>(b0 & 15) - zero));
            REQUIRE(hi_half(q4_pair_low(u)) - z ==
                    static_cast<float>(static_cast<int32_t>(b1 & 15) - zero));
            REQUIRE(lo_half(q4_pair_high(u)) - z ==
                    static_cast<float>(static_cast<int32_t>(b0 >> 4) - zero));
            REQUIRE(hi_half(q4_pair_high(u)) - z ==
                    static_cast<float>(static_cast<int32_t>(b1 >> 4) - zero));
        }
        const float z8 = f16_to_f32(pair_zero_bits(true, 0));
        REQUIRE(lo_half(q8_pair(u)) - z8 == static_cast<float>(static_cast<int8_t>(b0)));
        REQUIRE(hi_half(q8_pair(u)) - z8 == static_cast<float>(static_cast<int8_t>(b1)));
    }
}

TEST_CASE("chunk dequantization equals dequantize_row_ref bit for bit", "[cuda_host]") {
    for (QType t : supported_types(true)) {
        const QTypeTraits& tr = qtype_traits(t);
        for (uint64_t k : kLengths) {
            INFO(tr.name << " k " << k);
            const auto w = some_weights(k, static_cast<uint32_t>(k));
            std::vector<uint8_t> row(*qtype_row_bytes(t, k));
            REQUIRE(quantize_row_ref(t, w.data(), k, row.data()) == QuantStatus::ok);
            std::vector<float> ref(k);
            dequantize_row_ref(t, row.data(), k, ref.data());
            const GpuMatrixFormat f = gpu_matrix_format(t, k);
            if (f.super_rows) continue;  // past k they hold -min (the test above)
            // A carried qtype's chunks are its carrier's row's, against the file's values.
            std::vector<uint8_t> held = row;
            if (f.source != f.qtype) {
                held.assign(*qtype_row_bytes(f.qtype, k), 0);
                transcode_row(t, row.data(), k, f.qtype, held.data());
            }
            for (uint64_t c = 0; c < f.chunks; ++c) {
                float out[32];
                std::fill(out, out + 32, std::nanf(""));
                dequant_quant_chunk(held.data(), qtype_traits(f.qtype).bits, c, f.chunks_per_group,
                                    f.scales_offset, f.zeros_offset, f.has_zeros, f.zero, out);
                for (uint64_t i = 0; i < 32; ++i) {
                    const uint64_t j = c * 32 + i;
                    if (j < k)
                        REQUIRE(bits_of(out[i]) == bits_of(ref[j]));
                    else
                        REQUIRE(out[i] == 0.0f);  // codes past k hold the zero code
                }
            }
        }
    }
}

TEST_CASE("GEMV plans cover every chunk with the fewest whole warps", "[cuda_host]") {
    for (QType t : supported_types()) {
        const QTypeTraits& tr = qtype_traits(t);
        for (uint64_t k : {uint64_t{8}, uint64_t{64}, uint64_t{576}, uint64_t{1000}, uint64_t{4096},
                           uint64_t{5632}, uint64_t{14336}, uint64_t{100000}}) {
            const GpuMatrixFormat f = gpu_matrix_format(tr.type, k);
            for (uint64_t rows : {uint64_t{1}, uint64_t{3}, uint64_t{67}, uint64_t{4096}}) {
                for (uint64_t m = 1; m <= 20; ++m) {
                    INFO(tr.name << " k " << k << " rows " << rows << " m " << m);
                    const GemvPlan p = plan_gemv(f, rows, m);
                    REQUIRE(p.threads % 32 == 0);
                    REQUIRE(p.threads >= 32);
                    REQUIRE(p.threads <= kGemvMaxThreads);
                    REQUIRE(uint64_t{p.threads} * p.chunk_steps >= f.chunks);
                    if (f.chunks > 32)  // one warp fewer would need another step
                        REQUIRE(uint64_t{p.threads - 32} * p.chunk_steps < f.chunks);
                    REQUIRE(p.blocks * p.rows_per_block >= rows);
                    REQUIRE((p.blocks - 1) * p.rows_per_block < rows);
                    // default tuning: q4 at 1-2 tokens over 256 chunks or more, 2 rows
                    const bool two = f.kind == WeightKind::q4 && m <= 2 && f.chunks >= 256;
                    REQUIRE(p.rows_per_block == (two ? 2u : gemv_rows_per_block(f.kind)));
                    const uint64_t tile = std::min<uint64_t>(m, kGemvMaxTokens);
                    REQUIRE(p.token_tile >= tile);
                    REQUIRE(p.token_tile < 2 * tile);
                    REQUIRE(p.passes * kGemvMaxTokens >= m);
                }
            }
        }
    }
    // The shapes the issue names: q4 at k = 14336 is 448 chunks, two steps of 224 threads.
    const GemvPlan down = plan_gemv(gpu_matrix_format(QType::q4_g128, 14336), 4096, 1);
    REQUIRE(down.threads == 224);
    REQUIRE(down.chunk_steps == 2);
    REQUIRE(down.rows_per_block == 2);
    REQUIRE(down.blocks == 2048);
    // q4 and q8 at 1-2 tokens take two chunk steps per thread by default (plans.hpp:
    // GemvTuning); float kinds, and any kind at more tokens, as few steps as 256 threads allow.
    const GemvPlan sq = plan_gemv(gpu_matrix_format(QType::q4_g128, 4096), 4096, 1);
    REQUIRE(sq.threads == 64);
    REQUIRE(sq.chunk_steps == 2);
    const GemvPlan sq4 = plan_gemv(gpu_matrix_format(QType::q4_g128, 4096), 4096, 4);
    REQUIRE(sq4.threads == 128);
    REQUIRE(sq4.chunk_steps == 1);
    const GemvPlan f16 = plan_gemv(gpu_matrix_format(QType::f16, 4096), 4096, 1);
    REQUIRE(f16.threads == 128);
    const GemvPlan q8 = plan_gemv(gpu_matrix_format(QType::q8_g32, 4096), 4096, 2);
    REQUIRE(q8.threads == 64);
    const GemvPlan one = plan_gemv(gpu_matrix_format(QType::q4_g128, 4096), 4096, 1, {1});
    REQUIRE(one.threads == 128);
    // A batched decode step's passes take a lone token's threads (the order of each output's
    // additions), whatever their tokens: any kind and length of row, any token count.
    GemvTuning batched;
    batched.one_token_threads = true;
    for (QType qt : {QType::q4_g128, QType::q4s_g32, QType::q8, QType::q8_g32, QType::f16,
                     QType::bf16, QType::f32})
        for (uint64_t k : {32, 96, 2080, 4096, 4180, 8192, 14336}) {
            const GpuMatrixFormat f = gpu_matrix_format(qt, k);
            const GemvPlan alone = plan_gemv(f, 64, 1);
            for (uint64_t m = 1; m <= 40; ++m) {
                const GemvPlan p = plan_gemv(f, 64, m, batched);
                REQUIRE(p.threads == alone.threads);
                REQUIRE(p.chunk_steps == alone.chunk_steps);
                REQUIRE(p.token_tile == plan_gemv(f, 64, m).token_tile);
            }
        }
    REQUIRE(plan_gemv(gpu_matrix_format(QType::q4_g128, 4096), 4096, 8, batched).threads == 64);
    GemvTuning t;
    REQUIRE(parse_gemv_tuning("steps=3", t));
    REQUIRE(t.min_steps == 3);
    REQUIRE(parse_gemv_tuning("rows=2,steps=4", t));
    REQUIRE((t.q4_rows == 2 && t.min_steps == 4));
    REQUIRE(plan_gemv(gpu_matrix_format(QType::q4_g128, 4096), 4096, 1, t).rows_per_block == 2);
    REQUIRE(plan_gemv(gpu_matrix_format(QType::q4_g128, 14336), 4096, 3, t).rows_per_block == 4);
    REQUIRE(plan_gemv(gpu_matrix_format(QType::q4_g128, 14336), 4096, 1, {0, 4}).rows_per_block ==
            4);
    REQUIRE(plan_gemv(gpu_matrix_format(QType::q8, 14336), 4096, 1, t).rows_per_block == 2);
    for (const char* bad : {"", "steps=0", "steps=5", "steps=", "rows=8", "steps=2,", ",rows=2"})
        REQUIRE_FALSE(parse_gemv_tuning(bad, t));
}

TEST_CASE("split attention slices cover any cache in at most 32 slices", "[cuda_host]") {
    for (uint32_t capacity = 1; capacity <= 140000; capacity += capacity < 300 ? 1 : 997) {
        INFO("capacity " << capacity);
        const uint32_t len = attention_split_len(capacity);
        REQUIRE(len >= 64);
        REQUIRE(len % 32 == 0);
        const uint32_t slices = (capacity + len - 1) / len;
        REQUIRE(slices >= 1);
        REQUIRE(slices <= kAttnMaxSplits);
        // as short as that allows (64 at the least): one slice fewer would not cover it
        if (len > 64) REQUIRE(uint64_t{len - 32} * kAttnMaxSplits < capacity);
    }
    REQUIRE(attention_workspace_floats(8, 32, 128) == uint64_t{8} * 32 * kAttnMaxSplits * 4 * 130);
}

TEST_CASE("tensor-core GEMM plans split K without empty splits", "[cuda_host]") {
    for (QType t : supported_types(true)) {
        for (uint64_t k : {uint64_t{100}, uint64_t{576}, uint64_t{4096}, uint64_t{14336}}) {
            const GpuMatrixFormat f = gpu_matrix_format(t, k);
            for (uint64_t rows :
                 {uint64_t{67}, uint64_t{4096}, uint64_t{14336}, uint64_t{128256}}) {
                for (uint64_t m : {uint64_t{9}, uint64_t{16}, uint64_t{64}, uint64_t{512}}) {
                    for (int sms : {1, 132}) {
                        INFO(qtype_traits(t).name << " k " << k << " rows " << rows << " m " << m);
                        const MmaPlan p = plan_mma(f, rows, m, sms);
                        REQUIRE(p.row_tiles * kMmaTileRows >= rows);
                        REQUIRE(p.token_tiles * kMmaTileTokens >= m);
                        REQUIRE(p.token_tiles <= 65535);
                        REQUIRE(p.splits >= 1);
                        REQUIRE(p.splits <= 64);
                        REQUIRE(p.chunks_per_split * p.splits >= f.chunks);
                        REQUIRE((p.splits - 1) * p.chunks_per_split < f.chunks);
                        REQUIRE(p.workspace_floats == (p.splits > 1 ? p.splits * m * rows : 0));
                        if (p.splits > 1) REQUIRE(p.chunks_per_split >= 4 * kMmaWarps);
                    }
                }
            }
        }
    }
    // Enough blocks to fill an H200 at decode-sized batches.
    const MmaPlan p = plan_mma(gpu_matrix_format(QType::q4_g128, 4096), 4096, 16, 132);
    REQUIRE(p.row_tiles * p.token_tiles * p.splits >= 4 * 132);
}

TEST_CASE("matmul path choice by size, kind and architecture", "[cuda_host]") {
    const auto q4 = gpu_matrix_format(QType::q4_g128, 4096);
    const auto q8 = gpu_matrix_format(QType::q8, 4096);
    const auto f16 = gpu_matrix_format(QType::f16, 4096);
    const auto bf16 = gpu_matrix_format(QType::bf16, 4096);
    const auto f32 = gpu_matrix_format(QType::f32, 4096);
    for (uint64_t m = 1; m <= kGemvMaxTokens; ++m)
        for (const auto* f : {&q4, &q8, &f16, &bf16, &f32})
            REQUIRE(choose_matmul_path(*f, m, 9) == MatmulPath::gemv);
    REQUIRE(choose_matmul_path(q4, 9, 9) == MatmulPath::mma);
    REQUIRE(choose_matmul_path(q8, kMmaMaxTokens, 8) == MatmulPath::mma);
    REQUIRE(choose_matmul_path(q4, kMmaMaxTokens + 1, 9) == MatmulPath::cublas);
    REQUIRE(choose_matmul_path(q4, 64, 7) == MatmulPath::cublas);  // sm_75: no m16n8k16 path
    REQUIRE(choose_matmul_path(f16, 512, 9) == MatmulPath::cublas);
    REQUIRE(choose_matmul_path(bf16, 512, 9) == MatmulPath::cublas);  // TF32 tensor cores
    REQUIRE(choose_matmul_path(bf16, kBf16CublasMinTokens, 8) == MatmulPath::cublas);
    REQUIRE(choose_matmul_path(bf16, kBf16CublasMinTokens - 1, 9) == MatmulPath::gemv);
    REQUIRE(choose_matmul_path(bf16, 512, 7) == MatmulPath::gemv);  // sm_75: no TF32
    REQUIRE(matmul_path_applies(MatmulPath::cublas, bf16, 8));
    REQUIRE_FALSE(matmul_path_applies(MatmulPath::cublas, bf16, 7));
    REQUIRE_FALSE(matmul_path_applies(MatmulPath::mma, bf16, 9));
    REQUIRE(choose_matmul_path(f32, 512, 9) == MatmulPath::gemv);
    REQUIRE(matmul_path_applies(MatmulPath::mma, q4, 8));
    REQUIRE_FALSE(matmul_path_applies(MatmulPath::mma, q4, 7));
    REQUIRE_FALSE(matmul_path_applies(MatmulPath::mma, f16, 9));
    REQUIRE_FALSE(matmul_path_applies(MatmulPath::cublas, f32, 9));
    REQUIRE(matmul_path_applies(MatmulPath::cublas, f16, 9));
    REQUIRE(matmul_path_applies(MatmulPath::gemv, f32, 5));
}

TEST_CASE("cuBLAS slabs fit the scratch and cover the rows", "[cuda_host]") {
    const auto f = gpu_matrix_format(QType::q4_g128, 4096);
    REQUIRE(cublas_slab_rows(f, 14336, uint64_t{64} << 20) == 14336);
    REQUIRE(cublas_slab_rows(f, 128256, uint64_t{64} << 20) == (uint64_t{64} << 20) / 4096);
    REQUIRE(cublas_slab_rows(f, 100, 4096) == 1);
    REQUIRE(cublas_slab_rows(f, 100, 10) == 1);  // never zero
    // bf16 rows widen to f32 in the slab: two halves of scratch per weight.
    const auto b = gpu_matrix_format(QType::bf16, 4096);
    REQUIRE(cublas_slab_rows(b, 128256, uint64_t{64} << 20) == (uint64_t{64} << 20) / 8192);
    REQUIRE(cublas_slab_rows(b, 100, 8192) == 1);
}

TEST_CASE("attention dims per lane", "[cuda_host]") {
    REQUIRE(attention_dims_per_lane(8) == 1);
    REQUIRE(attention_dims_per_lane(32) == 1);
    REQUIRE(attention_dims_per_lane(64) == 2);
    REQUIRE(attention_dims_per_lane(96) == 4);
    REQUIRE(attention_dims_per_lane(128) == 4);
    REQUIRE(attention_dims_per_lane(256) == 8);
}

TEST_CASE("backend names and auto selection", "[cuda_host]") {
    REQUIRE(backend_kind_from_name("cpu") == BackendKind::cpu);
    REQUIRE(backend_kind_from_name("cuda") == BackendKind::cuda);
    REQUIRE(backend_kind_from_name("auto") == BackendKind::auto_select);
    REQUIRE_FALSE(backend_kind_from_name("gpu"));
    REQUIRE(resolve_backend_kind(BackendKind::cpu) == BackendKind::cpu);
    REQUIRE(resolve_backend_kind(BackendKind::cuda) == BackendKind::cuda);
    std::string why;
    const BackendKind k = resolve_backend_kind(BackendKind::auto_select, &why);
    REQUIRE_FALSE(why.empty());
    REQUIRE((k == BackendKind::cpu || k == BackendKind::cuda));
}

}  // namespace cuda_host_test
