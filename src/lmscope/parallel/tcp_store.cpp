// The TCP store's server and client. A request is one byte of operation (S set, G get, W wait, C
// check), a u64 timeout in milliseconds, a u32 count and that many blobs (u32 length, bytes), all
// little-endian; the answer is a status byte (0 done, 1 timed out or missing) and blobs: the value
// for G, the keys still missing when a G, W or C fails. The server waits for keys itself (one thread
// per client, a condition variable), so a waiting rank sends nothing until it is answered.
#include "lmscope/parallel/tcp_store.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

namespace lmscope::parallel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kMaxBlob = 64u << 20, kMaxBlobs = 1u << 20;  // a rendezvous key is far smaller

void put(std::vector<char>& b, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}
void put_blob(std::vector<char>& b, const std::string& s) {
  put(b, s.size(), 4);
  b.insert(b.end(), s.begin(), s.end());
}
std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool send_all(int fd, const std::vector<char>& b) {
  for (std::size_t done = 0; done < b.size();) {
    const ssize_t n = ::send(fd, b.data() + done, b.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Reads exactly n bytes; false at end of stream, on an error or (with a deadline) when it passes.
bool recv_all(int fd, char* p, std::size_t n, const Clock::time_point* deadline = nullptr) {
  for (std::size_t done = 0; done < n;) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      pollfd pfd{fd, POLLIN, 0};
      if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) == 0) return false;
    }
    const ssize_t got = ::recv(fd, p + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<std::size_t>(got);
  }
  return true;
}

// A message after its first `head` bytes: a count and that many blobs.
bool recv_message(int fd, char* head, std::size_t head_bytes, std::vector<std::string>& blobs,
                  const Clock::time_point* deadline = nullptr) {
  char count[4], len[4];
  if (!recv_all(fd, head, head_bytes, deadline) || !recv_all(fd, count, 4, deadline)) return false;
  const std::uint64_t n = get_le(count, 4);
  if (n > kMaxBlobs) return false;
  blobs.assign(n, {});
  for (std::string& s : blobs) {
    if (!recv_all(fd, len, 4, deadline) || get_le(len, 4) > kMaxBlob) return false;
    s.resize(get_le(len, 4));
    if (!recv_all(fd, s.data(), s.size(), deadline)) return false;
  }
  return true;
}

std::string seconds(std::chrono::milliseconds t) { return fmt::format("{:g} s", t.count() / 1000.0); }

}  // namespace

class TcpStore::Server {
 public:
  Server(const std::string& where, int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);  // MASTER_ADDR names this host as the others reach it
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    if (fd_ < 0 || ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 1024) != 0) {
      const int err = errno;
      if (fd_ >= 0) ::close(fd_);
      throw RankFailure(fmt::format("cannot listen on {} for the rendezvous: {}", where, std::strerror(err)));
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    {
      std::lock_guard lock(mutex_);
      for (int c : clients_) ::shutdown(c, SHUT_RDWR);  // wakes each client thread's recv()
    }
    changed_.notify_all();  // and its waits
    for (std::thread& t : threads_) t.join();
    for (int c : clients_) ::close(c);
    ::close(fd_);
  }

 private:
  void accept_loop() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      std::lock_guard lock(mutex_);
      if (stopping_) {
        if (c >= 0) ::close(c);
        return;
      }
      if (c < 0) continue;  // a client that gave up before we took it; EINTR
      clients_.push_back(c);
      threads_.emplace_back([this, c] { serve(c); });
    }
  }

  void serve(int c) {
    char head[9];
    std::vector<std::string> blobs;
    while (recv_message(c, head, sizeof head, blobs)) {
      const char op = head[0];
      const auto deadline = Clock::now() + std::chrono::milliseconds(get_le(head + 1, 8));
      std::vector<char> answer{0};
      std::vector<std::string> missing, out;
      {
        std::unique_lock lock(mutex_);
        if (op == 'S' && blobs.size() == 2) {
          data_[blobs[0]].assign(blobs[1].begin(), blobs[1].end());
          changed_.notify_all();
        } else if (op == 'G' || op == 'W' || op == 'C') {
          auto all_there = [&] {
            missing.clear();
            for (const std::string& k : blobs)
              if (!data_.count(k)) missing.push_back(k);
            return missing.empty() || stopping_;
          };
          if (op != 'C') changed_.wait_until(lock, deadline, all_there);
          if (!all_there() || stopping_) {
            answer[0] = 1;
            out = missing;
          } else if (op == 'G' && blobs.size() == 1) {
            const std::vector<char>& v = data_[blobs[0]];
            out.emplace_back(v.begin(), v.end());
          }
        } else {
          return;  // not our protocol: drop the connection
        }
      }
      put(answer, out.size(), 4);
      for (const std::string& s : out) put_blob(answer, s);
      if (!send_all(c, answer)) return;
    }
  }

  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  std::thread acceptor_;
};

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
                   const std::string& prefix)
    : where_(fmt::format("{}:{}", host, port)), prefix_(prefix), timeout_(timeout) {
  if (serve) server_ = std::make_unique<Server>(where_, port);
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = Clock::now() + timeout;
  std::string why;
  // The server may not be up yet: try every address of HOST until the timeout.
  for (;;) {
    if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
      why = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
        fd_ = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd_ >= 0 && ::connect(fd_, a->ai_addr, a->ai_addrlen) != 0) {
          why = std::strerror(errno);
          ::close(fd_);
          fd_ = -1;
        }
      }
      ::freeaddrinfo(found);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      throw RankFailure(fmt::format("cannot reach the rendezvous at {} within {}: {}", where_, seconds(timeout), why));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small requests, answered at once
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::vector<char> TcpStore::request(char op, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                                    const std::vector<char>& value) {
  std::vector<char> msg{op};
  put(msg, static_cast<std::uint64_t>(timeout.count()), 8);
  put(msg, keys.size() + (op == 'S' ? 1 : 0), 4);
  for (const std::string& k : keys) put_blob(msg, prefix_ + k);
  if (op == 'S') put_blob(msg, std::string(value.begin(), value.end()));

  std::lock_guard lock(mutex_);
  // The server answers by the timeout; a little more before deciding it is gone.
  const auto deadline = Clock::now() + timeout + std::chrono::seconds(5);
  char status = 0;
  std::vector<std::string> blobs;
  if (!send_all(fd_, msg) || !recv_message(fd_, &status, 1, blobs, &deadline))
    throw RankFailure(
        fmt::format("lost the rendezvous server at {} while asking for key '{}'", where_, keys.empty() ? "" : keys[0]));
  if (status != 0) {
    if (op == 'C') return {};
    std::string names;
    for (const std::string& k : blobs)
      names += fmt::format("{}'{}'", names.empty() ? "" : ", ", k.substr(std::min(prefix_.size(), k.size())));
    throw RankFailure(fmt::format("waited {} for key{} {} at the rendezvous {} (LMSCOPE_DIST_TIMEOUT sets how long)",
                                  seconds(timeout), blobs.size() == 1 ? "" : "s", names, where_));
  }
  if (op == 'C') return {1};
  return blobs.empty() ? std::vector<char>{} : std::vector<char>(blobs[0].begin(), blobs[0].end());
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) { request('S', {key}, timeout_, data); }
std::vector<char> TcpStore::get(const std::string& key) { return request('G', {key}, timeout_); }
void TcpStore::wait(const std::vector<std::string>& keys) { request('W', keys, timeout_); }
void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  request('W', keys, timeout);
}
bool TcpStore::check(const std::vector<std::string>& keys) { return !request('C', keys, timeout_).empty(); }

}  // namespace lmscope::parallel
