#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "formats/qf.hpp"
#include "formats/qf_validate.hpp"
#include "tokenizer/tokenizer.hpp"

namespace qforge::cli {

Runner register_verify(CLI::App& app, CommonOptions& common) {
    auto path = std::make_shared<std::string>();
    add_input_option(app, "file", *path, ".qf file")->required();
    add_json_option(app, common);
    return [path, &common]() {
        // Structure (preamble, header checksum, every tensor entry) and the model against its
        // config and the architecture table: what every other command checks at open.
        QfFile qf(*path);
        // The tokenizer as ppl, generate and tokenize build it.
        if (qf.has_tokenizer()) (void)Tokenizer::from_schema(qf.tokenizer(), *path);
        uint64_t total = 0;
        for (const auto& t : qf.tensors()) total += t.stored_length;
        Progress progress("verify", total);
        std::vector<uint8_t> scratch;
        for (const auto& t : qf.tensors()) {
            const auto bytes = qf.tensor_bytes(t, scratch, /*verify=*/true);
            // convert refuses non-finite weights; an edited file can still hold them.
            if (const auto bad = find_non_finite(t, bytes))
                throw Error(*path, t.name, *bad + ": weights must be finite");
            qf.release(t);
            progress.advance(t.stored_length);
        }
        progress.finish();
        if (common.json) {
            nlohmann::json j = {{"file", *path},
                                {"ok", true},
                                {"format_version", qf.version()},
                                {"tensors", qf.tensors().size()},
                                {"bytes", qf.file_size()}};
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf(
                "%s: OK (format version %u, %zu tensors, %s, the model matches its config, "
                "all checksums match, all weights finite)\n",
                path->c_str(), qf.version(), qf.tensors().size(),
                human_bytes(qf.file_size()).c_str());
        }
        return 0;
    };
}

}  // namespace qforge::cli
