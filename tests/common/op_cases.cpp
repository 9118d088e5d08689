// The op table's plumbing: dtypes by role and precision, the rows' names, their inputs' values, and
// a case's tensors on a backend. The rows themselves are in op_table.cpp.
#include "op_cases.h"

#include "lmscope/core/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>

namespace lmscope::test {

const char* prec_name(Prec p) {
  switch (p) {
    case Prec::f64:
      return "f64";
    case Prec::f32:
      return "f32";
    case Prec::tf32:
      return "tf32";
    case Prec::bf16:
      return "bf16";
    case Prec::f16:
      return "f16";
  }
  return "?";
}

bool is_lowp(Prec p) { return p == Prec::bf16 || p == Prec::f16; }

DType dtype_of(Role r, Prec p) {
  const DType master = p == Prec::f64 ? DType::f64 : DType::f32;
  switch (r) {
    case Role::compute:
      return p == Prec::bf16 ? DType::bf16 : p == Prec::f16 ? DType::f16 : master;
    case Role::grad:
      return p == Prec::bf16 ? DType::bf16 : master;
    case Role::ids:
      return DType::i32;
    case Role::master:
    case Role::stat:
      return master;
  }
  return master;
}

const Tensor& Args::operator[](std::string_view name) const {
  for (const auto& [n, t] : tensors_)
    if (n == name) return t;
  throw std::logic_error("op case: no tensor named " + std::string(name));
}

bool OpCase::takes(Prec p) const { return std::find(precs.begin(), precs.end(), p) != precs.end(); }

const TensorSpec& OpCase::spec(std::string_view tensor) const {
  for (const TensorSpec& s : tensors)
    if (s.name == tensor) return s;
  throw std::logic_error(name + ": no tensor named " + std::string(tensor));
}

std::vector<OpRow> op_rows(std::initializer_list<Prec> precs) {
  std::vector<OpRow> rows;
  for (const OpCase& c : op_cases())
    for (Prec p : precs)
      if (c.takes(p)) rows.push_back({&c, p});
  return rows;
}

std::string op_row_name(const OpRow& row) { return row.op->name + "_" + prec_name(row.prec); }

void PrintTo(const OpRow& row, std::ostream* os) { *os << op_row_name(row); }

Values initial_values(const OpCase& c) {
  Values v;
  for (const TensorSpec& s : c.tensors) {
    if (s.io == Io::out) continue;
    Rng rng = Rng::stream(54, c.name + "." + s.name);
    std::vector<double>& x = v[s.name];
    x.resize(static_cast<std::size_t>(shape_numel(s.shape)));
    for (double& e : x) switch (s.init.kind) {
        case Init::normal:
          e = s.init.value * rng.normal();
          break;
        case Init::abs_normal:
          e = std::fabs(s.init.value * rng.normal());
          break;
        case Init::ids:
          e = static_cast<double>(rng.below(static_cast<std::uint64_t>(s.init.value)));
          break;
        case Init::constant:
          e = s.init.value;
          break;
      }
  }
  return v;
}

CaseTensors::CaseTensors(Backend& be, const OpCase& c, Prec p) : be_(be), case_(c) {
  for (const TensorSpec& s : c.tensors) {
    Allocation a = be.allocator().allocate(s.shape, dtype_of(s.role, p), {MemKind::workspace, "op_table." + s.name});
    if (s.io == Io::out) be.fill(a, NAN);
    args_.add(s.name, a.tensor());
    held_.push_back(std::move(a));
  }
}

void CaseTensors::upload(const Values& values) {
  for (const TensorSpec& s : case_.tensors) {
    if (s.io == Io::out) continue;
    const Tensor& t = args_[s.name];
    const std::vector<double>& v = values.find(s.name)->second;
    if (t.dtype == DType::i32) {
      std::vector<std::int32_t> ids(v.begin(), v.end());
      be_.copy_from_host(t, ids.data());
    } else if (t.dtype == DType::f32 || t.dtype == DType::f64) {
      lmscope::upload(be_, t, v);
    } else {  // 16-bit: rounded from f32 by the backend's cast
      Allocation wide = be_.allocator().allocate(t.shape, DType::f32, {MemKind::workspace, "op_table.upload"});
      lmscope::upload(be_, wide, v);
      be_.cast(wide, t);
    }
  }
}

std::vector<double> CaseTensors::download(std::string_view name) {
  const Tensor& t = args_[name];
  if (t.dtype == DType::i32) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(t.numel()));
    be_.copy_to_host(ids.data(), t);
    return {ids.begin(), ids.end()};
  }
  if (t.dtype == DType::f32 || t.dtype == DType::f64) return lmscope::download(be_, t);
  Allocation wide = be_.allocator().allocate(t.shape, DType::f32, {MemKind::workspace, "op_table.download"});
  be_.cast(t, wide);
  return lmscope::download(be_, wide);
}

Values CaseTensors::download_all(bool inputs) {
  Values v;
  for (const TensorSpec& s : case_.tensors)
    if (s.io == Io::inout || (s.io == Io::in) == inputs) v[s.name] = download(s.name);
  return v;
}

double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) err += (a[i] - b[i]) * (a[i] - b[i]), ref += b[i] * b[i];
  return ref > 0 ? std::sqrt(err / ref) : std::sqrt(err);
}

std::vector<std::string> allocation_record(const Allocator& mem) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> segments;
  std::vector<std::string> lines;
  for (const MemEvent& e : mem.events()) {
    if (e.action == MemAction::segment_alloc) segments.emplace_back(e.address, e.bytes);
    std::size_t seg = segments.size();
    for (std::size_t i = 0; i < segments.size(); ++i)
      if (e.address >= segments[i].first && e.address < segments[i].first + segments[i].second) seg = i;
    const std::uintptr_t offset = seg < segments.size() ? e.address - segments[seg].first : 0;
    lines.push_back(fmt::format("{} {} bytes of {} {} {} ({}:{}, {}) in segment {} at {}", mem_action_name(e.action),
                                e.bytes, e.tag.what, shape_str(e.shape), dtype_name(e.dtype),
                                e.tag.file ? e.tag.file : "", e.tag.line, mem_kind_name(e.tag.kind), seg, offset));
  }
  return lines;
}

void expect_same_record(const Allocator& reference, const Allocator& dry_run) {
  const std::vector<std::string> want = allocation_record(reference), got = allocation_record(dry_run);
  for (std::size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    ASSERT_LT(i, want.size()) << "the dry run recorded more: " << got[i];
    ASSERT_LT(i, got.size()) << "the dry run recorded less: " << want[i];
    ASSERT_EQ(got[i], want[i]) << "event " << i;
  }
}

bool any_nan(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}

}  // namespace lmscope::test
