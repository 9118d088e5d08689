#include "lmscope/io/checkpoint.h"

#include "lmscope/backend/backend.h"
#include "lmscope/io/durable_file.h"
#include "lmscope/io/safetensors.h"
#include "lmscope/model/optimizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace lmscope {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "lmscope-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kPartialPrefix = ".partial-";

std::string step_dir_name(std::int64_t step) { return fmt::format("step-{:08d}", step); }

// The step a directory name "step-00000100" stands for; -1 for any other name.
std::int64_t step_of(const std::string& name) {
  if (name.size() != 13 || name.rfind("step-", 0) != 0) return -1;
  std::int64_t step = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

// The checkpoints in dir, newest first. (With error codes: an unreadable directory, or a step-* that
// is a symlink loop, threw the library's "filesystem error".)
std::vector<std::pair<std::int64_t, fs::path>> checkpoints_in(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code is_dir_ec;
    if (const std::int64_t s = step_of(it->path().filename().string()); s >= 0 && it->is_directory(is_dir_ec))
      out.emplace_back(s, it->path());
  }
  if (ec) user_error("cannot read the checkpoint directory '{}': {}", dir.string(), ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string hex(std::uint64_t v) { return fmt::format("{:016x}", v); }

std::uint64_t from_hex(const std::string& s) {
  std::size_t used = 0;
  const std::uint64_t v = std::stoull(s, &used, 16);
  if (used != s.size()) throw std::invalid_argument("not hexadecimal");
  return v;
}

nlohmann::ordered_json digest_json(const FileDigest& d) { return {{"bytes", d.bytes}, {"crc32", d.crc32}}; }

// The CRC-32 state.json carries of itself: of the object without its "crc32", written compactly
// (its keys in their order), so whitespace aside the file is checked as the other files are.
std::uint32_t state_crc(nlohmann::ordered_json j) {
  j.erase("crc32");
  return crc32_of(j.dump());
}

// Why a state.json is not to be trusted (thrown inside read_state).
struct Untrusted {
  std::string why;
};

// A non-negative whole number of state.json's: 3.5, 1e300 or -1 are refused.
std::int64_t whole(const nlohmann::ordered_json& j, const char* key, const std::string& name) {
  const auto& v = j.at(key);
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    throw Untrusted{fmt::format("its {}'s {} is {}, not a whole number", kStateFile, name, v.dump())};
  return v.get<std::int64_t>();
}

// The state in dir's state.json, checked against its own CRC-32 and the step of its directory's
// name; why it is not to be trusted, or "" (then `notes` may say something of it).
std::string read_state(const fs::path& dir, std::int64_t dir_step, CheckpointState& state, nlohmann::ordered_json& j,
                       std::vector<std::string>& notes) {
  const fs::path state_path = dir / kStateFile;
  std::error_code ec;
  const fs::file_status st = fs::status(state_path, ec);
  if (!fs::exists(st)) return fmt::format("it has no {}", kStateFile);
  if (!fs::is_regular_file(st)) return fmt::format("its {} is not a regular file", kStateFile);
  // A state.json is kilobytes; a larger one (a sparse file of terabytes) was read whole into memory.
  constexpr std::uintmax_t kMaxStateBytes = std::uintmax_t{1} << 24;
  if (const std::uintmax_t bytes = fs::file_size(state_path, ec); !ec && bytes > kMaxStateBytes)
    return fmt::format("its {} holds {} bytes, more than a checkpoint's state ever does ({} at most)", kStateFile,
                       bytes, kMaxStateBytes);
  std::ifstream in(state_path, std::ios::binary);
  std::ostringstream text;
  if (!in) return fmt::format("its {} cannot be read", kStateFile);
  text << in.rdbuf();  // (an empty file sets `text`'s failbit, and parses as no JSON below)
  j = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fmt::format("its {} is not a JSON object", kStateFile);
  try {
    if (!j.contains("format") || j["format"] != kFormat)
      return fmt::format("{} is not an lmscope checkpoint's", kStateFile);
    if (!j.contains("version") || j["version"] != kVersion)
      return fmt::format("it is of version {}, and this lmscope reads version {}",
                         j.value("version", nlohmann::ordered_json()).dump(), kVersion);
    if (!j.contains("crc32")) {
      notes.push_back(
          fmt::format("'{}' carries no CRC-32 of its own (an lmscope before 2026-11-28 wrote it): its "
                      "fields are checked, its bytes cannot be",
                      state_path.string()));
    } else if (!j["crc32"].is_number_unsigned() || j["crc32"].get<std::uint64_t>() != state_crc(j)) {
      return fmt::format("{} does not match its CRC-32 (damaged or edited)", kStateFile);
    }
    state.step = whole(j, "step", "step");
    if (state.step != dir_step)
      return fmt::format("its {} says step {}, and its directory step {}", kStateFile, state.step, dir_step);
    state.adamw_steps = whole(j, "adamw_steps", "adamw_steps");
    if (state.adamw_steps > state.step)
      return fmt::format("its {}'s adamw_steps ({}) is more than its step ({})", kStateFile, state.adamw_steps,
                         state.step);
    state.sampler.rng_state = from_hex(j.at("sampler").at("rng_state").get<std::string>());
    state.sampler.batches = whole(j.at("sampler"), "batches", "sampler batches");
    state.config = j.at("config");
    if (!state.config.is_object()) return fmt::format("its {}'s config is not an object", kStateFile);
    state.loss_scaler.reset();
    if (j.contains("loss_scaler")) {
      const auto& s = j.at("loss_scaler");
      state.loss_scaler =
          LossScaler::State{s.at("scale").get<double>(), whole(s, "good_steps", "loss scaler's good_steps"),
                            whole(s, "skipped", "loss scaler's skipped")};
      if (!(state.loss_scaler->scale > 0) || !std::isfinite(state.loss_scaler->scale))
        return fmt::format("its {}'s loss scale is not a positive number", kStateFile);
    }
    state.weights_finite = j.value("weights_finite", true);
  } catch (const Untrusted& e) {
    return e.why;
  } catch (const nlohmann::json::exception&) {
    return fmt::format("its {} lacks a field or holds one of another kind", kStateFile);
  } catch (const std::invalid_argument&) {
    return fmt::format("its {} holds a malformed sampler state", kStateFile);
  } catch (const std::out_of_range&) {
    return fmt::format("its {} holds a malformed sampler state", kStateFile);
  }
  return "";
}

// Why the checkpoint at `dir` (of step dir_step) is not complete, or "" when it is; its state when it is.
std::string check(const fs::path& dir, std::int64_t dir_step, CheckpointState& state, std::vector<std::string>& notes) {
  nlohmann::ordered_json j;
  std::vector<std::string> said;
  if (std::string why = read_state(dir, dir_step, state, j, said); !why.empty()) return why;
  try {
    for (const char* file : {kModelFile, kOptimizerFile}) {
      const auto& want = j.at("files").at(file);
      const fs::path p = dir / file;
      std::error_code ec;
      const fs::file_status st = fs::status(p, ec);
      if (!fs::exists(st)) return fmt::format("{} is missing", file);
      if (!fs::is_regular_file(st)) return fmt::format("{} is not a regular file", file);
      const FileDigest expected{want.at("bytes").get<std::uint64_t>(), want.at("crc32").get<std::uint32_t>()};
      std::string why_not;
      const std::optional<FileDigest> found = digest_of_file(p.string(), why_not);
      if (!found) return fmt::format("{} cannot be read ({})", file, why_not);
      if (found->bytes != expected.bytes)
        return fmt::format("{} holds {} bytes, not the {} written (truncated?)", file, found->bytes, expected.bytes);
      if (found->crc32 != expected.crc32) return fmt::format("{} does not match its CRC-32 (damaged)", file);
    }
  } catch (const nlohmann::json::exception&) {
    return fmt::format("its {} lacks a file's size or CRC-32", kStateFile);
  }
  notes.insert(notes.end(), said.begin(), said.end());
  return "";
}

// Whether the checkpoint at `dir` is one --keep holds on to as the newest with finite weights: its
// state.json trusted and saying so (its big files are not read).
bool holds_finite_weights(const fs::path& dir, std::int64_t dir_step) {
  CheckpointState state;
  nlohmann::ordered_json j;
  std::vector<std::string> notes;
  return read_state(dir, dir_step, state, j, notes).empty() && state.weights_finite;
}

// AdamW's moments by PyTorch's names; the file holds each parameter's, in the model's order, in this
// order: the order in which a sharded AdamW's ranks assemble them, the writer's and the others' alike.
constexpr std::array<std::pair<const char*, AdamW::Moment>, 2> kMoments{
    {{".exp_avg", AdamW::Moment::first}, {".exp_avg_sq", AdamW::Moment::second}}};

std::vector<TensorSource> moment_sources(Transformer& model, AdamW& opt) {
  std::vector<TensorSource> moments;
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    for (const auto& [suffix, which] : kMoments)
      moments.push_back({params[i].spec.name + suffix, model.whole_shape(i),
                         [&opt, i, which = which] { return opt.moment_values(i, which); }});
  return moments;
}

}  // namespace

void join_checkpoint_write(Transformer& model, AdamW& opt) {
  // In the writer's order: the weights' file, then the moments'.
  for (std::size_t i = 0; i < model.parameters().size(); ++i) opt.join_parameter_values(i);
  for (std::size_t i = 0; i < model.parameters().size(); ++i)
    for (const auto& [suffix, which] : kMoments) opt.join_moment_values(i, which);
}

std::string write_checkpoint(const std::string& dir, Transformer& model, AdamW& opt, const CheckpointState& state,
                             int keep) {
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec || !fs::is_directory(root)) user_error("cannot make the checkpoint directory '{}': {}", dir, ec.message());
  const fs::path final_dir = root / step_dir_name(state.step);
  const fs::path partial = root / (kPartialPrefix + step_dir_name(state.step));
  fs::remove_all(partial);
  fs::create_directory(partial, ec);
  if (ec) user_error("cannot make '{}': {}", partial.string(), ec.message());

  // The weights as save_parameters writes them, each tensor looked at for non-finite values on the way.
  bool finite = true;
  std::vector<TensorSource> weight_sources =
      parameter_sources(model, [&opt](std::size_t i) { return opt.parameter_values(i); });
  for (TensorSource& t : weight_sources)
    t.values = [&finite, values = std::move(t.values)] {
      std::vector<float> v = values();
      finite = finite && std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
      return v;
    };
  const FileDigest weights =
      write_safetensors((partial / kModelFile).string(), weight_sources, model_metadata(model.config()));
  const FileDigest optimizer =
      write_safetensors((partial / kOptimizerFile).string(), moment_sources(model, opt), {{"producer", "lmscope"}});
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = state.step;
  j["adamw_steps"] = state.adamw_steps;
  j["sampler"] = {{"rng_state", hex(state.sampler.rng_state)}, {"batches", state.sampler.batches}};
  j["config"] = state.config;
  if (state.loss_scaler) {
    const LossScaler::State& s = *state.loss_scaler;
    j["loss_scaler"] = {{"scale", s.scale}, {"good_steps", s.good_steps}, {"skipped", s.skipped}};
  }
  j["weights_finite"] = finite;
  j["files"] = {{kModelFile, digest_json(weights)}, {kOptimizerFile, digest_json(optimizer)}};
  j["crc32"] = state_crc(j);
  write_file_durably((partial / kStateFile).string(), j.dump(2) + "\n");
  sync_directory(partial.string());

  // A checkpoint of the same step (a run resumed before it and saving it again) gives way.
  fs::remove_all(final_dir);
  fs::rename(partial, final_dir, ec);
  if (ec) user_error("cannot move '{}' into place: {}", final_dir.string(), ec.message());
  sync_directory(root.string());

  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind(kPartialPrefix, 0) == 0) fs::remove_all(e.path());
  if (keep > 0) {  // the newest `keep`, and the newest with finite weights
    bool finite_kept = false;
    const auto all = checkpoints_in(root);
    for (std::size_t i = 0; i < all.size(); ++i) {
      const bool finite = !finite_kept && holds_finite_weights(all[i].second, all[i].first);
      finite_kept = finite_kept || finite;
      if (i >= static_cast<std::size_t>(keep) && !finite) fs::remove_all(all[i].second);
    }
  }
  return final_dir.string();
}

FoundCheckpoint find_checkpoint(const std::string& dir) {
  // (With an error code: a name too long for the system threw the library's "filesystem error".)
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && st.type() != fs::file_type::not_found)
    user_error("cannot use the checkpoint directory '{}': {}", dir, ec.message());
  if (!fs::exists(st)) user_error("the checkpoint directory '{}' does not exist", dir);
  if (!fs::is_directory(st)) user_error("the checkpoint directory '{}' is not a directory", dir);
  FoundCheckpoint found;
  for (const auto& [step, path] : checkpoints_in(dir)) {
    const std::string why = check(path, step, found.state, found.notes);
    if (why.empty()) {
      found.path = path.string();
      return found;
    }
    found.passed_over.push_back(fmt::format("'{}': {}", path.string(), why));
  }
  if (found.passed_over.empty()) user_error("'{}' holds no checkpoint (no step-* directory)", dir);
  user_error("'{}' holds no complete checkpoint; the newest, {}", dir, found.passed_over.front());
}

std::vector<std::string> FoundCheckpoint::warnings() const {
  std::vector<std::string> out;
  for (const std::string& why : passed_over) out.push_back("passed over " + why);
  out.insert(out.end(), notes.begin(), notes.end());
  return out;
}

std::vector<std::string> checkpoint_paths(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& [step, path] : checkpoints_in(dir)) out.push_back(path.string());
  return out;
}

void remove_checkpoints(const std::string& dir) {
  for (const std::string& path : checkpoint_paths(dir)) fs::remove_all(path);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(kPartialPrefix, 0) == 0) fs::remove_all(e.path());
  sync_directory(dir);
}

void load_checkpoint(const FoundCheckpoint& c, Transformer& model, AdamW& opt) {
  load_parameters(model, (fs::path(c.path) / kModelFile).string(),
                  [&opt](std::size_t i, std::span<const double> values) { opt.set_parameter_values(i, values); });
  const std::string path = (fs::path(c.path) / kOptimizerFile).string();
  SafetensorsFile file(path);
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    for (const auto& [suffix, which] : kMoments) {
      const SafetensorsEntry* e = file.find(p.spec.name + suffix);
      if (!e) user_error("'{}' lacks AdamW's '{}{}'", path, p.spec.name, suffix);
      if (e->shape != model.whole_shape(i))
        user_error("'{}{}' in '{}' has shape {}, but the model needs {}", p.spec.name, suffix, path,
                   shape_str(e->shape), shape_str(model.whole_shape(i)));
      opt.set_moment(i, which, file.read(*e));
    }
  }
  opt.set_steps_taken(c.state.adamw_steps);
  if (c.state.loss_scaler) opt.restore_loss_scaler(*c.state.loss_scaler);
}

}  // namespace lmscope
