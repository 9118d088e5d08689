#include "lmscope/parallel/collective_watchdog.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace lmscope::parallel {
namespace {

// How often the watchdog looks: a timeout is seen within this of its end, and a rank's collectives
// cost it nothing but a map entry.
constexpr auto kPoll = std::chrono::milliseconds(100);
// How long the abort may take before the process ends without it.
constexpr auto kAbortWait = std::chrono::seconds(5);

}  // namespace

CollectiveWatchdog::CollectiveWatchdog(FlightRecorder& recorder, const World& world, std::string library, Hooks hooks)
    : recorder_(recorder), world_(world), library_(std::move(library)), hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() { stop(); }

void CollectiveWatchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::watch(std::uint64_t seq, std::function<bool()> done) {
  std::lock_guard lock(mutex_);
  pending_.emplace(seq, std::move(done));
}

std::string CollectiveWatchdog::prefix() const {
  return world_.size > 1 ? fmt::format("lmscope: rank {}: ", world_.rank) : "lmscope: ";
}

void CollectiveWatchdog::run() {
  if (hooks_.thread_start) hooks_.thread_start();
  bool signal_written = false;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kPoll, [this] { return stopping_; });
    if (stopping_) break;
    const auto now = std::chrono::system_clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second()) {
        recorder_.ended(it->first, true);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    if (!pending_.empty()) {  // the oldest unfinished one is the one the others wait for
      const CollectiveRecord r = recorder_.record(pending_.begin()->first);
      const auto queued = std::chrono::system_clock::time_point(std::chrono::microseconds(r.queued_us));
      const double waited = std::chrono::duration<double>(now - queued).count();
      if (r.seq != 0 && waited >= static_cast<double>(world_.collective_timeout.count())) {
        lock.unlock();
        fail(fmt::format("the {} #{} of step {} ({}) over {} has not finished after {:.0f} s "
                         "(--collective-timeout {}): a rank stopped before it, or never called it",
                         r.kind, r.seq, r.step, size_words(r.bytes, r.tensors), library_, waited,
                         world_.collective_timeout.count()),
             "timeout");
      }
    }
    if (hooks_.async_error) {
      if (std::string error = hooks_.async_error(); !error.empty()) {
        const std::uint64_t seq = pending_.empty() ? 0 : pending_.begin()->first;
        lock.unlock();
        const CollectiveRecord r = recorder_.record(seq);
        fail(seq ? fmt::format("{} failed in the {} #{} of step {}: {}", library_, r.kind, r.seq, r.step, error)
                 : fmt::format("{} failed between collectives: {}", library_, error),
             "error");
      }
    }
    if (!signal_written && FlightRecorder::signal_noted() != 0) {
      signal_written = true;
      lock.unlock();
      recorder_.write(fmt::format("signal {}", FlightRecorder::signal_noted()));
      lock.lock();
    }
  }
}

void CollectiveWatchdog::fail(const std::string& what, const std::string& reason) {
  std::string failure;
  const std::string path = recorder_.write(reason, &failure);
  const std::string record = path.empty() ? fmt::format("; its flight record was not written ({})", failure)
                                          : fmt::format("; its last collectives are in '{}'", path);
  fmt::print(stderr, "{}error: {}{}\n", prefix(), what, record);
  std::fflush(nullptr);
  if (hooks_.abort) {
    // The abort ends what the GPU waits in; should it wait on something itself, the process ends anyway.
    auto aborted = std::make_shared<std::atomic<bool>>(false);
    std::thread([abort = hooks_.abort, aborted] {
      abort();
      aborted->store(true);
    }).detach();
    const auto until = std::chrono::steady_clock::now() + kAbortWait;
    while (!aborted->load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::_Exit(1);
}

}  // namespace lmscope::parallel
