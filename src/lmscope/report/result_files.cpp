#include "lmscope/report/result_files.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string_view>

namespace lmscope::report {

namespace {

using nlohmann::json;

// The file's rows: a JSON array of objects, each with every key of `needs`.
json read_rows(const std::string& path, const char* kind, std::initializer_list<const char*> needs) {
  std::ifstream in(path);
  if (!in) user_error("cannot read the {} results '{}'", kind, path);
  std::stringstream text;
  text << in.rdbuf();
  const auto wrong = [&](const std::string& why) {
    const char* article = std::string_view("aeiou").find(kind[0]) != std::string_view::npos ? "an" : "a";
    user_error("'{}' is not {} {} results file (what lmscope {} --format json writes): {}", path, article, kind, kind,
               why);
  };
  json rows = json::parse(text.str(), nullptr, false);
  if (rows.is_discarded()) wrong("it is not JSON");
  if (!rows.is_array() || rows.empty()) wrong("it is not a list of rows");
  for (const json& r : rows) {
    if (!r.is_object()) wrong("a row is not an object");
    for (const char* key : needs)
      if (!r.contains(key)) wrong(fmt::format("a row has no \"{}\"", key));
  }
  return rows;
}

std::map<std::string, Timing> timings(const json& row) {
  std::map<std::string, Timing> out;
  if (row.contains("ms"))
    for (const auto& [phase, t] : row["ms"].items()) out[phase] = {t.value("median", 0.0), t.value("std", 0.0)};
  return out;
}

std::string mode_words(const json& r) {
  std::string mode = r.value("mode", "");
  if (r.value("recompute", "none") != "none") mode += ", " + r.value("recompute", "") + " recompute";
  if (r.value("grad_accum", 1) > 1) mode += fmt::format(", {} micro-batches", r.value("grad_accum", 1));
  if (r.value("weight_copies", "kept") == "transient") mode += ", transient copies";
  return mode;
}

}  // namespace

std::string BenchRow::cell() const {
  return fmt::format("{} ctx {} b{} {} {} {}", model, ctx, batch, precision, attention, mode);
}
std::string MemoryRow::cell() const {
  return fmt::format("{} ctx {} b{} {} {} {}", model, ctx, batch, precision, attention, mode);
}

std::vector<BenchRow> read_bench_file(const std::string& path) {
  std::vector<BenchRow> out;
  for (const json& r : read_rows(path, "bench", {"model", "ctx", "batch", "mode", "status", "warmup", "steps"})) {
    BenchRow b;
    b.model = r["model"].value("name", "");
    b.parameters = r["model"].value("parameters", 0LL);
    b.device = r.value("device", "");
    b.device_name = r.value("device_name", "");
    b.precision = r.value("precision", "");
    b.attention = r.value("attention", "");
    b.mode = mode_words(r);
    b.status = r.value("status", "");
    b.batch = r.value("batch", 0LL);
    b.ctx = r.value("ctx", 0LL);
    b.dry_run = r.value("dry_run", false);
    b.ms = timings(r);
    b.tokens_per_s = r.value("tokens_per_s", 0.0);
    b.mfu = r.value("mfu", 0.0);
    b.peak_bytes = r.value("peak_bytes", 0.0);
    if (r.contains("kernels") && r["kernels"].contains("phases"))
      for (const json& ph : r["kernels"]["phases"])
        if (ph.contains("categories"))
          for (const json& c : ph["categories"])
            b.kernel_ms[ph.value("phase", "")][c.value("category", "")] = c.value("ms", 0.0);
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<MemoryRow> read_memory_file(const std::string& path) {
  std::vector<MemoryRow> out;
  for (const json& r : read_rows(path, "memory", {"model", "ctx", "batch", "mode", "status", "peak_by_kind"})) {
    MemoryRow m;
    m.model = r["model"].value("name", "");
    m.device = r.value("device", "");
    m.precision = r.value("precision", "");
    m.attention = r.value("attention", "");
    m.mode = mode_words(r);
    m.status = r.value("status", "");
    m.batch = r.value("batch", 0LL);
    m.ctx = r.value("ctx", 0LL);
    m.dry_run = r.value("dry_run", false);
    m.peak_bytes = r.value("peak_bytes", 0.0);
    for (const auto& [kind, bytes] : r["peak_by_kind"].items()) m.peak_by_kind[kind] = bytes.get<double>();
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<AttentionRow> read_attention_file(const std::string& path) {
  std::vector<AttentionRow> out;
  for (const json& r : read_rows(path, "attention", {"attention", "seq", "d", "batch", "status"})) {
    AttentionRow a;
    a.attention = r.value("attention", "");
    a.device = r.value("device", "");
    a.precision = r.value("precision", "");
    a.status = r.value("status", "");
    a.batch = r.value("batch", 0LL);
    a.seq = r.value("seq", 0LL);
    a.d = r.value("d", 0LL);
    a.ms = timings(r);
    if (r.contains("bytes")) {
      a.saved_bytes = r["bytes"].value("saved_for_backward", 0.0);
      a.peak_bytes = r["bytes"].value("peak", 0.0);
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace lmscope::report
