// The extension module under the Python package lmscope (python/lmscope): the run layer's reports,
// a training session, and the FlashAttention-2 kernels on DLPack tensors. lmscope's failures arrive
// as Python exceptions carrying the command line's sentence: UserError (a ValueError) for input that
// cannot be, Unsupported (a UserError) for what this build or device cannot serve, OutOfMemory (a
// MemoryError), EnvironmentFailure (an OSError) and RankFailure (a RuntimeError).
#include "bindings.h"

#include "lmscope/core/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_lmscope, m) {
  m.doc() = "lmscope's engine: the run layer's reports, a training session, FlashAttention-2";
  // Registered base first: the translators are asked newest first, so Unsupported is told apart.
  const auto& user_error = py::register_exception<lmscope::UserError>(m, "UserError", PyExc_ValueError);
  py::register_exception<lmscope::Unsupported>(m, "Unsupported", user_error.ptr());
  py::register_exception<lmscope::OutOfMemory>(m, "OutOfMemory", PyExc_MemoryError);
  py::register_exception<lmscope::EnvironmentFailure>(m, "EnvironmentFailure", PyExc_OSError);
  py::register_exception<lmscope::RankFailure>(m, "RankFailure", PyExc_RuntimeError);
  lmscope::python::bind_reports(m);
  lmscope::python::bind_session(m);
  lmscope::python::bind_attention(m);
}
