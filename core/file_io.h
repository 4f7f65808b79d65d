// Reading a user's input file whole, with the one-line errors every reader gives: the path and
// what is wrong with it (missing, a directory, not a regular file, unreadable).
#pragma once

#include <string>

#include "core/status.h"

namespace ptdp {

// The bytes of the regular file at `path`. `what` names the file's role in messages ("the
// corpus", "the plan"); "" says "file". A directory fails with "<path>: is a directory, not
// <what>"; a FIFO, socket or device with "is not a regular file" (reading one could block).
Result<std::string> ReadFileText(const std::string& path, const std::string& what = "");

}  // namespace ptdp
