#include "worker_message.h"

#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <cstring>

namespace stoker::python {

using protocol::kMessages;
using protocol::Tag;

Status SendMessage(int sock, Tag::Index tag, std::span<const int64_t> words, int fd,
                   std::string_view text) {
  const protocol::MessageKind& kind = kMessages[tag];
  assert(static_cast<int>(words.size()) == kind.words);
  assert(kind.text || text.empty());
  std::string bytes(protocol::kTagBytes, '\0');
  std::memcpy(bytes.data(), kind.tag, std::strlen(kind.tag));
  bytes.append(reinterpret_cast<const char*>(words.data()), words.size_bytes());
  bytes.append(text);
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) {
    if (errno == EINTR) continue;
    return ErrnoError("sending to a worker process", errno);
  }
  return Status::Ok();
}

Result<Message> ReceiveMessage(int sock) {
  std::array<char, protocol::kMaxMessageBytes> buffer;
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0) {
    // A process that died with our last message unread resets the
    // connection: gone, as one that closed its socket.
    if (errno == ECONNRESET) return Cancelled("the process closed its socket");
    if (errno != EINTR) return ErrnoError("receiving from a worker process", errno);
  }
  if (n == 0) return Cancelled("the process closed its socket");
  Message m;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
      m.fd.reset(fd);
    }
  }
  const auto size = static_cast<size_t>(n);
  const std::string tag(buffer.data(), strnlen(buffer.data(), std::min(size, protocol::kTagBytes)));
  m.tag = Tag::Index{};
  while (m.tag < Tag::kCount && tag != kMessages[m.tag].tag) m.tag = Tag::Index(m.tag + 1);
  if (m.tag == Tag::kCount || size < protocol::kTagBytes) {
    return Internal("a worker process sent an unknown message '" + tag + "'");
  }
  const protocol::MessageKind& kind = kMessages[m.tag];
  const size_t at = protocol::kTagBytes;
  const size_t words = static_cast<size_t>(kind.words) * sizeof(int64_t);
  if (size - at < words) {
    return Internal("a worker process sent a short " + tag + " message");
  }
  m.words.resize(static_cast<size_t>(kind.words));
  std::memcpy(m.words.data(), buffer.data() + at, words);
  if (kind.text) m.text.assign(buffer.data() + at + words, size - at - words);
  return m;
}

Result<Message> ReceiveMessageWithin(int sock, std::chrono::milliseconds limit,
                                     const std::function<bool()>& cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    if (cancelled()) return Cancelled("the loader was closed");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Unavailable("no message from the process within " +
                         std::to_string(limit.count() / 1000) + " s");
    }
    pollfd p{sock, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (n < 0 && errno != EINTR) return ErrnoError("waiting for a worker process", errno);
    if (n > 0) return ReceiveMessage(sock);
  }
}

}  // namespace stoker::python
