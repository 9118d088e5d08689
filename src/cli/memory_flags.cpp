#include "memory_flags.h"

#include "lmscope/backend/backend.h"
#include "lmscope/device/device_facts.h"

#include <fmt/core.h>

#include <algorithm>

namespace lmscope::cli {

void MemoryCellFlags::add_to(CLI::App& app, bool with_dry_run_flags) {
  model_.add_to(app, true);
  app.add_option("--ctx", ctx, "Context length(s)")->capture_default_str();
  app.add_option("--batch", batch, "Batch size(s)")->capture_default_str();
  app.add_option("--mode", mode,
                 "inference (a forward that keeps nothing for backward), forward, forward-backward or train "
                 "(comma list sweeps)")
      ->capture_default_str();
  app.add_option("--device", device, "cpu or cuda (comma list sweeps; default: cuda when a GPU is visible)");
  app.add_option("--precision", precision, "fp32, tf32, bf16 or fp16 (comma list sweeps)")->capture_default_str();
  app.add_option("--attention", attention, "flash or naive (comma list sweeps)")->capture_default_str();
  app.add_option("--recompute", recompute, recompute_help(true))->capture_default_str();
  app.add_option("--grad-accum", grad_accum, grad_accum_help(true))->capture_default_str();
  app.add_option("--weight-copies", weight_copies, weight_copies_help(true))->capture_default_str();
  app.add_option("--grad-dtype", grad_dtype, grad_dtype_help(true))->capture_default_str();
  app.add_option("--master-dtype", master_dtype, master_dtype_help(true))->capture_default_str();
  app.add_option("--warmup", warmup, warmup_help)->capture_default_str();
  app.add_option("--seed", seed_, seed_help)->capture_default_str();
  parallel_.add_to(app, with_dry_run_flags);
  if (!with_dry_run_flags) return;
  app.add_flag("--dry-run", dry_run_,
               always_dry_ ? "Always on here: every cell runs on the shape-only backend" : dry_run_help);
  app.add_option("--memory-limit", memory_limit_, memory_limit_help());
}

std::string memory_limit_help() {
  return fmt::format(
      "The memory a dry run is held to, e.g. 40GiB (default: the device's; for cuda without a GPU an H100 80GB HBM3's "
      "{})",
      human_bytes(static_cast<double>(h100_memory_bytes())));
}

std::size_t MemoryCellFlags::memory_limit() const {
  return memory_limit_.empty() ? 0 : parse_memory_size("--memory-limit", memory_limit_);
}

std::vector<MemorySpec> MemoryCellFlags::resolve() const {
  const auto models = model_.resolve();
  const auto ctxs = parse_positive_list("--ctx", ctx), batches = parse_positive_list("--batch", batch);
  std::vector<StepMode> modes;
  for (const auto& m : split_list(mode)) modes.push_back(parse_step_mode(m));
  const auto devices = split_list(device.empty() ? (dry_run_ ? std::string("cuda") : default_device()) : device);
  for (const auto& d : devices)
    if (d != "cpu" && d != "cuda") user_error("unknown --device '{}' (use cpu or cuda)", d);
  const auto precisions = split_list(precision);
  for (const auto& p : precisions) check_precision(p);
  std::vector<AttentionKind> attentions;
  for (const auto& a : split_list(attention)) attentions.push_back(parse_attention(a));
  std::vector<RecomputePlan> recomputes;
  for (const auto& r : split_list(recompute)) recomputes.push_back(parse_recompute(r));
  const auto accums = parse_positive_list("--grad-accum", grad_accum);
  std::vector<WeightCopies> copies;
  for (const auto& c : split_list(weight_copies)) copies.push_back(parse_weight_copies(c));
  const auto grad_dtypes = split_list(grad_dtype);
  for (const auto& g : grad_dtypes) check_grad_dtype(g, "bf16");  // the names; whether they fit, per cell
  std::vector<DType> masters;
  for (const auto& m : split_list(master_dtype)) masters.push_back(parse_master_dtype(m));
  if (warmup < 0) user_error("--warmup must be non-negative, got {}", warmup);
  const std::size_t limit = memory_limit();
  if (always_dry_ && !dry_run_) user_error("this command always runs dry; --dry-run=false is not possible");
  if (limit > 0 && !dry_run_) user_error("--memory-limit holds a dry run; add --dry-run");
  std::vector<MemorySpec> cells;
  for (const auto& m : models)
    for (const auto& d : devices)
      for (const auto& p : precisions)
        for (auto a : attentions)
          for (auto md : modes)
            for (auto rc : recomputes)
              for (auto wc : copies)
                for (const auto& gd : grad_dtypes)
                  for (auto ms : masters)
                    for (auto k : accums) {
                      // Only a backward accumulates: a mode without one runs once, as one micro-batch.
                      // Nor are there gradients to keep in another dtype.
                      if (!has_backward(md) && (k != accums.front() || gd != grad_dtypes.front())) continue;
                      // Only mixed precision has copies to place otherwise.
                      if (wc != WeightCopies::kept && compute_dtype(p) == DType::f32) continue;
                      // Only bf16 computes the gradients it can keep in bf16.
                      if (has_backward(md) && !grad_dtype_fits(gd, p)) continue;
                      // bf16 masters: bf16 compute on CUDA, their gradients bf16 whatever --grad-dtype says, no copies.
                      if (ms == DType::bf16 &&
                          (p != "bf16" || d != "cuda" || gd != grad_dtypes.front() || wc != WeightCopies::kept))
                        continue;
                      for (auto b : batches)
                        for (auto t : ctxs) {
                          MemorySpec s;
                          s.cell.model = m;
                          s.cell.device = d;
                          s.cell.precision = p;
                          s.cell.attention = a;
                          s.cell.mode = md;
                          s.cell.batch = b;
                          s.cell.ctx = t;
                          s.cell.warmup = warmup;
                          s.cell.steps = 1;
                          s.cell.seed = seed_;
                          s.cell.recompute = rc;
                          s.cell.grad_accum = has_backward(md) ? static_cast<int>(k) : 1;
                          s.cell.weight_copies = wc;
                          s.cell.grad_dtype = cell_grad_dtype(md, parse_grad_dtype(gd));
                          s.cell.master_dtype = ms;
                          if (ms == DType::bf16 && has_backward(md)) s.cell.grad_dtype = DType::bf16;
                          s.cell.parallel = parallel_.resolve(b, d, dry_run_);
                          RunSpec checked = s.cell;  // before any cell runs
                          validate_run(checked);
                          s.dry_run = dry_run_;
                          s.memory_limit = limit;
                          cells.push_back(s);
                        }
                    }
  if (cells.empty()) {
    if (std::find(grad_dtypes.begin(), grad_dtypes.end(), "fp32") == grad_dtypes.end())
      check_grad_dtype(grad_dtypes.front(), precisions.front());  // --grad-dtype bf16 without bf16
    for (const auto& c : split_list(weight_copies)) check_weight_copies(c, precisions.front());
    if (std::find(masters.begin(), masters.end(), DType::f32) == masters.end())
      user_error("no cell is left to run: --master-dtype bf16 needs --precision bf16 on --device cuda");
    user_error("no cell is left to run: what --weight-copies and --grad-dtype ask for needs --precision bf16");
  }
  return cells;
}

std::string cell_label(const MemorySpec& s) {
  const BenchSpec& c = s.cell;
  return fmt::format("{} {} {} {} {} batch {} ctx {}{}", c.model.name, c.device, c.precision,
                     attention_name(c.attention), c.label(), c.batch, c.ctx, s.dry_run ? " (dry run)" : "");
}

void warn_of_cells_that_cannot_fit(const std::vector<MemorySpec>& cells) {
  for (const MemorySpec& cell : cells) {
    if (cell.dry_run) continue;
    MemorySpec dry = cell;
    dry.dry_run = true;
    const MemoryRecord r = record_memory(dry);
    if (!r.fits())
      fmt::print(stderr, "lmscope: warning: {} {} by the dry run; expect it to run out of memory\n", cell_label(cell),
                 r.status);
  }
}

void check_ranks_run_the_same_cells(const std::vector<MemorySpec>& cells) {
  const parallel::World& world = cells.front().cell.parallel.world;
  if (world.size == 1 || cells.front().dry_run) return;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const MemorySpec& c : cells) {
    nlohmann::ordered_json j = c.cell.to_json();
    j["warmup"] = c.cell.warmup;
    j["steps"] = c.cell.steps;
    j["profile"] = c.cell.profile;
    j["trace"] = c.cell.trace;
    j["memory_limit"] = c.memory_limit;
    list.push_back(std::move(j));
  }
  check_ranks_agree(world, {{"cells", std::move(list)}});
}

}  // namespace lmscope::cli
