// How a cell's mode reads: bench's label and the report's reading of a result file word it alike.
#include "lmscope/report/result_files.h"
#include "lmscope/run/mode_words.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace lmscope {
namespace {

TEST(ModeWords, DefaultsSayOnlyTheMode) { EXPECT_EQ(mode_words({.mode = "train"}), "train"); }

TEST(ModeWords, EverySettingOffItsDefaultInOrder) {
  EXPECT_EQ(mode_words({.mode = "train",
                        .recompute = "selective",
                        .grad_accum = 4,
                        .weight_copies = "resident",
                        .grad_dtype = "bf16",
                        .graphs_off_on_cuda = true,
                        .fusion = false}),
            "train, selective recompute, 4 micro-batches, resident copies, bf16 gradients, graphs off, fusion off");
}

// A result file's rows as the report reads them: micro-batches only where a backward splits them
// (bench writes --grad-accum into every row), graphs off only for CUDA.
TEST(ModeWords, TheReportWordsResultRowsAsBenchDoes) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("lmscope-mode-words-" + std::to_string(::getpid()) + ".json"))
          .string();
  {
    std::ofstream f(path);
    f << R"([
 {"model": {"name": "small"}, "ctx": 128, "batch": 4, "mode": "train", "status": "ok", "steps": 1,
  "device": "cuda", "grad_accum": 2, "graphs": false, "weight_copies": "transient"},
 {"model": {"name": "small"}, "ctx": 128, "batch": 4, "mode": "forward", "status": "ok", "steps": 1,
  "device": "cpu", "grad_accum": 2, "graphs": false, "fusion": false}
])";
  }
  const std::vector<report::BenchRow> rows = report::read_bench_file(path);
  std::filesystem::remove(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].mode, "train, 2 micro-batches, transient copies, graphs off");
  EXPECT_EQ(rows[1].mode, "forward, fusion off");
}

}  // namespace
}  // namespace lmscope
