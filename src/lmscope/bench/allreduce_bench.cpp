#include "lmscope/bench/allreduce_bench.h"

#include "lmscope/backend/backend.h"
#include "lmscope/core/rng.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <new>
#include <numeric>

namespace lmscope {

std::int64_t parse_byte_size(const std::string& flag, const std::string& text) {
  std::size_t split = 0;
  while (split < text.size() && (std::isdigit(static_cast<unsigned char>(text[split])) || text[split] == '.')) ++split;
  std::string unit = text.substr(split);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {{"b", 1},
                                                  {"kb", 1e3},
                                                  {"mb", 1e6},
                                                  {"gb", 1e9},
                                                  {"kib", 1024.0},
                                                  {"mib", 1024.0 * 1024},
                                                  {"gib", 1024.0 * 1024 * 1024}};
  const auto* u = std::find_if(std::begin(units), std::end(units), [&](const auto& p) { return unit == p.first; });
  double number = 0;
  std::size_t used = 0;
  try {
    if (split > 0) number = std::stod(text.substr(0, split), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (split == 0 || used != split || u == std::end(units))
    user_error("{} takes sizes like 1MB or 512KiB (units B, KB, MB, GB of 1000 or KiB, MiB, GiB of 1024), not '{}'",
               flag, text);
  const double bytes = number * u->second;
  if (!(bytes >= 4) || bytes > 1e15 || std::abs(bytes - std::round(bytes)) > 1e-6 ||
      static_cast<std::int64_t>(std::round(bytes)) % 4 != 0)
    user_error("{} '{}' is not a whole, positive number of float32 values (a multiple of 4 bytes)", flag, text);
  return static_cast<std::int64_t>(std::round(bytes));
}

std::string decimal_bytes(std::int64_t bytes) {
  const char* names[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  return fmt::format("{:g} {}", std::round(v * 1000) / 1000, names[i]);
}

namespace {

using Clock = std::chrono::steady_clock;

// Copies `block` over t again and again: random values for a 1 GB tensor without drawing 250M of
// them, and a pattern of period 8 when the block's length is a multiple of 8.
void tile(Backend& be, const Tensor& t, const std::vector<float>& block) {
  const auto b = static_cast<std::int64_t>(block.size());
  for (std::int64_t at = 0; at < t.numel(); at += b)
    be.copy_from_host(t.rows(at, std::min(b, t.numel() - at)), block.data());
}

float element(Backend& be, const Tensor& t, std::int64_t i) {
  float x = 0;
  be.copy_to_host(&x, t.rows(i, 1));
  return x;
}

// Rank r holds (r+1)·(1 + (i mod 8)/8) at i, so the sum is n(n+1)/2 · (1 + (i mod 8)/8): exact in
// float32, different on every rank and along the tensor, so a sum that dropped a rank, added one
// twice or shifted the data would show.
void check_sum(Backend& be, parallel::Communicator& comm, const Tensor& t, std::vector<float>& block) {
  for (std::size_t i = 0; i < block.size(); ++i)
    block[i] = static_cast<float>((comm.rank() + 1) * (1 + static_cast<double>(i % 8) / 8));
  tile(be, t, block);
  comm.all_reduce(t);
  be.synchronize();
  const std::int64_t n = t.numel(), ranks = comm.size();
  std::vector<std::int64_t> at;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(n, 8); ++i) at.push_back(i), at.push_back(n - 1 - i);
  at.push_back(n / 2);
  for (std::int64_t i : at) {
    const double want = static_cast<double>(ranks * (ranks + 1) / 2) * (1 + static_cast<double>(i % 8) / 8);
    const float got = element(be, t, i);
    if (std::abs(got - want) > 1e-6 * want)
      throw std::runtime_error(
          fmt::format("the {} all-reduce of {} values on {} ranks gave {} at element {} where "
                      "the sum is {} (rank {})",
                      comm.name(), n, ranks, got, i, want, comm.rank()));
  }
}

// Every rank's `mine` (the same length on each), in rank order, on every rank.
std::vector<double> gather(Backend& be, parallel::Communicator& comm, const std::vector<double>& mine) {
  Allocator& mem = be.allocator();
  const auto n = static_cast<std::int64_t>(mine.size());
  Allocation in = mem.allocate({n}, DType::f32, {MemKind::workspace, "allreduce.gather_in", -1});
  Allocation out = mem.allocate({n * comm.size()}, DType::f32, {MemKind::workspace, "allreduce.gather_out", -1});
  upload(be, in, mine);
  comm.all_gather(in, out);
  be.synchronize();
  return download(be, out);
}

}  // namespace

AllreduceBenchRow run_allreduce_size(Backend& backend, parallel::Communicator& comm, const AllreduceBenchSpec& spec,
                                     const BenchProgress& progress) {
  AllreduceBenchRow r{.spec = spec,
                      .world = comm.size(),
                      .backend = comm.name(),
                      .device = backend.allocator().device_name(),
                      .version = comm.version()};
  const std::int64_t n = spec.bytes / 4;
  Allocation tensor;
  try {
    tensor = backend.allocator().allocate({n}, DType::f32, {MemKind::workspace, "allreduce.tensor", -1});
  } catch (const OutOfMemory&) {
    r.status = failure_status(std::current_exception());
  } catch (const std::bad_alloc&) {
    r.status = fmt::format("OOM: the host could not give {}", decimal_bytes(spec.bytes));
  }
  // Every rank runs the collectives below or none does: a rank that failed alone would leave the
  // others waiting in the first all-reduce until the timeout.
  const std::vector<double> failed = gather(backend, comm, {r.ok() ? 0.0 : 1.0});
  for (int rank = 0; rank < comm.size() && r.ok(); ++rank)
    if (failed[static_cast<std::size_t>(rank)] != 0)
      r.status = fmt::format("OOM: rank {} could not hold {}", rank, decimal_bytes(spec.bytes));
  if (!r.ok()) return r;

  std::vector<float> block(static_cast<std::size_t>(std::min<std::int64_t>(n, 1 << 20)));
  Rng rng = Rng::stream(spec.seed, fmt::format("allreduce.rank{}", comm.rank()));
  auto fill_random = [&] {
    for (float& x : block) x = static_cast<float>(1 + rng.uniform());  // in [1, 2): never zero
    tile(backend, tensor, block);
  };
  const int total = spec.warmup + spec.iters;
  fill_random();
  for (int i = 0; i < spec.warmup; ++i) {
    comm.all_reduce(tensor);
    backend.synchronize();
    if (progress) progress(i + 1, total);
  }
  check_sum(backend, comm, tensor, block);
  fill_random();

  std::vector<double> ms;
  for (int i = 0; i < spec.iters; ++i) {
    comm.barrier();  // every rank starts together, so no rank's time holds another's lateness
    const auto start = Clock::now();
    comm.all_reduce(tensor);
    backend.synchronize();  // NCCL's wait() only orders the stream
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (progress) progress(spec.warmup + i + 1, total);
  }

  const std::vector<double> all = gather(backend, comm, ms);
  std::vector<double> rank_means;
  for (int rank = 0; rank < comm.size(); ++rank) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(rank) * spec.iters;
    rank_means.push_back(std::accumulate(first, first + spec.iters, 0.0) / spec.iters);
  }
  r.mean_ms = std::accumulate(rank_means.begin(), rank_means.end(), 0.0) / comm.size();
  r.min_rank_ms = *std::min_element(rank_means.begin(), rank_means.end());
  r.max_rank_ms = *std::max_element(rank_means.begin(), rank_means.end());
  double square = 0;
  for (double t : all) square += (t - r.mean_ms) * (t - r.mean_ms);
  r.std_ms = all.size() > 1 ? std::sqrt(square / static_cast<double>(all.size() - 1)) : 0.0;
  r.algbw_gbs = static_cast<double>(spec.bytes) / (r.mean_ms * 1e-3) / 1e9;
  r.busbw_gbs = r.algbw_gbs * 2.0 * (comm.size() - 1) / comm.size();
  return r;
}

namespace {

std::string allreduce_markdown(const std::vector<AllreduceBenchRow>& rows) {
  std::string out =
      "| size | ranks | backend | mean ms | std ms | rank means ms (min–max) | algbw GB/s | busbw GB/s | status |\n"
      "|---:|---:|---|---:|---:|---:|---:|---:|---|\n";
  for (const AllreduceBenchRow& r : rows) {
    out += fmt::format("| {} | {} | {}{}{} | ", decimal_bytes(r.spec.bytes), r.world, r.backend,
                       r.version.empty() ? "" : " ", r.version);
    if (r.ok())
      out += fmt::format("{:.3f} | {:.3f} | {:.3f}–{:.3f} | {:.4g} | {:.4g} | ok |\n", r.mean_ms, r.std_ms,
                         r.min_rank_ms, r.max_rank_ms, r.algbw_gbs, r.busbw_gbs);
    else
      out += fmt::format("- | - | - | - | - | {} |\n", r.status);
  }
  if (std::any_of(rows.begin(), rows.end(), [](const AllreduceBenchRow& r) { return r.world == 1; }))
    out += "\nOne rank: the all-reduce moves nothing between ranks, so its bus bandwidth, algbw · 2(n−1)/n, is 0.\n";
  return out;
}

std::string allreduce_csv(const std::vector<AllreduceBenchRow>& rows) {
  std::string out =
      "bytes,elements,world,backend,device,warmup,iters,mean_ms,std_ms,min_rank_ms,max_rank_ms,algbw_gbs,busbw_gbs,"
      "status,version\n";
  for (const AllreduceBenchRow& r : rows) {
    out += fmt::format("{},{},{},{},{},{},{}", r.spec.bytes, r.spec.bytes / 4, r.world, r.backend, csv_field(r.device),
                       r.spec.warmup, r.spec.iters);
    if (r.ok())
      out += fmt::format(",{:.5f},{:.5f},{:.5f},{:.5f},{:.6g},{:.6g}", r.mean_ms, r.std_ms, r.min_rank_ms,
                         r.max_rank_ms, r.algbw_gbs, r.busbw_gbs);
    else
      out += ",,,,,,";
    out += "," + csv_field(r.status) + "," + csv_field(r.version) + "\n";
  }
  return out;
}

std::string allreduce_json(const std::vector<AllreduceBenchRow>& rows) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const AllreduceBenchRow& r : rows) {
    nlohmann::ordered_json j;
    j["bytes"] = r.spec.bytes;
    j["elements"] = r.spec.bytes / 4;
    j["dtype"] = "f32";
    j["world"] = r.world;
    j["backend"] = r.backend;
    if (!r.version.empty()) j["version"] = r.version;
    j["device"] = r.device;
    j["warmup"] = r.spec.warmup;
    j["iters"] = r.spec.iters;
    j["status"] = r.status;
    if (r.ok()) {
      j["ms"] = {{"mean", r.mean_ms}, {"std", r.std_ms}, {"min_rank", r.min_rank_ms}, {"max_rank", r.max_rank_ms}};
      j["algbw_gbs"] = r.algbw_gbs;
      j["busbw_gbs"] = r.busbw_gbs;
    }
    arr.push_back(j);
  }
  return arr.dump(2) + "\n";
}

}  // namespace

std::string format_allreduce_bench(const std::vector<AllreduceBenchRow>& rows, ReportFormat f) {
  return format_rows(rows, f, allreduce_markdown, allreduce_csv, allreduce_json);
}

}  // namespace lmscope
