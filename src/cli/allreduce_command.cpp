// lmscope allreduce: the assignment's all-reduce benchmark. Each rank of the world this process is in
// (lmscope launch, torchrun or Slurm start them; alone, a world of one) all-reduces float32 tensors of
// each size; rank 0 prints the table and writes --out, the other ranks print nothing on success.
#include "commands.h"
#include "model_flags.h"
#include "parallel_flags.h"
#include "sweep_output.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/bench/allreduce_bench.h"
#include "lmscope/parallel/store.h"

namespace lmscope::cli {
namespace {

class AllreduceCommand : public Command {
 public:
  explicit AllreduceCommand(CLI::App& parent) {
    app = parent.add_subcommand("allreduce",
                                "Benchmark all-reduce of float32 tensors across the ranks (run under lmscope "
                                "launch --nproc N, torchrun or Slurm; alone it times a world of one)");
    app->add_option("--sizes", sizes_,
                    "Tensor sizes in bytes, comma list: KB, MB, GB are decimal (1MB = 10^6 bytes = 250000 float32 "
                    "values), KiB, MiB, GiB binary")
        ->capture_default_str();
    app->add_option("--device", device_,
                    "cpu (collectives over Gloo) or cuda (over NCCL; default when a GPU is visible)");
    app->add_option("--backend", backend_, "gloo or nccl: another way to say --device cpu or --device cuda");
    app->add_option("--warmup", warmup_, "Untimed all-reduces before the timed ones, per size")->capture_default_str();
    app->add_option("--iters", iters_, "Timed all-reduces per size")->capture_default_str();
    app->add_option("--seed", seed_, "Seed of the random values (each rank draws its own)")->capture_default_str();
    app->add_option("--format", format_, "md, csv or json")->capture_default_str();
    app->add_option("--out", out_, "Write the results here in --format (rank 0), updated after every size");
    app->add_option("--rendezvous", rendezvous_,
                    "Where the ranks meet: file:DIR (a directory every rank sees) or tcp:HOST:PORT (default: "
                    "MASTER_ADDR and MASTER_PORT)");
  }

  int run() override {
    std::vector<std::int64_t> sizes;
    for (const auto& s : split_list(sizes_)) sizes.push_back(parse_byte_size("--sizes", s));
    if (sizes.empty()) user_error("--sizes needs at least one size, like 1MB");
    if (warmup_ < 0) user_error("--warmup must be non-negative, got {}", warmup_);
    if (iters_ <= 0) user_error("--iters must be positive, got {}", iters_);
    if (!device_.empty() && device_ != "cpu" && device_ != "cuda")
      user_error("unknown --device '{}' (use cpu or cuda)", device_);
    if (!backend_.empty() && backend_ != "gloo" && backend_ != "nccl")
      user_error("unknown --backend '{}' (use gloo for the CPU or nccl for GPUs)", backend_);
    const std::string implied = backend_ == "gloo" ? "cpu" : backend_ == "nccl" ? "cuda" : "";
    if (!device_.empty() && !implied.empty() && device_ != implied)
      user_error("--backend {} runs on --device {}, not {}", backend_, implied, device_);
    const std::string device = !device_.empty() ? device_ : !implied.empty() ? implied : default_device();
    const ReportFormat format = parse_report_format(format_);

    const parallel::World world = parallel::world_from_environment(rendezvous_);
    const bool main_rank = world.rank == 0;
    if (main_rank && !out_.empty()) write_file(out_, "");  // fails now, not after the sweep
    if (device == "cuda" && world.size > 1) use_gpu(world.local_rank);
    std::unique_ptr<Backend> backend = make_backend(device, "fp32");
    // Ranks told other sizes or counts would wait on each other in the middle of a sweep (each draws
    // its own values: --seed may differ).
    check_ranks_agree(world, {{"sizes", sizes}, {"warmup", warmup_}, {"iters", iters_}, {"device", device}});
    std::unique_ptr<parallel::Store> store = parallel::next_group_store(world);
    std::unique_ptr<parallel::Communicator> comm = parallel::make_communicator(*backend, world, *store);

    std::optional<SweepProgress> shown;
    if (main_rank) shown.emplace();
    std::vector<AllreduceBenchRow> rows;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const AllreduceBenchSpec spec{.bytes = sizes[i], .warmup = warmup_, .iters = iters_, .seed = seed_};
      if (shown)
        shown->start(fmt::format("[{}/{}] all-reduce of {} over {} rank{} ({})", i + 1, sizes.size(),
                                 decimal_bytes(spec.bytes), world.size, world.size == 1 ? "" : "s", comm->name()));
      rows.push_back(run_allreduce_size(*backend, *comm, spec, [&](int done, int total) {
        if (shown) shown->step(done, total, " all-reduces");
      }));
      if (!shown) continue;
      shown->finish(rows.back().status);
      if (!out_.empty()) write_file(out_, format_allreduce_bench(rows, format));
    }
    if (main_rank) fmt::print("{}", format_allreduce_bench(rows, out_.empty() ? format : ReportFormat::markdown));
    return 0;
  }

 private:
  std::string sizes_ = "1MB,10MB,100MB,1GB", device_, format_ = "md", out_, rendezvous_, backend_;
  int warmup_ = 5, iters_ = 20;
  std::uint64_t seed_ = 0;
};

}  // namespace

std::unique_ptr<Command> add_allreduce_command(CLI::App& parent) { return std::make_unique<AllreduceCommand>(parent); }

}  // namespace lmscope::cli
