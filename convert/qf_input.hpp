// A model given to a command that runs or reads a .qf (ppl, generate, bench, inspect, export),
// as the path of a .qf: the input itself when it is one, else a temporary .qf that `convert`'s
// own path (source -> writer, at the source's precision) writes into the temporary directory
// ($TMPDIR, else /tmp) and that is removed when this object goes or the process is interrupted
// (SIGINT/SIGTERM/SIGHUP). What a SIGKILL leaves is removed by a later conversion: a
// "qforge-<pid>-..." file of this user whose process is gone.
//
// Why a file and not an in-memory model: runtime::Model runs matrices in place from a .qf
// mapping (zero copy, page cache shared between processes). Writing the same bytes `qforge
// convert` would write and mapping them keeps one loader and one set of validity checks
// (formats/qf_validate.hpp) for every input kind, and the converted model runs bit for bit as
// the converted file would; building Model from a ModelSource directly would be a second
// loader to keep equal to the first. The cost is one pass over the weights and their size in
// temporary space; models that are run repeatedly are better converted once.
#pragma once

#include <memory>
#include <string>

#include "convert/convert.hpp"
#include "core/atomic_file.hpp"

namespace qforge {

class QfInput {
  public:
    // `input`: any model source (sources/detect.hpp decides); `tokenizer`: for a checkpoint,
    // the tokenizer file to embed (empty: the one found beside it, or a GGUF's own).
    explicit QfInput(const std::string& input, const std::string& tokenizer = {});
    QfInput(const QfInput&) = delete;
    QfInput& operator=(const QfInput&) = delete;

    // The .qf to open: the input, or the temporary conversion.
    const std::string& path() const { return path_; }
    bool converted() const { return scratch_ != nullptr; }
    // The conversion's report (warnings: no tokenizer, ignored tensors); empty for a .qf.
    const ConvertReport& report() const { return report_; }

  private:
    std::string path_;
    std::unique_ptr<ScratchFile> scratch_;  // the temporary conversion, when there is one
    ConvertReport report_;
};

}  // namespace qforge
