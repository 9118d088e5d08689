#include "lmscope/report/result_files.h"

#include "lmscope/core/error.h"
#include "lmscope/core/json_kind.h"
#include "lmscope/io/regular_file.h"
#include "lmscope/run/mode_words.h"
#include "lmscope/run/step_mode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <sstream>
#include <string_view>
#include <type_traits>

namespace lmscope::report {

namespace {

using nlohmann::json;

// A field of another kind than lmscope writes, in words (thrown while a row is read; the reader says
// which file and row). The JSON library's own sentence was the message.
struct WrongField {
  std::string why;
};

// The row's `key`: `fallback` where the row has none (none given: the row must have it), else its value,
// which must be of T's kind.
template <typename T>
T field(const json& row, const char* key, std::optional<T> fallback = std::nullopt) {
  if (!row.contains(key)) {
    if (fallback) return *fallback;
    throw WrongField{fmt::format("it has no \"{}\"", key)};
  }
  const json& v = row[key];
  if (!json_holds<T>(v))
    throw WrongField{fmt::format("its \"{}\" is {} {}, not {}", key, v.is_array() || v.is_object() ? "an" : "a",
                                 v.type_name(), json_kind_words<T>())};
  return v.get<T>();
}

// The row's `key` where it is an object (or nothing: an empty one); another kind is WrongField.
const json& object(const json& row, const char* key) {
  static const json none = json::object();
  if (!row.contains(key)) return none;
  if (!row[key].is_object()) throw WrongField{fmt::format("its \"{}\" is not an object", key)};
  return row[key];
}

// The file's rows: a JSON array of objects, each with every key of `needs` and none of `refuses`
// (the keys that tell another kind's rows apart). Calls read(row) for each, turning a row whose
// fields have the wrong type into the same one-sentence refusal.
template <typename Row, typename Read>
std::vector<Row> read_rows(const std::string& path, const char* kind, std::initializer_list<const char*> needs,
                           std::initializer_list<const char*> refuses, Read read) {
  const std::string text = read_regular_file(path, fmt::format("the {} results", kind));
  const auto wrong = [&](const std::string& why) {
    const char* article = std::string_view("aeiou").find(kind[0]) != std::string_view::npos ? "an" : "a";
    user_error("'{}' is not {} {} results file (what lmscope {} --format json writes): {}", path, article, kind, kind,
               why);
  };
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    user_error("'{}' is empty (did the run that writes it finish?)", path);
  json rows = json::parse(text, nullptr, false);
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
    } catch (const WrongField& e) {
      wrong(fmt::format("row {}: {}", out.size() + 1, e.why));
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
  for (const auto& [phase, t] : object(row, "ms").items()) {
    if (!t.is_object()) throw WrongField{fmt::format("its \"ms\" of {} is not an object", phase)};
    out[phase] = {field<double>(t, "median", 0.0), field<double>(t, "std", 0.0)};
  }
  return out;
}

std::string mode_of_row(const json& r) {
  const std::string mode = field<std::string>(r, "mode", "");
  // Micro-batches only split a backward (a mode this build does not know, from another's file: none).
  const std::optional<StepMode> known = step_mode_named(mode);
  const bool backward = known && has_backward(*known);
  return lmscope::mode_words(ModeSettings{
      .mode = mode,
      .recompute = field<std::string>(r, "recompute", "none"),
      .grad_accum = backward ? field<long long>(r, "grad_accum", 1) : 1,
      .weight_copies = field<std::string>(r, "weight_copies", "kept"),
      .grad_dtype = field<std::string>(r, "grad_dtype", "fp32"),
      .master_dtype = field<std::string>(r, "master_dtype", "fp32"),
      .graphs_off_on_cuda = !field<bool>(r, "graphs", true) && field<std::string>(r, "device", "") == "cuda",
      .fusion = field<bool>(r, "fusion", true)});
}

// The fields bench and memory rows share.
void read_cell(const json& r, ModelCellRow& c) {
  c.model = field<std::string>(object(r, "model"), "name");
  c.device = field<std::string>(r, "device", "");
  c.precision = field<std::string>(r, "precision", "");
  c.attention = field<std::string>(r, "attention", "");
  c.mode = mode_of_row(r);
  c.status = field<std::string>(r, "status");
  c.batch = field<long long>(r, "batch");
  c.ctx = field<long long>(r, "ctx");
  c.dry_run = field<bool>(r, "dry_run", false);
  c.peak_bytes = number(r, "peak_bytes");
}

}  // namespace

std::string ModelCellRow::cell() const {
  return fmt::format("{} ctx {} b{} {} {} {}", model, ctx, batch, precision, attention, mode);
}

std::vector<BenchRow> read_bench_file(const std::string& path) {
  return read_rows<BenchRow>(
      path, "bench", {"model", "ctx", "batch", "mode", "status", "steps"}, {"seq"}, [](const json& r) {
        BenchRow b;
        read_cell(r, b);
        b.parameters = field<long long>(object(r, "model"), "parameters", 0);
        b.device_name = field<std::string>(r, "device_name", "");
        b.ms = timings(r);
        b.tokens_per_s = number(r, "tokens_per_s");
        b.mfu = number(r, "mfu");
        const json& kernels = object(r, "kernels");
        if (kernels.contains("phases") && !kernels["phases"].is_array())
          throw WrongField{"its kernels' \"phases\" is not a list"};
        for (const json& ph : kernels.value("phases", json::array())) {
          if (!ph.is_object()) throw WrongField{"a kernels' phase is not an object"};
          if (ph.contains("categories") && !ph["categories"].is_array())
            throw WrongField{"a kernels' phase's \"categories\" is not a list"};
          for (const json& c : ph.value("categories", json::array())) {
            if (!c.is_object()) throw WrongField{"a kernel category is not an object"};
            b.kernel_ms[field<std::string>(ph, "phase", "")][field<std::string>(c, "category", "")] = number(c, "ms");
          }
        }
        return b;
      });
}

std::vector<MemoryRow> read_memory_file(const std::string& path) {
  // A failed row has no peak_by_kind; bench rows have "steps" and attention rows "seq".
  return read_rows<MemoryRow>(path, "memory", {"model", "ctx", "batch", "mode", "status"}, {"steps", "seq"},
                              [](const json& r) {
                                MemoryRow m;
                                read_cell(r, m);
                                for (const auto& [kind, bytes] : object(r, "peak_by_kind").items())
                                  m.peak_by_kind[kind] = number(object(r, "peak_by_kind"), kind.c_str());
                                return m;
                              });
}

std::vector<AttentionRow> read_attention_file(const std::string& path) {
  return read_rows<AttentionRow>(path, "attention", {"attention", "seq", "d", "batch", "status"}, {"ctx"},
                                 [](const json& r) {
                                   AttentionRow a;
                                   a.attention = field<std::string>(r, "attention");
                                   a.device = field<std::string>(r, "device", "");
                                   a.precision = field<std::string>(r, "precision", "");
                                   a.status = field<std::string>(r, "status");
                                   a.batch = field<long long>(r, "batch");
                                   a.heads = field<long long>(r, "heads", 1);
                                   a.seq = field<long long>(r, "seq");
                                   a.d = field<long long>(r, "d");
                                   a.causal = field<bool>(r, "causal", true);
                                   a.deterministic = field<bool>(r, "deterministic", true);
                                   a.ms = timings(r);
                                   a.saved_bytes = number(object(r, "bytes"), "saved_for_backward");
                                   a.peak_bytes = number(object(r, "bytes"), "peak");
                                   return a;
                                 });
}

std::vector<TrainStep> read_train_log(const std::string& path) {
  std::istringstream in(read_regular_file(path, "the training log"));
  std::vector<TrainStep> steps;
  std::string line;
  for (long long n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json r = json::parse(line, nullptr, false);
    const bool description = !r.is_discarded() && r.is_object() && !r.contains("step") && r.contains("run");
    if (description) continue;  // the line describing a run or resumption (train --log writes them)
    if (r.is_discarded() || !r.is_object() || !r.contains("step") || !r.contains("loss"))
      user_error("'{}' is not a training log (what lmscope train --log writes): line {} is not a step's JSON", path, n);
    try {
      TrainStep s;
      s.step = field<long long>(r, "step");
      s.loss = field<double>(r, "loss");
      if (r.contains("val_loss") && r["val_loss"].is_number()) s.val_loss = r["val_loss"].get<double>();
      if (r.contains("grad_norm") && r["grad_norm"].is_number()) s.grad_norm = r["grad_norm"].get<double>();
      if (r.contains("loss_scale")) s.loss_scale = field<double>(r, "loss_scale");
      s.skipped = field<bool>(r, "skipped", false);
      s.tokens = number(r, "tokens");
      s.elapsed_s = number(r, "elapsed_s");
      steps.push_back(s);
    } catch (const WrongField& e) {
      user_error("'{}' is not a training log (what lmscope train --log writes): line {}: {}", path, n, e.why);
    }
  }
  if (steps.empty()) user_error("'{}' is empty (did the run that writes it take a step?)", path);
  return steps;
}

}  // namespace lmscope::report
