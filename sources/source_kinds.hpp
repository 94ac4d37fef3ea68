// The constructors of each input kind's ModelSource, for open_model_source's dispatch only
// (sources/model_source.cpp): callers open a model by content, never by naming its kind.
#pragma once

#include <memory>
#include <string>

#include "sources/model_source.hpp"

namespace qforge {

std::unique_ptr<ModelSource> open_qf_source(const std::string& path);
std::unique_ptr<ModelSource> open_hf_source(const std::string& path, const SourceOptions& options);
std::unique_ptr<ModelSource> open_gguf_source(const std::string& path,
                                              const SourceOptions& options);
std::unique_ptr<ModelSource> open_llama2c_source(const std::string& path,
                                                 const SourceOptions& options);

}  // namespace qforge
