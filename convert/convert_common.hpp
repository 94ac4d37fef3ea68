// Pieces of the converter that depend on its options: the provenance record and the stored type
// of a tensor. What every input kind shares lives below, in sources/source_common.hpp.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "convert/convert.hpp"
#include "formats/qtype.hpp"

namespace qforge {

// The provenance object of a converted .qf: generator, sources and the recipe (the command and
// its options). `recipe_extra` keys are added to the recipe (e.g. the source format).
nlohmann::json convert_provenance(nlohmann::json sources, const ConvertOptions& options,
                                  const nlohmann::json& recipe_extra = nlohmann::json::object());

// The type a tensor is stored as. Without --dtype, the source's. With --dtype, matrices take
// it and 1-D tensors (norms, biases) are stored as f32, which holds f16/bf16 values exactly.
QType target_qtype(std::span<const uint64_t> shape, QType source,
                   const std::optional<QType>& requested);

}  // namespace qforge
