// Where the ptdp binary finds what ships with it: always relative to the binary itself
// (/proc/self/exe), never the working directory and never a path compiled in, so that a build
// tree or an install prefix works from any folder and on any machine it is copied to.
//
//   build tree:      build/ptdp        build/share/ptdp/{configs,data}    build/lib/ptdp/<module>
//   install prefix:  PREFIX/bin/ptdp   PREFIX/share/ptdp/{configs,data}   PREFIX/lib/ptdp/<module>
//
// The rule is one: the nearest `<folder>/<relative>` at or above the binary's folder, so the
// test binaries under build/tests/... find build/share/ptdp too. PTDP_SHARE_DIR, when set,
// names the share folder outright (a relocated data folder).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace ptdp::cli {

// The folder of the running executable (/proc/self/exe resolved); "" when it cannot be read.
std::string ExecutableDir();

// The nearest existing `<ancestor>/<relative>` for the ancestors of ExecutableDir(), nearest
// first. Fails naming `relative` and the binary's folder when none exists.
Result<std::string> FindShipped(const std::string& relative);

// The folder holding configs/ and data/ (share/ptdp), or PTDP_SHARE_DIR. Fails with a message
// saying where it looked and how to fix it.
Result<std::string> ShareDir();

// What a --cluster / --model value names. A value with no '/' that does not end in ".yaml" is a
// shipped config's name ("dgx-a100" -> share/ptdp/configs/clusters/dgx-a100.yaml); anything
// else is a path, returned unchanged (relative to the working directory, as a user typed it).
// `kind` is "clusters" or "models". An unknown name fails listing the shipped names.
bool IsConfigName(const std::string& value);
Result<std::string> ResolveConfig(const std::string& kind, const std::string& value);

// What a plan records for a --cluster value: a shipped name as it is, a file as an absolute path
// (so the plan works from any folder).
std::string ConfigReference(const std::string& value);

// The shipped config names of `kind`, sorted ("dgx-a100", ...); empty when none is found.
std::vector<std::string> ShippedConfigNames(const std::string& kind);

// A file of the share folder's data/, e.g. ShippedData("tinyshakespeare/input.txt").
Result<std::string> ShippedData(const std::string& relative);

}  // namespace ptdp::cli
