#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/progress.hpp"
#include "formats/qf.hpp"

namespace qforge::cli {

Runner register_verify(CLI::App& app, CommonOptions& common) {
    auto path = std::make_shared<std::string>();
    add_input_option(app, "file", *path, ".qf file")->required();
    add_json_option(app, common);
    return [path, &common]() {
        QfFile qf(*path);  // structure: preamble, header checksum, every tensor entry
        uint64_t total = 0;
        for (const auto& t : qf.tensors()) total += t.stored_length;
        Progress progress("verify", total);
        std::vector<uint8_t> scratch;
        for (const auto& t : qf.tensors()) {
            qf.verify_tensor(t, scratch);
            qf.release(t);
            progress.advance(t.stored_length);
        }
        progress.finish();
        if (common.json) {
            nlohmann::json j = {{"file", *path}, {"ok", true}, {"format_version", qf.version()},
                                {"tensors", qf.tensors().size()}, {"bytes", qf.file_size()}};
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("%s: OK (format version %u, %zu tensors, %s, all checksums match)\n",
                        path->c_str(), qf.version(), qf.tensors().size(),
                        human_bytes(qf.file_size()).c_str());
        }
        return 0;
    };
}

}  // namespace qforge::cli
