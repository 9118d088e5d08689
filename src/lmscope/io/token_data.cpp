#include "lmscope/io/token_data.h"

#include "lmscope/core/error.h"
#include "lmscope/io/regular_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <utility>

namespace lmscope {
namespace {

// Header text as a message may show it: a header's newlines and binary bytes split the one sentence.
std::string shown(const std::string& text) {
  std::string out;
  for (const char c : text.substr(0, 40)) out += c >= ' ' && c <= '~' ? c : '?';
  return text.size() > 40 ? out + "..." : out;
}

// Parses the .npy header (format versions 1-3) and returns the data offset; sets element size and count.
std::size_t parse_npy(const std::string& path, const unsigned char* p, std::size_t size, int& elem_size,
                      std::int64_t& count) {
  if (size < 10) user_error("'{}' is truncated: too short for a .npy header", path);
  const int major = p[6];
  if (major < 1 || major > 3)
    user_error("'{}' is a .npy file of format version {}, and lmscope reads versions 1 to 3", path, major);
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (size < 8 + len_bytes) user_error("'{}' is truncated: too short for a .npy header", path);
  std::size_t header_len = 0;
  for (std::size_t i = 0; i < len_bytes; ++i) header_len |= std::size_t{p[8 + i]} << (8 * i);
  const std::size_t offset = 8 + len_bytes + header_len;
  if (offset > size) user_error("'{}' is truncated: its .npy header runs past the end of the file", path);
  const std::string header(reinterpret_cast<const char*>(p + 8 + len_bytes), header_len);
  // The value after 'key': in the header dict, with leading spaces skipped.
  auto value_of = [&](const char* key) -> std::string {
    std::size_t k = header.find(key);
    if (k == std::string::npos) return {};
    k = header.find(':', k);
    if (k == std::string::npos) return {};
    k = header.find_first_not_of(' ', k + 1);
    return k == std::string::npos ? std::string() : header.substr(k);
  };
  const std::string descr_field = value_of("'descr'");
  if (descr_field.size() < 2 || descr_field[0] != '\'') user_error("'{}' has a .npy header without a dtype", path);
  const std::size_t quote = descr_field.find('\'', 1);
  if (quote == std::string::npos) user_error("'{}' has a .npy header without a dtype", path);
  const std::string descr = descr_field.substr(1, quote - 1);
  if (descr == "<u2" || descr == "|u2")
    elem_size = 2;
  else if (descr == "<i4")
    elem_size = 4;
  else if (descr == "<i8")
    elem_size = 8;
  else
    user_error("'{}' holds dtype '{}'; token arrays must be little-endian uint16, int32 or int64", path, shown(descr));
  if (value_of("'fortran_order'").rfind("True", 0) == 0)
    user_error("'{}' is stored in Fortran order; save a C-ordered one-dimensional array", path);
  const std::string shape_field = value_of("'shape'");
  const std::size_t close = shape_field.find(')');
  if (shape_field.empty() || shape_field[0] != '(' || close == std::string::npos)
    user_error("'{}' has a .npy header without a shape", path);
  std::string dims = shape_field.substr(1, close - 1);  // "1000," or "2, 2"
  while (!dims.empty() && (dims.back() == ',' || dims.back() == ' ')) dims.pop_back();
  if (dims.empty() || dims.find_first_not_of("0123456789") != std::string::npos)
    user_error("'{}' must hold a one-dimensional token array, not shape ({})", path, shown(dims));
  // A shape past 64 bits (10^23, which std::stoll threw at) promises more than any file holds.
  std::uint64_t promised = 0;
  const auto [end, ec] = std::from_chars(dims.data(), dims.data() + dims.size(), promised);
  const std::size_t holds = (size - offset) / static_cast<std::size_t>(elem_size);
  if (ec != std::errc() || end != dims.data() + dims.size() || promised > holds)
    user_error("'{}' is truncated: its header promises {} tokens but the file holds {}", path, shown(dims), holds);
  count = static_cast<std::int64_t>(promised);
  return offset;
}

}  // namespace

TokenData::TokenData(const std::string& path) : path_(path) {
  const int fd = open_regular_file(path, "token file", map_size_);
  if (map_size_ == 0) {
    ::close(fd);
    user_error("token file '{}' is empty", path);
  }
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) user_error("cannot map token file '{}': {}", path, std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  mapped_ = true;
  try {
    if (map_size_ >= 6 && std::memcmp(map_, "\x93NUMPY", 6) == 0) {
      offset_ = parse_npy(path, map_, map_size_, elem_size_, count_);
    } else {
      if (map_size_ % 2 != 0)
        user_error("'{}' has an odd number of bytes ({}), so it is not a raw uint16 token array", path, map_size_);
      count_ = static_cast<std::int64_t>(map_size_ / 2);
    }
  } catch (...) {
    ::munmap(m, map_size_);
    throw;
  }
}

TokenData::TokenData(const void* ids, std::int64_t count, int elem_size, std::string name)
    : path_(std::move(name)), map_(static_cast<const unsigned char*>(ids)), elem_size_(elem_size), count_(count) {
  if (elem_size != 2 && elem_size != 4 && elem_size != 8)
    user_error("{} holds ids of {} bytes; token ids are uint16, int32 or int64", path_, elem_size);
  if (count <= 0) user_error("{} holds no tokens", path_);
}

TokenData::~TokenData() {
  if (mapped_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
}

std::int64_t TokenData::at(std::int64_t i) const {
  const unsigned char* p = map_ + offset_ + static_cast<std::size_t>(i) * static_cast<std::size_t>(elem_size_);
  if (elem_size_ == 2) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  if (elem_size_ == 4) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  std::int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void TokenData::check_vocabulary(std::int64_t vocab) const {
  if (elem_size_ == 2 && vocab > 65535) return;  // every uint16 fits
  for (std::int64_t i = 0; i < count_; ++i) {
    const std::int64_t v = at(i);
    if (v < 0 || v >= vocab)
      user_error("token id {} at position {} of '{}' is outside the vocabulary of {} (ids 0..{})", v, i, path_, vocab,
                 vocab - 1);
  }
}

BatchSampler::BatchSampler(const TokenData& data, std::int64_t batch, std::int64_t ctx, bool sequential,
                           std::uint64_t seed)
    : data_(data), batch_(batch), ctx_(ctx), sequential_(sequential), rng_(Rng::stream(seed, "batches")) {
  if (data.size() < ctx + 1)
    user_error("'{}' holds {} tokens, fewer than one window of ctx + 1 = {} tokens", data.path(), data.size(), ctx + 1);
}

void BatchSampler::next(std::int32_t* inputs, std::int32_t* targets) {
  const std::int64_t windows = (data_.size() - 1) / ctx_;
  for (std::int64_t b = 0; b < batch_; ++b) {
    const std::int64_t start =
        sequential_ ? ((step_ * batch_ + b) % windows) * ctx_
                    : static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(data_.size() - ctx_)));
    for (std::int64_t t = 0; t < ctx_; ++t) {
      inputs[b * ctx_ + t] = static_cast<std::int32_t>(data_.at(start + t));
      targets[b * ctx_ + t] = static_cast<std::int32_t>(data_.at(start + t + 1));
    }
  }
  ++step_;
}

}  // namespace lmscope
