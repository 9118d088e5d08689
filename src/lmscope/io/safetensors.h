// safetensors (the Hugging Face format PyTorch users save weights in): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw little-endian data. Read through mmap, so large checkpoints are not copied twice.
#pragma once

#include "lmscope/core/tensor.h"
#include "lmscope/io/durable_file.h"
#include "lmscope/model/config.h"

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace lmscope {

class Backend;
class Transformer;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  Shape shape;
  std::size_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  // Opens and validates the header against the file's size; throws UserError if malformed.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The tensor's values as float64 (F32, F64, BF16 and F16 are read; other dtypes are a UserError).
  std::vector<double> read(const SafetensorsEntry& e) const;

 private:
  void parse_header();
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  const unsigned char* map_ = nullptr;
  std::size_t map_size_ = 0, data_offset_ = 0;
};

struct NamedTensorData {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

// An F32 tensor to write, its values fetched only when its turn comes (a checkpoint of 2.7B never
// holds more than one tensor on the host).
struct TensorSource {
  std::string name;
  Shape shape;
  std::function<std::vector<float>()> values;
};

// Writes F32 tensors; the file appears complete or not at all (DurableFile). Returns its digest.
FileDigest write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                             const std::map<std::string, std::string>& metadata = {});
FileDigest write_safetensors(const std::string& path, const std::vector<NamedTensorData>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// Parameter i's values whole on the host, and set from whole values: the model's own tensors unless
// given; a run whose parameters are sharded (ZeRO-3) gives AdamW's (AdamW::parameter_values and
// set_parameter_values).
using ParameterValues = std::function<std::vector<float>(std::size_t)>;
using SetParameterValues = std::function<void(std::size_t, std::span<const double>)>;

// The model's parameters by their PyTorch names. Loading checks that the file holds exactly the
// model's tensors with their shapes; a name prefixed "_orig_mod." (torch.compile) is accepted.
void load_parameters(Transformer& model, const std::string& path, const SetParameterValues& set = {});
FileDigest save_parameters(Transformer& model, const std::string& path, const ParameterValues& values = {});
// The tensors save_parameters writes, for writers of other files beside them (checkpoints).
std::vector<TensorSource> parameter_sources(Transformer& model, const ParameterValues& values = {});
std::map<std::string, std::string> model_metadata(const ModelConfig& c);
// A tensor's values on the host as F32, for a TensorSource.
std::vector<float> host_f32(Backend& backend, const Tensor& t);

}  // namespace lmscope
