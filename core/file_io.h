// Reading a user's input file whole, with the one-line errors every reader gives: the path and
// what is wrong with it (missing, a directory, not a regular file, unreadable, too large).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace ptdp {

// The largest input each kind of file may have. Parsing costs a multiple of the text (yaml-cpp
// keeps ~40 bytes of nodes per byte of a plan, nlohmann ~10 per byte of JSON), so an unbounded
// read of a huge or endless file would exhaust memory before any message. The limits are far
// above any real file: a shipped config is 1-3 KiB, a plan.yaml 1.5 KiB, a Hugging Face
// config.json under 10 KiB, a measured.json ~600 bytes per rank and step (a 1,000-step run of
// 64 ranks: 38 MiB).
inline constexpr uint64_t kMiB = uint64_t(1) << 20;
inline constexpr uint64_t kMaxConfigBytes = 16 * kMiB;     // cluster, model, plan, config.json
inline constexpr uint64_t kMaxDataBytes = 64 * kMiB;       // published runs, calibration tables
inline constexpr uint64_t kMaxMeasuredBytes = 256 * kMiB;  // measured.json
inline constexpr uint64_t kMaxCorpusBytes = 2048 * kMiB;   // a training corpus (read whole)

// The bytes of the regular file at `path`, at most `max_bytes` of them. `what` names the file's
// role in messages ("the corpus", "a plan.yaml"); "" says "file". A directory fails with
// "<path>: is a directory, not <what>"; a FIFO, socket or device with "is not a regular file"
// (it is opened without blocking and never read: reading one could block forever or never
// end); a larger file with "<path>: 17.0 MiB, more than the 16 MiB <what> may have".
Result<std::string> ReadFileText(const std::string& path, const std::string& what = "",
                                 uint64_t max_bytes = kMaxConfigBytes);

// "16 MiB", "1.5 KiB", "812 bytes": a byte count for messages.
std::string ByteSize(uint64_t bytes);

// ---- Writing files whole or not at all.

// "<what>: <the system's words for err>". Callers copy errno into `err` right after the failed
// call, before building `what` (an allocation may change errno, and function arguments are
// evaluated in no fixed order, so SysError(a + b, errno) could read errno after the + ran).
Status SysError(const std::string& what, int err);

// The folder of a file path: "." for a bare name.
std::string FolderOf(const std::string& path);

// fsync of the folder holding `path`, so that a rename into it survives a power loss.
Status SyncFolderOf(const std::string& path);

// Renames the finished temporary file `tmp` over `path` and syncs the folder; when the rename
// fails, `tmp` is removed and the error names both.
Status RenameIntoPlace(const std::string& tmp, const std::string& path);

// Writes `bytes` to `path` atomically: into a temporary file in the same folder
// ("<path>.tmp-XXXXXX", mode 0644), fsync'ed, renamed over `path`, the folder fsync'ed. A
// reader sees the old file (or none) or the whole new one. On failure `path` is untouched, the
// temporary file removed, and the message names the file and the system's reason.
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace ptdp
