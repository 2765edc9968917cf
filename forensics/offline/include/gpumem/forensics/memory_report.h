// MemoryReport: what `gpumem report` (and the OOM postmortem) says about one device of a snapshot
// or trace at one moment (moment.h; by default the OOM when the file records one, else the peak
// of reserved bytes): the memory there in the terms of vocabulary.h, the live memory and what
// reserved it per op and per call site (group_table.h), and one verdict with its evidence and
// advice.
//
// At an OOM the verdict says why the request failed (OomAnalysis):
//   fragmentation   enough memory is free for the request, but no free extent it could use is
//                   large enough (largest usable extent < rounded request <= free)
//   pending_frees   the request would fit if blocks freed but still in use on other streams
//                   were released
//   outside_memory  the device's memory is held outside the allocator (the device total minus
//                   its free memory minus what the allocator reserved would hold the request)
//   capacity        live memory really is too large for the cap or the device
// At any other moment it says where reserved memory beyond the request goes (FragmentationVerdict):
//   fragmentation   inactive split is the largest part of reserved - requested
//   caching         cached free is (memory the allocator could release as it is)
//   rounding        rounding is
//   pending_frees   pending free is
//   compact         reserved is within 10% of requested: little to gain
//   empty           nothing is reserved
// Advice follows from the verdict: a replay under gpumem's policy is offered only for
// fragmentation and pending_frees at an OOM (under capacity no policy can serve the request),
// and only when the replay holds the whole live set (replay_at_moment.h); otherwise the report
// says why not.
//
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/forensics/fragmentation.h"
#include "gpumem/forensics/group_table.h"
#include "gpumem/forensics/moment.h"
#include "gpumem/forensics/oom_moment.h"
#include "gpumem/forensics/replay_at_moment.h"
#include "gpumem/forensics/snapshot.h"

namespace gpumem::forensics {

struct OomAnalysis {
  std::uint64_t request_bytes = 0;
  std::uint64_t rounded_request_bytes = 0;
  std::uint64_t largest_usable_extent_bytes = 0;  // on the request's stream and pool
  std::uint64_t stream = 0;
  std::int64_t time_us = 0;
  std::string site;                                // where the failed request came from
  std::string op;
  std::optional<std::uint64_t> device_free_bytes;
  std::optional<std::uint64_t> device_total_bytes;
  std::optional<std::uint64_t> cap_bytes;
  std::optional<std::uint64_t> outside_bytes;      // device total - free - reserved
  std::uint64_t replay_limit_bytes = 0;            // the memory a replay gets (cap, else reserved)
  std::string verdict;
  std::vector<std::string> evidence;
  std::vector<std::string> advice;
};

// The verdict of a moment without an OOM, and the policies' replays to that moment.
struct FragmentationVerdict {
  std::string verdict;
  std::vector<std::string> evidence;
  std::vector<std::string> advice;
  std::vector<MomentReplay> replays;  // pytorch, pytorch:expandable, gpumem (when replayed)
};

// The memory of one pool at the moment: the device's default pool ({0, 0}) or a private pool
// (segment_pool_id: a CUDA graph's, cudagraph trees', or a torch.cuda.MemPool's), whose memory
// serves nothing else.
struct PoolTotals {
  std::pair<std::int64_t, std::int64_t> pool_id{0, 0};
  std::size_t segments = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t requested_bytes = 0;
};

// How reports name a pool: "default pool" for {0, 0}, "private pool (a, b)" otherwise.
std::string pool_label(std::pair<std::int64_t, std::int64_t> pool_id);

struct MemoryReport {
  std::string source;
  int device = 0;
  std::size_t trace_entries = 0;
  Moment moment;
  StateAtMoment state;               // the segments at the moment
  Fragmentation fragmentation;
  std::optional<OomAnalysis> oom;    // when the moment is an OOM
  std::optional<FragmentationVerdict> at_moment;  // otherwise
  std::vector<GroupRow> ops;         // by op, at most `top` rows
  std::vector<GroupRow> sites;       // by call site, at most `top` rows
  std::vector<PoolTotals> pools;     // per pool at the moment, by pool id (the default pool first)
  std::optional<ReplayInput> replay_coverage;     // what the replays held (no trace: none)
  std::vector<std::string> notes;    // what was done to the data (rollbacks, reconstruction)
  std::size_t top = 10;              // rows per list as rendered (ops, sites, pinned segments)

  // The verdict (OOM or not).
  const std::string& verdict() const;
};

struct ReportOptions {
  std::size_t top = 10;
  std::optional<int> device;  // default: the device with an oom, else the first traced one
  MomentSpec at;              // default: the OOM, else the peak of reserved bytes
  bool replay = true;         // replay the trace for the advice and the comparison
};

// Throws ForensicsError when options ask for what the file does not have (a device it does not
// record, an OOM it does not record, an entry past its end).
MemoryReport build_report(const Snapshot& snapshot, const ReportOptions& options = {});

std::string render_report_text(const MemoryReport& report);
std::string render_report_json(const MemoryReport& report);

// PyTorch's rounding of a request to a block size (512-byte multiples, at least 512).
std::uint64_t rounded_request(std::uint64_t requested_bytes) noexcept;

// The memory limit a replay of this file's OOM gets: the cap the file records, else the bytes
// reserved at the OOM when the device still had room (a cap PyTorch does not record refused the
// growth), else reserved + device free. nullopt when the file records no OOM on that device.
std::optional<std::uint64_t> oom_replay_limit(const Snapshot& snapshot, int device);

// The devices a file records (a trace or segments), in order.
std::vector<int> recorded_devices(const Snapshot& snapshot);

}  // namespace gpumem::forensics
