// Ranks started one by one (torchrun, Slurm, or by hand, each with its own command line) may be given
// different flags. A different model or exchange aborts inside a collective; a different batch or seed
// trains on, silently wrong. So before its first collective every rank's description of its run (the
// settings' JSON) is compared with rank 0's through the store, and on a difference every rank learns
// which rank differs and both descriptions.
#pragma once

#include "lmscope/parallel/world.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace lmscope::parallel {

// The first rank whose description differs from rank 0's, with both.
struct RankDisagreement {
  int rank = 0;
  nlohmann::ordered_json rank0, theirs;
};

// Every rank of `world` calls it at the same point (before its first communicator: it takes the
// store's next group, parallel/store.h). Each rank publishes a hash of `description` and the
// description; rank 0 compares the hashes and publishes the first rank that differs (or none); every
// rank reads the verdict and, where one differs, both descriptions. Nothing in a world of one.
// RankFailure when a rank never comes (the store's timeout).
std::optional<RankDisagreement> compare_with_rank0(const World& world, const nlohmann::ordered_json& description);

// Where two descriptions first differ, depth first in a's order: the path of the leaf ("model.layers",
// "cells[1].batch"), its last key ("layers") and both values as JSON text ("3", "'cpu'"). A list of
// plain values is one value; a list holding objects is compared entry by entry, and where the lengths
// differ the difference is the list's key with the two lengths.
struct JsonDifference {
  std::string path, key, a, b;
};
std::optional<JsonDifference> first_difference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

}  // namespace lmscope::parallel
