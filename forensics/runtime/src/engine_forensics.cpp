#include "gpumem/forensics/engine_forensics.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "gpumem/forensics/engine_snapshot.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/memory_report.h"
#include "gpumem/forensics/snapshot_writer.h"

namespace gpumem::forensics {
namespace {

void write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw ForensicsError(fmt::format("{}: cannot create ({})", path, std::strerror(errno)));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw ForensicsError(fmt::format("{}: write failed ({})", path, std::strerror(errno)));
}

}  // namespace

EngineForensics::EngineForensics(alloc::CachingAllocator& engine, const Config& config)
    : EngineForensics(engine, config, nullptr, std::string()) {}

EngineForensics::EngineForensics(alloc::CachingAllocator& engine, const Config& config,
                                 std::shared_ptr<TraceRing> ring, std::string settings, StackSymbolizer symbolize)
    : engine_(engine),
      report_dir_(config.oom_report_dir),
      settings_(std::move(settings)),
      stacks_(config.python_stacks_on() && symbolize != nullptr),
      symbolize_(std::move(symbolize)) {
  std::size_t trace = config.trace_entries;
  if (!report_dir_.empty()) trace = std::max(trace, kPostmortemTrace);
  if (ring != nullptr) {
    // The composer's ring: with no trace of ours it may still keep PyTorch's history
    // (_record_memory_history, turned on later), whose records then carry the op too.
    ring_ = std::move(ring);
    if (trace > 0) ring_->keep_at_least(trace);
    ring_->set_record_ops(config.record_ops);
    if (stacks_) ring_->set_keep_contexts(true);
  } else if (trace > 0) {
    ring_ = std::make_shared<TraceRing>(trace, config.record_ops);
    ring_->set_keep_contexts(stacks_);
    own_ring_ = true;
    engine_.attach_observer(ring_);
  }
  if (trace > 0 || config.record_ops || stacks_) {
    tracker_ = std::make_shared<FragmentationTracker>(config.record_ops, stacks_);
    engine_.attach_observer(tracker_);
  }
}

EngineForensics::~EngineForensics() {
  if (tracker_) engine_.detach_observer(tracker_.get());
  if (ring_ && own_ring_) engine_.detach_observer(ring_.get());
  if (ring_ && !own_ring_) {  // the composer's ring goes back to its own settings
    ring_->keep_at_least(0);
    ring_->set_record_ops(false);
    if (stacks_) ring_->set_keep_contexts(false);
  }
}

Snapshot EngineForensics::snapshot_with(const std::optional<alloc::OomInfo>& oom) {
  const alloc::EngineSnapshot view = engine_.snapshot();
  EngineSnapshotExtras extras;
  extras.tracker = tracker_.get();
  if (stacks_) extras.symbolize = &symbolize_;
  const alloc::ProviderMemInfo mem = oom ? oom->provider : engine_.source().mem_info();
  extras.device_total_bytes = mem.total_bytes;
  extras.device_free_bytes = mem.free_bytes;
  if (oom) extras.oom_device_free_bytes = oom->provider.free_bytes;
  std::vector<PoolEngineView> pools;
  if (pool_engines_) pools = pool_engines_();
  extras.pools = pools;
  std::vector<TraceRecord> records;
  if (ring_) records = ring_->records();
  Snapshot snap = snapshot_from_engine(view, records, extras);
  if (!settings_.empty()) snap.gpumem.settings = settings_;
  if (oom && oom->cap_bytes != alloc::kNoLimit) snap.gpumem.cap_bytes = oom->cap_bytes;
  return snap;
}

Snapshot EngineForensics::snapshot() { return snapshot_with(std::nullopt); }

std::optional<OomPostmortemFiles> EngineForensics::on_oom(const alloc::OomInfo& oom) {
  if (report_dir_.empty()) return std::nullopt;
  // The snapshot is taken before write_mutex_: symbolizing Python stacks takes the GIL, and a
  // thread that holds the GIL may be waiting for write_mutex_ in its own on_oom.
  std::optional<Snapshot> taken;
  std::string failure;
  try {
    taken = snapshot_with(oom);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::lock_guard lock(write_mutex_);
  OomPostmortemFiles files;
  const std::string base = fmt::format("{}/gpumem-oom-{}-{}", report_dir_, static_cast<long>(::getpid()), reports_written_++);
  files.snapshot_path = base + ".pickle";
  files.report_path = base + ".txt";
  files.json_path = base + ".json";
  try {
    if (!taken) throw ForensicsError(fmt::format("taking the snapshot failed: {}", failure));
    Snapshot& snap = *taken;
    snap.source = files.snapshot_path;
    write_snapshot(snap, files.snapshot_path);
    ReportOptions options;
    options.replay = false;  // keep the failing call short; `gpumem report` replays
    const MemoryReport report = build_report(snap, options);
    files.verdict = report.oom ? report.oom->verdict : "";
    write_text(files.report_path, render_report_text(report));
    write_text(files.json_path, render_report_json(report));
    files.message = fmt::format("gpumem wrote an OOM report to {} (verdict: {}) and a snapshot to {} (open it with "
                                "`gpumem report` or https://pytorch.org/memory_viz)",
                                files.report_path, files.verdict.empty() ? "unknown" : files.verdict,
                                files.snapshot_path);
  } catch (const std::exception& e) {
    files.message = fmt::format("gpumem could not write its OOM report to {}: {}; check that oom_report_dir exists "
                                "and is writable",
                                report_dir_, e.what());
  }
  return files;
}

std::optional<OomPostmortemFiles> EngineForensics::on_last_oom() {
  if (report_dir_.empty() || !ring_) return std::nullopt;
  const auto records = ring_->records();
  const TraceRecord* last = nullptr;
  for (const auto& r : records) {
    if (r.event.kind == alloc::EventKind::oom && (!last || r.event.seq > last->event.seq)) last = &r;
  }
  if (!last) return std::nullopt;
  const alloc::EngineTotals t = engine_.totals();
  alloc::OomInfo oom;
  oom.requested_bytes = last->event.requested_bytes;
  oom.rounded_bytes = last->event.size_bytes;
  oom.allocated_bytes = t.allocated_bytes;
  oom.reserved_bytes = t.reserved_bytes;
  oom.cached_free_bytes = t.cached_free_bytes;
  oom.largest_free_extent_bytes = t.largest_free_extent_bytes;
  oom.cap_bytes = t.cap_bytes;
  oom.provider = engine_.source().mem_info();
  oom.stream = last->event.stream;
  oom.pool = last->event.pool;
  return on_oom(oom);
}

}  // namespace gpumem::forensics
