// One table of op cases (as ggml's test-backend-ops has), each op described once: its tensors (shapes,
// odd sizes among them, and the role that gives each its dtype in a precision), what it runs, the
// precisions it takes, the scalar loss and the gradients it yields, an f64 formula for its outputs
// where one is short, and its tolerances. Three runners read it: the CPU in f64 against the formula
// and central finite differences, and the dry run against the CPU's allocations (tests/unit/
// test_op_table.cpp); CUDA against the CPU (tests/gpu/test_op_table_on_gpu.cpp).
#pragma once

#include "lmscope/backend/backend.h"

#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace lmscope::test {

// f64: the CPU's gradient checks; f32: what users run; tf32: f32 storage, GEMMs on tf32 tensor cores
// (CUDA); bf16 and f16: 16-bit storage, f32 arithmetic (CUDA).
enum class Prec { f64, f32, tf32, bf16, f16 };
const char* prec_name(Prec p);
bool is_lowp(Prec p);

// What a tensor is to the op, which gives its dtype in a precision (docs/precision.md):
// compute: the precision's storage (f64, f32, bf16, f16); master: f32 (f64 in f64), as the residual
// stream, parameters and moments; stat: the same, as rstd, lse, losses and norms; grad: a parameter's
// gradient, bf16 in bf16 (--grad-dtype bf16) and the master's otherwise; ids: i32 token ids.
enum class Role { compute, master, stat, grad, ids };
DType dtype_of(Role r, Prec p);

enum class Io { in, out, inout };  // out: written by the op (NaN before it runs); inout: read, then written

// How an input's values are drawn: scale · N(0,1); |scale · N(0,1)|; ids uniform below `value`; or
// every element `value`.
struct Init {
  enum Kind { normal, abs_normal, ids, constant } kind = normal;
  double value = 1.0;
};

struct TensorSpec {
  std::string name;
  Shape shape;
  Role role = Role::compute;
  Io io = Io::in;
  Init init{};
};

// A case's tensors on one backend, by name.
class Args {
 public:
  void add(std::string name, Tensor t) { tensors_.emplace_back(std::move(name), std::move(t)); }
  const Tensor& operator[](std::string_view name) const;

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

using Values = std::map<std::string, std::vector<double>, std::less<>>;  // by tensor name
using OpRun = std::function<void(Backend&, const Args&)>;

// Relative errors (‖a − b‖ / ‖b‖) a case is held to.
struct Tolerances {
  double gradient = 1e-6;                       // f64: the analytic gradient against central differences
  double formula = 1e-12;                       // f64: the outputs against the f64 formula
  double f32 = 1e-5, tf32 = 1e-3, lowp = 1e-2;  // CUDA against the CPU in f32 (the 16-bit types widened)
  double cuda(Prec p) const { return p == Prec::tf32 ? tf32 : is_lowp(p) ? lowp : f32; }
};

struct OpCase {
  std::string name;  // letters, digits and '_' (a test's name)
  std::vector<TensorSpec> tensors;
  std::vector<Prec> precs;  // f64 where the CPU checks it; f32; then tf32, bf16, f16 where CUDA has them
  OpRun run;                // the op(s), forward then backward: writes every out and inout tensor
  // Gradients: L = Σ ⟨out, weight⟩ over `loss` (Σ out where weight is empty), recomputed by `forward`
  // from the inputs' values; after `run`, tensor dx holds factor · dL/dx.
  OpRun forward;
  struct LossTerm {
    std::string out, weight;
  };
  std::vector<LossTerm> loss;
  struct Grad {
    std::string x, dx;
    double factor = 1;
  };
  std::vector<Grad> grads;
  // The expected values of some outputs, evaluated in f64 from the inputs' values; none where the
  // formula is the op itself at length.
  std::function<Values(const Values&)> formula;
  Tolerances tol{};

  bool takes(Prec p) const;
  const TensorSpec& spec(std::string_view tensor) const;
};

// The table, every op of backend.h the model uses.
const std::vector<OpCase>& op_cases();

// One row in one precision: a test's parameter.
struct OpRow {
  const OpCase* op = nullptr;
  Prec prec = Prec::f32;
};
std::vector<OpRow> op_rows(std::initializer_list<Prec> precs);
std::string op_row_name(const OpRow& row);         // "<case>_<prec>"
void PrintTo(const OpRow& row, std::ostream* os);  // GoogleTest's name for a parameter

// The row's inputs as drawn (from a seed and the case's and tensor's names): the same on every backend.
Values initial_values(const OpCase& c);

// A case's tensors allocated on one backend in the dtypes of a precision (in the order of the table),
// inputs from values, outputs poisoned with NaN so that an element an op forgets to write shows.
class CaseTensors {
 public:
  CaseTensors(Backend& be, const OpCase& c, Prec p);
  void upload(const Values& values);  // the in and inout tensors
  const Args& args() const { return args_; }
  const Tensor& operator[](std::string_view name) const { return args_[name]; }
  std::vector<double> download(std::string_view name);  // widened through f32 where 16-bit
  // The in and inout tensors (inputs: before the op runs, as the backend stores them), or the out and
  // inout ones (after).
  Values download_all(bool inputs);

 private:
  Backend& be_;
  const OpCase& case_;
  std::vector<Allocation> held_;
  Args args_;
};

// ‖a − b‖ / ‖b‖, and whether any element of a is NaN.
double relative_difference(const std::vector<double>& a, const std::vector<double>& b);
bool any_nan(const std::vector<double>& v);

// An allocator's recorded events as comparable lines: the action, bytes, tensor, dtype, tag with its
// line of code, and where: the how-manieth segment of the record and the offset in it (the addresses
// of two backends differ). expect_same_record fails at the first line where the dry run's differs.
std::vector<std::string> allocation_record(const Allocator& mem);
void expect_same_record(const Allocator& reference, const Allocator& dry_run);

}  // namespace lmscope::test
