// EngineForensics: gpumem's forensics attached to one engine, as its forensics::Config asks:
//   trace_entries > 0     a TraceRing of that many records (the snapshots' trace)
//   record_ops            events tagged with the current op / user scope (OpStack)
//   oom_report_dir != ""  the OOM postmortem: on_oom() writes a snapshot and a report there (with
//                         at least the last kPostmortemTrace events, whatever trace_entries says:
//                         a training step of the corpus's largest workloads, so that the trace
//                         covers the memory a step allocates)
//   python_stacks_on()    live blocks and alloc records keep their allocation's stack context
//                         (AllocContext), symbolized through the StackSymbolizer at snapshots
//                         (only when the composer gives one: the torch adapter's python_stacks.h)
// plus a FragmentationTracker whenever any of them is on (live blocks with their op, stack and
// age, for blocks older than the trace). The per-op and per-site tables of reports are computed
// from the snapshot (its blocks and trace), not counted here. With all off nothing is attached
// and the engine pays nothing.
//
// The trace ring: alone, EngineForensics makes and attaches its own. A composer that already keeps
// a ring on the engine (the torch adapter: PyTorch's _record_memory_history reads it) passes that
// ring instead, so every event is recorded once: EngineForensics then asks it to keep at least
// what the postmortem needs (TraceRing::keep_at_least) and reads all it keeps.
//
// The OOM postmortem: the code that calls allocate() (the torch adapter, or any user of the
// engine) calls on_oom(oom) when the result carries an OomInfo, before it returns the error, and
// appends the returned message to its error (e.g. PyTorch's OutOfMemoryError). on_oom writes, in
// oom_report_dir, gpumem-oom-<pid>-<n>.pickle (the snapshot PyTorch's tools open), .txt (the
// report, `gpumem report` on that snapshot) and .json (the same report as JSON). It never throws:
// a failure to write is described in the message instead.
//
// Thread-safety: snapshot() and on_oom() may be called from any thread (on_oom serializes file
// writing, and symbolizes stacks before it takes its lock, since the symbolizer may take the GIL);
// the constructor and destructor must not race with engine calls that publish events.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/forensics/config.h"
#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/fragmentation_tracker.h"
#include "gpumem/forensics/snapshot.h"
#include "gpumem/forensics/stack_symbolizer.h"
#include "gpumem/forensics/trace_ring.h"

namespace gpumem::forensics {

struct OomPostmortemFiles {
  std::string snapshot_path;
  std::string report_path;
  std::string json_path;
  std::string verdict;  // the report's verdict
  std::string message;  // one sentence for the OOM error: where the files are, or why not written
};

class EngineForensics {
 public:
  // Records the postmortem keeps at least (64 bytes each: 4 MiB).
  static constexpr std::size_t kPostmortemTrace = 65536;

  // With its own trace ring (attached to engine while this object lives).
  EngineForensics(alloc::CachingAllocator& engine, const Config& config);
  // With the ring the composer attached to engine (not detached here), and the configuration text
  // snapshots report as gpumem's settings (empty: the engine's own settings).
  // symbolize: turns the stack contexts of records and live blocks into frames at snapshots
  // (null: snapshots carry no frames).
  EngineForensics(alloc::CachingAllocator& engine, const Config& config, std::shared_ptr<TraceRing> ring,
                  std::string settings, StackSymbolizer symbolize = nullptr);
  ~EngineForensics();
  EngineForensics(const EngineForensics&) = delete;
  EngineForensics& operator=(const EngineForensics&) = delete;

  // The engines of the device's private pools (CUDA graphs, MemPool: the torch adapter's), whose
  // segments snapshots and postmortems add, tagged with their pool. Set it before the engine is
  // shared between threads; `pools` is called from snapshot() and on_oom() on any thread.
  using PoolEngines = std::function<std::vector<PoolEngineView>()>;
  void set_pool_engines(PoolEngines pools) { pool_engines_ = std::move(pools); }

  // The engine's state now (and its pools') with the trace, ops and the per-op table (emits a
  // snapshot event).
  Snapshot snapshot();
  // nullopt when oom_report_dir is not configured.
  std::optional<OomPostmortemFiles> on_oom(const alloc::OomInfo& oom);
  // The postmortem of the engine's latest OOM, for code that only sees the error (a
  // c10::OutOfMemoryError the torch adapter threw): the request from the last oom record of the
  // trace, the totals from the engine now (call it before freeing anything). nullopt when
  // oom_report_dir is not configured or no OOM was recorded.
  std::optional<OomPostmortemFiles> on_last_oom();

  const TraceRing* trace_ring() const noexcept { return ring_.get(); }
  const FragmentationTracker* tracker() const noexcept { return tracker_.get(); }

 private:
  Snapshot snapshot_with(const std::optional<alloc::OomInfo>& oom);
  alloc::CachingAllocator& engine_;
  std::string report_dir_;
  std::string settings_;
  bool stacks_ = false;
  std::shared_ptr<TraceRing> ring_;
  bool own_ring_ = false;  // attached (and detached) by this object
  std::shared_ptr<FragmentationTracker> tracker_;
  StackSymbolizer symbolize_;
  PoolEngines pool_engines_;
  std::mutex write_mutex_;
  unsigned reports_written_ = 0;
};

}  // namespace gpumem::forensics
