// The run layer's reports from Python: each takes a RunSpec's flags (run_args.h) and returns the row
// the command line's --format json writes for the same run, as JSON text the package reads.
#include "bindings.h"
#include "run_args.h"

#include "lmscope/bench/report.h"
#include "lmscope/bench/runner.h"
#include "lmscope/core/error.h"
#include "lmscope/memory/memory_report.h"
#include "lmscope/memory/plan.h"
#include "lmscope/memory/recommend.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace lmscope::python {
namespace {

std::string memory_json(const RunFlags& flags, bool dry_run, const std::string& memory_limit, int top, int warmup) {
  if (top <= 0) user_error("top must be positive, got {}", top);
  const MemorySpec spec = resolve_run(flags, {dry_run, warmup, memory_limit});
  py::gil_scoped_release running;
  std::vector<MemoryRow> rows;
  rows.push_back(memory_row(record_memory(spec), top));
  return format_memory(rows, ReportFormat::json);
}

std::string bench_json(const RunFlags& flags, int warmup, int steps, const std::function<void(int, int)>& progress) {
  if (warmup < 0) user_error("warmup must be non-negative, got {}", warmup);
  if (steps <= 0) user_error("steps must be positive, got {}", steps);
  BenchSpec cell = resolve_run(flags, {false, warmup, ""}).cell;
  cell.steps = steps;
  BenchProgress said;
  if (progress)
    said = [&progress](int done, int total) {
      py::gil_scoped_acquire python;
      progress(done, total);
    };
  py::gil_scoped_release running;
  const BenchResult r = run_bench_cell(cell, said);
  return format_bench({r}, ReportFormat::json);
}

std::string plan_json(const RunFlags& flags, const std::string& memory_limit, std::int64_t ctx_multiple) {
  if (ctx_multiple <= 0 || ctx_multiple > kPlanMaxCtx)
    user_error("ctx_multiple must be from 1 to {}, got {}", kPlanMaxCtx, ctx_multiple);
  const MemorySpec spec = resolve_run(flags, {true, 1, memory_limit});
  py::gil_scoped_release running;
  return format_plan({plan_cell(PlanSpec{spec.cell, ctx_multiple, spec.memory_limit})}, ReportFormat::json);
}

std::string recommend_json(const RunFlags& flags, const std::string& memory_limit, bool measure, int measure_steps) {
  if (measure_steps < 1) user_error("measure_steps must be at least 1, got {}", measure_steps);
  const MemorySpec spec = resolve_run(flags, {true, 1, memory_limit});
  const BenchSpec& c = spec.cell;
  if (c.recompute != Recompute::none || c.grad_accum != 1 || c.weight_copies != WeightCopies::kept)
    user_error("plan_recommend chooses recompute, grad_accum and weight_copies itself; leave them out");
  if (!has_backward(c.mode))
    user_error("plan_recommend is for steps with a backward (mode 'train' or 'forward-backward'), got '{}'",
               step_mode_name(c.mode));
  py::gil_scoped_release running;
  return format_recommendations({recommend(RecommendSpec{c, spec.memory_limit, measure, measure_steps})},
                                ReportFormat::json);
}

}  // namespace

void bind_reports(py::module_& m) {
  m.def("run_flag_names", &run_flag_names, "The flags a RunSpec takes, without their dashes");
  m.def(
      "describe_run",
      [](const RunFlags& flags, bool dry_run) {
        return resolve_run(flags, {dry_run, 1, ""}).cell.to_json().dump();
      },
      py::arg("flags"), py::arg("dry_run"), "The run the flags describe, as state.json keeps it (JSON text)");
  m.def(
      "memory_json",
      [](const RunFlags& flags, bool dry_run, const std::string& memory_limit, int top, int warmup) {
        return memory_json(flags, dry_run, memory_limit, top, warmup);
      },
      py::arg("flags"), py::arg("dry_run"), py::arg("memory_limit"), py::arg("top"), py::arg("warmup"),
      "lmscope memory --format json's rows for the run");
  m.def("bench_json", &bench_json, py::arg("flags"), py::arg("warmup"), py::arg("steps"), py::arg("progress"),
        "lmscope bench --format json's rows for the run");
  m.def("plan_json", &plan_json, py::arg("flags"), py::arg("memory_limit"), py::arg("ctx_multiple"),
        "lmscope plan --format json's rows for the run");
  m.def("recommend_json", &recommend_json, py::arg("flags"), py::arg("memory_limit"), py::arg("measure"),
        py::arg("measure_steps"), "lmscope plan --recommend --format json's rows for the run");
}

}  // namespace lmscope::python
