#pragma once

// What crosses the process boundary between stoker.DataLoader's parent
// (process_workers.cc) and its zygote and worker processes (_workers.py):
// message tags and their words, the segment header, and the descriptors the
// engine carries. Each list below is the one definition; C++ reads it through
// the enums, Python through `_stoker.protocol` (BindWorkerProtocol), by name.
// Renaming or moving a field here is the only edit a change needs.
//
// Each message is one SOCK_SEQPACKET datagram: an 8-byte tag (NUL-padded),
// then native int64 words in the order listed, then UTF-8 text for the
// messages marked with text (SAMPFAIL's, TASKFAIL's and INITFAIL's end in
// bytes: the pickled exception). A file descriptor may ride along (SCM_RIGHTS).

#include <array>
#include <cstddef>
#include <cstdint>

namespace stoker::python::protocol {

inline constexpr size_t kTagBytes = 8;
/// The longest message the parent reads whole; a longer one is cut there.
inline constexpr size_t kMaxMessageBytes = size_t{1} << 16;

// X(CppName, python_name): the words of each message, in order. The lists
// are tables, one field a line.
// clang-format off

// parent -> zygote: fork a worker with this torch worker id, of this many.
#define STOKER_FORK_WORDS(X) \
  X(WorkerId, worker_id)     \
  X(NumWorkers, num_workers)
// parent -> worker, before its first task: the base seed torch's iterator
// drew for the epoch it serves (get_worker_info().seed is it plus the id);
// it runs worker_init_fn under it, then answers INITDONE or INITFAIL. A
// worker starts before iter() draws that seed, so it cannot come with FORK.
#define STOKER_INIT_WORDS(X) \
  X(BaseSeed, base_seed)
// zygote -> parent: the worker's pid; its socket rides along.
#define STOKER_FORKED_WORDS(X) \
  X(Pid, pid)
// parent -> zygote: collect this worker.
#define STOKER_REAP_WORDS(X) \
  X(Pid, pid)
// zygote -> parent: how it ended (signalled: 0 exit code, 1 signal number).
#define STOKER_REAPED_WORDS(X) \
  X(Signalled, signalled)      \
  X(Value, value)
// parent -> worker: run a batch; the segment's fd rides along the first
// time this worker sees the segment. num_workers: how many run now;
// memory_limit: the unique memory the worker may reach before a sample
// (its share of the memory budget; 0: none), past which it sends OVER.
#define STOKER_TASK_WORDS(X)   \
  X(Epoch, epoch)              \
  X(Batch, batch)              \
  X(Segment, segment)          \
  X(SegmentSize, segment_size) \
  X(NumWorkers, num_workers)   \
  X(MemoryLimit, memory_limit)
// worker -> parent, before DONE, for each sample whose __getitem__ raised:
// its index, whether it is not the sample's fault (memory, a store gone),
// and text: the exception and the worker's traceback; then, exception_bytes
// long (0: none), the pickled (exception type, exception or None) that ends
// the message, for the consumer to raise as its type.
#define STOKER_SAMPLEFAIL_WORDS(X)             \
  X(Index, index)                              \
  X(NotTheSamplesFault, not_the_samples_fault) \
  X(ExceptionBytes, exception_bytes)
// worker -> parent: TASKFAIL instead of DONE, the batch failed outside its
// samples (collate_fn raised, the batch could not be written); INITFAIL
// instead of INITDONE, worker_init_fn raised. Text as SAMPFAIL's, the pickled
// exception after it (exception_bytes, 0: none). `refused`: the machine
// refused a resource (memory, descriptors), no fault of the data's: a
// ResourceError (TASKFAIL's; INITFAIL's is 0).
#define STOKER_FAIL_WORDS(X)           \
  X(ExceptionBytes, exception_bytes) \
  X(Refused, refused)
// worker -> parent: the batch is in the segment (`samples` of it loaded),
// with the worker's figures (cumulative CPU and run-queue delay, unique
// memory; 0: not measured).
#define STOKER_DONE_WORDS(X)   \
  X(Samples, samples)          \
  X(SegmentSize, segment_size) \
  X(MetaOffset, meta_offset)   \
  X(MetaLength, meta_length)   \
  X(CpuNs, cpu_ns)             \
  X(RunDelayNs, run_delay_ns)  \
  X(PrivateBytes, private_bytes)
// worker -> parent, before DONE, while a sharded stream's item is made: the
// item's batch number `part` (0, 1, ...) is in the segment, pickled at
// meta_offset (as DONE's), the segment segment_size long now; the consumer
// may take it before the item is done. DONE's meta lists every part's
// meta (a _shards.PartRefs).
#define STOKER_PART_WORDS(X)   \
  X(Part, part)                \
  X(SegmentSize, segment_size) \
  X(MetaOffset, meta_offset)   \
  X(MetaLength, meta_length)
// worker -> parent, instead of DONE, after YIELD (parent -> worker, no
// words: its engine thread leaves the pool): the sharded stream's item stops
// after its last PART; what a continuation needs (a shard's resume) is at
// resume_offset, and its data may start at data_end. Another worker
// continues it in the same segment (the header's resume words). A shard's
// resume, int64 words: the parts made (k), then each one's meta_offset and
// meta_length; the worker that continues reads on from sample k * batch size.
// The parent writes one too, for a fresh process after one died in the shard.
#define STOKER_YIELDED_WORDS(X)  \
  X(SegmentSize, segment_size)   \
  X(ResumeOffset, resume_offset) \
  X(ResumeLength, resume_length) \
  X(DataEnd, data_end)
// DROP (parent -> worker, no words: the item's epoch was abandoned) stops a
// sharded stream's item at its next sample; the worker answers DROPPED (no
// words) instead of DONE, and nothing of the item is kept: its parts and
// segment go back (a DROP that comes after its item ended is ignored).
// worker -> parent, instead of DONE: its unique memory passed the task's
// memory_limit after `samples` of the batch; it left the batch unfinished
// and exits (the parent reruns the batch in a fresh process).
#define STOKER_OVER_WORDS(X)   \
  X(Samples, samples)          \
  X(PrivateBytes, private_bytes)
// Messages of no words: HELLO (worker -> parent: started, waiting for INIT;
// a zygote started afresh by "spawn" or "forkserver" -> parent: started),
// INITDONE (worker_init_fn ran: ready for tasks), EXIT, and those that carry
// text.
#define STOKER_NO_WORDS(X)

// X(CppName, TAG, its words, carries text after them). EXIT (parent ->
// worker or zygote): leave now; a zygote kills its workers, collects them
// and exits. The FAIL messages carry the error's text: a fork refused,
// worker_init_fn raised, a sample raised, a batch failed outside its
// samples (collate_fn).
#define STOKER_MESSAGES(X)                                 \
  X(Fork, FORK, STOKER_FORK_WORDS, false)                  \
  X(Forked, FORKED, STOKER_FORKED_WORDS, false)            \
  X(ForkFail, FORKFAIL, STOKER_NO_WORDS, true)             \
  X(Reap, REAP, STOKER_REAP_WORDS, false)                  \
  X(Reaped, REAPED, STOKER_REAPED_WORDS, false)            \
  X(Hello, HELLO, STOKER_NO_WORDS, false)                  \
  X(Init, INIT, STOKER_INIT_WORDS, false)                  \
  X(InitDone, INITDONE, STOKER_NO_WORDS, false)            \
  X(InitFail, INITFAIL, STOKER_FAIL_WORDS, true)           \
  X(Task, TASK, STOKER_TASK_WORDS, false)                  \
  X(SampleFail, SAMPFAIL, STOKER_SAMPLEFAIL_WORDS, true)     \
  X(TaskFail, TASKFAIL, STOKER_FAIL_WORDS, true)           \
  X(Part, PART, STOKER_PART_WORDS, false)                  \
  X(Yield, YIELD, STOKER_NO_WORDS, false)                  \
  X(Yielded, YIELDED, STOKER_YIELDED_WORDS, false)         \
  X(Drop, DROP, STOKER_NO_WORDS, false)                    \
  X(Dropped, DROPPED, STOKER_NO_WORDS, false)              \
  X(Done, DONE, STOKER_DONE_WORDS, false)                  \
  X(Over, OVER, STOKER_OVER_WORDS, false)                  \
  X(Exit, EXIT, STOKER_NO_WORDS, false)

// The first words of a batch segment (kSegmentHeaderWords reserved), then
// the batch's `samples` dataset indices, then keys_bytes of the sampler's
// pickled keys (0: the indices are the keys; else the indices are positions
// in that list), then data from `data_offset`. The worker keeps `position`
// on the sample it is loading (-1 outside one), so that the parent can blame
// that sample if the process dies. resume_offset/resume_length: a sharded
// stream's item continued after YIELDED (its resume); 0: from its start.
#define STOKER_SEGMENT_HEADER(X)   \
  X(Magic, magic)                  \
  X(Position, position)            \
  X(Samples, samples)              \
  X(DataOffset, data_offset)       \
  X(Seed, seed)                    \
  X(KeysBytes, keys_bytes)         \
  X(ResumeOffset, resume_offset)   \
  X(ResumeLength, resume_length)

// A batch made by a worker process, as the engine carries it to the consumer.
#define STOKER_PROCESS_DESCRIPTOR(X) \
  X(Magic, magic)                    \
  X(Segment, segment)                \
  X(Ticket, ticket)                  \
  X(SegmentSize, segment_size)       \
  X(MetaOffset, meta_offset)         \
  X(MetaLength, meta_length)         \
  X(Epoch, epoch)                    \
  X(Batch, batch)
// A batch made by a worker thread (a Python object held by ticket).
#define STOKER_THREAD_DESCRIPTOR(X) \
  X(Magic, magic)                   \
  X(Ticket, ticket)                 \
  X(Epoch, epoch)                   \
  X(Batch, batch)

// A batch of stoker.DataLoader's native path (native_batch_kind.h): the
// engine's item holds it whole: these words, then `samples` int64 labels
// from labels_offset, then the samples, back to back, from images_offset.
// `asked`: the indices the batch held (0: the batch sampler gave []);
// `epoch` and `batch`: the engine's, which name it.
#define STOKER_NATIVE_BATCH(X)     \
  X(Magic, magic)                  \
  X(Samples, samples)              \
  X(Asked, asked)                  \
  X(Epoch, epoch)                  \
  X(Batch, batch)                  \
  X(LabelsOffset, labels_offset)   \
  X(ImagesOffset, images_offset)

// clang-format on

inline constexpr int kSegmentHeaderWords = 8;
inline constexpr int64_t kSegmentMagic = 0x31474553524b5453;  // "STKRSEG1"
inline constexpr int64_t kThreadMagic = 0x31444854524b5453;   // "STKRTHD1"
/// A ThreadDescriptor of a batch made on a remote slot (held by the remote
/// slots' ThreadWorkers).
inline constexpr int64_t kRemoteMagic = 0x31544d52524b5453;  // "STKRRMT1"
/// A NativeBatch header.
inline constexpr int64_t kNativeMagic = 0x3154414e524b5453;  // "STKRNAT1"
/// Segments grow in steps of this many bytes, so batches of one shape fit again.
inline constexpr size_t kSegmentGrain = size_t{1} << 20;
/// Arrays in a segment start at multiples of this.
inline constexpr size_t kDataAlign = 64;

#define STOKER_PROTOCOL_ENUMERATOR(Cpp, py) k##Cpp,
#define STOKER_PROTOCOL_WORDS_ENUM(Name, Words) \
  enum Name : int { Words(STOKER_PROTOCOL_ENUMERATOR) kCount };

/// Word positions, e.g. TaskWord::kBatch; kCount: how many words.
struct TaskWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_TASK_WORDS)
};
struct DoneWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_DONE_WORDS)
};
struct PartWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_PART_WORDS)
};
struct YieldedWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_YIELDED_WORDS)
};
struct OverWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_OVER_WORDS)
};
struct SampleFailWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_SAMPLEFAIL_WORDS)
};
struct FailWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_FAIL_WORDS)
};
struct ForkWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_FORK_WORDS)
};
struct InitWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_INIT_WORDS)
};
struct ForkedWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_FORKED_WORDS)
};
struct ReapWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_REAP_WORDS)
};
struct ReapedWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_REAPED_WORDS)
};
struct SegmentWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_SEGMENT_HEADER)
};
struct ProcessDescriptor {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_PROCESS_DESCRIPTOR)
};
struct ThreadDescriptor {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_THREAD_DESCRIPTOR)
};
struct NativeBatchWord {
  STOKER_PROTOCOL_WORDS_ENUM(Index, STOKER_NATIVE_BATCH)
};
static_assert(SegmentWord::kCount <= kSegmentHeaderWords);

/// The words of one layout, indexed by its enum: Words<TaskWord> w; w[TaskWord::kBatch] = b;
template <typename Layout>
using Words = std::array<int64_t, Layout::kCount>;

/// The messages, e.g. Tag::kDone; kMessages[Tag::kDone].tag is "DONE".
struct Tag {
#define STOKER_PROTOCOL_TAG_ENUMERATOR(Cpp, TAG, Words, text) k##Cpp,
  enum Index : int { STOKER_MESSAGES(STOKER_PROTOCOL_TAG_ENUMERATOR) kCount };
#undef STOKER_PROTOCOL_TAG_ENUMERATOR
};
struct MessageKind {
  const char* tag;
  bool text;  // carries text after its words
  int words;
};
inline constexpr MessageKind kMessages[] = {
#define STOKER_PROTOCOL_COUNT_WORD(Cpp, py) +1
#define STOKER_PROTOCOL_MESSAGE_KIND(Cpp, TAG, Words, text) \
  {#TAG, text, 0 Words(STOKER_PROTOCOL_COUNT_WORD)},
    STOKER_MESSAGES(STOKER_PROTOCOL_MESSAGE_KIND)
#undef STOKER_PROTOCOL_MESSAGE_KIND
#undef STOKER_PROTOCOL_COUNT_WORD
};
static_assert(sizeof kMessages / sizeof kMessages[0] == Tag::kCount);
static_assert(
    [] {
      for (const MessageKind& m : kMessages) {
        size_t n = 0;
        while (m.tag[n] != '\0') ++n;
        if (n > kTagBytes) return false;
      }
      return true;
    }(),
    "a tag longer than kTagBytes");

}  // namespace stoker::python::protocol
