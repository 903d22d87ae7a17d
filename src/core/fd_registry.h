#pragma once

namespace stoker {

/// Descriptors stoker holds (batch segments, sockets, its threads'
/// /proc files), for a forked child to close: a zygote must not keep another
/// loader's descriptors open, nor hand them to every worker it forks.
/// Lock-free and async-signal-safe to read, so a child forked while another
/// thread registers still reads a consistent table.
void RegisterFd(int fd);
/// Before the descriptor is closed: its number may be reused by then.
void UnregisterFd(int fd);
/// In a freshly forked child: closes every registered descriptor except `keep`.
void CloseRegisteredFds(int keep);

}  // namespace stoker
