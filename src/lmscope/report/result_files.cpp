#include "lmscope/report/result_files.h"

#include "lmscope/core/error.h"
#include "lmscope/run/mode_words.h"
#include "lmscope/run/step_mode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

namespace lmscope::report {

namespace {

using nlohmann::json;

// The file's rows: a JSON array of objects, each with every key of `needs` and none of `refuses`
// (the keys that tell another kind's rows apart). Calls read(row) for each, turning a row whose
// fields have the wrong type into the same one-sentence refusal.
template <typename Row, typename Read>
std::vector<Row> read_rows(const std::string& path, const char* kind, std::initializer_list<const char*> needs,
                           std::initializer_list<const char*> refuses, Read read) {
  if (std::filesystem::is_directory(path)) user_error("'{}' is a directory, not {} results", path, kind);
  std::ifstream in(path);
  if (!in) user_error("cannot read the {} results '{}'", kind, path);
  std::stringstream text;
  text << in.rdbuf();
  const auto wrong = [&](const std::string& why) {
    const char* article = std::string_view("aeiou").find(kind[0]) != std::string_view::npos ? "an" : "a";
    user_error("'{}' is not {} {} results file (what lmscope {} --format json writes): {}", path, article, kind, kind,
               why);
  };
  if (text.str().find_first_not_of(" \t\r\n") == std::string::npos)
    user_error("'{}' is empty (did the run that writes it finish?)", path);
  json rows = json::parse(text.str(), nullptr, false);
  if (rows.is_discarded()) wrong("it is not JSON");
  if (!rows.is_array()) wrong("it is not a list of rows");
  if (rows.empty()) wrong("it has no rows");
  std::vector<Row> out;
  for (const json& r : rows) {
    if (!r.is_object()) wrong("a row is not an object");
    for (const char* key : needs)
      if (!r.contains(key)) wrong(fmt::format("a row has no \"{}\"", key));
    for (const char* key : refuses)
      if (r.contains(key)) wrong(fmt::format("its rows have \"{}\", as another command's do", key));
    try {
      out.push_back(read(r));
    } catch (const json::exception& e) {
      wrong(fmt::format("a row's fields are not what they should be ({})", e.what()));
    }
  }
  return out;
}

// A number that may be null (what JSON holds for a NaN or an infinity): 0 then.
double number(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

std::map<std::string, Timing> timings(const json& row) {
  std::map<std::string, Timing> out;
  if (row.contains("ms"))
    for (const auto& [phase, t] : row["ms"].items()) out[phase] = {t.value("median", 0.0), t.value("std", 0.0)};
  return out;
}

std::string mode_of_row(const json& r) {
  const std::string mode = r.value("mode", "");
  // Micro-batches only split a backward (a mode this build does not know, from another's file: none).
  const std::optional<StepMode> known = step_mode_named(mode);
  const bool backward = known && has_backward(*known);
  return lmscope::mode_words(
      ModeSettings{.mode = mode,
                   .recompute = r.value("recompute", "none"),
                   .grad_accum = backward ? r.value("grad_accum", 1LL) : 1,
                   .weight_copies = r.value("weight_copies", "kept"),
                   .grad_dtype = r.value("grad_dtype", "fp32"),
                   .graphs_off_on_cuda = !r.value("graphs", true) && r.value("device", "") == "cuda",
                   .fusion = r.value("fusion", true)});
}

// The fields bench and memory rows share.
void read_cell(const json& r, ModelCellRow& c) {
  c.model = r["model"].at("name").get<std::string>();
  c.device = r.value("device", "");
  c.precision = r.value("precision", "");
  c.attention = r.value("attention", "");
  c.mode = mode_of_row(r);
  c.status = r.at("status").get<std::string>();
  c.batch = r.at("batch").get<long long>();
  c.ctx = r.at("ctx").get<long long>();
  c.dry_run = r.value("dry_run", false);
  c.peak_bytes = number(r, "peak_bytes");
}

}  // namespace

std::string ModelCellRow::cell() const {
  return fmt::format("{} ctx {} b{} {} {} {}", model, ctx, batch, precision, attention, mode);
}

std::vector<BenchRow> read_bench_file(const std::string& path) {
  return read_rows<BenchRow>(path, "bench", {"model", "ctx", "batch", "mode", "status", "steps"}, {"seq"},
                             [](const json& r) {
                               BenchRow b;
                               read_cell(r, b);
                               b.parameters = r["model"].value("parameters", 0LL);
                               b.device_name = r.value("device_name", "");
                               b.ms = timings(r);
                               b.tokens_per_s = number(r, "tokens_per_s");
                               b.mfu = number(r, "mfu");
                               if (r.contains("kernels") && r["kernels"].contains("phases"))
                                 for (const json& ph : r["kernels"]["phases"])
                                   if (ph.contains("categories"))
                                     for (const json& c : ph["categories"])
                                       b.kernel_ms[ph.value("phase", "")][c.value("category", "")] = number(c, "ms");
                               return b;
                             });
}

std::vector<MemoryRow> read_memory_file(const std::string& path) {
  // A failed row has no peak_by_kind; bench rows have "steps" and attention rows "seq".
  return read_rows<MemoryRow>(path, "memory", {"model", "ctx", "batch", "mode", "status"}, {"steps", "seq"},
                              [](const json& r) {
                                MemoryRow m;
                                read_cell(r, m);
                                if (r.contains("peak_by_kind"))
                                  for (const auto& [kind, bytes] : r["peak_by_kind"].items())
                                    m.peak_by_kind[kind] = bytes.get<double>();
                                return m;
                              });
}

std::vector<AttentionRow> read_attention_file(const std::string& path) {
  return read_rows<AttentionRow>(path, "attention", {"attention", "seq", "d", "batch", "status"}, {"ctx"},
                                 [](const json& r) {
                                   AttentionRow a;
                                   a.attention = r.at("attention").get<std::string>();
                                   a.device = r.value("device", "");
                                   a.precision = r.value("precision", "");
                                   a.status = r.at("status").get<std::string>();
                                   a.batch = r.at("batch").get<long long>();
                                   a.heads = r.value("heads", 1LL);
                                   a.seq = r.at("seq").get<long long>();
                                   a.d = r.at("d").get<long long>();
                                   a.causal = r.value("causal", true);
                                   a.deterministic = r.value("deterministic", true);
                                   a.ms = timings(r);
                                   if (r.contains("bytes")) {
                                     a.saved_bytes = number(r["bytes"], "saved_for_backward");
                                     a.peak_bytes = number(r["bytes"], "peak");
                                   }
                                   return a;
                                 });
}

std::vector<TrainStep> read_train_log(const std::string& path) {
  if (std::filesystem::is_directory(path)) user_error("'{}' is a directory, not a training log", path);
  std::ifstream in(path);
  if (!in) user_error("cannot read the training log '{}'", path);
  std::vector<TrainStep> steps;
  std::string line;
  for (long long n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.is_object() || !r.contains("step") || !r.contains("loss"))
      user_error("'{}' is not a training log (what lmscope train --log writes): line {} is not a step's JSON", path, n);
    try {
      TrainStep s;
      s.step = r.at("step").get<long long>();
      s.loss = r.at("loss").get<double>();
      if (r.contains("val_loss") && r["val_loss"].is_number()) s.val_loss = r["val_loss"].get<double>();
      if (r.contains("grad_norm") && r["grad_norm"].is_number()) s.grad_norm = r["grad_norm"].get<double>();
      if (r.contains("loss_scale")) s.loss_scale = r["loss_scale"].get<double>();
      s.skipped = r.value("skipped", false);
      s.tokens = number(r, "tokens");
      s.elapsed_s = number(r, "elapsed_s");
      steps.push_back(s);
    } catch (const json::exception& e) {
      user_error("'{}' is not a training log (what lmscope train --log writes): line {} ({})", path, n, e.what());
    }
  }
  if (steps.empty()) user_error("'{}' is empty (did the run that writes it take a step?)", path);
  return steps;
}

}  // namespace lmscope::report
