// The key-value store ranks meet in before any collective (their addresses, NCCL's unique id):
// Gloo's store interface, gloo::rendezvous::Store, where Gloo is installed. A build without Gloo (the
// GPU machine has no Debian packages) declares the same interface here, so the TCP store and NCCL's
// rendezvous build on both.
#pragma once

#include "lmscope/parallel/world.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#if LMSCOPE_HAVE_GLOO
#include <gloo/rendezvous/store.h>
namespace lmscope::parallel {
using Store = gloo::rendezvous::Store;
}
#else
namespace lmscope::parallel {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace lmscope::parallel
#endif

namespace lmscope::parallel {

// The store of world.rendezvous: Gloo's FileStore in DIR for file:DIR (Unsupported in a build
// without Gloo), a TcpStore for tcp:HOST:PORT (rank 0 serves it, every rank connects). Keys go under
// world.run_id when it is set; get and wait give up after world.timeout with an error naming the key
// and the rendezvous. A world of one without a rendezvous gets a store in this process's memory.
std::unique_ptr<Store> open_store(const World& world);

// This process's store of `world` (opened the first time it is asked for and kept until the process
// ends, so rank 0's TCP store serves every communicator the process makes, never a second server on
// the same port while the first still answers), with every key under the next group's prefix
// ("group0.", "group1.", ..., counted per store): every rank makes its communicators in the same
// order (a bench sweep's cells, one each) from one thread, so each rank's n-th meets the others' n-th
// and the keys of one never answer another's.
std::unique_ptr<Store> next_group_store(const World& world);

}  // namespace lmscope::parallel
