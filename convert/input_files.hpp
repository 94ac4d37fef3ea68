// Every file and directory that convert or quantize may read for a checkpoint input, so the
// output can be checked against all of them before any work (core/output_path.hpp).
#pragma once

#include <string>
#include <vector>

namespace qforge {

// `input` itself; for a file that is not a .qf or .gguf (a .safetensors or llama2.c .bin), the
// files the readers look for beside it: config.json, the tokenizer files, the GPTQ/AWQ configs,
// the safetensors shards and their index, and llama2.c's tokenizer.bin / tok*.bin, which
// find_tokenizer also looks for one directory up. `tokenizer` (a --tokenizer file, may be empty)
// with the JSON files read beside it. A directory input stands for everything under it. Only
// paths that exist are listed.
std::vector<std::string> checkpoint_input_files(const std::string& input,
                                                const std::string& tokenizer);

}  // namespace qforge
