#include "lmscope/parallel/flight_recorder.h"

#include "lmscope/core/allocator.h"
#include "lmscope/core/json_kind.h"
#include "lmscope/parallel/world.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

namespace lmscope::parallel {
namespace {

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::ordered_json to_json(const CollectiveRecord& r) {
  return {{"seq", r.seq},
          {"kind", r.kind},
          {"bytes", r.bytes},
          {"tensors", r.tensors},
          {"step", r.step},
          {"state", state_name(r.state)},
          {"queued_us", r.queued_us},
          {"started_us", r.started_us},
          {"ended_us", r.ended_us}};
}

// One rank's file as read back: its records (seq, kind, bytes, step, state, queued_us), the time it
// was written and why. Nothing where the file is missing or not a record of ours.
struct RankRecord {
  std::int64_t written_us = 0;
  std::string reason;
  std::vector<nlohmann::json> collectives;
  const nlohmann::json* last() const { return collectives.empty() ? nullptr : &collectives.back(); }
  const nlohmann::json* find(std::uint64_t seq) const {
    for (const auto& c : collectives)
      if (c.value("seq", std::uint64_t{0}) == seq) return &c;
    return nullptr;
  }
};

// A record's collective as we write it: every field there of its kind (the comparison reads them with
// json::value, which throws on another kind), a damaged or foreign one is passed over.
bool well_formed(const nlohmann::json& c) {
  if (!c.is_object() || !c.contains("seq") || !json_holds<std::uint64_t>(c["seq"])) return false;
  for (const char* key : {"kind", "state"})
    if (c.contains(key) && !json_holds<std::string>(c[key])) return false;
  for (const char* key : {"bytes", "step"})
    if (c.contains(key) && !json_holds<std::int64_t>(c[key])) return false;
  if (c.contains("tensors") && !json_holds<int>(c["tensors"])) return false;
  for (const char* key : {"queued_us", "started_us", "ended_us"})
    if (c.contains(key) && !json_holds<double>(c[key])) return false;
  return true;
}

std::optional<RankRecord> read_rank_record(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("collectives") || !j["collectives"].is_array()) return std::nullopt;
  RankRecord r;
  if (j.contains("written_us") && j["written_us"].is_number_integer())
    r.written_us = j["written_us"].get<std::int64_t>();
  if (j.contains("reason") && j["reason"].is_string()) r.reason = j["reason"].get<std::string>();
  for (const auto& c : j["collectives"])
    if (well_formed(c)) r.collectives.push_back(c);
  return r;
}

// "all-reduce #57 (12.3 MiB in 3 tensors, step 4)"
std::string collective_words(const nlohmann::json& c) {
  return fmt::format("{} #{} ({}, step {})", c.value("kind", std::string{"collective"}), c.value("seq", 0),
                     size_words(c.value("bytes", std::int64_t{0}), c.value("tensors", 1)), c.value("step", 0));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

std::atomic<int> FlightRecorder::signal_{0};

std::string size_words(std::int64_t bytes, int tensors) {
  const std::string size = human_bytes(static_cast<double>(bytes));
  return tensors > 1 ? fmt::format("{} in {} tensors", size, tensors) : size;
}

const char* state_name(CollectiveRecord::State s) {
  switch (s) {
    case CollectiveRecord::State::queued:
      return "queued";
    case CollectiveRecord::State::started:
      return "started";
    case CollectiveRecord::State::completed:
      return "completed";
    case CollectiveRecord::State::failed:
      return "failed";
  }
  return "queued";
}

FlightRecorder::FlightRecorder(const World& world, std::string backend, std::size_t capacity)
    : ring_(std::max<std::size_t>(capacity, 1)),
      fault_(TestFault::from_environment(world.rank)),
      rank_(world.rank),
      size_(world.size),
      backend_(std::move(backend)) {
  path_ = flight_record_dir(world) + fmt::format("/rank-{}.json", rank_);
}

std::uint64_t FlightRecorder::enter(const char* kind, std::int64_t bytes, int tensors) {
  fault_.at_collective(step_.load(), ++in_step_);
  std::lock_guard lock(mutex_);
  const std::uint64_t seq = next_++;
  CollectiveRecord& r = ring_[seq % ring_.size()];
  r = CollectiveRecord{seq, kind, bytes, tensors, step_.load(), CollectiveRecord::State::queued, now_us(), 0, 0};
  return seq;
}

void FlightRecorder::started(std::uint64_t seq) {
  std::lock_guard lock(mutex_);
  CollectiveRecord& r = ring_[seq % ring_.size()];
  if (r.seq == seq) r.state = CollectiveRecord::State::started, r.started_us = now_us();
}

void FlightRecorder::ended(std::uint64_t seq, bool ok) {
  std::lock_guard lock(mutex_);
  CollectiveRecord& r = ring_[seq % ring_.size()];
  const bool open = r.state == CollectiveRecord::State::queued || r.state == CollectiveRecord::State::started;
  if (r.seq == seq && open)  // the first to say how it ended is right
    r.state = ok ? CollectiveRecord::State::completed : CollectiveRecord::State::failed, r.ended_us = now_us();
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  std::lock_guard lock(mutex_);
  std::vector<CollectiveRecord> out;
  const std::uint64_t n = ring_.size();
  for (std::uint64_t seq = next_ > n ? next_ - n : 1; seq < next_; ++seq) out.push_back(ring_[seq % n]);
  return out;
}

CollectiveRecord FlightRecorder::record(std::uint64_t seq) const {
  std::lock_guard lock(mutex_);
  const CollectiveRecord& r = ring_[seq % ring_.size()];
  return r.seq == seq ? r : CollectiveRecord{};
}

std::string FlightRecorder::write(const std::string& reason, std::string* failure) {
  {
    std::lock_guard lock(mutex_);
    if (written_) return path_;
    written_ = true;
  }
  nlohmann::ordered_json j{{"rank", rank_},
                           {"world_size", size_},
                           {"backend", backend_},
                           {"reason", reason},
                           {"written_us", now_us()},
                           {"step", step_.load()},
                           {"collectives", nlohmann::ordered_json::array()}};
  for (const CollectiveRecord& r : records()) j["collectives"].push_back(to_json(r));
  std::error_code ec;
  const std::filesystem::path path(path_);
  std::filesystem::create_directories(path.parent_path(), ec);
  const std::string partial = path_ + fmt::format(".partial.{}", ::getpid());
  {
    std::ofstream out(partial, std::ios::trunc);
    out << j.dump(1) << '\n';
    out.flush();
    if (!out) {
      if (failure) *failure = fmt::format("cannot write '{}': {}", partial, std::strerror(errno));
      std::filesystem::remove(partial, ec);
      return "";
    }
  }
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    if (failure) *failure = fmt::format("cannot write '{}': {}", path_, ec.message());
    return "";
  }
  return path_;
}

std::string flight_record_dir(const World& world) {
  if (const char* d = std::getenv("LMSCOPE_FLIGHT_RECORD_DIR"); d != nullptr && *d != '\0') return d;
  const char* tmp = std::getenv("TMPDIR");
  return fmt::format("{}/lmscope-flight-records/{}", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                     world.run_id.empty() ? "run" : world.run_id);
}

std::vector<std::string> compare_flight_records(const std::string& dir, int size, int first) {
  std::map<int, RankRecord> ranks;
  std::vector<int> missing;
  for (int r = first; r < first + size; ++r) {
    if (auto rec = read_rank_record(fmt::format("{}/rank-{}.json", dir, r)))
      ranks.emplace(r, std::move(*rec));
    else
      missing.push_back(r);
  }
  if (ranks.empty()) return {};
  std::vector<std::string> out;
  // The collective the run is stuck in: the first that some rank did not see complete (a GPU rank's
  // host goes on queueing collectives after the one it will wait in, so later ones say nothing).
  auto seq_of = [](const nlohmann::json& c) { return c["seq"].get<std::uint64_t>(); };
  std::uint64_t stuck = UINT64_MAX;
  for (const auto& [r, rec] : ranks) {
    std::uint64_t first_open = rec.last() ? seq_of(*rec.last()) + 1 : 1;
    for (const auto& c : rec.collectives)
      if (c.value("state", std::string{}) != "completed") {
        first_open = seq_of(c);
        break;
      }
    stuck = std::min(stuck, first_open);
  }
  std::vector<int> entered, behind;
  for (const auto& [r, rec] : ranks) (rec.last() && seq_of(*rec.last()) >= stuck ? entered : behind).push_back(r);
  const int at = entered.empty() || ranks.at(entered.front()).find(stuck) == nullptr ? -1 : entered.front();
  if (at >= 0) {
    const nlohmann::json& c = *ranks.at(at).find(stuck);
    for (int r : behind) {
      const auto* last = ranks.at(r).last();
      out.push_back(
          fmt::format("rank {} never entered {}, in which {} waited; its last collective was {}", r,
                      collective_words(c), rank_list(entered),
                      last ? fmt::format("{}, {}", collective_words(*last), last->value("state", "?")) : "none"));
    }
    if (behind.empty()) {
      // Every rank that wrote a record entered it: which saw it fail, which waited how long.
      std::vector<int> failed;
      std::string waits;
      for (int r : entered) {
        const RankRecord& rec = ranks.at(r);
        const nlohmann::json& mine = *rec.find(stuck);
        if (mine.value("state", std::string{}) == "failed") {
          failed.push_back(r);
          continue;
        }
        const double s = static_cast<double>(rec.written_us - mine.value("queued_us", std::int64_t{0})) / 1e6;
        waits += fmt::format("{}rank {} for {:.1f} s", waits.empty() ? "" : ", ", r, std::max(0.0, s));
      }
      if (!failed.empty()) out.push_back(fmt::format("{} saw {} fail", rank_list(failed), collective_words(c)));
      if (!waits.empty()) out.push_back(fmt::format("still waiting in {}: {}", collective_words(c), waits));
    }
  }
  // The same number for different collectives: the ranks called them in different orders.
  const int ref = at >= 0 ? at : ranks.begin()->first;
  for (const auto& [r, rec] : ranks) {
    if (r == ref) continue;
    for (const auto& c : rec.collectives) {
      const auto* theirs = ranks.at(ref).find(c["seq"].get<std::uint64_t>());
      if (theirs && ((*theirs).value("kind", "") != c.value("kind", "") ||
                     (*theirs).value("bytes", std::int64_t{0}) != c.value("bytes", std::int64_t{0}))) {
        out.push_back(fmt::format("ranks {} and {} called different collectives as #{}: {} and {}", ref, r,
                                  c.value("seq", 0), collective_words(*theirs), collective_words(c)));
        break;
      }
    }
  }
  if (!missing.empty())
    out.push_back(
        fmt::format("{} left no record (killed, or ended before a collective went wrong)", rank_list(missing)));
  return out;
}

}  // namespace lmscope::parallel
