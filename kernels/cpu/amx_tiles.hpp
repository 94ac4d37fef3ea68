// The AMX tile configuration (palette 1) of the tile kernels (bf16_gemm_amx.cpp, qdot_amx.cpp):
// loading one sets every tile's shape and zeroes their data; _tile_release() ends the use.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qforge::detail {

struct alignas(64) AmxTileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};  // bytes per row of tile i
    uint8_t rows[16] = {};    // rows of tile i
};

#if defined(__x86_64__)
__attribute__((target("amx-tile"))) inline void amx_load_config(const AmxTileConfig& c) {
    // GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the 64, which then drops the
    // stores that filled the rest as dead (and the CPU faults on the stale bytes): a memory
    // clobber keeps them.
    __asm__ __volatile__("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}
#endif

}  // namespace qforge::detail
