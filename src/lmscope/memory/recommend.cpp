#include "lmscope/memory/recommend.h"

#include "lmscope/memory/memory_analysis.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <tuple>

namespace lmscope {

namespace {
int zero_stage(const BenchSpec& s) { return s.parallel.data ? s.parallel.data->zero : 0; }
}  // namespace

Recommendation recommend(const RecommendSpec& spec) {
  const BenchSpec& c = spec.cell;
  LMSCOPE_CHECK(has_backward(c.mode) && c.batch >= 1, "recommendations are for steps with a backward");
  Recommendation out;
  out.spec = spec;
  // Copies exist only under mixed precision (fp32 masters, 16-bit compute). Resident ones save work only where device
  // graphs run (the forward casts kept copies there, AdamW writes resident ones in place): on CUDA, without data
  // or tensor parallelism (which turn graphs off); elsewhere AdamW writes kept copies as it would resident
  // ones, so resident would only add memory.
  std::vector<WeightCopies> copies{WeightCopies::kept};
  if (compute_dtype(c.precision) != DType::f32 && c.master_dtype == DType::f32) {
    if (c.graphs && c.device == "cuda" && !c.parallel.data && c.parallel.tp == 1)
      copies.insert(copies.begin(), WeightCopies::resident);
    copies.push_back(WeightCopies::transient);
  }
  // Data parallelism: the ZeRO stages from the cell's up to the highest built, each sharding more
  // (ZeRO-1 the optimizer's state, ZeRO-2 the gradients too, ZeRO-3 the parameters as well) for
  // communication that lies less well beside the compute; stage 0 is the cell's DDP exchange.
  std::vector<int> stages{c.parallel.data ? c.parallel.data->zero : 0};
  if (c.parallel.data)
    for (int z = stages.front() + 1; z <= parallel::kMaxZeroStage; ++z) stages.push_back(z);
  auto staged = [&](BenchSpec s, int z) {
    if (s.parallel.data && s.parallel.data->zero != z) {
      parallel::DataParallelSpec& d = *s.parallel.data;
      d = parallel::DataParallelSpec{.bucket_mb = d.bucket_mb, .zero = z};  // ZeRO's exchange is its own
    }
    return s;
  };
  // A way no cheaper on any count than one already found (by a coarser split, or by this one with a
  // lower stage or copies that cost less work: resident, then kept) is never faster.
  const int layers = c.model.layers;
  auto dominated = [&](int z, const RecomputePlan& r, WeightCopies w) {
    for (const Candidate& o : out.candidates)
      if (zero_stage(o.spec) <= z && o.spec.recompute.no_more_than(r, layers) && o.spec.weight_copies <= w) return true;
    return false;
  };
  // The ladder of recomputation, least first: none, selective, the first j layers in full and the rest
  // selective (j = 1 .. layers - 1), full. The first way up it that fits is the candidate. Over the
  // mixes j is found by bisection, one layer more in full keeping less for the backward (the dry run of
  // the j named is what says it fits). Full is the last rung, not the mixes' end: its last layer, rerun
  // first, holds its whole activations beside every earlier layer's input, more than that layer kept
  // selective, so full can peak above the mix with one layer fewer in full.
  auto mix = [](int j) { return RecomputePlan(Recompute::full, j, Recompute::selective); };
  // Adds the least recomputation of this split, stage and copies that fits (nothing where none does, or
  // where a way found before is as cheap); false when a dry run failed other than by memory.
  auto climb = [&](BenchSpec s) {
    const int z = zero_stage(s);
    const WeightCopies w = s.weight_copies;
    std::optional<MemoryRecord> fitting;
    auto fits = [&](const RecomputePlan& r) -> std::optional<bool> {  // nullopt: the dry run failed
      s.recompute = r;
      MemoryRecord rec = record_memory(MemorySpec{s, true, spec.memory_limit}, false);
      if (out.device_name.empty()) {
        out.device_name = rec.device_name;
        out.limit = device_limit(rec);
      }
      if (rec.outcome == MemoryOutcome::failed) {
        out.failure = rec.status;
        return std::nullopt;
      }
      if (!rec.ok()) return false;
      fitting = std::move(rec);
      return true;
    };
    auto add = [&](const RecomputePlan& r, const MemoryRecord& rec) {
      s.recompute = r;
      const MemoryAnalysis a = analyze_memory(rec, 1);
      out.candidates.push_back(Candidate{s, a.peak, device_need(rec, a), std::nullopt, "ok"});
      return true;
    };
    for (Recompute r : {Recompute::none, Recompute::selective}) {
      if (dominated(z, r, w)) return true;  // and so is every way that recomputes more
      const std::optional<bool> f = fits(r);
      if (!f) return false;
      if (*f) return add(r, *fitting);
    }
    if (layers > 1 && !dominated(z, mix(1), w)) {
      const std::optional<bool> most = fits(mix(layers - 1));
      if (!most) return false;
      if (*most) {
        int lo = 1, hi = layers - 1;  // the least j that fits lies in [lo, hi]
        MemoryRecord best = std::move(*fitting);
        while (lo < hi) {
          const int mid = lo + (hi - lo) / 2;
          const std::optional<bool> f = fits(mix(mid));
          if (!f) return false;
          if (*f) {
            hi = mid;
            best = std::move(*fitting);
          } else {
            lo = mid + 1;
          }
        }
        return dominated(z, mix(hi), w) || add(mix(hi), best);
      }
    }
    if (dominated(z, Recompute::full, w)) return true;
    const std::optional<bool> f = fits(Recompute::full);
    if (!f) return false;
    return !*f || add(Recompute::full, *fitting);
  };
  // A micro-batch of the step's sequences is split across the ranks too: the splits stop where it no
  // longer divides evenly among them (2 sequences on 2 ranks: one micro-batch of 2, no finer).
  // (Under tensor parallelism every rank runs every sequence.)
  const std::int64_t ranks = c.parallel.data ? std::max(1, c.parallel.world.size) : 1;
  for (std::int64_t k = 1; k <= c.batch && !dominated(stages.front(), Recompute::none, copies.front()); k *= 2) {
    if (c.batch % k != 0 || (c.batch / k) % ranks != 0) break;
    for (int z : stages)
      for (WeightCopies w : copies) {
        BenchSpec s = staged(c, z);
        s.batch = c.batch / k;
        s.grad_accum = static_cast<int>(k);
        s.weight_copies = w;
        if (!climb(s)) {
          out.candidates.clear();
          return out;
        }
      }
  }
  if (out.candidates.empty()) return out;
  // Untimed, the coarsest split with the least recomputation is named, a higher ZeRO stage or
  // transient copies before more recomputation (an exchange that overlaps the backward, or two casts
  // of the weights, against a pass over the activations), and at one split and recomputation the
  // lowest stage, then the copies with the least work (found first).
  std::stable_sort(out.candidates.begin(), out.candidates.end(), [layers](const Candidate& a, const Candidate& b) {
    return std::tuple(a.spec.grad_accum, a.spec.recompute.work(layers), zero_stage(a.spec)) <
           std::tuple(b.spec.grad_accum, b.spec.recompute.work(layers), zero_stage(b.spec));
  });
  out.chosen = 0;
  if (!spec.measure) return out;
  BenchSweep sweep;  // every candidate builds the same model
  for (std::size_t i = 0; i < out.candidates.size(); ++i) {
    Candidate& cand = out.candidates[i];
    BenchSpec run = cand.spec;
    run.steps = spec.measure_steps;
    const BenchSpec* next = i + 1 < out.candidates.size() ? &out.candidates[i + 1].spec : nullptr;
    const BenchResult r = sweep.run(run, next);
    cand.status = r.status;
    if (!r.ok()) continue;
    cand.step_ms = r.step.mean;
    if (!out.candidates[out.chosen].step_ms || *cand.step_ms < *out.candidates[out.chosen].step_ms)
      out.chosen = static_cast<int>(i);
  }
  return out;
}

namespace {

std::string gib(std::size_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1024.0 * 1024 * 1024)); }

// "selective recompute, transient copies, 2 micro-batches of 2": how to run it, in words.
std::string way(const BenchSpec& s) {
  std::string r =
      s.recompute == Recompute::none ? "no recompute" : recompute_name(s.recompute) + std::string(" recompute");
  if (zero_stage(s) != 0) r += fmt::format(", ZeRO-{}", zero_stage(s));
  if (s.weight_copies != WeightCopies::kept) r += fmt::format(", {} copies", weight_copies_name(s.weight_copies));
  if (s.master_dtype != DType::f32)
    r += fmt::format(", {} masters", master_dtype_name(s.master_dtype));  // their gradients are of their dtype
  else if (s.grad_dtype != DType::f32)
    r += fmt::format(", {} gradients", grad_dtype_name(s.grad_dtype));
  return s.grad_accum == 1 ? fmt::format("{}, one batch of {}", r, s.batch)
                           : fmt::format("{}, {} micro-batches of {}", r, s.grad_accum, s.batch);
}

// The flags that run it: "--recompute full --weight-copies transient --grad-accum 2 --batch 2".
std::string flags(const BenchSpec& s) {
  std::vector<std::string> f;
  if (zero_stage(s) != 0) f.push_back(fmt::format("--zero {}", zero_stage(s)));
  if (s.recompute != Recompute::none) f.push_back(fmt::format("--recompute {}", recompute_name(s.recompute)));
  if (s.weight_copies != WeightCopies::kept)
    f.push_back(fmt::format("--weight-copies {}", weight_copies_name(s.weight_copies)));
  if (s.master_dtype != DType::f32)
    f.push_back(fmt::format("--master-dtype {}", master_dtype_name(s.master_dtype)));
  else if (s.grad_dtype != DType::f32)
    f.push_back(fmt::format("--grad-dtype {}", grad_dtype_name(s.grad_dtype)));
  if (s.grad_accum > 1) f.push_back(fmt::format("--grad-accum {} --batch {}", s.grad_accum, s.batch));
  std::string joined;
  for (const std::string& part : f) joined += (joined.empty() ? "" : " ") + part;
  return joined.empty() ? "(as is)" : joined;
}

std::string timing(const Candidate& c) {
  if (c.step_ms) return fmt::format("{:.1f} ms", *c.step_ms);
  return c.status == "ok" ? "not timed" : c.status;
}

std::string markdown(const std::vector<Recommendation>& rows) {
  if (rows.empty()) return "";
  std::map<std::string, std::size_t> budgets;
  for (const Recommendation& r : rows)
    if (!r.device_name.empty()) budgets.emplace(r.device_name, r.limit);
  const BenchSpec& c = rows.front().spec.cell;
  std::string out = fmt::format(
      "The fastest way to run a {} step of the sequences named, found by dry runs: per split into micro-batches{}, "
      "the least recomputation that fits, with the weights' bf16 copies (under mixed precision) resident where "
      "device graphs run, kept and, where that saves recomputation, transient; {}.\n",
      step_mode_name(c.mode),
      c.parallel.data ? fmt::format(" and ZeRO stage (from {} to {})", c.parallel.data->zero, parallel::kMaxZeroStage)
                      : "",
      rows.front().spec.measure ? "each candidate then timed on the device, the fastest named"
                                : "the coarsest split named (not timed: --measure times every candidate)");
  for (const auto& [name, limit] : budgets)
    out += fmt::format("Budget of the {}: {} GiB, the whole device.\n", name, gib(limit));
  out +=
      "\n| model | precision | attention | ctx | sequences per step | recommended | flags | peak GiB | whole device "
      "GiB | step | other candidates |\n|---|---|---|---:|---:|---|---|---:|---:|---:|---|\n";
  for (const Recommendation& r : rows) {
    const BenchSpec& s = r.spec.cell;
    const std::string head = fmt::format("| {} | {} | {} | {} | {} |", s.model.name, s.precision,
                                         attention_name(s.attention), s.ctx, s.batch);
    if (r.chosen < 0) {
      out += head + fmt::format(" {} | - | - | - | - | |\n", r.failure.empty() ? "nothing fits" : r.failure);
      continue;
    }
    const Candidate& best = r.candidates[r.chosen];
    std::string others;
    for (std::size_t i = 0; i < r.candidates.size(); ++i) {
      if (static_cast<int>(i) == r.chosen) continue;
      const Candidate& o = r.candidates[i];
      others += fmt::format("{}{}: {} GiB, {}", others.empty() ? "" : "; ", way(o.spec), gib(o.peak), timing(o));
    }
    out += head + fmt::format(" {} | `{}` | {} | {} | {} | {} |\n", way(best.spec), flags(best.spec), gib(best.peak),
                              gib(best.need), timing(best), others);
  }
  return out;
}

std::string csv(const std::vector<Recommendation>& rows) {
  std::string out =
      "model,device,device_name,memory_limit_bytes,precision,grad_dtype,master_dtype,attention,ctx,sequences_per_step,"
      "recompute,"
      "grad_accum,micro_batch,weight_copies,zero,peak_bytes,device_need_bytes,step_ms,status,chosen\n";
  for (const Recommendation& r : rows) {
    const BenchSpec& s = r.spec.cell;
    if (r.candidates.empty())
      out += fmt::format("{},{},{},{},{},{},{},{},{},{},,,,,,,,,{},\n", csv_field(s.model.name), s.device,
                         csv_field(r.device_name), r.limit, s.precision, grad_dtype_name(s.grad_dtype),
                         master_dtype_name(s.master_dtype), attention_name(s.attention), s.ctx, s.batch,
                         csv_field(r.failure.empty() ? "nothing fits" : r.failure));
    for (std::size_t i = 0; i < r.candidates.size(); ++i) {
      const Candidate& c = r.candidates[i];
      out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(s.model.name),
                         s.device, csv_field(r.device_name), r.limit, s.precision, grad_dtype_name(s.grad_dtype),
                         master_dtype_name(s.master_dtype), attention_name(s.attention), s.ctx, s.batch,
                         recompute_name(c.spec.recompute), c.spec.grad_accum, c.spec.batch,
                         weight_copies_name(c.spec.weight_copies), zero_stage(c.spec), c.peak, c.need,
                         c.step_ms ? fmt::format("{:.3f}", *c.step_ms) : "", csv_field(c.status),
                         static_cast<int>(i) == r.chosen ? 1 : 0);
    }
  }
  return out;
}

std::string json(const std::vector<Recommendation>& rows) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Recommendation& r : rows) {
    const BenchSpec& s = r.spec.cell;
    nlohmann::ordered_json j;
    j["model"] = model_json(s.model);
    j["device"] = s.device;
    j["device_name"] = r.device_name;
    j["memory_limit_bytes"] = r.limit;
    j["precision"] = s.precision;
    j["grad_dtype"] = grad_dtype_name(s.grad_dtype);
    j["master_dtype"] = master_dtype_name(s.master_dtype);
    j["attention"] = attention_name(s.attention);
    j["mode"] = step_mode_name(s.mode);
    j["ctx"] = s.ctx;
    j["sequences_per_step"] = s.batch;
    j["measured"] = r.spec.measure;
    j["failure"] = r.failure.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.failure);
    j["chosen"] = r.chosen < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.chosen);
    j["candidates"] = nlohmann::ordered_json::array();
    for (const Candidate& c : r.candidates)
      j["candidates"].push_back({{"recompute", recompute_name(c.spec.recompute)},
                                 {"grad_accum", c.spec.grad_accum},
                                 {"micro_batch", c.spec.batch},
                                 {"weight_copies", weight_copies_name(c.spec.weight_copies)},
                                 {"zero", zero_stage(c.spec)},
                                 {"peak_bytes", c.peak},
                                 {"device_need_bytes", c.need},
                                 {"step_ms", c.step_ms ? nlohmann::ordered_json(*c.step_ms) : nullptr},
                                 {"status", c.status},
                                 // The whole run as lmscope describes one (RunSpec::from_json reads it).
                                 {"run", c.spec.to_json()}});
    out.push_back(j);
  }
  return out.dump(2) + "\n";
}

}  // namespace

std::string format_recommendations(const std::vector<Recommendation>& rows, ReportFormat f) {
  return format_rows(rows, f, markdown, csv, json);
}

}  // namespace lmscope
