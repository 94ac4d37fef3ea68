#include "kernels/cpu/isa.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#define QF_X86 1
#endif
#if defined(__linux__) && defined(QF_X86)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qforge {

namespace {

struct CpuFeatures {
    bool amd = false;     // AuthenticAMD
    bool zen5 = false;    // AMD, family 0x1a
    bool avx2 = false;    // AVX2 + FMA + F16C, with the OS saving the ymm state
    bool avx512 = false;  // AVX-512 F/BW/VL + VNNI, with the OS saving the zmm and mask state
    bool avx512_bf16 = false;
    bool avx_vnni = false;  // VEX-encoded vpdpbusd (the avx2 level's int8 products)
    bool amx_bf16 = false;  // AMX tiles with tdpbf16ps, the OS saving the tile state (XCR0)
    bool amx_int8 = false;  // the same with tdpbssd / tdpbsud (int8 products)
};

#ifdef QF_X86
// CPUID directly rather than __builtin_cpu_supports: clang 14 knows neither "f16c" nor
// "avx512bf16" there, and the OS check (XCR0) must cover the zmm state too.
CpuFeatures detect_features() {
    CpuFeatures f;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
    // The family: the base field, plus the extended one when the base is 0xf.
    const unsigned base_family = (eax >> 8) & 0xf;
    const unsigned family = base_family == 0xf ? base_family + ((eax >> 20) & 0xff) : base_family;
    unsigned vendor[4] = {};
    __get_cpuid(0, &vendor[3], &vendor[0], &vendor[2], &vendor[1]);  // ebx, edx, ecx: the name
    f.amd = std::memcmp(vendor, "AuthenticAMD", 12) == 0;
    f.zen5 = f.amd && family == 0x1a;
    const bool fma = ecx & bit_FMA, f16c = ecx & bit_F16C, osxsave = ecx & bit_OSXSAVE;
    if (!osxsave) return f;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool os_ymm = (xcr0_lo & 0x6) == 0x6;    // SSE and AVX state
    const bool os_zmm = (xcr0_lo & 0xe6) == 0xe6;  // plus opmask, ZMM0-15 high, ZMM16-31
    unsigned b7 = 0, c7 = 0, d7 = 0, a7 = 0;
    if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return f;
    unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
    if (a7 >= 1) __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
    const bool avx2 = b7 & bit_AVX2;
    const bool avx512f = b7 & bit_AVX512F, avx512bw = b7 & bit_AVX512BW,
               avx512vl = b7 & bit_AVX512VL, avx512vnni = c7 & (1u << 11);
    f.avx2 = os_ymm && avx2 && fma && f16c;
    f.avx512 = f.avx2 && os_zmm && avx512f && avx512bw && avx512vl && avx512vnni;
    f.avx512_bf16 = f.avx512 && (a71 & (1u << 5));
    f.avx_vnni = f.avx2 && (a71 & (1u << 4));
    const bool amx_tile = d7 & (1u << 24), amx_bf16 = d7 & (1u << 22), amx_int8 = d7 & (1u << 25);
    const bool os_tiles = (xcr0_lo & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
    f.amx_bf16 = f.avx512 && amx_tile && amx_bf16 && os_tiles;
    f.amx_int8 = f.avx512 && amx_tile && amx_int8 && os_tiles;
    return f;
}
#else
CpuFeatures detect_features() { return {}; }
#endif

Isa highest(const CpuFeatures& f) {
    return f.avx512 ? Isa::avx512 : f.avx2 ? Isa::avx2 : Isa::scalar;
}

struct Choice {
    CpuFeatures features;
    Isa supported, used;
    const char* note;  // why the level in use is below the supported one; null if it is not
};

Choice choose() {
    Choice c{detect_features(), Isa::scalar, Isa::scalar, nullptr};
    c.supported = highest(c.features);
    c.used = c.supported;
    if (std::getenv("QFORGE_NO_AVX2")) {
        c.used = Isa::scalar;
        c.note = "QFORGE_NO_AVX2";
    } else if (const char* env = std::getenv("QFORGE_ISA"); env && *env) {
        // An unknown name caps at scalar: the safe reading of "use less than the CPU has".
        Isa cap = Isa::scalar;
        bool known = false;
        for (Isa level : kIsaLevels)
            if (isa_name(level) == env) cap = level, known = true;
        if (cap < c.used) c.used = cap;
        c.note = known ? "QFORGE_ISA" : "QFORGE_ISA not understood";
    }
    return c;
}

const Choice& choice() {
    static const Choice c = choose();
    return c;
}

}  // namespace

std::string_view isa_name(Isa isa) {
    switch (isa) {
        case Isa::scalar:
            return "scalar";
        case Isa::avx2:
            return "avx2";
        case Isa::avx512:
            return "avx512";
    }
    return "unknown";
}

Isa cpu_isa_supported() { return choice().supported; }
Isa cpu_isa() { return choice().used; }
bool cpu_has_avx512_bf16() { return choice().features.avx512_bf16; }
bool cpu_has_avx_vnni() { return choice().features.avx_vnni; }
bool cpu_is_zen5() { return choice().features.zen5; }
bool cpu_is_amd() { return choice().features.amd; }
bool cpu_uses_avx_vnni() {
    static const bool use =
        cpu_has_avx_vnni() && cpu_isa() >= Isa::avx2 && !std::getenv("QFORGE_NO_AVX_VNNI");
    return use;
}

bool cpu_has_amx_bf16() { return choice().features.amx_bf16; }
bool cpu_has_amx_int8() { return choice().features.amx_int8; }

namespace {

// Whether this process may use AMX tiles at all: the CPU has them (bf16 or int8), the level in
// use is avx512, QFORGE_NO_AMX is not set and the kernel granted the tile state.
bool amx_granted() {
    static const bool use = [] {
        if (!(cpu_has_amx_bf16() || cpu_has_amx_int8()) || cpu_isa() < Isa::avx512 ||
            std::getenv("QFORGE_NO_AMX"))
            return false;
#if defined(__linux__) && defined(QF_X86)
        // Linux hands out the tile data state on request, once per process (all its threads):
        // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18). A kernel that refuses it
        // leaves AMX unused.
        return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
        return false;
#endif
    }();
    return use;
}

}  // namespace

bool cpu_uses_amx_bf16() { return cpu_has_amx_bf16() && amx_granted(); }
bool cpu_uses_amx_int8() { return cpu_has_amx_int8() && amx_granted(); }

std::string cpu_isa_description() {
    const Choice& c = choice();
    std::string s(isa_name(c.used));
    s += " (CPU: ";
    s += isa_name(c.supported);
    if (c.features.avx512_bf16) s += ", avx512_bf16";
    if (c.features.avx_vnni) s += cpu_uses_avx_vnni() ? ", avx_vnni" : ", avx_vnni off";
    if (c.features.amx_bf16) s += cpu_uses_amx_bf16() ? ", amx_bf16" : ", amx_bf16 off";
    if (c.features.amx_int8) s += cpu_uses_amx_int8() ? ", amx_int8" : ", amx_int8 off";
    if (c.note && c.used != c.supported) {
        s += "; lowered by ";
        s += c.note;
    } else if (c.note && std::strcmp(c.note, "QFORGE_ISA not understood") == 0) {
        s += "; QFORGE_ISA not understood";
    }
    s += ")";
    return s;
}

std::vector<Isa> cpu_isa_levels() {
    std::vector<Isa> v;
    for (Isa isa : kIsaLevels)
        if (isa <= cpu_isa()) v.push_back(isa);
    return v;
}

}  // namespace qforge
