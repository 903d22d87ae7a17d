#pragma once

// One message of the worker protocol (worker_protocol.h) on a SOCK_SEQPACKET
// socket, sent and received: the parent's side (process_workers.cc) and the
// fake zygote of its test speak through these two functions.

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/unique_fd.h"
#include "stoker/status.h"
#include "worker_protocol.h"

namespace stoker::python {

/// A message as worker_protocol.h lays it out: one send is one message.
struct Message {
  protocol::Tag::Index tag = protocol::Tag::kCount;
  std::vector<int64_t> words;  // as many as the tag has
  std::string text;            // the messages that carry text
  UniqueFd fd;                 // received with it: closed with the message unless taken
};

/// Sends `tag` with `words` (in the order of the tag's list, indexed by its
/// enum), then `text`, and, when `fd` >= 0, a copy of `fd`. REQUIRES: the
/// tag carries words, as many as given, and text if any is given. Blocks
/// until the socket takes it.
Status SendMessage(int sock, protocol::Tag::Index tag, std::span<const int64_t> words, int fd = -1,
                   std::string_view text = {});
/// Blocks for the next message. kCancelled on end of file (the other side is
/// gone); kInternal for a tag the protocol does not have or a message short
/// of its words.
Result<Message> ReceiveMessage(int sock);
/// ReceiveMessage, waiting at most `limit` (kUnavailable after it) and
/// checking `cancelled` every 100 ms (kCancelled once it says true).
Result<Message> ReceiveMessageWithin(int sock, std::chrono::milliseconds limit,
                                     const std::function<bool()>& cancelled);

}  // namespace stoker::python
