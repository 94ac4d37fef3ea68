// CalibProducts (quant/calibration.hpp): the names and the default. Apart from calibration.cpp,
// which the calibration fuzz harness builds alone, without the kernels.
#include "core/error.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "quant/calibration.hpp"

namespace qforge {

std::string_view calib_products_name(CalibProducts p) {
    return p == CalibProducts::bf16 ? "bf16" : "f32";
}

CalibProducts default_calib_products() {
    return bf16_dot_available() ? CalibProducts::bf16 : CalibProducts::f32;
}

CalibProducts parse_calib_products(std::string_view name) {
    if (name == "auto") return default_calib_products();
    if (name == "f32") return CalibProducts::f32;
    if (name == "bf16") {
        if (!bf16_dot_available())
            throw Error(
                "--calib-products bf16 needs the avx512 level and AVX-512 BF16; this "
                "process runs " +
                cpu_isa_description());
        return CalibProducts::bf16;
    }
    throw Error("--calib-products: '" + std::string(name) + "' is not one of auto, f32, bf16");
}

}  // namespace qforge
