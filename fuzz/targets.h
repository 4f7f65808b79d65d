// The fuzz targets' bodies, one per reader of user input, shared by the libFuzzer entry points
// (fuzz/*_fuzz.cc) and the replay of saved findings in the test suite (tests/fuzz). Each takes
// the raw input and returns what the reader said (OK or its error); each aborts, printing why,
// when a property that must hold for every input breaks (libFuzzer then keeps the input).
#pragma once

#include <string>

#include "core/status.h"

namespace ptdp::fuzz {

// Every estimate made for an accepted input must be a number in range (cost_model CheckEstimate:
// finite, positive step time and memory, finite non-negative parts), in the planner's search and
// in the simulator; one that is not aborts like any broken property (issue 12).
//
// Cluster YAML (topology/cluster.h): accepted clusters write back (ClusterToYaml) to text that
// is accepted again; those of up to 4096 GPUs also build a Topology, on which the planner's
// search of gpt-tiny (on up to 8, and up to 64, GPUs) gives estimates in range.
Status FuzzCluster(const std::string& text);
// Model YAML (core/model.h): accepted models pass ValidateModel, give their counts without
// overflow, round-trip through ModelToYaml unchanged, and the planner's search of them on
// local-cpu (8 slots, no network) and 2 nodes of dgx-a100 gives estimates in range.
Status FuzzModel(const std::string& text);
// plan.yaml (core/plan.h): accepted plans round-trip through PlanToYaml unchanged.
Status FuzzPlan(const std::string& text);
// Hugging Face config.json (core/model.h ImportHfConfigText): imported models pass
// ValidateModel, give their counts without overflow, and estimates in range as FuzzModel's.
Status FuzzHfConfig(const std::string& text);
// The layout flags (cli/common.h): one argument per line, parsed by CLI11 as `ptdp simulate`
// does, then LayoutFromFlags and SpaceFromFlags on dgx-a100 x gpt3-13b (resized by --nodes up
// to 64, --gpus, --seq-len as LoadWorld does). An accepted layout's estimate (and simulation,
// up to 4096 pipeline slots) and an accepted search's estimates (up to 64 GPUs) are in range.
Status FuzzLayoutFlags(const std::string& text);

// Checkpoint files (runtime/checkpoint.h ReadCheckpoint): the input is a file's metadata YAML,
// optionally followed by a line "=== shard" and a shard's metadata, and by a line "=== data"
// and the data section's bytes (the shard's, else the file's). The target wraps each in a
// well-formed container with the right CRC32C (so that the reader gets past it to the parsers),
// writes the first as step-00000001.ckpt (version 2 with a shard, else 1) after replacing
// BYTES and CRC in it by the shard's size and CRC32C, and the shard under each plain file name
// the first's `shards` list names (up to 4), into a folder of its own, then reads it with
// ReadCheckpoint, whole and with a filter. An accepted checkpoint's tensors hold the elements of
// their shapes, and the filtered read is the whole read's wanted tensors.
Status FuzzCheckpoint(const std::string& text);

}  // namespace ptdp::fuzz
