// The parts of the extension module _lmscope, each adding its functions and classes to it.
#pragma once

#include <pybind11/pybind11.h>

namespace lmscope::python {

void bind_reports(pybind11::module_& m);    // RunSpec's flags, dry_run, memory, bench, plan, plan_recommend
void bind_session(pybind11::module_& m);    // Session: a run trained step by step
void bind_attention(pybind11::module_& m);  // FlashAttention-2's forward and backward on DLPack tensors

}  // namespace lmscope::python
