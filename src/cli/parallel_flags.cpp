#include "parallel_flags.h"

#include "lmscope/core/error.h"
#include "lmscope/parallel/communicator.h"
#include "lmscope/parallel/nccl_version.h"
#include "lmscope/parallel/run_agreement.h"

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace lmscope::cli {
namespace {

// What a description's key is on the command line: mostly its flag ("bucket_mb" is --bucket-mb).
std::string setting_words(const std::string& key) {
  static const std::map<std::string, std::string> named{
      {"name", "--model"},
      {"world_size", "WORLD_SIZE"},
      {"kind", "--lr-schedule"},
      {"lr_max", "--lr"},
      {"lr_min", "--min-lr"},
      {"data_tokens", "the number of tokens in --data"},
      {"val_data_tokens", "the number of tokens in --val-data"},
      {"resumed_step", "the step of the checkpoint --resume goes on from"},
      {"cells", "the number of cells the flags make"}};
  if (const auto it = named.find(key); it != named.end()) return it->second;
  std::string flag = "--" + key;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

// A model's name and parameter count follow from its shape: moved after it, so that a difference of
// shape is named by its own flag (--layers) rather than by the name it makes.
nlohmann::ordered_json derived_last(const nlohmann::ordered_json& j) {
  if (j.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& v : j) out.push_back(derived_last(v));
    return out;
  }
  if (!j.is_object()) return j;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [k, v] : j.items())
    if (k != "name" && k != "parameters") out[k] = derived_last(v);
  for (const char* k : {"name", "parameters"})
    if (j.contains(k)) out[k] = j.at(k);
  return out;
}

}  // namespace

void ParallelFlags::add_to(CLI::App& app, bool with_world_size) {
  app_ = &app;
  if (with_world_size)
    app.add_option("--world-size", world_size,
                   "With --dry-run: the number of ranks the run is one of (a real run's comes from lmscope launch, "
                   "torchrun or Slurm)");
  app.add_option("--tp", tp,
                 "Tensor parallelism over the ranks (lmscope launch --nproc N, torchrun or Slurm start them; N of "
                 "them): each layer's q, k, v, w1 and w3 split by their outputs, output_proj and w2 by their inputs, "
                 "one all-reduce after each of those; every rank reads the whole batch (docs/tensor-parallel.md)")
      ->capture_default_str();
  app.add_option("--ddp", ddp,
                 "Data parallelism over the ranks (lmscope launch, torchrun or Slurm start them): naive (each "
                 "gradient all-reduced after the backward), flat (one buffer), overlap (each gradient's all-reduce "
                 "started as the backward finishes it) or bucketed (the default with several ranks)");
  app.add_option("--grad-exchange", grad_exchange,
                 "With --ddp: how the ranks' gradients are summed: all-reduce (NCCL's or Gloo's), or all-gather "
                 "(every rank gathers every rank's gradients and adds them up after the backward, holding the "
                 "world's size times the gradients; on GPUs with --symmetric-memory on and NCCL 2.28.9 or later, "
                 "NCCL moves them by the copy engines, leaving every SM to the backward)")
      ->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb,
                 "Bucket size of --ddp bucketed and of --zero 1 and 2's exchange (MiB; --zero 3 exchanges each "
                 "parameter by itself)")
      ->capture_default_str();
  app.add_option("--comm-sms", comm_sms,
                 "GPUs, --ddp overlap or bucketed: the SMs the gradients' exchange may hold during the backward "
                 "(NCCL's blocks capped to it), the backward's matrix products chosen for the SMs left by timing "
                 "them beside that many held SMs; 0: NCCL's own choice and the products as alone; auto: 8 with "
                 "--symmetric-memory on, else 0")
      ->capture_default_str();
  app.add_option("--zero", zero,
                 "1: shard AdamW's moments across the ranks (ZeRO-1: gradients reduce-scattered, each rank updates "
                 "its part, parameters all-gathered); 2: the summed gradients too (ZeRO-2: each --bucket-mb bucket "
                 "reduce-scattered in the backward as it becomes final, and freed)")
      ->capture_default_str();
  app.add_option("--symmetric-memory", symmetric_memory,
                 "With --ddp: on: the gradients in NCCL's symmetric memory (a window every rank maps alike), whose "
                 "all-reduce runs on a few SMs and leaves the backward beside it the rest; off: where the allocator "
                 "puts them (NCCL's ring, on more SMs)")
      ->capture_default_str();
  app.add_option("--collective-timeout", collective_timeout,
                 "Seconds a collective may take before its rank gives up: it writes its flight record, aborts its "
                 "communicator and exits 1 naming the collective (NCCL and Gloo)")
      ->capture_default_str();
  app.add_option("--rendezvous", rendezvous,
                 "Where the ranks meet: file:DIR (a directory every rank sees) or tcp:HOST:PORT (default: "
                 "MASTER_ADDR and MASTER_PORT)");
}

parallel::ParallelPlan ParallelFlags::resolve(std::int64_t global_batch, const std::string& device,
                                              bool dry_run) const {
  const CLI::App& app = *app_;
  const bool sized = app.get_option_no_throw("--world-size") && app.count("--world-size") > 0;
  if (sized && !dry_run)
    user_error(
        "--world-size sets the world of a dry run (--dry-run); a real run's ranks come from lmscope launch, "
        "torchrun or Slurm");
  if (sized && world_size < 1) user_error("--world-size must be positive, got {}", world_size);
  parallel::ParallelPlan r;
  if (sized)
    r.world.size = world_size;  // rank 0 of it: every rank's share is the same size
  else
    r.world = parallel::world_from_environment(rendezvous);
  if (collective_timeout < 1)
    user_error("--collective-timeout must be a positive number of seconds, got {}", collective_timeout);
  r.world.collective_timeout = std::chrono::seconds(collective_timeout);
  if (symmetric_memory != "on" && symmetric_memory != "off")
    user_error("unknown --symmetric-memory '{}' (use on or off)", symmetric_memory);
  bool asked = taken_;
  const char* data_flag = nullptr;  // the first data-parallel flag given
  for (const char* flag : {"--ddp", "--zero", "--bucket-mb", "--symmetric-memory", "--comm-sms", "--grad-exchange"})
    if (app.count(flag) > 0 && !data_flag) data_flag = flag;
  asked = asked || data_flag != nullptr;
  r.tp = tp;
  if (tp != 1) {
    if (asked)
      user_error(
          "--tp {} runs over the whole world for now: {} and the rest of data parallelism beside it are not "
          "built yet",
          tp, data_flag ? data_flag : "a checkpoint's data-parallel layout");
    r.validate(global_batch, true, true);
    return r;
  }
  if (r.world.size == 1 && !asked) return r;
  // A bucket's bytes are a size_t: --bucket-mb 1e308 (or 2^64) overflowed it and ran as some other size.
  constexpr int kMaxBucketMb = 1 << 20;
  if (bucket_mb > kMaxBucketMb)
    user_error("--bucket-mb must be at most {} (a TiB, past any model's gradients), got {}", kMaxBucketMb, bucket_mb);
  parallel::DataParallelSpec spec;
  if (!ddp.empty()) spec.mode = parallel::parse_ddp_mode(ddp);
  spec.exchange = parallel::parse_grad_exchange(grad_exchange);
  spec.bucket_mb = bucket_mb;
  spec.zero = zero;
  spec.symmetric_memory = symmetric_memory == "on";
  if (comm_sms != "auto") {
    try {
      std::size_t used = 0;
      spec.comm_sms = std::stoi(comm_sms, &used);
      if (used != comm_sms.size() || spec.comm_sms < 0) throw std::invalid_argument(comm_sms);
    } catch (const std::exception&) {
      user_error("--comm-sms takes auto, or 0 (NCCL's choice) to 64, got '{}'", comm_sms);
    }
  }
  if (zero != 0 && !ddp.empty())
    user_error(
        "--zero {} exchanges the gradients its own way (reduce-scattered in --bucket-mb buckets); leave --ddp "
        "out",
        zero);
  if (zero == 3 && app.count("--bucket-mb") > 0)
    user_error(
        "--bucket-mb sizes the buckets of --ddp and of --zero 1 and 2; --zero 3 exchanges each parameter by "
        "itself: leave it out");
  if (zero != 0 && app.count("--symmetric-memory") + app.count("--comm-sms") + app.count("--grad-exchange") > 0)
    user_error(
        "--symmetric-memory, --comm-sms and --grad-exchange shape --ddp's exchange; --zero {} exchanges its own "
        "way: leave them out",
        zero);
  if (spec.exchange == parallel::GradExchange::all_gather && app.count("--comm-sms") > 0)
    user_error(
        "--comm-sms plans the backward beside the all-reduce's blocks, and --grad-exchange all-gather is not "
        "planned around (on the copy engines it holds no SMs): leave it out");
  if (app.count("--comm-sms") > 0 && (spec.mode == parallel::DdpMode::naive || spec.mode == parallel::DdpMode::flat))
    user_error(
        "--comm-sms plans the backward for an exchange beside it, and --ddp {} exchanges after it: use it "
        "with --ddp overlap or bucketed",
        parallel::ddp_mode_name(spec.mode));
  if (spec.symmetric_memory && spec.zero == 0 && device == "cuda" && !dry_run && r.world.size > 1) {
    const int nccl = parallel::loaded_nccl_version();
    if (!parallel::symmetric_windows_trusted(nccl)) {
      spec.symmetric_memory = false;
      static bool said = false;
      if (r.world.rank == 0 && !std::exchange(said, true))
        fmt::print(stderr,
                   "note: NCCL {} is loaded, and lmscope uses its symmetric memory from {} on (2.28.3 summed a "
                   "bucket's all-reduces there wrongly): the gradients stay in ordinary memory, as with "
                   "--symmetric-memory off\n",
                   parallel::nccl_version_text(nccl), parallel::nccl_version_text(parallel::kSymmetricWindowsFrom));
    }
  }
  r.data = spec;
  r.validate(global_batch, true, true);
  return r;
}

void ParallelFlags::take_from_checkpoint(const parallel::ParallelPlan& theirs) {
  const CLI::App& app = *app_;
  const int ranks = parallel::world_from_environment(rendezvous).size;
  // Tensor parallelism goes on where the world still has its degree of ranks and no layout was asked.
  if (theirs.tp > 1 && ranks == theirs.tp && app.count("--tp") == 0) {
    bool other = false;
    for (const char* flag : {"--ddp", "--zero", "--bucket-mb", "--symmetric-memory", "--comm-sms", "--grad-exchange"})
      other = other || app.count(flag) > 0;
    if (!other) tp = theirs.tp;
    return;
  }
  if (!theirs.data || ranks == 1) return;
  const parallel::DataParallelSpec& d = *theirs.data;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  const bool exchange_given =
      given("--ddp") || given("--grad-exchange") || given("--symmetric-memory") || given("--comm-sms");
  if (!given("--bucket-mb")) bucket_mb = d.bucket_mb;
  if (d.zero != 0) {
    if (!given("--zero") && !exchange_given) zero = d.zero;
  } else if (zero == 0) {
    if (!given("--ddp")) ddp = parallel::ddp_mode_name(d.mode);
    if (!given("--grad-exchange")) grad_exchange = parallel::grad_exchange_name(d.exchange);
    if (!given("--symmetric-memory")) symmetric_memory = d.symmetric_memory ? "on" : "off";
    if (!given("--comm-sms"))
      comm_sms = d.comm_sms == parallel::DataParallelSpec::kAutoCommSms ? "auto" : std::to_string(d.comm_sms);
  }
  taken_ = true;
}

std::vector<std::string> ParallelFlags::changes(const parallel::ParallelPlan& theirs,
                                                const parallel::ParallelPlan& now) {
  auto ranks = [](int n) { return fmt::format("{} rank{}", n, n == 1 ? "" : "s"); };
  auto layout = [](const parallel::ParallelPlan& p) {
    return p.data || p.tp > 1 ? p.words() : std::string("one process");
  };
  std::vector<std::string> said;
  if (theirs.world.size != now.world.size)
    said.push_back(fmt::format(
        "the checkpoint's run was on {} and this one is on {}: the global batch is the same, its gradients summed in "
        "another order (the steps will not repeat an unstopped run's bit for bit)",
        ranks(theirs.world.size), ranks(now.world.size)));
  if (layout(theirs) != layout(now))
    said.push_back(fmt::format("the {}parallelism is {} here and was {} in the checkpoint's run; going on with {}",
                               theirs.tp > 1 || now.tp > 1 ? "" : "data ", layout(now), layout(theirs), layout(now)));
  return said;
}

void check_ranks_agree(const parallel::World& world, const nlohmann::ordered_json& description) {
  const auto disagreement = parallel::compare_with_rank0(world, description);
  if (!disagreement) return;
  const int r = disagreement->rank;
  const auto d = parallel::first_difference(derived_last(disagreement->theirs), derived_last(disagreement->rank0));
  if (!d)  // (the hashes differed, the descriptions not: cannot be, but is no reason to go on)
    user_error("rank {} was started with other flags than rank 0; give every rank the same flags", r);
  user_error(
      "rank {} was started with other flags than rank 0: {} is {} there and {} on rank 0 (key {} of the run's "
      "settings); give every rank the same flags",
      r, setting_words(d->key), d->a, d->b, d->path);
}

}  // namespace lmscope::cli
