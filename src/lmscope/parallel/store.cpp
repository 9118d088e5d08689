// open_store: the store of a world's rendezvous, its keys under the run's id, its waits bounded by the
// world's timeout with one sentence naming what was missing.
#include "lmscope/parallel/store.h"

#include "lmscope/core/error.h"
#include "lmscope/parallel/tcp_store.h"

#include <fmt/format.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>

#if LMSCOPE_HAVE_GLOO
#include <gloo/rendezvous/file_store.h>
#endif

namespace lmscope::parallel {
namespace {

// A world of one's store: a map in this process.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<char>& data) override {
    std::lock_guard lock(mutex_);
    data_[key] = data;
    changed_.notify_all();
  }
  std::vector<char> get(const std::string& key) override {
    std::lock_guard lock(mutex_);
    return data_.at(key);  // Keyed below waits for it first.
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, std::chrono::seconds(30)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::unique_lock lock(mutex_);
    auto all = [&] {
      for (const std::string& k : keys)
        if (!data_.count(k)) return false;
      return true;
    };
    if (!changed_.wait_for(lock, timeout, all)) throw std::runtime_error("timed out");
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
};

// Puts every key under the run's prefix and waits before each get, so a key that never comes is our
// sentence naming it and the rendezvous rather than the inner store's own exception.
class Keyed : public Store {
 public:
  Keyed(std::unique_ptr<Store> inner, std::string prefix, std::chrono::milliseconds timeout, std::string where)
      : inner_(std::move(inner)), prefix_(std::move(prefix)), timeout_(timeout), where_(std::move(where)) {}

  void set(const std::string& key, const std::vector<char>& data) override { inner_->set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return inner_->get(prefix_ + key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    try {
      inner_->wait(full, timeout);
    } catch (const std::exception&) {  // the file and memory stores' waits throw only when time is up
      std::string names;
      for (const std::string& k : keys) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", k);
      throw RankFailure(
          fmt::format("waited {:g} s for key{} {} at the rendezvous {} (LMSCOPE_DIST_TIMEOUT "
                      "sets how long)",
                      timeout.count() / 1000.0, keys.size() == 1 ? "" : "s", names, where_));
    }
  }

 private:
  std::unique_ptr<Store> inner_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::string where_;
};

// Another store's keys under a prefix; the other store stays its owner's.
class Prefixed : public Store {
 public:
  Prefixed(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { base_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return base_.get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { base_.wait(under(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    base_.wait(under(keys), timeout);
  }

 private:
  std::vector<std::string> under(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  Store& base_;
  std::string prefix_;
};

// The process's stores, one a world, with the groups each has handed out.
struct ProcessStore {
  std::once_flag opened;
  std::unique_ptr<Store> store;
  int groups = 0;
};

}  // namespace

std::unique_ptr<Store> next_group_store(const World& world) {
  static std::mutex mutex;
  static std::map<std::string, ProcessStore> stores;  // nodes stay where they are
  ProcessStore* entry = nullptr;
  {
    std::lock_guard lock(mutex);
    entry = &stores[fmt::format("{}|{}|{}|{}", world.rendezvous, world.run_id, world.rank, world.size)];
  }
  // Opened outside the registry's lock: a TCP client retries until rank 0 serves, which may be another
  // thread of this process asking for its own store meanwhile. (A failed open may be tried again.)
  std::call_once(entry->opened, [&] { entry->store = open_store(world); });
  std::lock_guard lock(mutex);
  return std::make_unique<Prefixed>(*entry->store, fmt::format("group{}.", entry->groups++));
}

std::unique_ptr<Store> open_store(const World& world) {
  const std::string& r = world.rendezvous;
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(world.timeout);
  // A separator that is a valid file name character too (the file store's keys are file names).
  const std::string prefix = world.run_id.empty() ? "" : world.run_id + ".";
  if (r.starts_with("tcp:")) {
    const auto colon = r.rfind(':');
    LMSCOPE_CHECK(colon > 4, "rendezvous '{}' was not checked", r);
    return std::make_unique<TcpStore>(r.substr(4, colon - 4), std::stoi(r.substr(colon + 1)), world.rank == 0, timeout,
                                      prefix);
  }
  if (r.starts_with("file:")) {
#if LMSCOPE_HAVE_GLOO
    const std::string dir = r.substr(5);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) user_error("cannot create the rendezvous directory {}: {}", dir, ec.message());
    return std::make_unique<Keyed>(std::make_unique<gloo::rendezvous::FileStore>(dir), prefix, timeout, r);
#else
    throw Unsupported(
        fmt::format("--rendezvous {} needs Gloo's file store, which this build lacks (Debian: "
                    "libgloo-dev); use MASTER_ADDR and MASTER_PORT instead",
                    r));
#endif
  }
  if (!r.empty()) user_error("unknown rendezvous '{}' (use file:DIR or tcp:HOST:PORT)", r);
  if (world.size == 1) return std::make_unique<Keyed>(std::make_unique<MemoryStore>(), prefix, timeout, "in memory");
  user_error("ranks of a world of {} need a rendezvous: set MASTER_ADDR and MASTER_PORT, or give --rendezvous file:DIR",
             world.size);
}

}  // namespace lmscope::parallel
