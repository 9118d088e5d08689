#include "lmscope/memory/snapshot.h"

#include "lmscope/memory/memory_analysis.h"

#include <bit>
#include <cstring>
#include <string_view>

namespace lmscope {
namespace {

// Pickle protocol 2 without memo: what the Python unpickler and MemoryViz.js's both read.
class PickleWriter {
 public:
  PickleWriter() { out_ += "\x80\x02"; }  // PROTO 2
  void begin_dict() { out_ += "}("; }     // EMPTY_DICT MARK
  void end_dict() { out_ += 'u'; }        // SETITEMS
  void begin_list() { out_ += "]("; }     // EMPTY_LIST MARK
  void end_list() { out_ += 'e'; }        // APPENDS
  void str(std::string_view s) {          // BINUNICODE: u32 length, UTF-8
    out_ += 'X';
    put_le(s.size(), 4);
    out_ += s;
  }
  void integer(std::int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {  // BININT: i32
      out_ += 'J';
      put_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
      return;
    }
    // LONG1: the fewest little-endian two's-complement bytes whose top bit is the sign.
    std::string bytes;
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((u >> (8 * i)) & 0xff);
    while (bytes.size() > 1) {
      const auto last = static_cast<unsigned char>(bytes.back()),
                 prev = static_cast<unsigned char>(bytes[bytes.size() - 2]);
      if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))
        bytes.pop_back();
      else
        break;
    }
    out_ += '\x8a';
    out_ += static_cast<char>(bytes.size());
    out_ += bytes;
  }
  void real(double v) {  // BINFLOAT: big-endian IEEE double
    out_ += 'G';
    const auto bits = std::bit_cast<std::uint64_t>(v);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }  // NEWTRUE, NEWFALSE
  void key(std::string_view k) { str(k); }
  void item(std::string_view k, std::int64_t v) {
    key(k);
    integer(v);
  }
  void item(std::string_view k, std::string_view v) {
    key(k);
    str(v);
  }
  void empty_list() {
    begin_list();
    end_list();
  }
  std::string finish() {
    out_ += '.';  // STOP
    return std::move(out_);
  }

 private:
  void put_le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

void write_frames(PickleWriter& w, const AllocTag& tag, const Shape& shape, DType dtype, Phase phase) {
  w.begin_list();
  w.begin_dict();
  w.key("filename");
  w.str(source_path(tag.file));
  w.key("line");
  w.integer(tag.line);
  w.key("name");
  w.str(fmt::format("{}: {} {}{} in {}", buffer_name(tag), mem_kind_name(tag.kind), dtype_name(dtype), shape_str(shape),
                    phase_name(phase)));
  w.end_dict();
  w.end_list();
}

std::size_t requested_bytes(const Shape& shape, DType dtype) {
  return static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
}

void write_block(PickleWriter& w, std::uintptr_t address, std::size_t bytes, const LiveBuffer* b) {
  const std::size_t requested = b ? requested_bytes(b->shape, b->dtype) : 0;
  w.begin_dict();
  w.item("address", static_cast<std::int64_t>(address));
  w.item("size", static_cast<std::int64_t>(bytes));
  w.item("requested_size", static_cast<std::int64_t>(requested));
  w.item("state", b ? "active_allocated" : "inactive");
  w.key("frames");
  if (b)
    write_frames(w, b->tag, b->shape, b->dtype, b->phase);
  else
    w.empty_list();
  if (b) {  // PyTorch 1.x's reader (torch.cuda._memory_viz) takes frames from the history
    w.key("history");
    w.begin_list();
    w.begin_dict();
    w.item("addr", static_cast<std::int64_t>(address));
    w.item("real_size", static_cast<std::int64_t>(requested));
    w.key("frames");
    write_frames(w, b->tag, b->shape, b->dtype, b->phase);
    w.end_dict();
    w.end_list();
  }
  w.end_dict();
}

// Each segment with its blocks in address order: the buffers live at the end of the record, and
// the free stretches between them as inactive blocks.
void write_segments(PickleWriter& w, const MemoryRecord& record) {
  MemoryReplay replay;
  for (const MemEvent& e : record.events) replay.apply(e);
  w.begin_list();
  for (const MemoryReplay::Segment& s : replay.segments()) {
    std::size_t allocated = 0, requested = 0;
    for (const auto& [address, b] : s.live) {
      allocated += b.bytes;
      requested += requested_bytes(b.shape, b.dtype);
    }
    w.begin_dict();
    w.item("device", 0);
    w.item("address", static_cast<std::int64_t>(s.address));
    w.item("total_size", static_cast<std::int64_t>(s.bytes));
    w.item("allocated_size", static_cast<std::int64_t>(allocated));
    w.item("active_size", static_cast<std::int64_t>(allocated));
    w.item("requested_size", static_cast<std::int64_t>(requested));
    w.item("stream", 0);
    w.item("segment_type", s.small ? "small" : "large");
    w.key("is_expandable");
    w.boolean(false);
    w.key("frames");
    w.empty_list();
    w.key("blocks");
    w.begin_list();
    std::uintptr_t at = s.address;
    for (const auto& [address, b] : s.live) {
      if (address > at) write_block(w, at, address - at, nullptr);
      write_block(w, address, b.bytes, &b);
      at = address + b.bytes;
    }
    if (at < s.address + s.bytes) write_block(w, at, s.address + s.bytes - at, nullptr);
    w.end_list();
    w.end_dict();
  }
  w.end_list();
}

void write_trace_entry(PickleWriter& w, const MemoryRecord& record, const MemEvent& e, const char* action,
                       std::size_t reserved) {
  w.begin_dict();
  w.item("action", action);
  w.item("addr", static_cast<std::int64_t>(e.address));
  w.item("size", static_cast<std::int64_t>(e.bytes));
  w.item("stream", 0);
  w.item("time_us", static_cast<std::int64_t>(record.start_epoch_us + e.time_us));
  if (e.action == MemAction::oom)
    w.item("device_free", static_cast<std::int64_t>(record.capacity - std::min(record.capacity, reserved)));
  w.key("frames");
  if (e.action == MemAction::segment_free)
    w.empty_list();
  else
    write_frames(w, e.tag, e.shape, e.dtype, e.phase);
  w.end_dict();
}

void write_trace(PickleWriter& w, const MemoryRecord& record) {
  MemoryReplay replay;  // for the free device memory an oom entry reports
  w.begin_list();
  w.begin_list();  // device 0
  for (std::size_t i = 0; i < record.events.size(); ++i) {
    const MemEvent& e = record.events[i];
    if (i >= record.step_begin) {
      switch (e.action) {
        case MemAction::alloc:
          write_trace_entry(w, record, e, "alloc", replay.reserved());
          break;
        case MemAction::free:  // the pair PyTorch writes for a free with no stream to wait for
          write_trace_entry(w, record, e, "free_requested", replay.reserved());
          write_trace_entry(w, record, e, "free_completed", replay.reserved());
          break;
        case MemAction::segment_alloc:
          write_trace_entry(w, record, e, "segment_alloc", replay.reserved());
          break;
        case MemAction::segment_free:
          write_trace_entry(w, record, e, "segment_free", replay.reserved());
          break;
        case MemAction::oom:
          write_trace_entry(w, record, e, "oom", replay.reserved());
          break;
      }
    }
    replay.apply(e);
  }
  w.end_list();
  w.end_list();
}

}  // namespace

std::string memory_snapshot_pickle(const MemoryRecord& record) {
  PickleWriter w;
  w.begin_dict();
  w.key("segments");
  write_segments(w, record);
  w.key("device_traces");
  write_trace(w, record);
  w.end_dict();
  return w.finish();
}

}  // namespace lmscope
