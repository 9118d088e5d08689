#include "lmscope/io/safetensors.h"

#include "lmscope/io/regular_file.h"
#include "lmscope/model/transformer.h"

#include <sys/mman.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

namespace lmscope {
namespace {

std::size_t safetensors_dtype_size(const std::string& t) {
  if (t == "F64" || t == "I64" || t == "U64") return 8;
  if (t == "F32" || t == "I32" || t == "U32") return 4;
  if (t == "F16" || t == "BF16" || t == "I16" || t == "U16") return 2;
  if (t == "I8" || t == "U8" || t == "BOOL" || t == "F8_E4M3" || t == "F8_E5M2") return 1;
  return 0;
}

double half_to_double(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? std::ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY) : std::ldexp(mant + 1024, exp - 25);
  return sign ? -v : v;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = open_regular_file(path, "weights file", map_size_);
  if (map_size_ < 8) {
    ::close(fd);
    user_error("'{}' is not a safetensors file: it is {} bytes long, shorter than the 8-byte header length", path,
               map_size_);
  }
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) user_error("cannot map weights file '{}': {}", path, std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  try {
    parse_header();
  } catch (...) {
    ::munmap(m, map_size_);
    throw;
  }
}

void SafetensorsFile::parse_header() {
  const std::string& path = path_;
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map_[i];
  if (header_len > map_size_ - 8)
    user_error("'{}' is truncated or not a safetensors file: its header claims {} bytes but the file has {}", path,
               header_len, map_size_ - 8);
  data_offset_ = 8 + header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map_ + 8, map_ + data_offset_);
  } catch (const nlohmann::json::parse_error& e) {
    user_error("'{}' has a malformed safetensors header: its {} bytes are not JSON (the fault at byte {})", path,
               header_len, e.byte);
  }
  if (!header.is_object()) user_error("'{}' has a malformed safetensors header: not a JSON object", path);
  const std::size_t data_size = map_size_ - data_offset_;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto& [k, s] : v.items())
          if (s.is_string()) metadata_[k] = s.get<std::string>();
      continue;
    }
    // Each field checked for its kind, so that the sentence says which is wrong.
    const auto malformed = [&](const char* why) {
      user_error("'{}' has a malformed header entry for tensor '{}': {}", path, name, why);
    };
    if (!v.is_object()) malformed("not a JSON object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) malformed("its \"dtype\" is missing or not text");
    if (!v.contains("shape") || !v["shape"].is_array()) malformed("its \"shape\" is missing or not a list");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      malformed("its \"data_offsets\" is missing or not two numbers");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    const std::size_t es = safetensors_dtype_size(e.dtype);
    if (es == 0) user_error("tensor '{}' in '{}' has unknown dtype '{}'", name, path, e.dtype);
    // The bytes the shape takes, counted without overflow ([2^32, 2^32] wrapped to none and was accepted).
    std::size_t bytes = es;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        malformed("its \"shape\" holds something other than a whole number of at least 0");
      e.shape.push_back(d.get<std::int64_t>());
      if (__builtin_mul_overflow(bytes, static_cast<std::size_t>(e.shape.back()), &bytes))
        user_error("tensor '{}' in '{}' has shape {}, more values than any file holds", name, path, v["shape"].dump());
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) malformed("its \"data_offsets\" are not whole numbers of at least 0");
    e.begin = v["data_offsets"][0].get<std::size_t>();
    e.end = v["data_offsets"][1].get<std::size_t>();
    if (e.end < e.begin || e.end - e.begin != bytes)
      user_error("tensor '{}' in '{}' has data_offsets [{}, {}] that do not fit its shape {} of {}", name, path,
                 e.begin, e.end, shape_str(e.shape), e.dtype);
    if (e.end > data_size)
      user_error("'{}' is truncated: tensor '{}' ends at byte {} of a data section of {} bytes", path, name, e.end,
                 data_size);
    entries_.push_back(std::move(e));
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<double> SafetensorsFile::read(const SafetensorsEntry& e) const {
  const unsigned char* p = map_ + data_offset_ + e.begin;
  const std::size_t n = static_cast<std::size_t>(shape_numel(e.shape));
  std::vector<double> out(n);
  // safetensors data is little-endian, as is every machine lmscope runs on.
  if (e.dtype == "F32") {
    for (std::size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = f;
    }
  } else if (e.dtype == "F64") {
    std::memcpy(out.data(), p, 8 * n);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if (e.dtype == "BF16") {
        std::uint32_t bits = std::uint32_t{h} << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        out[i] = f;
      } else {
        out[i] = half_to_double(h);
      }
    }
  } else {
    user_error("tensor '{}' in '{}' has dtype {}, but weights must be F32, F64, BF16 or F16", e.name, path_, e.dtype);
  }
  return out;
}

FileDigest write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    const std::size_t bytes = static_cast<std::size_t>(shape_numel(t.shape)) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data section is 8-byte aligned
  DurableFile f(path);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>((static_cast<std::uint64_t>(h.size()) >> (8 * i)) & 0xff);
  f.write(len, 8);
  f.write(h.data(), h.size());
  for (const auto& t : tensors) {
    const std::vector<float> v = t.values();
    LMSCOPE_CHECK(static_cast<std::int64_t>(v.size()) == shape_numel(t.shape), "tensor {} size", t.name);
    f.write(v.data(), v.size() * 4);
  }
  return f.commit();
}

FileDigest write_safetensors(const std::string& path, const std::vector<NamedTensorData>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSource> sources;
  for (const auto& t : tensors) sources.push_back({t.name, t.shape, [&t] { return t.values; }});
  return write_safetensors(path, sources, metadata);
}

void load_parameters(Transformer& model, const std::string& path, const SetParameterValues& set) {
  SafetensorsFile file(path);
  std::set<std::string> expected;
  for (const Parameter& p : model.parameters()) expected.insert(p.spec.name);
  auto canonical = [](const std::string& n) { return n.rfind("_orig_mod.", 0) == 0 ? n.substr(10) : n; };
  for (const auto& e : file.entries())
    if (!expected.count(canonical(e.name)))
      user_error("'{}' holds tensor '{}', which this model (d_model {}, layers {}) does not have", path, e.name,
                 model.config().d_model, model.config().layers);
  std::vector<Parameter>& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    const SafetensorsEntry* e = file.find(p.spec.name);
    if (!e) e = file.find("_orig_mod." + p.spec.name);
    if (!e) user_error("'{}' lacks tensor '{}' of shape {}", path, p.spec.name, shape_str(p.spec.shape));
    if (e->shape != model.whole_shape(i))
      user_error("tensor '{}' in '{}' has shape {}, but the model needs {}", p.spec.name, path, shape_str(e->shape),
                 shape_str(model.whole_shape(i)));
    if (set)
      set(i, file.read(*e));
    else
      upload(model.backend(), p.value, model.local_values(i, file.read(*e)));  // this rank's block where split
  }
  if (!set) model.refresh_lowp_copies();
}

std::vector<float> host_f32(Backend& backend, const Tensor& t) {
  const std::vector<double> v = download(backend, t);
  return std::vector<float>(v.begin(), v.end());
}

std::vector<TensorSource> parameter_sources(Transformer& model, const ParameterValues& values) {
  std::vector<TensorSource> out;
  std::vector<Parameter>& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    if (values)  // whole values, in the whole shape (tensor parallelism's blocks gathered)
      out.push_back({p.spec.name, model.whole_shape(i), [values, i] { return values(i); }});
    else
      out.push_back({p.spec.name, p.spec.shape, [&model, &p] { return host_f32(model.backend(), p.value); }});
  }
  return out;
}

std::map<std::string, std::string> model_metadata(const ModelConfig& c) {
  return {{"format", "pt"},
          {"producer", "lmscope"},
          {"vocab_size", std::to_string(c.vocab)},
          {"d_model", std::to_string(c.d_model)},
          {"d_ff", std::to_string(c.d_ff)},
          {"num_layers", std::to_string(c.layers)},
          {"num_heads", std::to_string(c.heads)},
          {"rope_theta", fmt::format("{}", c.rope_theta)}};
}

FileDigest save_parameters(Transformer& model, const std::string& path, const ParameterValues& values) {
  return write_safetensors(path, parameter_sources(model, values), model_metadata(model.config()));
}

}  // namespace lmscope
