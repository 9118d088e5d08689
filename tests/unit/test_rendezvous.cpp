// The rank environment and the rendezvous stores: world_from over torchrun's, Slurm's and no
// variables, each mistake a UserError naming its variable; the TCP store between a server and
// client threads, its timeout and a taken port; the file store keeping two runs' keys apart; ranks
// comparing their runs' descriptions with rank 0's.
#include "lmscope/core/error.h"
#include "lmscope/parallel/run_agreement.h"
#include "lmscope/parallel/store.h"
#include "lmscope/parallel/tcp_store.h"
#include "lmscope/parallel/world.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>
#include <thread>

namespace lmscope::parallel {
namespace {

using namespace std::chrono_literals;
using Env = std::map<std::string, std::string>;

World world(const Env& env, const std::string& flag = "") {
  return world_from(
      [&](const char* name) -> const char* {
        const auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      flag);
}

// The UserError's message, failing the test if there is none.
std::string user_error_of(const Env& env, const std::string& flag = "") {
  try {
    world(env, flag);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& b) { return {b.begin(), b.end()}; }

// A port free now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(World, NoVariablesIsAWorldOfOne) {
  const World w = world({});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.local_rank, 0);
  EXPECT_EQ(w.rendezvous, "");
  EXPECT_EQ(w.timeout, 300s);
  EXPECT_EQ(w.run_id, "");
}

TEST(World, TorchrunVariables) {
  const World w = world({{"RANK", "3"},
                         {"WORLD_SIZE", "4"},
                         {"LOCAL_RANK", "1"},
                         {"MASTER_ADDR", "node7"},
                         {"MASTER_PORT", "29500"},
                         {"LMSCOPE_DIST_TIMEOUT", "20"},
                         {"LMSCOPE_RUN_ID", "launch-1-2"}});
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.rendezvous, "tcp:node7:29500");
  EXPECT_EQ(w.timeout, 20s);
  EXPECT_EQ(w.run_id, "launch-1-2");
  // LOCAL_RANK defaults to RANK; --rendezvous wins over MASTER_ADDR, LMSCOPE_RENDEZVOUS comes between.
  const Env two{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  EXPECT_EQ(world(two).local_rank, 1);
  EXPECT_EQ(world(two, "file:/shared/r").rendezvous, "file:/shared/r");
  Env launched = two;
  launched["LMSCOPE_RENDEZVOUS"] = "file:/tmp/x";
  EXPECT_EQ(world(launched).rendezvous, "file:/tmp/x");
  EXPECT_EQ(world(launched, "tcp:a:5").rendezvous, "tcp:a:5");
}

// torchrun's agent serves its own store on MASTER_PORT: ours takes the next port; its run id names the
// keys of a shared file store.
TEST(World, UnderTorchrunsAgentStore) {
  Env env{{"RANK", "0"},
          {"WORLD_SIZE", "2"},
          {"MASTER_ADDR", "h"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RUN_ID", "abc"}};
  EXPECT_EQ(world(env).rendezvous, "tcp:h:29501");
  EXPECT_EQ(world(env).run_id, "torchrun-abc");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env["TORCHELASTIC_RUN_ID"] = "none";  // torchrun's word for no id
  EXPECT_EQ(world(env).rendezvous, "tcp:h:29500");
  EXPECT_EQ(world(env).run_id, "");
}

TEST(World, SlurmVariables) {
  const World w = world({{"SLURM_PROCID", "5"},
                         {"SLURM_NTASKS", "8"},
                         {"SLURM_LOCALID", "1"},
                         {"SLURM_JOB_ID", "1234"},
                         {"SLURM_STEP_ID", "0"},
                         {"MASTER_ADDR", "n1"},
                         {"MASTER_PORT", "29400"}});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.rendezvous, "tcp:n1:29400");
  EXPECT_EQ(w.run_id, "slurm-1234.0");
  // A file rendezvous instead of MASTER_ADDR; torchrun's variables win over Slurm's.
  EXPECT_EQ(world({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "file:/d").rendezvous, "file:/d");
  EXPECT_EQ(world({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}}).size, 1);
}

TEST(World, EveryMistakeNamesItsVariable) {
  const Env ok{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& name, const std::string& value) {
    Env e = ok;
    e[name] = value;
    return e;
  };
  auto without = [&](const std::string& name) {
    Env e = ok;
    e.erase(name);
    return e;
  };
  struct Case {
    Env env;
    std::string flag, names;
  };
  const std::vector<Case> cases{
      {with("RANK", "one"), "", "RANK"},
      {with("RANK", "2"), "", "RANK"},
      {with("RANK", "-1"), "", "RANK"},
      {with("WORLD_SIZE", "0"), "", "WORLD_SIZE"},
      {with("WORLD_SIZE", "2x"), "", "WORLD_SIZE"},
      {with("LOCAL_RANK", "9"), "", "LOCAL_RANK"},
      {without("WORLD_SIZE"), "", "WORLD_SIZE"},
      {without("RANK"), "", "RANK"},
      {without("MASTER_ADDR"), "", "MASTER_ADDR"},
      {without("MASTER_PORT"), "", "MASTER_PORT"},
      {with("MASTER_PORT", "70000"), "", "MASTER_PORT"},
      {with("MASTER_PORT", "http"), "", "MASTER_PORT"},
      {ok, "nfs:/x", "--rendezvous"},
      {ok, "tcp:host", "--rendezvous"},
      {ok, "file:", "--rendezvous"},
      {with("LMSCOPE_RENDEZVOUS", "/dir"), "", "LMSCOPE_RENDEZVOUS"},
      {with("LMSCOPE_DIST_TIMEOUT", "0"), "", "LMSCOPE_DIST_TIMEOUT"},
      {with("LMSCOPE_DIST_TIMEOUT", "1.5"), "", "LMSCOPE_DIST_TIMEOUT"},
      {with("LMSCOPE_RUN_ID", "a/b"), "", "LMSCOPE_RUN_ID"},
      {{{"SLURM_PROCID", "3"}}, "", "SLURM_NTASKS"},
      {{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "2"}}, "", "SLURM_PROCID"},
  };
  for (const Case& c : cases) {
    const std::string msg = user_error_of(c.env, c.flag);
    EXPECT_NE(msg.find(c.names), std::string::npos) << c.names << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(user_error_of(without("MASTER_ADDR")),
            "RANK is set (1) but MASTER_ADDR is not: set MASTER_ADDR and MASTER_PORT, or give --rendezvous file:DIR");
}

TEST(TcpStore, ServerAndThreeClients) {
  const int port = free_port();
  TcpStore server("127.0.0.1", port, true, 5s, "run.");
  std::vector<std::thread> clients;
  std::vector<std::string> seen(3);
  for (int i = 0; i < 3; ++i)
    clients.emplace_back([&, i] {
      TcpStore s("localhost", port, false, 5s, "run.");
      s.set("addr" + std::to_string(i), bytes("client " + std::to_string(i)));
      s.wait({"addr0", "addr1", "addr2", "go"});  // waits on the others and on the server's key
      seen[i] = text(s.get("addr" + std::to_string((i + 1) % 3))) + "|" + text(s.get("go"));
    });
  server.wait({"addr0", "addr1", "addr2"});
  EXPECT_TRUE(server.check({"addr0", "addr2"}));
  EXPECT_FALSE(server.check({"go"}));
  server.set("go", std::vector<char>{'\0', 'x'});  // values are bytes
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(seen[i], "client " + std::to_string((i + 1) % 3) + "|" + std::string("\0x", 2));
  // A value set again replaces the old one; keys are under their prefix.
  server.set("addr0", bytes("again"));
  EXPECT_EQ(text(server.get("addr0")), "again");
  TcpStore other_run("127.0.0.1", port, false, 1s, "other.");
  EXPECT_FALSE(other_run.check({"addr0"}));
}

TEST(TcpStore, GetTimesOutNamingTheKeyAndAddress) {
  const int port = free_port();
  World w;
  w.rendezvous = "tcp:127.0.0.1:" + std::to_string(port);
  w.timeout = 1s;
  std::unique_ptr<Store> s = open_store(w);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s->get("nccl_id");
    FAIL() << "no timeout";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'nccl_id'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_THROW(s->wait({"a", "b"}, 100ms), std::runtime_error);
}

TEST(TcpStore, ATakenPortIsAddressAlreadyInUse) {
  const int port = free_port();
  TcpStore first("127.0.0.1", port, true, 2s);
  try {
    TcpStore second("127.0.0.1", port, true, 2s);
    FAIL() << "second server started";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("cannot listen on 127.0.0.1:{} for the rendezvous: Address already in use", port));
  }
}

TEST(TcpStore, ServerStopsWithClientsConnectedAndClientsGiveUp) {
  const int port = free_port();
  auto server = std::make_unique<TcpStore>("127.0.0.1", port, true, 5s);
  TcpStore client("127.0.0.1", port, false, 5s);
  std::thread waiter([&] { EXPECT_THROW(client.get("never"), std::runtime_error); });
  std::this_thread::sleep_for(100ms);
  server.reset();  // with the waiter's request pending
  waiter.join();
  // No server at all: the client retries until its timeout.
  EXPECT_THROW(TcpStore("127.0.0.1", port, false, 300ms), std::runtime_error);
}

#if LMSCOPE_HAVE_GLOO
TEST(Rendezvous, FileStoreKeepsTwoRunsApart) {
  const auto dir = std::filesystem::temp_directory_path() / ("lmscope_rdv_" + std::to_string(::getpid())) / "new";
  World a;
  a.rendezvous = "file:" + dir.string();
  a.timeout = 1s;
  a.run_id = "launch-1";
  World b = a;
  b.run_id = "launch-2";
  std::unique_ptr<Store> sa = open_store(a), sb = open_store(b);  // creates the directory
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  sa->set("id", bytes("from a"));
  sb->set("id", bytes("from b"));
  EXPECT_EQ(text(sa->get("id")), "from a");
  EXPECT_EQ(text(sb->get("id")), "from b");
  sa->set("only_a", bytes("1"));
  try {
    sb->get("only_a");
    FAIL() << "run b saw run a's key";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'only_a'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(a.rendezvous), std::string::npos) << msg;
  }
  std::filesystem::remove_all(dir.parent_path());
}
#endif

TEST(Rendezvous, EachRanksNthGroupMeetsTheOthersNth) {
  World w;
  w.rendezvous = fmt::format("tcp:127.0.0.1:{}", free_port());
  w.size = 2;
  w.timeout = 5s;
  w.run_id = "groups";
  // Two ranks as threads of this process, each taking two groups: rank 1 (its store a client) may ask
  // first and waits for rank 0's server, which its own thread opens meanwhile.
  auto rank = [&](int r) {
    World mine = w;
    mine.rank = r;
    std::unique_ptr<Store> g0 = next_group_store(mine), g1 = next_group_store(mine);
    g0->set(fmt::format("rank{}", r), bytes(fmt::format("group 0 of rank {}", r)));
    g1->set(fmt::format("rank{}", r), bytes(fmt::format("group 1 of rank {}", r)));
    const int peer = 1 - r;
    EXPECT_EQ(text(g0->get(fmt::format("rank{}", peer))), fmt::format("group 0 of rank {}", peer));
    EXPECT_EQ(text(g1->get(fmt::format("rank{}", peer))), fmt::format("group 1 of rank {}", peer));
    g1->set(fmt::format("done{}", r), bytes("1"));  // rank 0's server stays up until rank 1 has read
    g1->wait({fmt::format("done{}", peer)});
  };
  std::thread one([&] { rank(1); });
  std::this_thread::sleep_for(50ms);
  rank(0);
  one.join();
  // A third group of rank 0 starts empty: no key of the first two answers it.
  EXPECT_THROW(next_group_store(w)->wait({"rank1"}, 50ms), std::runtime_error);
}

TEST(Rendezvous, AWorldOfOneNeedsNone) {
  World w;
  w.timeout = 1s;
  std::unique_ptr<Store> s = open_store(w);
  s->set("k", bytes("v"));
  EXPECT_EQ(text(s->get("k")), "v");
  EXPECT_THROW(s->wait({"missing"}, 50ms), std::runtime_error);
  w.size = 2;
  EXPECT_THROW(open_store(w), UserError);
}

TEST(RankAgreement, TheFirstDifferenceNamesItsKeyAndBothValues) {
  using J = nlohmann::ordered_json;
  const J a = {{"model", {{"d_model", 64}, {"layers", 2}}}, {"device", "cpu"}, {"sizes", {1, 2}}};
  EXPECT_FALSE(first_difference(a, a));
  J b = a;
  b["model"]["layers"] = 3;
  b["device"] = "cuda";  // after the model: not the first
  auto d = first_difference(a, b);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->path, "model.layers");
  EXPECT_EQ(d->key, "layers");
  EXPECT_EQ(d->a, "2");
  EXPECT_EQ(d->b, "3");
  d = first_difference(a, J{{"model", a["model"]}, {"device", "cuda"}, {"sizes", {1, 2}}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->a, "'cpu'");
  EXPECT_EQ(d->b, "'cuda'");
  // A list of values is one value; a list of objects goes entry by entry, or by its length.
  d = first_difference(a, J{{"model", a["model"]}, {"device", "cpu"}, {"sizes", {1, 2, 3}}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->path, "sizes");
  EXPECT_EQ(d->b, "[1,2,3]");
  const J cells = {{"cells", {{{"batch", 2}}, {{"batch", 4}}}}};
  d = first_difference(cells, J{{"cells", {{{"batch", 2}}, {{"batch", 8}}}}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->path, "cells[1].batch");
  d = first_difference(cells, J{{"cells", {{{"batch", 2}}}}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->path, "cells");
  EXPECT_EQ(d->a, "2");
  EXPECT_EQ(d->b, "1");
  d = first_difference(J{{"x", 1}}, J{{"x", 1}, {"y", 2}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->path, "y");
  EXPECT_EQ(d->a, "absent");
}

TEST(RankAgreement, EveryRankLearnsTheFirstThatDiffersFromRank0) {
  // Three ranks as threads: ranks 0 and 1 alike, rank 2 not; then all alike (a second world, whose
  // store is its own).
  for (const bool alike : {false, true}) {
    World w;
    w.rendezvous = fmt::format("tcp:127.0.0.1:{}", free_port());
    w.size = 3;
    w.timeout = 5s;
    w.run_id = alike ? "alike" : "unlike";
    std::optional<RankDisagreement> seen[3];
    auto rank = [&](int r) {
      World mine = w;
      mine.rank = r;
      const nlohmann::ordered_json run = {{"batch", r == 2 && !alike ? 8 : 4}, {"seed", 0}};
      seen[r] = compare_with_rank0(mine, run);
    };
    std::thread one([&] { rank(1); }), two([&] { rank(2); });
    rank(0);
    one.join();
    two.join();
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE(r);
      ASSERT_EQ(seen[r].has_value(), !alike);
      if (alike) continue;
      EXPECT_EQ(seen[r]->rank, 2);
      EXPECT_EQ(seen[r]->rank0.at("batch"), 4);
      EXPECT_EQ(seen[r]->theirs.at("batch"), 8);
    }
  }
}

}  // namespace
}  // namespace lmscope::parallel
