#include "lmscope/parallel/run_agreement.h"

#include "lmscope/parallel/store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

namespace lmscope::parallel {
namespace {

// FNV-1a, 64 bits: the same on every build (std::hash need not be), and a rank's hash is all rank 0
// reads of it when the descriptions agree.
std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& b) { return {b.begin(), b.end()}; }

std::string shown(const nlohmann::ordered_json& v) {
  if (v.is_string()) return fmt::format("'{}'", v.get<std::string>());
  return v.dump();
}

std::optional<JsonDifference> differ(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                                     const std::string& path, const std::string& key) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items()) {
      const std::string inner = path.empty() ? k : path + "." + k;
      if (!b.contains(k)) return JsonDifference{inner, k, shown(v), "absent"};
      if (auto d = differ(v, b.at(k), inner, k)) return d;
    }
    for (const auto& [k, v] : b.items())
      if (!a.contains(k)) return JsonDifference{path.empty() ? k : path + "." + k, k, "absent", shown(v)};
    return std::nullopt;
  }
  auto primitives = [](const nlohmann::ordered_json& list) {
    return std::all_of(list.begin(), list.end(), [](const auto& v) { return v.is_primitive(); });
  };
  // A list of values is one value ("--sizes"); a list of objects (a sweep's cells) is compared entry
  // by entry, or by its length.
  if (a.is_array() && b.is_array() && !(primitives(a) && primitives(b))) {
    if (a.size() != b.size()) return JsonDifference{path, key, std::to_string(a.size()), std::to_string(b.size())};
    for (std::size_t i = 0; i < a.size(); ++i)
      if (auto d = differ(a[i], b[i], fmt::format("{}[{}]", path, i), key)) return d;
    return std::nullopt;
  }
  if (a == b) return std::nullopt;
  return JsonDifference{path, key, shown(a), shown(b)};
}

}  // namespace

std::optional<JsonDifference> first_difference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  return differ(a, b, "", "");
}

std::optional<RankDisagreement> compare_with_rank0(const World& world, const nlohmann::ordered_json& description) {
  if (world.size == 1) return std::nullopt;
  const std::unique_ptr<Store> store = next_group_store(world);
  const std::string mine = description.dump();
  store->set(fmt::format("run.{}", world.rank), bytes(mine));
  store->set(fmt::format("run.hash.{}", world.rank), bytes(fmt::format("{:016x}", fnv1a(mine))));
  if (world.rank == 0) {
    int first = -1;
    const std::string own = fmt::format("{:016x}", fnv1a(mine));
    for (int r = 1; r < world.size && first < 0; ++r)
      if (text(store->get(fmt::format("run.hash.{}", r))) != own) first = r;
    store->set("run.verdict", bytes(std::to_string(first)));
  }
  const int differs = std::stoi(text(store->get("run.verdict")));
  if (differs < 0) return std::nullopt;
  RankDisagreement d;
  d.rank = differs;
  d.rank0 = nlohmann::ordered_json::parse(text(store->get("run.0")));
  d.theirs = nlohmann::ordered_json::parse(text(store->get(fmt::format("run.{}", differs))));
  // Rank 0 may serve the store (tcp:): it stays until every rank has read what it needs. (It may be
  // gone as soon as it has seen this key, before the answer to setting it: nothing is lost then.)
  if (world.rank != 0) {
    try {
      store->set(fmt::format("run.read.{}", world.rank), bytes("1"));
    } catch (const std::exception&) {
    }
  } else {
    std::vector<std::string> read;
    for (int r = 1; r < world.size; ++r) read.push_back(fmt::format("run.read.{}", r));
    try {
      store->wait(read);
    } catch (const std::exception&) {  // a rank gone meanwhile: the disagreement is still the news
    }
  }
  return d;
}

}  // namespace lmscope::parallel
