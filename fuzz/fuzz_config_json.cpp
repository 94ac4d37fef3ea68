// config.json: the model config (read_model_config) and the quantization it declares
// (read_hf_quant_config, with quantize_config.json / quant_config.json beside it). Parts:
// config.json, then quantize_config.json, then quant_config.json (written only when not empty).
// An accepted config must round-trip through the .qf header's normalized form unchanged.
#include "formats/model_config.hpp"
#include "fuzz/fuzz_support.hpp"
#include "sources/hf_quantized.hpp"

using namespace qforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::clear_scratch();
    const auto parts = fuzz::split_files(data, size, 3);
    const std::string path = fuzz::write_file("config.json", parts[0]);
    if (!parts[1].empty()) fuzz::write_file("quantize_config.json", parts[1]);
    if (!parts[2].empty()) fuzz::write_file("quant_config.json", parts[2]);
    fuzz::run_reader([&] {
        const ModelConfig cfg = read_model_config(path);
        const nlohmann::json normalized = model_config_to_json(cfg);
        bool same = false;
        try {
            same = model_config_from_json(normalized, "normalized") == cfg;
        } catch (const Error& e) {
            std::fprintf(stderr,
                         "\n==qforge-fuzz== an accepted config is refused in its .qf form: %s\n",
                         e.what());
        }
        if (!same) {
            std::fprintf(stderr, "\n==qforge-fuzz== config does not round-trip: %s\n",
                         normalized.dump().c_str());
            std::abort();
        }
        volatile size_t sink = model_dims_to_json(cfg).dump().size();
        (void)sink;
    });
    fuzz::run_reader([&] {
        if (auto qc = read_hf_quant_config(path)) {
            volatile auto target = hf_quant_target(*qc);
            (void)target;
        }
    });
    return 0;
}
