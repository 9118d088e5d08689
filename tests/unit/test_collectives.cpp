// The Gloo communicator between three ranks (threads of this process, each with its own CPU backend,
// meeting in a file store): every collective's values, f32 and f64, sizes that do not divide evenly
// anywhere, collectives started before earlier ones are waited for, and the data-parallel buckets.
#include "lmscope/backend/backend.h"
#include "lmscope/parallel/communicator.h"
#include "lmscope/parallel/data_parallel.h"
#include "lmscope/parallel/nccl_version.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <thread>

namespace lmscope::parallel {
namespace {

#if LMSCOPE_HAVE_GLOO  // (a build without Gloo, the GPU machine's, has no CPU ranks)
// Runs body(rank, backend, communicator) on `size` ranks at once; every rank's failure is reported.
void on_ranks(int size, const std::function<void(int, Backend&, Communicator&)>& body) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("lmscope-collectives-" + std::to_string(getpid()) + "-" +
                                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::vector<std::string> failures(static_cast<std::size_t>(size));
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r)
    ranks.emplace_back([&, r] {
      try {
        World w;
        w.rank = w.local_rank = r;
        w.size = size;
        w.rendezvous = "file:" + dir.string();
        w.timeout = std::chrono::seconds(60);
        std::unique_ptr<Backend> backend = make_cpu_backend();
        std::unique_ptr<Store> store = open_store(w);
        std::unique_ptr<Communicator> comm = make_communicator(*backend, w, *store);
        body(r, *backend, *comm);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < size; ++r) EXPECT_EQ(failures[static_cast<std::size_t>(r)], "") << "rank " << r;
}

Allocation filled(Backend& be, DType dtype, std::int64_t n, const std::function<double(std::int64_t)>& value) {
  Allocation t = be.allocator().allocate({n}, dtype, {MemKind::workspace, "test", -1});
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(i);
  upload(be, t, v);
  return t;
}

void expect_values(Backend& be, const Tensor& t, const std::function<double(std::int64_t)>& want, const char* what,
                   int rank) {
  const std::vector<double> got = download(be, t);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    ASSERT_EQ(got[static_cast<std::size_t>(i)], want(i)) << what << ", rank " << rank << ", element " << i;
}

constexpr int kRanks = 3;

TEST(GlooCollectives, EveryOpGivesItsValues) {
  on_ranks(kRanks, [](int rank, Backend& be, Communicator& comm) {
    EXPECT_EQ(comm.name(), "gloo");
    EXPECT_EQ(name_and_version(comm), "gloo");  // Gloo tells no version at run time
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), kRanks);
    for (DType dtype : {DType::f32, DType::f64}) {
      // all-reduce: the sum of every rank's values (small whole numbers: exact in any order)
      Allocation a = filled(be, dtype, 7, [&](std::int64_t i) { return rank * 10 + i; });
      comm.all_reduce(a);
      expect_values(
          be, a, [](std::int64_t i) { return 30 + 3 * i; }, "all-reduce", rank);
      // all-reduce of several tensors in one call (a bucket's gradients where they lie)
      Allocation g1 = filled(be, dtype, 5, [&](std::int64_t i) { return rank + i; });
      Allocation g2 = filled(be, dtype, 9, [&](std::int64_t i) { return rank * i; });
      const Tensor group[] = {g1.tensor(), g2.tensor()};
      comm.all_reduce_async(group)->wait();
      expect_values(
          be, g1, [](std::int64_t i) { return 3.0 + 3 * i; }, "all-reduce of a group, first", rank);
      expect_values(
          be, g2, [](std::int64_t i) { return 3.0 * i; }, "all-reduce of a group, second", rank);
      // reduce-scatter: rank r gets the sum of every rank's part r (5 values each)
      Allocation in = filled(be, dtype, 5 * kRanks, [&](std::int64_t i) { return (rank + 1) * (i + 1); });
      Allocation out = filled(be, dtype, 5, [](std::int64_t) { return -1; });
      comm.reduce_scatter(in, out);
      expect_values(
          be, out, [&](std::int64_t j) { return 6.0 * static_cast<double>(rank * 5 + j + 1); }, "reduce-scatter", rank);
      // all-gather: every rank's 4 values in rank order, from this rank's own part in place too
      Allocation mine = filled(be, dtype, 4, [&](std::int64_t j) { return rank * 100 + j; });
      Allocation all = filled(be, dtype, 4 * kRanks, [](std::int64_t) { return -1; });
      comm.all_gather(mine, all);
      expect_values(
          be, all, [](std::int64_t i) { return static_cast<double>((i / 4) * 100 + i % 4); }, "all-gather", rank);
      Allocation whole = filled(be, dtype, 4 * kRanks, [&](std::int64_t i) { return i / 4 == rank ? i : -1; });
      comm.all_gather(whole.tensor().rows(rank * 4, 4), whole);
      expect_values(
          be, whole, [](std::int64_t i) { return static_cast<double>(i); }, "all-gather in place", rank);
      // broadcast from the last rank
      Allocation b = filled(be, dtype, 3, [&](std::int64_t i) { return rank == kRanks - 1 ? 7 + i : 0; });
      comm.broadcast(b, kRanks - 1);
      expect_values(
          be, b, [](std::int64_t i) { return static_cast<double>(7 + i); }, "broadcast", rank);
    }
    comm.barrier();
  });
}

TEST(GlooCollectives, CollectivesRunInTheOrderStartedWhateverTheOrderOfWaits) {
  on_ranks(kRanks, [](int rank, Backend& be, Communicator& comm) {
    std::vector<Allocation> t;
    std::vector<std::unique_ptr<CollectiveWork>> work;
    for (int k = 0; k < 6; ++k) {
      t.push_back(filled(be, DType::f32, 1000 + k, [&](std::int64_t i) { return rank + k + i % 3; }));
      work.push_back(comm.all_reduce_async(t.back()));
    }
    for (int k = 5; k >= 0; --k) work[static_cast<std::size_t>(k)]->wait();
    for (int k = 0; k < 6; ++k)
      expect_values(
          be, t[static_cast<std::size_t>(k)], [&](std::int64_t i) { return 3.0 * (1 + k + i % 3); }, "async all-reduce",
          rank);
  });
}
#endif

TEST(DataParallel, BucketsFollowTheBackwardsOrderAndTheirSize) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::vector<Parameter> params(5);
  const std::int64_t sizes[5] = {100, 300, 50, 200, 100};  // f32: 400, 1200, 200, 800, 400 bytes
  for (int i = 0; i < 5; ++i)
    params[static_cast<std::size_t>(i)].value =
        be->allocator().allocate({sizes[i]}, DType::f32, {MemKind::parameter, "p", -1});
  auto indices = [](const std::vector<Bucket>& b) {
    std::vector<std::vector<std::size_t>> out;
    for (const Bucket& x : b) out.push_back(x.params);
    return out;
  };
  using V = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(indices(make_buckets(params, 1000)), (V{{4}, {3, 2}, {1}, {0}}));  // 1200 alone: it is larger
  EXPECT_EQ(indices(make_buckets(params, 1200)), (V{{4, 3}, {2}, {1}, {0}}));
  EXPECT_EQ(indices(make_buckets(params, 1600)), (V{{4, 3, 2}, {1, 0}}));
  EXPECT_EQ(indices(make_buckets(params, 0)), (V{{4}, {3}, {2}, {1}, {0}}));
  EXPECT_EQ(make_buckets(params, 1600)[0].elements, 350);
}

// The NCCL a run loaded decides whether gradients go into symmetric windows: 2.28.3 summed a bucket's
// grouped all-reduces there wrongly, 2.28.9 right (docs/distributed.md).
TEST(NcclVersion, SymmetricWindowsFromTheVersionThatSummedRight) {
  EXPECT_EQ(nccl_version_text(22803), "2.28.3");
  EXPECT_EQ(nccl_version_text(23001), "2.30.1");
  EXPECT_FALSE(symmetric_windows_trusted(22703));
  EXPECT_FALSE(symmetric_windows_trusted(22803));
  EXPECT_TRUE(symmetric_windows_trusted(22809));
  EXPECT_TRUE(symmetric_windows_trusted(23001));
}

}  // namespace
}  // namespace lmscope::parallel
