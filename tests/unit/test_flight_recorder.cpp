// The flight record a rank writes when a collective goes wrong, and what lmscope launch reads from
// the ranks' records side by side.
#include "lmscope/core/error.h"
#include "lmscope/parallel/flight_recorder.h"
#include "lmscope/parallel/test_fault.h"
#include "lmscope/parallel/world.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace lmscope::parallel {
namespace {

class FlightRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("lmscope-flight-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    ::setenv("LMSCOPE_FLIGHT_RECORD_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("LMSCOPE_FLIGHT_RECORD_DIR");
    std::filesystem::remove_all(dir_);
  }
  static World world(int rank, int size) {
    World w;
    w.rank = rank, w.size = size;
    return w;
  }
  std::filesystem::path dir_;
};

TEST_F(FlightRecorderTest, KeepsTheLastCollectivesInOrderWithTheirStateAndStep) {
  FlightRecorder rec(world(0, 2), "gloo", 3);
  rec.begin_step(1);
  const auto a = rec.enter("broadcast", 64, 1);
  rec.ended(a, true);
  rec.begin_step(2);
  const auto b = rec.enter("all-reduce", 400, 2);
  rec.started(b);
  rec.ended(b, false);
  rec.ended(b, true);  // the first to say how it ended is right
  const auto c = rec.enter("all-gather", 8, 1);
  const auto d = rec.enter("barrier", 0, 0);
  const auto kept = rec.records();
  ASSERT_EQ(kept.size(), 3u);  // a fell out
  EXPECT_EQ(kept[0].seq, b);
  EXPECT_EQ(kept[0].state, CollectiveRecord::State::failed);
  EXPECT_EQ(kept[0].step, 2);
  EXPECT_EQ(kept[0].bytes, 400);
  EXPECT_GT(kept[0].started_us, 0);
  EXPECT_EQ(kept[1].seq, c);
  EXPECT_EQ(kept[2].seq, d);
  EXPECT_EQ(kept[2].state, CollectiveRecord::State::queued);
  EXPECT_EQ(rec.record(a).seq, 0u);  // no longer held
}

TEST_F(FlightRecorderTest, WritesItsRecordOnceUnderTheDirectoryGiven) {
  FlightRecorder rec(world(1, 2), "nccl");
  rec.enter("all-reduce", 4, 1);
  const std::string path = rec.write("timeout");
  EXPECT_EQ(path, (dir_ / "rank-1.json").string());
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["reason"], "timeout");
  EXPECT_EQ(j["backend"], "nccl");
  ASSERT_EQ(j["collectives"].size(), 1u);
  EXPECT_EQ(j["collectives"][0]["kind"], "all-reduce");
  EXPECT_EQ(j["collectives"][0]["state"], "queued");
  rec.enter("all-reduce", 4, 1);
  EXPECT_EQ(rec.write("signal 15"), path);  // written already: not again
  std::ifstream again(path);
  EXPECT_EQ(nlohmann::json::parse(again)["collectives"].size(), 1u);
}

TEST_F(FlightRecorderTest, ComparisonNamesTheRankThatNeverEnteredTheCollectiveOthersWaitIn) {
  // Ranks 0 and 2 called three collectives; rank 1 stopped after two; rank 3 left nothing.
  for (int r : {0, 1, 2}) {
    FlightRecorder rec(world(r, 4), "gloo");
    rec.begin_step(5);
    for (int i = 0; i < (r == 1 ? 2 : 3); ++i) {
      const auto seq = rec.enter("all-reduce", 1024, 1);
      if (i < 2) rec.ended(seq, true);
    }
    rec.write("signal 15");
  }
  {  // rank 0's host went on queueing: it called a fourth, which rank 1 never reached either
    FlightRecorder rec(world(0, 4), "gloo");
    rec.begin_step(5);
    for (int i = 0; i < 4; ++i) {
      const auto seq = rec.enter("all-reduce", 1024, 1);
      if (i < 2) rec.ended(seq, true);
    }
    std::filesystem::remove(rec.path());
    rec.write("timeout");
  }
  const auto said = compare_flight_records(dir_.string(), 4);
  ASSERT_EQ(said.size(), 2u) << ::testing::PrintToString(said);
  EXPECT_EQ(said[0],
            "rank 1 never entered all-reduce #3 (1.00 KiB, step 5), in which ranks 0 and 2 waited; its last "
            "collective was all-reduce #2 (1.00 KiB, step 5), completed");
  EXPECT_EQ(said[1], "rank 3 left no record (killed, or ended before a collective went wrong)");
}

TEST_F(FlightRecorderTest, ComparisonSaysWhoWaitedAndWhoSawItFailAndCollectivesCalledOutOfOrder) {
  for (int r : {0, 1}) {
    FlightRecorder rec(world(r, 2), "nccl");
    rec.ended(rec.enter(r == 0 ? "broadcast" : "all-reduce", 16, 1), true);
    const auto seq = rec.enter("all-reduce", 16, 1);
    if (r == 1) rec.ended(seq, false);
    rec.write("timeout");
  }
  const auto said = compare_flight_records(dir_.string(), 2);
  ASSERT_EQ(said.size(), 3u) << ::testing::PrintToString(said);
  EXPECT_EQ(said[0], "rank 1 saw all-reduce #2 (16 B, step 0) fail");
  EXPECT_TRUE(said[1].starts_with("still waiting in all-reduce #2 (16 B, step 0): rank 0 for ")) << said[1];
  EXPECT_EQ(said[2],
            "ranks 0 and 1 called different collectives as #1: broadcast #1 (16 B, step 0) and all-reduce #1 (16 B, "
            "step 0)");
  EXPECT_TRUE(compare_flight_records((dir_ / "none").string(), 2).empty());
}

TEST_F(FlightRecorderTest, ComparisonPassesOverDamagedRecordsWithoutThrowing) {
  for (int r : {0, 1}) {
    FlightRecorder rec(world(r, 2), "gloo");
    rec.ended(rec.enter("all-reduce", 16, 1), true);
    rec.enter("all-reduce", 16, 1);
    rec.write("timeout");
  }
  // Rank 1's file rewritten with fields of other kinds: its collectives are passed over, not read.
  std::ifstream in(dir_ / "rank-1.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["reason"] = 5;
  j["collectives"][0]["kind"] = 7;
  j["collectives"][1]["bytes"] = "many";
  j["collectives"].push_back({{"seq", 3}, {"state", nullptr}});
  std::ofstream(dir_ / "rank-1.json") << j.dump();
  std::vector<std::string> said;
  ASSERT_NO_THROW(said = compare_flight_records(dir_.string(), 2));
  EXPECT_FALSE(said.empty());
  for (const std::string& line : said) EXPECT_EQ(line.find("many"), std::string::npos) << line;
}

TEST(TestFault, IsReadStrictlyAndOnlyForItsRankOnTheFirstStart) {
  ::setenv("LMSCOPE_TEST_FAULT", "1:3:hang:2", 1);
  EXPECT_NO_THROW(TestFault::from_environment(0));
  EXPECT_NO_THROW(TestFault::from_environment(1));
  for (const char* bad : {"1:3:sleep", "1:3:hang:", "1:3", "1:-1:exit", "x", "1:3:exit:2:4"}) {
    ::setenv("LMSCOPE_TEST_FAULT", bad, 1);
    EXPECT_THROW(TestFault::from_environment(0), UserError) << bad;
  }
  ::setenv("LMSCOPE_RESTART_COUNT", "1", 1);  // a restart runs without it, even a malformed one
  EXPECT_NO_THROW(TestFault::from_environment(0));
  ::unsetenv("LMSCOPE_RESTART_COUNT");
  ::unsetenv("LMSCOPE_TEST_FAULT");
}

}  // namespace
}  // namespace lmscope::parallel
