// A run trained step by step from Python: the run layer's Session and StepDriver, as train builds
// and steps them (the same weights, batches and order, so the same bits), on batches the caller
// gives as NumPy arrays or drawn from token ids the caller holds, as train draws them from its file.
#include "bindings.h"
#include "dlpack_tensor.h"
#include "run_args.h"

#include "cli/train_settings.h"

#include "lmscope/core/error.h"
#include "lmscope/device/device.h"
#include "lmscope/io/safetensors.h"
#include "lmscope/io/token_data.h"
#include "lmscope/run/batch_source.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace lmscope::python {
namespace {

using TokenArray = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;

// The step's batches: the rows the caller gave for this step (each micro-batch's in turn), else the
// next ones drawn from the caller's token ids.
class StepBatches : public BatchSource {
 public:
  StepBatches(std::int64_t rows, std::int64_t ctx) : rows_(rows), ctx_(ctx) {}
  void draw_from(const TokenData& data, bool sequential, std::uint64_t seed) {
    sampler_.emplace(data, rows_, ctx_, sequential, seed);
  }
  bool draws() const { return sampler_.has_value(); }
  void give(const std::int32_t* ids, const std::int32_t* targets) {
    given_ids_ = ids, given_targets_ = targets, given_at_ = 0;
  }
  void forget_given() { given_ids_ = given_targets_ = nullptr; }
  bool next(std::int32_t* ids, std::int32_t* targets) override {
    const std::size_t n = static_cast<std::size_t>(rows_ * ctx_);
    if (given_ids_ != nullptr) {
      std::memcpy(ids, given_ids_ + given_at_, n * sizeof(std::int32_t));
      std::memcpy(targets, given_targets_ + given_at_, n * sizeof(std::int32_t));
      given_at_ += n;
    } else {
      sampler_->next(ids, targets);
    }
    return true;
  }

 private:
  std::int64_t rows_, ctx_;
  std::optional<BatchSampler> sampler_;
  const std::int32_t *given_ids_ = nullptr, *given_targets_ = nullptr;
  std::size_t given_at_ = 0;
};

class TrainingSession {
 public:
  TrainingSession(const RunFlags& flags, const std::string& init, py::object data, const std::string& sample)
      : run_(resolve_run(flags, {false, 1, ""}).cell), non_finite_(run_.optimizer.clip) {
    if (run_.mode != StepMode::train)
      user_error("a Session trains (mode 'train'); dry_run, memory and bench take mode '{}'",
                 step_mode_name(run_.mode));
    if (run_.parallel.world.size > 1)
      user_error("a Session runs in one process; data parallelism runs through lmscope launch");
    if (sample != "random" && sample != "sequential")
      user_error("unknown sample '{}' (use random or sequential)", sample);
    batches_.emplace(run_.batch, run_.ctx);
    if (!data.is_none()) {
      data_array_ = token_ids(data);
      const py::buffer_info ids = data_array_.request();
      tokens_.emplace(ids.ptr, ids.size, static_cast<int>(ids.itemsize), "the token array");
      tokens_->check_vocabulary(run_.model.vocab);
      batches_->draw_from(*tokens_, sample == "sequential", run_.seed);
    }
    SessionOptions options;
    options.weights = init.empty() ? InitialWeights::seeded : InitialWeights::file;
    options.weights_file = init;
    py::gil_scoped_release building;
    session_.emplace(run_, std::move(options));
    driver_.emplace(*session_, *batches_, true);
  }

  py::dict step(const py::object& inputs, const py::object& targets) {
    const std::int64_t step = iteration_ + 1;
    TokenArray ids, tgt;
    if (inputs.is_none() != targets.is_none()) user_error("step() takes inputs and targets together, or neither");
    if (!inputs.is_none()) {
      ids = batch_array(inputs, "inputs");
      tgt = batch_array(targets, "targets");
      batches_->give(ids.data(), tgt.data());
    } else if (!batches_->draws()) {
      user_error("step() needs inputs and targets: this Session was made without data= to draw them from");
    }
    StepResult r;
    {
      py::gil_scoped_release stepping;
      try {
        r = driver_->step(iteration_, step);
      } catch (...) {
        batches_->forget_given();
        throw;
      }
    }
    batches_->forget_given();
    ++iteration_;
    AdamW& opt = *session_->optimizer();
    const std::string note = non_finite_.after_step(step, r.applied, r.loss, opt);
    py::dict out;
    out["step"] = step;
    out["loss"] = r.loss;
    out["lr"] = r.lr;
    out["grad_norm"] = opt.last_grad_norm();
    out["applied"] = r.applied;
    out["loss_scale"] = opt.loss_scaler().on() ? py::object(py::float_(opt.last_loss_scale())) : py::none();
    out["note"] = note;
    return out;
  }

  void save(const std::string& path) {
    AdamW& opt = *session_->optimizer();
    py::gil_scoped_release saving;
    save_parameters(session_->model(), path, [&opt](std::size_t i) { return opt.parameter_values(i); });
  }

  std::string spec_json() const { return session_->spec().to_json().dump(); }
  std::int64_t steps_done() const { return iteration_; }
  std::string device_name() { return session_->backend().name(); }

  // Where the parameters live, as DLPack's __dlpack_device__ says it: (1, 0) the CPU, (2, i) GPU i.
  std::pair<int, int> dlpack_device() const {
    return run_.device == "cuda" ? std::pair{2, current_cuda_device()} : std::pair{1, 0};
  }

  std::vector<std::string> parameter_names() {
    std::vector<std::string> names;
    for (const Parameter& p : session_->model().parameters()) names.push_back(p.spec.name);
    return names;
  }

  // Parameter `name`'s values in place (the master copy the optimizer updates), after the device has
  // finished the work queued so far.
  py::capsule parameter(const std::string& name, py::object owner) {
    for (const Parameter& p : session_->model().parameters()) {
      if (p.spec.name != name) continue;
      session_->backend().synchronize();
      const bool cuda = run_.device == "cuda";
      return lend_dlpack(p.value.tensor(), cuda ? DLPackDevice::cuda : DLPackDevice::cpu,
                         cuda ? current_cuda_device() : 0, std::move(owner));
    }
    user_error("the model has no parameter '{}' (parameter_names() lists them)", name);
  }

 private:
  // Token ids the sampler reads in place: one dimension of uint16, int32 or int64.
  static py::array token_ids(const py::object& data) {
    py::array a = py::array::ensure(data, py::array::c_style);
    if (!a || a.ndim() != 1) user_error("data must be a one-dimensional array of token ids");
    const py::dtype d = a.dtype();
    if (!(d.is(py::dtype::of<std::uint16_t>()) || d.is(py::dtype::of<std::int32_t>()) ||
          d.is(py::dtype::of<std::int64_t>())))
      user_error("data must hold uint16, int32 or int64 token ids (np.memmap of a .bin file is uint16), not {}",
                 py::str(static_cast<const py::handle&>(d)).cast<std::string>());
    return a;
  }

  // A step's rows: (batch, ctx), or (grad_accum, batch, ctx) with micro-batches; int32 is read in place.
  TokenArray batch_array(const py::object& given, const char* what) const {
    TokenArray a = TokenArray::ensure(given);
    if (!a) user_error("{} must be an array of integer token ids", what);
    const std::int64_t rows = run_.batch * run_.micro_batches();
    if (a.ndim() < 2 || a.shape(a.ndim() - 1) != run_.ctx || a.size() != rows * run_.ctx)
      user_error("{} must hold {} rows of ctx {} tokens{}, got shape {}", what, rows, run_.ctx,
                 run_.micro_batches() > 1 ? " (grad_accum × batch rows)" : "",
                 std::string(py::str(py::tuple(given.attr("shape")))));
    const std::int32_t* p = a.data();
    for (py::ssize_t i = 0; i < a.size(); ++i)
      if (p[i] < 0 || p[i] >= run_.model.vocab)
        user_error("{} holds token id {} at flat position {}, outside the vocabulary of {}", what, p[i], i,
                   run_.model.vocab);
    return a;
  }

  RunSpec run_;
  py::array data_array_;  // the caller's token ids, kept alive while tokens_ reads them
  std::optional<TokenData> tokens_;
  std::optional<StepBatches> batches_;
  std::optional<Session> session_;
  std::optional<StepDriver> driver_;
  cli::NonFiniteSteps non_finite_;
  std::int64_t iteration_ = 0;
};

}  // namespace

void bind_session(py::module_& m) {
  py::class_<TrainingSession>(m, "TrainingSession")
      .def(py::init<const RunFlags&, const std::string&, py::object, const std::string&>(), py::arg("flags"),
           py::arg("init"), py::arg("data"), py::arg("sample"))
      .def("step", &TrainingSession::step, py::arg("inputs"), py::arg("targets"))
      .def("save", &TrainingSession::save, py::arg("path"))
      .def("spec_json", &TrainingSession::spec_json)
      .def("steps_done", &TrainingSession::steps_done)
      .def("device_name", &TrainingSession::device_name)
      .def("parameter_names", &TrainingSession::parameter_names)
      .def("dlpack_device", &TrainingSession::dlpack_device)
      .def(
          "parameter",
          [](py::object self, const std::string& name) { return self.cast<TrainingSession&>().parameter(name, self); },
          py::arg("name"));
}

}  // namespace lmscope::python
