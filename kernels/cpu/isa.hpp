// Instruction-set levels of the CPU kernels and the one run-time choice among them.
//
//   scalar  the reference versions: plain C++, obviously right
//   avx2    AVX2 + FMA + F16C (every x86-64 CPU of the last decade); its int8 products take
//           AVX-VNNI's vpdpbusd where the CPU has it (same bits; QFORGE_NO_AVX_VNNI=1: not)
//   avx512  avx2 plus AVX-512 F/BW/VL and VNNI (vpdpbusd): the int8-activation products 16
//           rows at a time, bit-identical to scalar's (kernels/README.md says why)
//
// The level in use is the highest the CPU has, lowered by the environment: QFORGE_ISA=scalar,
// avx2 or avx512 caps it (never raises it past the CPU's; an unknown name caps at scalar), and
// QFORGE_NO_AVX2 set to anything forces scalar as it always has. Both are read once, at the first
// kernel call. Each level's kernels live in their own translation unit, compiled with target
// attributes (never -march for the whole build), so one binary runs on every x86-64 CPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

enum class Isa : uint8_t { scalar, avx2, avx512 };

inline constexpr Isa kIsaLevels[] = {Isa::scalar, Isa::avx2, Isa::avx512};
inline constexpr size_t kIsaCount = std::size(kIsaLevels);

std::string_view isa_name(Isa isa);

// The highest level this CPU supports, ignoring the environment.
Isa cpu_isa_supported();

// The level in use: cpu_isa_supported() capped by QFORGE_ISA / QFORGE_NO_AVX2.
Isa cpu_isa();

// Whether the CPU has AVX-512 BF16 (vdpbf16ps; kernels/cpu/bf16_gemm.hpp), whatever the level.
bool cpu_has_avx512_bf16();

// Whether the CPU has AVX-VNNI (VEX vpdpbusd on 256-bit registers), whatever the level; and
// whether the avx2 level's int8 products use it: the CPU has it, the level in use is avx2 or
// above, and QFORGE_NO_AVX_VNNI is not set. The products give the same bits either way
// (kernels/cpu/qdot_avx_vnni.cpp), so this is a speed choice only, never a result one.
bool cpu_has_avx_vnni();
bool cpu_uses_avx_vnni();

// Whether the CPU has AMX tiles with BF16 (tdpbf16ps) and the OS saves their state, whatever the
// level; and whether the bf16 products use them (kernels/cpu/bf16_gemm.hpp): the CPU has them,
// the level in use is avx512, QFORGE_NO_AMX is not set and the kernel granted this process the
// tile state (Linux asks for it once). Unlike AVX-VNNI this changes bits: the tiles' bf16
// products are their own chain (bf16_gemm.hpp says which).
bool cpu_has_amx_bf16();
bool cpu_uses_amx_bf16();
// The same for AMX-INT8 (tdpbssd, tdpbsud): whether the int8-activation products of several
// tokens on packed rows use the tiles (kernels/cpu/qdot_amx.cpp). Their block sums are the same
// exact integers, so, like AVX-VNNI, this is a speed choice only, never a result one.
bool cpu_has_amx_int8();
bool cpu_uses_amx_int8();

// Whether the CPU is AMD's family 0x1a (Zen 5, and later parts of that family): a tuning fact
// (float_dot.cpp's prefetch), never a result one.
bool cpu_is_zen5();
// Whether the CPU is AMD's (decode's choice of kernel and prefetch distance, qdot.cpp and
// qdot_avx512.cpp: measured on a Zen 4 and on an Intel Xeon): a tuning fact, never a result one.
bool cpu_is_amd();

// Every level up to cpu_isa(), lowest first (what the kernel tests run).
std::vector<Isa> cpu_isa_levels();

// One line for --version and bench reports, e.g. "avx512 (CPU: avx512, avx512_bf16, avx_vnni)":
// the level in use, then the CPU's highest level and the extensions it has beyond the levels
// (avx512_bf16: the opt-in bf16-activation mode; avx_vnni: the avx2 level's int8 products, or
// "avx_vnni off" when QFORGE_NO_AVX_VNNI turns that off; amx_bf16 and amx_int8: the bf16 and
// int8 products on AMX tiles, or "amx_bf16 off" / "amx_int8 off").
std::string cpu_isa_description();

}  // namespace qforge
