// A key-value store over TCP for the rendezvous of tcp:HOST:PORT (torchrun's MASTER_ADDR and
// MASTER_PORT): rank 0 serves it from a background thread, every rank (rank 0 too) is a client. It
// carries a few small keys (addresses, NCCL's unique id), never tensors.
#pragma once

#include "lmscope/parallel/store.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lmscope::parallel {

class TcpStore : public Store {
 public:
  // serve: listen on PORT (every interface) first; throws std::runtime_error "cannot listen on
  // HOST:PORT for the rendezvous: <strerror>" if that fails. Then connects to HOST:PORT, retrying
  // until `timeout` (the server may start later). Keys are stored as prefix + key; `timeout` bounds
  // every get and wait(keys).
  TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
           const std::string& prefix = "");
  ~TcpStore() override;  // stops the server (if any) even with clients still connected

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits until the key exists; std::runtime_error naming the key and HOST:PORT after the timeout.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // Whether every key exists now, without waiting.
  bool check(const std::vector<std::string>& keys);

  class Server;

 private:
  std::vector<char> request(char op, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                            const std::vector<char>& value = {});

  std::string where_, prefix_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
  std::mutex mutex_;  // one request at a time on the connection
};

}  // namespace lmscope::parallel
