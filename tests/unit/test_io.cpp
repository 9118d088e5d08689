// safetensors and token files: round trips, and every malformed input a clear UserError.
#include "../common/tiny_model.h"

#include "lmscope/io/safetensors.h"
#include "lmscope/io/token_data.h"
#include "lmscope/model/transformer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace lmscope::test {
namespace {

namespace fs = std::filesystem;

class TempDir : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("lmscope_io_" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
};

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// Expects a UserError whose sentence contains `needle`.
template <typename F>
void expect_user_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();  // our words only
  }
}

TEST_F(TempDir, ParametersRoundTrip) {
  auto be = make_cpu_backend();
  Transformer a(tiny_model(), *be), b(tiny_model(), *be);
  a.init_parameters(1);
  b.init_parameters(2);
  save_parameters(a, path("w.safetensors"));
  load_parameters(b, path("w.safetensors"));
  for (std::size_t i = 0; i < a.parameters().size(); ++i)
    EXPECT_EQ(download(*be, a.parameters()[i].value), download(*be, b.parameters()[i].value));
  SafetensorsFile f(path("w.safetensors"));
  EXPECT_EQ(f.metadata().at("d_model"), "32");
}

TEST_F(TempDir, MissingExtraAndMisshapedTensorsAreRefused) {
  auto be = make_cpu_backend();
  Transformer model(tiny_model(), *be);
  std::vector<NamedTensorData> tensors;
  for (Parameter& p : model.parameters())
    tensors.push_back({p.spec.name, p.spec.shape, std::vector<float>(p.value.tensor().numel(), 0.5f)});
  auto with = [&](auto edit) {
    auto t = tensors;
    edit(t);
    write_safetensors(path("w.safetensors"), t);
    return [&] { load_parameters(model, path("w.safetensors")); };
  };
  expect_user_error(with([](auto& t) { t.pop_back(); }), "lacks tensor 'lm_head.weight'");
  expect_user_error(with([](auto& t) { t.push_back({"extra.weight", {2}, {1, 2}}); }), "extra.weight");
  expect_user_error(with([](auto& t) { t[0].shape = {32, 37}; }), "has shape [32, 37], but the model needs [37, 32]");
  // torch.compile's prefix is accepted
  with([](auto& t) {
    for (auto& x : t) x.name = "_orig_mod." + x.name;
  })();
}

TEST_F(TempDir, MalformedSafetensorsAreRefused) {
  auto be = make_cpu_backend();
  Transformer model(tiny_model(), *be);
  auto load = [&](const std::string& name) { return [&, name] { load_parameters(model, path(name)); }; };
  write("short", "abc");
  expect_user_error(load("short"), "shorter than the 8-byte header");
  write("badlen", safetensors_bytes(std::string(10, ' '), "").substr(0, 12));
  expect_user_error(load("badlen"), "truncated");
  write("notjson", safetensors_bytes("{nope", ""));
  expect_user_error(load("notjson"), "malformed");
  write("trunc", safetensors_bytes(R"({"ln_final.weight":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", "1234"));
  expect_user_error(load("trunc"), "truncated");
  write("dtype", safetensors_bytes(R"({"ln_final.weight":{"dtype":"I64","shape":[8],"data_offsets":[0,64]}})",
                                   std::string(64, '\0')));
  SafetensorsFile int_weights(path("dtype"));
  expect_user_error([&] { int_weights.read(int_weights.entries()[0]); }, "must be F32, F64, BF16 or F16");
  write("offsets", safetensors_bytes(R"({"ln_final.weight":{"dtype":"F32","shape":[8],"data_offsets":[0,16]}})",
                                     std::string(16, '\0')));
  expect_user_error(load("offsets"), "do not fit its shape");
  expect_user_error(load("absent"), "cannot open");
}

// Each field of a header entry checked for its kind (the JSON library's words were the sentence), and
// a shape counted without overflow: [2^32, 2^32] was 2^64 values, wrapped to none and accepted.
TEST_F(TempDir, SafetensorsHeadersThatLieAreSaidInOurWords) {
  const auto entry = [&](const std::string& name, const std::string& fields) {
    write(name, safetensors_bytes("{\"w\":" + fields + "}", std::string(64, '\0')));
    return [this, name] { SafetensorsFile f(path(name)); };
  };
  expect_user_error(
      entry("wrap", R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]})"),
      "tensor 'w' in '" + path("wrap") + "' has shape [4294967296,4294967296], more values than any file");
  expect_user_error(entry("huge", R"({"dtype":"F32","shape":[9223372036854775807,3],"data_offsets":[0,64]})"),
                    "more values than any file holds");
  expect_user_error(entry("dtype", R"({"dtype":5,"shape":[2],"data_offsets":[0,8]})"),
                    "entry for tensor 'w': its \"dtype\" is missing or not text");
  expect_user_error(entry("shape", R"({"dtype":"F32","shape":[-1],"data_offsets":[0,8]})"),
                    "its \"shape\" holds something other than a whole number");
  expect_user_error(entry("past", R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]})"),
                    "its \"shape\" holds something other than a whole number");
  expect_user_error(entry("offsets", R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"),
                    "its \"data_offsets\" is missing or not two numbers");
  expect_user_error(entry("negative", R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
                    "its \"data_offsets\" are not whole numbers");
  expect_user_error(entry("number", "5"), "entry for tensor 'w': not a JSON object");
  write("text", safetensors_bytes("{\"w\": nope}", ""));
  expect_user_error([&] { SafetensorsFile f(path("text")); }, "its 11 bytes are not JSON (the fault at byte 8)");
}

TEST_F(TempDir, Bf16WeightsAreRead) {
  // 1.5 in bf16 is 0x3FC0; -2 is 0xC000.
  std::string data = {'\xC0', '\x3F', '\x00', '\xC0'};
  write("bf", safetensors_bytes(R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", data));
  SafetensorsFile f(path("bf"));
  auto v = f.read(f.entries()[0]);
  EXPECT_EQ(v, (std::vector<double>{1.5, -2.0}));
}

std::string npy(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

TEST_F(TempDir, TokenFilesOfEveryFormat) {
  std::string u16 = {1, 0, 2, 0, 3, 0, 4, 0};
  write("t.bin", u16);
  write("t16.npy", npy("<u2", "(4,)", u16));
  std::string i32 = {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0};
  write("t32.npy", npy("<i4", "(4,)", i32));
  std::string i64;
  for (char c : {1, 2, 3, 4}) i64 += std::string{c, 0, 0, 0, 0, 0, 0, 0};
  write("t64.npy", npy("<i8", "(4,)", i64));
  for (const char* name : {"t.bin", "t16.npy", "t32.npy", "t64.npy"}) {
    TokenData d(path(name));
    ASSERT_EQ(d.size(), 4) << name;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(d.at(i), i + 1) << name;
    EXPECT_NO_THROW(d.check_vocabulary(5));
    expect_user_error([&] { d.check_vocabulary(4); }, "token id 4 at position 3");
  }
}

TEST_F(TempDir, MalformedTokenFilesAreRefused) {
  write("odd.bin", "abc");
  expect_user_error([&] { TokenData d(path("odd.bin")); }, "odd number of bytes");
  write("empty.bin", "");
  expect_user_error([&] { TokenData d(path("empty.bin")); }, "empty");
  write("f.npy", npy("<f4", "(1,)", "abcd"));
  expect_user_error([&] { TokenData d(path("f.npy")); }, "holds dtype '<f4'");
  write("2d.npy", npy("<u2", "(2, 2)", "abcdefgh"));
  expect_user_error([&] { TokenData d(path("2d.npy")); }, "one-dimensional");
  write("short.npy", npy("<u2", "(100,)", "ab"));
  expect_user_error([&] { TokenData d(path("short.npy")); }, "truncated");
}

TEST_F(TempDir, SequentialBatchesReadConsecutiveWindows) {
  std::string bytes;
  for (int i = 0; i < 50; ++i) bytes += std::string{static_cast<char>(i), 0};
  write("seq.bin", bytes);
  TokenData d(path("seq.bin"));
  BatchSampler s(d, 2, 4, true, 0);
  std::vector<std::int32_t> x(8), y(8);
  s.next(x.data(), y.data());
  EXPECT_EQ(x, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(y, (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  s.next(x.data(), y.data());  // step 1: rows start at (1·2+0)·4 = 8 and 12
  EXPECT_EQ(x[0], 8);
  EXPECT_EQ(x[4], 12);
  for (int i = 0; i < 5; ++i) s.next(x.data(), y.data());  // step 6: windows wrap after ⌊49/4⌋ = 12
  EXPECT_EQ(x[0], 0);
  BatchSampler r(d, 3, 4, false, 1);
  std::vector<std::int32_t> rx(12), ry(12);
  for (int k = 0; k < 20; ++k) {
    r.next(rx.data(), ry.data());
    for (int i = 0; i < 12; ++i) EXPECT_EQ(ry[i], rx[i] + 1);
    for (int b = 0; b < 3; ++b) EXPECT_LE(rx[b * 4 + 3], 48);  // the last target (≤ 49) stays inside the file
  }
  expect_user_error([&] { BatchSampler too_long(d, 1, 50, true, 0); }, "fewer than one window");
}

}  // namespace
}  // namespace lmscope::test
