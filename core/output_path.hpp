// The checks every writing command (convert, quantize, export) makes on its output path before it
// does any work, so a mistyped -o never destroys an input, a device node or a directory, and a
// path that cannot be written fails in the first millisecond instead of after the conversion.
//
// What is refused (a qforge::Error naming the output and, where one is involved, the input):
//   - an empty output path;
//   - an output whose directory does not exist or is not a directory: qforge never creates
//     parent directories, so a failed run has nothing of its own to remove;
//   - a file output that exists and is not a regular file (a device node such as /dev/null or
//     /dev/full, a FIFO, a socket, a directory): it is never opened, truncated or renamed over;
//   - a directory output (export) that exists and is not an empty directory;
//   - an output that is an input file: compared by device and inode, so a symlink or a hard link
//     to the input counts, as does a path spelled differently (./a/../model.qf);
//   - an output inside an input directory (a Hugging Face checkpoint directory), or, for a
//     directory output, one that contains an input.
// An output that is an existing regular file and no input is replaced atomically, as a rerun
// expects (see AtomicFile); an existing symlink there is replaced by the file, its target is
// left alone.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace qforge {

enum class OutputKind { file, directory };

// What a file of this st_mode is, for messages: "a regular file", "a directory", "a FIFO", ...
std::string file_kind(mode_t mode);

// `inputs`: every file and directory the command reads (a directory means everything under it).
// Inputs that do not exist are skipped: a missing input is the reader's error to report.
void check_output_path(const std::string& output, const std::vector<std::string>& inputs,
                       OutputKind kind = OutputKind::file);

// `quantize --resume DIR`: DIR holds state that outlives the run, so it must be disjoint from the
// output and the inputs: not the output, not an input, not inside an input directory, and no
// input inside it. Like the output, its parent directory must exist.
void check_state_dir(const std::string& dir, const std::string& output,
                     const std::vector<std::string>& inputs);

}  // namespace qforge
