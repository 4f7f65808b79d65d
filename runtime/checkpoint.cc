// Checkpoint files: CRC32C, the atomic writer, the verifying reader and the checkpoint folder;
// see checkpoint.h for the byte layout.
#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_set>

#include "core/file_io.h"
#include "core/yaml_reader.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ptdp::rt {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian host would need byte swaps");

namespace {

constexpr char kMagic[8] = {'P', 'T', 'D', 'P', 'C', 'K', 'P', 'T'};
constexpr char kEnd[4] = {'E', 'N', 'D', '1'};
constexpr uint32_t kVersion = 1;         // whole-tensor files
constexpr uint32_t kShardedVersion = 2;  // manifests and shards
constexpr uint64_t kHeaderBytes = 48;
constexpr uint64_t kTrailerBytes = 8;
constexpr uint64_t kAlign = 64;

// ---- CRC32C: Castagnoli polynomial x^32 + x^28 + x^27 + x^26 + x^25 + x^23 + x^22 + x^20 +
// x^19 + x^18 + x^14 + x^13 + x^11 + x^10 + x^9 + x^8 + x^6 + 1, bit-reflected 0x82F63B78
// (RFC 3720 appendix B.4), computed 8 bytes at a time with 8 tables ("slicing-by-8").

struct CrcTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
};

const CrcTables& Tables() {
  static const CrcTables tables;
  return tables;
}

uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

std::string Errno() { return std::strerror(errno); }

void PutU32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint32_t GetU32(const char* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t GetU64(const char* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Doubles and seeds are written so that reading them back gives the same bits.
std::string Exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Offsets (relative to the data start) of every tensor, each 64-byte aligned; sets *end to the
// data bytes.
std::vector<uint64_t> Offsets(const Checkpoint& c, uint64_t* end) {
  std::vector<uint64_t> off;
  uint64_t at = 0;
  for (const NamedTensor& t : c.state.tensors) {
    at = AlignUp(at);
    off.push_back(at);
    at += t.data.size() * sizeof(float);
  }
  *end = at;
  return off;
}

// The keys a whole file and a manifest share, up to the tensor table.
std::string CommonMetadataYaml(const Checkpoint& c, uint32_t version) {
  std::ostringstream o;
  o << "# ptdp checkpoint metadata; the byte layout is described in runtime/checkpoint.h\n"
    << "format: ptdp-checkpoint\n"
    << "version: " << version << "\n"
    << "step: " << c.state.step << "              # training steps completed\n"
    << "optimizer_steps: " << c.state.optimizer_steps << "   # AdamW updates applied\n"
    << "seed: " << c.seed << "\n"
    << "global_batch: " << c.global_batch << "\n"
    << "# data position; with the seed the whole state of the counter-based data-order RNG\n"
    << "consumed_samples: " << c.state.consumed_samples << "\n"
    << "layout: " << YamlQuote(c.layout) << "\n"
    << "model:\n"
    << ModelToYaml(c.model, "  ") << "optimizer:\n";
  for (const auto& [k, v] : c.optimizer) o << "  " << YamlQuote(k) << ": " << Exact(v) << "\n";
  if (c.optimizer.empty()) o << "  {}\n";
  return o.str();
}

std::string ShapeYaml(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

std::string RangesYaml(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::string s = "[";
  for (size_t k = 0; k < ranges.size(); ++k)
    s += (k ? ", [" : "[") + std::to_string(ranges[k].first) + ", " +
         std::to_string(ranges[k].second) + "]";
  return s + "]";
}

std::string MetadataYaml(const Checkpoint& c, const std::vector<uint64_t>& offsets) {
  std::ostringstream o;
  o << CommonMetadataYaml(c, kVersion) << "tensors:\n";
  for (size_t i = 0; i < c.state.tensors.size(); ++i) {
    const NamedTensor& t = c.state.tensors[i];
    o << "  - {name: " << YamlQuote(t.name) << ", shape: " << ShapeYaml(t.shape)
      << ", offset: " << offsets[i] << "}\n";
  }
  return o.str();
}

// Writes all of [data, data + bytes) to fd, continuing the CRC.
Status WriteAll(int fd, const void* data, size_t bytes, uint32_t* crc, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  if (crc) *crc = Crc32c(*crc, p, bytes);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t(1) << 30));
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      return SysError(path + ": cannot write", err);
    }
    p += n;
    bytes -= size_t(n);
  }
  return Status::Ok();
}

// Reads exactly `bytes` bytes, continuing the CRC; fails on a short read.
Status ReadAll(int fd, void* data, size_t bytes, uint32_t* crc, const std::string& path) {
  char* p = static_cast<char*>(data);
  const size_t want = bytes;
  while (bytes > 0) {
    const ssize_t n = ::read(fd, p, std::min<size_t>(bytes, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error(path + ": cannot read: " + Errno());
    }
    if (n == 0) return Status::Error(path + ": truncated: the file ended early");
    p += n;
    bytes -= size_t(n);
  }
  if (crc) *crc = Crc32c(*crc, data, want);
  return Status::Ok();
}

// Reads and CRCs `bytes` bytes that are not kept (padding, or the rest after an error).
Status SkipAll(int fd, uint64_t bytes, uint32_t* crc, const std::string& path) {
  std::vector<char> buf(size_t(std::min<uint64_t>(bytes, 1 << 20)));
  while (bytes > 0) {
    const size_t n = size_t(std::min<uint64_t>(bytes, buf.size()));
    PTDP_RETURN_IF_ERROR(ReadAll(fd, buf.data(), n, crc, path));
    bytes -= n;
  }
  return Status::Ok();
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error (a deferred write error shows up here).
  int Close() { const int r = ::close(fd_); fd_ = -1; return r; }
  // Gives the descriptor up: it stays open.
  void Release() { fd_ = -1; }
  // Closes the one held (if any) and holds `fd`.
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// One stretch of a file's data section: `bytes` bytes at `offset` (relative to the data start).
struct Section {
  uint64_t offset = 0;
  const void* data = nullptr;
  size_t bytes = 0;
};

// What a finished file is: its size and the CRC32C its trailer holds.
struct Written {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Writes the header, `meta`, the sections (increasing offsets, zero padding between them) up to
// `data_bytes`, and the trailer to `tmp`, fsync'ed. The hook runs once about halfway through
// the data.
Result<Written> WriteContainer(const std::string& tmp, uint32_t version, const std::string& meta,
                               const std::vector<Section>& sections, uint64_t data_bytes,
                               const PartialWriteHook& hook) {
  const uint64_t data_offset = AlignUp(kHeaderBytes + meta.size());
  const uint64_t file_bytes = data_offset + data_bytes + kTrailerBytes;

  std::string head(kMagic, sizeof kMagic);
  PutU32(head, version);
  PutU32(head, 0);
  PutU64(head, file_bytes);
  PutU64(head, meta.size());
  PutU64(head, data_offset);
  PutU64(head, data_bytes);
  head += meta;
  head.resize(size_t(data_offset), '\0');

  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const int err = errno;
    return SysError(tmp + ": cannot create", err);
  }
  uint32_t crc = 0;
  PTDP_RETURN_IF_ERROR(WriteAll(fd.get(), head.data(), head.size(), &crc, tmp));
  const std::vector<char> zeros(kAlign, 0);
  auto pad = [&](uint64_t n) -> Status {
    for (; n > 0; n -= std::min<uint64_t>(n, kAlign))
      PTDP_RETURN_IF_ERROR(WriteAll(fd.get(), zeros.data(), size_t(std::min<uint64_t>(n, kAlign)), &crc, tmp));
    return Status::Ok();
  };
  uint64_t at = 0;
  bool hooked = !hook;
  for (const Section& sec : sections) {
    assert(sec.offset >= at && sec.offset + sec.bytes <= data_bytes);
    PTDP_RETURN_IF_ERROR(pad(sec.offset - at));
    PTDP_RETURN_IF_ERROR(WriteAll(fd.get(), sec.data, sec.bytes, &crc, tmp));
    at = sec.offset + sec.bytes;
    if (!hooked && at * 2 >= data_bytes) {
      hooked = true;
      hook(tmp);
    }
  }
  PTDP_RETURN_IF_ERROR(pad(data_bytes - at));
  std::string tail;
  PutU32(tail, crc);
  tail.append(kEnd, sizeof kEnd);
  PTDP_RETURN_IF_ERROR(WriteAll(fd.get(), tail.data(), tail.size(), nullptr, tmp));
  if (::fsync(fd.get()) != 0) {
    const int err = errno;
    return SysError(tmp + ": fsync failed", err);
  }
  if (fd.Close() != 0) {
    const int err = errno;
    return SysError(tmp + ": close failed", err);
  }
  return Written{file_bytes, crc};
}

// WriteContainer into "<path>.tmp", renamed over `path` (the temporary removed on failure).
Result<Written> WriteAtomically(const std::string& path, uint32_t version, const std::string& meta,
                                const std::vector<Section>& sections, uint64_t data_bytes,
                                const PartialWriteHook& hook) {
  const std::string tmp = path + ".tmp";
  Result<Written> w = WriteContainer(tmp, version, meta, sections, data_bytes, hook);
  if (!w.ok()) {
    ::unlink(tmp.c_str());
    return w.status();
  }
  PTDP_RETURN_IF_ERROR(RenameIntoPlace(tmp, path));
  return w;
}

// fsync of the folder holding `path`, so that a rename in it survives a power loss.

// ---- metadata reading

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20 ||
      !std::all_of(s.begin(), s.end(), [](unsigned char ch) { return ch >= '0' && ch <= '9'; }))
    return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// One entry of the tensor table (a manifest's has no offset).
struct TableEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
};

// A tensor's size may be at most 2^40 elements (4 TiB of fp32): far above any model's tensor,
// and its bytes cannot overflow a u64.
constexpr uint64_t kMaxElements = uint64_t(1) << 40;

// The shape at `node` (a list of at most 8 sizes, product <= kMaxElements) into *shape and its
// element count into *numel; false when it is not one.
bool ParseShape(const YAML::Node& node, std::vector<int64_t>* shape, uint64_t* numel) {
  if (!node.IsSequence() || node.size() > 8) return false;
  shape->clear();
  *numel = 1;
  for (size_t k = 0; k < node.size(); ++k) {
    uint64_t d = 0;
    if (!node[k].IsScalar() || !ParseU64(node[k].Scalar(), &d) || d > kMaxElements) return false;
    shape->push_back(int64_t(d));
    *numel = d == 0 ? 0 : (*numel > kMaxElements / d ? kMaxElements + 1 : *numel * d);
  }
  return *numel <= kMaxElements;
}

// The tensor table: with offsets (a whole file), each tensor's data must fit the data section
// in order; without (a manifest), there is no data.
Status ReadTable(const YAML::Node& list, const std::string& file, uint64_t data_bytes,
                 bool with_offsets, std::vector<TableEntry>* out) {
  if (!list.IsDefined() || list.IsNull()) return Status::Ok();
  if (!list.IsSequence()) return Status::Error(file + ": metadata key 'tensors' must be a list");
  uint64_t end = 0;  // where the previous tensor's data ends
  std::unordered_set<std::string> names;
  size_t i = 0;
  for (auto item = list.begin(); item != list.end(); ++item, ++i) {
    const std::string where = "tensors[" + std::to_string(i) + "]";
    YamlReader r(*item, file, where);
    TableEntry e;
    e.name = r.String("name");
    const YAML::Node shape = r.Child("shape");
    const int64_t offset = with_offsets ? r.NonNegativeInt("offset", -1) : 0;
    PTDP_RETURN_IF_ERROR(r.Finish());
    if (offset < 0) return Status::Error(file + ": " + where + ": missing offset");
    e.offset = uint64_t(offset);
    uint64_t numel = 0;
    if (!ParseShape(shape, &e.shape, &numel))
      return Status::Error(file + ": " + where + " (" + e.name + "): shape must be a list of at "
                           "most 8 sizes of at most 2^40 elements in all");
    if (with_offsets) {
      const uint64_t bytes = numel * sizeof(float);
      if (e.offset < end || e.offset % kAlign != 0 || e.offset > data_bytes ||
          bytes > data_bytes - e.offset)
        return Status::Error(file + ": " + where + " (" + e.name + "): offset " +
                             std::to_string(e.offset) + " and size do not fit the data section of " +
                             std::to_string(data_bytes) + " bytes in order");
      end = e.offset + bytes;
    }
    if (!names.insert(e.name).second)  // a hash set: a pairwise check is quadratic
      return Status::Error(file + ": tensor '" + e.name + "' appears twice");
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

// A manifest's own keys.
struct Manifest {
  int world = 0;
  std::vector<ShardRecord> shards;  // by first rank
};

Status ReadShardTable(const YAML::Node& list, const std::string& file, int64_t step, int world,
                      std::vector<ShardRecord>* out) {
  if (!list.IsSequence() || list.size() == 0)
    return Status::Error(file + ": metadata key 'shards' must be a list of shard files");
  size_t i = 0;
  for (auto item = list.begin(); item != list.end(); ++item, ++i) {
    const std::string where = "shards[" + std::to_string(i) + "]";
    YamlReader r(*item, file, where);
    ShardRecord rec;
    rec.file = r.String("file");
    rec.first_rank = r.NonNegativeIntAtMost("first_rank", world - 1, -1);
    const int64_t bytes = r.NonNegativeInt("bytes", -1);
    const std::string crc = r.String("crc32c");
    const YAML::Node ranges = r.Child("tensors");
    PTDP_RETURN_IF_ERROR(r.Finish());
    if (!ranges.IsSequence())
      return Status::Error(file + ": " + where + ": tensors must be a list of [first, last) index ranges");
    for (size_t k = 0; k < ranges.size(); ++k) {
      uint64_t a = 0, b = 0;
      const YAML::Node& ab = ranges[k];
      const int64_t prev = rec.tensors.empty() ? 0 : rec.tensors.back().second;
      if (!ab.IsSequence() || ab.size() != 2 || !ab[0].IsScalar() || !ab[1].IsScalar() ||
          !ParseU64(ab[0].Scalar(), &a) || !ParseU64(ab[1].Scalar(), &b) || a >= b ||
          int64_t(a) < prev || b > kMaxElements)
        return Status::Error(file + ": " + where + ": tensors[" + std::to_string(k) +
                             "] is not an increasing [first, last) index range");
      rec.tensors.emplace_back(int64_t(a), int64_t(b));
    }
    if (rec.first_rank < 0 || bytes < 0)
      return Status::Error(file + ": " + where + ": needs first_rank and bytes");
    rec.bytes = uint64_t(bytes);
    char* end = nullptr;
    const unsigned long v = std::strtoul(crc.c_str(), &end, 16);
    if (crc.size() != 10 || crc.rfind("0x", 0) != 0 || *end != '\0' || v > 0xffffffffUL)
      return Status::Error(file + ": " + where + ": crc32c '" + crc + "' is not 0x and 8 hex digits");
    rec.crc32c = uint32_t(v);
    if (rec.file != ShardFileName(step, rec.first_rank))
      return Status::Error(file + ": " + where + ": file '" + rec.file + "' is not " +
                           ShardFileName(step, rec.first_rank) + ", the name of step " +
                           std::to_string(step) + "'s shard from rank " +
                           std::to_string(rec.first_rank));
    if (!out->empty() && out->back().first_rank >= rec.first_rank)
      return Status::Error(file + ": " + where + ": shards must be listed by increasing first_rank");
    out->push_back(std::move(rec));
  }
  return Status::Ok();
}

// Parses the metadata of a whole file (version 1) or a manifest (version 2) into `c` (tensors
// named and shaped, data not yet read), the table and, for a manifest, *manifest.
Status ParseMetadata(const std::string& text, const std::string& file, uint32_t file_version,
                     uint64_t data_bytes, Checkpoint* c, std::vector<TableEntry>* table,
                     Manifest* manifest) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, ParseYamlText(text, file + " (metadata)"));
  if (root.IsMap() && root["format"] && root["format"].IsScalar() &&
      root["format"].Scalar() == "ptdp-checkpoint-shard")
    return Status::Error(file + ": is one shard of a sharded checkpoint: read the checkpoint "
                         "through its manifest, step-NNNNNNNN.ckpt in the same folder");
  YamlReader r(root, file, "");
  const std::string format = r.String("format");
  const int64_t version = r.PositiveInt("version");
  c->state.step = r.NonNegativeInt("step", -1);
  c->state.optimizer_steps = r.NonNegativeInt("optimizer_steps", -1);
  const std::string seed = r.String("seed");
  c->global_batch = r.PositiveInt("global_batch");
  c->state.consumed_samples = r.NonNegativeInt("consumed_samples", -1);
  c->layout = r.String("layout", "");
  const YAML::Node model = r.Child("model");
  const YAML::Node optimizer = r.Child("optimizer");
  const YAML::Node tensors = r.Child("tensors");
  const bool sharded = file_version == kShardedVersion;
  YAML::Node shards;
  if (sharded) {
    manifest->world = r.PositiveIntAtMost("world", 1 << 24);
    shards = r.Child("shards");
  }
  if (format != "ptdp-checkpoint") r.Fail("format", "'" + format + "' is not ptdp-checkpoint");
  if (version != int64_t(file_version))
    r.Fail("version", std::to_string(version) + " is not the header's " + std::to_string(file_version));
  if (c->state.step < 0 || c->state.optimizer_steps < 0 || c->state.consumed_samples < 0)
    r.Fail("step", "step, optimizer_steps and consumed_samples are required");
  if (!ParseU64(seed, &c->seed)) r.Fail("seed", "'" + seed + "' is not an unsigned integer");
  PTDP_RETURN_IF_ERROR(r.Finish());
  if (!model.IsDefined() || model.IsNull()) return Status::Error(file + ": metadata has no model");
  PTDP_ASSIGN_OR_RETURN(c->model, ModelFromYaml(model, file, "model"));
  if (optimizer.IsDefined() && !optimizer.IsNull()) {
    if (!optimizer.IsMap()) return Status::Error(file + ": metadata key 'optimizer' must be a mapping");
    for (auto it = optimizer.begin(); it != optimizer.end(); ++it) {
      double v = 0;
      if (!it->second.IsScalar() || !ParseDouble(it->second.Scalar(), &v))
        return Status::Error(file + ": optimizer." + it->first.Scalar() + " is not a number");
      c->optimizer[it->first.Scalar()] = v;
    }
  }
  if (sharded)
    PTDP_RETURN_IF_ERROR(
        ReadShardTable(shards, file, c->state.step, manifest->world, &manifest->shards));
  PTDP_RETURN_IF_ERROR(ReadTable(tensors, file, data_bytes, /*with_offsets=*/!sharded, table));
  if (sharded)
    for (const ShardRecord& rec : manifest->shards)
      if (!rec.tensors.empty() && rec.tensors.back().second > int64_t(table->size()))
        return Status::Error(file + ": shard " + rec.file + ": tensor index " +
                             std::to_string(rec.tensors.back().second - 1) + " is beyond the " +
                             std::to_string(table->size()) + " tensors of the table");
  return Status::Ok();
}

// One entry of a shard's piece table.
struct PieceEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;                        // of the whole tensor
  uint64_t runs = 0, runs_offset = 0;        // the run table: runs x 16 bytes
  uint64_t elements = 0, offset = 0;         // the data: elements x 4 bytes
};

// What a shard's metadata says.
struct ShardMeta {
  int64_t step = -1, optimizer_steps = -1, consumed_samples = -1;
  int world = 0;
  std::vector<int> ranks;
  std::vector<PieceEntry> pieces;
};

static_assert(sizeof(ElementRun) == 16, "a run table entry is two u64");

Status ParseShardMetadata(const std::string& text, const std::string& file, uint64_t data_bytes,
                          ShardMeta* m) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, ParseYamlText(text, file + " (metadata)"));
  YamlReader r(root, file, "");
  const std::string format = r.String("format");
  const int64_t version = r.PositiveInt("version");
  m->step = r.NonNegativeInt("step", -1);
  m->optimizer_steps = r.NonNegativeInt("optimizer_steps", -1);
  m->consumed_samples = r.NonNegativeInt("consumed_samples", -1);
  m->world = r.PositiveIntAtMost("world", 1 << 24);
  const YAML::Node ranks = r.Child("ranks");
  const YAML::Node pieces = r.Child("pieces");
  if (format != "ptdp-checkpoint-shard")
    r.Fail("format", "'" + format + "' is not ptdp-checkpoint-shard");
  if (version != kShardedVersion) r.Fail("version", std::to_string(version) + " is not 2");
  if (m->step < 0 || m->optimizer_steps < 0 || m->consumed_samples < 0)
    r.Fail("step", "step, optimizer_steps and consumed_samples are required");
  PTDP_RETURN_IF_ERROR(r.Finish());
  if (!ranks.IsSequence() || ranks.size() == 0)
    return Status::Error(file + ": metadata key 'ranks' must be a list of global ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    uint64_t g = 0;
    if (!ranks[i].IsScalar() || !ParseU64(ranks[i].Scalar(), &g) || g >= uint64_t(m->world) ||
        (!m->ranks.empty() && int64_t(g) <= m->ranks.back()))
      return Status::Error(file + ": ranks[" + std::to_string(i) + "] must be increasing global "
                           "ranks below the world of " + std::to_string(m->world));
    m->ranks.push_back(int(g));
  }
  if (!pieces.IsDefined() || pieces.IsNull()) return Status::Ok();  // a rank may hold nothing
  if (!pieces.IsSequence()) return Status::Error(file + ": metadata key 'pieces' must be a list");
  uint64_t end = 0;  // where the previous section ends
  size_t i = 0;
  for (auto item = pieces.begin(); item != pieces.end(); ++item, ++i) {
    const std::string where = "pieces[" + std::to_string(i) + "]";
    YamlReader pr(*item, file, where);
    PieceEntry e;
    e.name = pr.String("name");
    const YAML::Node shape = pr.Child("shape");
    const int64_t runs = pr.NonNegativeInt("runs", -1), runs_offset = pr.NonNegativeInt("runs_offset", -1);
    const int64_t elements = pr.NonNegativeInt("elements", -1), offset = pr.NonNegativeInt("offset", -1);
    PTDP_RETURN_IF_ERROR(pr.Finish());
    if (runs < 0 || runs_offset < 0 || elements < 0 || offset < 0)
      return Status::Error(file + ": " + where + ": needs runs, runs_offset, elements and offset");
    if (!ParseShape(shape, &e.shape, &e.numel))
      return Status::Error(file + ": " + where + " (" + e.name + "): shape must be a list of at "
                           "most 8 sizes of at most 2^40 elements in all");
    e.runs = uint64_t(runs), e.runs_offset = uint64_t(runs_offset);
    e.elements = uint64_t(elements), e.offset = uint64_t(offset);
    // Two sections in order, each 64-aligned and inside the data: no size can overflow, since
    // each count is first bounded by the data bytes.
    const bool fits = e.runs <= data_bytes / sizeof(ElementRun) && e.elements <= e.numel &&
                      e.runs <= e.elements && e.runs_offset % kAlign == 0 &&
                      e.offset % kAlign == 0 && e.runs_offset >= end &&
                      e.runs_offset <= data_bytes &&
                      e.runs * sizeof(ElementRun) <= data_bytes - e.runs_offset &&
                      e.offset >= e.runs_offset + e.runs * sizeof(ElementRun) &&
                      e.offset <= data_bytes && e.elements * sizeof(float) <= data_bytes - e.offset;
    if (!fits)
      return Status::Error(file + ": " + where + " (" + e.name + "): " + std::to_string(e.runs) +
                           " runs at " + std::to_string(e.runs_offset) + " and " +
                           std::to_string(e.elements) + " elements at " + std::to_string(e.offset) +
                           " do not fit the data section of " + std::to_string(data_bytes) +
                           " bytes in order");
    end = e.offset + e.elements * sizeof(float);
    m->pieces.push_back(std::move(e));
  }
  return Status::Ok();
}

#if defined(__x86_64__)
// The SSE4.2 crc32 instruction computes the same CRC32C (same polynomial, same reflection),
// 8 bytes per instruction: ~4x the table version on the build machine.
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const void* data,
                                                       size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  for (; bytes > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --bytes)
    c = _mm_crc32_u8(uint32_t(c), *p++);
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  for (; bytes > 0; --bytes) c = _mm_crc32_u8(uint32_t(c), *p++);
  return ~uint32_t(c);
}
#endif

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return Crc32cSse42(crc, data, bytes);
#endif
  return Crc32cPortable(crc, data, bytes);
}

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t bytes) {
  const CrcTables& T = Tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; bytes > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --bytes)
    crc = (crc >> 8) ^ T.t[0][(crc ^ *p++) & 0xff];
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = T.t[7][w & 0xff] ^ T.t[6][(w >> 8) & 0xff] ^ T.t[5][(w >> 16) & 0xff] ^
          T.t[4][(w >> 24) & 0xff] ^ T.t[3][(w >> 32) & 0xff] ^ T.t[2][(w >> 40) & 0xff] ^
          T.t[1][(w >> 48) & 0xff] ^ T.t[0][w >> 56];
  }
  for (; bytes > 0; --bytes) crc = (crc >> 8) ^ T.t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

std::string CheckpointMetadataYaml(const Checkpoint& ckpt) {
  uint64_t end = 0;
  return MetadataYaml(ckpt, Offsets(ckpt, &end));
}

Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt,
                       const PartialWriteHook& hook) {
  uint64_t data_bytes = 0;
  const std::vector<uint64_t> offsets = Offsets(ckpt, &data_bytes);
  std::vector<Section> sections;
  for (size_t i = 0; i < ckpt.state.tensors.size(); ++i) {
    const NamedTensor& t = ckpt.state.tensors[i];
    assert(int64_t(t.data.size()) == Numel(t.shape));
    sections.push_back({offsets[i], t.data.data(), t.data.size() * sizeof(float)});
  }
  return WriteAtomically(path, kVersion, MetadataYaml(ckpt, offsets), sections, data_bytes, hook)
      .status();
}

std::string ShardFileName(int64_t step, int first_rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%08lld.rank%05d.shard", static_cast<long long>(step),
                first_rank);
  return buf;
}

std::vector<std::pair<int64_t, int64_t>> TensorRanges(const StateShard& shard) {
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < shard.tensors.size(); ++i) index[shard.tensors[i].name] = int64_t(i);
  std::vector<int64_t> held;
  for (const TensorPiece& p : shard.pieces) {
    auto it = index.find(p.name);
    assert(it != index.end());
    held.push_back(it->second);
  }
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i : held)
    if (!ranges.empty() && ranges.back().second == i)
      ++ranges.back().second;
    else
      ranges.emplace_back(i, i + 1);
  return ranges;
}

Result<ShardRecord> WriteCheckpointShard(const std::string& path, const StateShard& shard,
                                         const PartialWriteHook& hook) {
  assert(!shard.ranks.empty());
  std::ostringstream o;
  o << "# ptdp checkpoint shard: one process's ranks' part of the training state; the byte "
       "layout is described in runtime/checkpoint.h\n"
    << "format: ptdp-checkpoint-shard\n"
    << "version: " << kShardedVersion << "\n"
    << "step: " << shard.step << "\n"
    << "optimizer_steps: " << shard.optimizer_steps << "\n"
    << "consumed_samples: " << shard.consumed_samples << "\n"
    << "world: " << shard.world << "\n"
    << "ranks: [";
  for (size_t i = 0; i < shard.ranks.size(); ++i) o << (i ? ", " : "") << shard.ranks[i];
  o << "]\n" << (shard.pieces.empty() ? "pieces: []\n" : "pieces:\n");
  std::vector<Section> sections;
  uint64_t at = 0;
  for (const TensorPiece& p : shard.pieces) {
    int64_t count = 0;
    for (const ElementRun& run : p.runs) count += run.length;
    assert(count == int64_t(p.data.size()));
    (void)count;
    const uint64_t runs_offset = AlignUp(at);
    const uint64_t offset = AlignUp(runs_offset + p.runs.size() * sizeof(ElementRun));
    sections.push_back({runs_offset, p.runs.data(), p.runs.size() * sizeof(ElementRun)});
    sections.push_back({offset, p.data.data(), p.data.size() * sizeof(float)});
    at = offset + p.data.size() * sizeof(float);
    o << "  - {name: " << YamlQuote(p.name) << ", shape: " << ShapeYaml(p.shape)
      << ", runs: " << p.runs.size() << ", runs_offset: " << runs_offset
      << ", elements: " << p.data.size() << ", offset: " << offset << "}\n";
  }
  PTDP_ASSIGN_OR_RETURN(Written w,
                        WriteAtomically(path, kShardedVersion, o.str(), sections, at, hook));
  ShardRecord rec;
  rec.file = std::filesystem::path(path).filename().string();
  rec.first_rank = shard.ranks.front();
  rec.bytes = w.bytes;
  rec.crc32c = w.crc32c;
  rec.tensors = TensorRanges(shard);
  return rec;
}

Result<ShardRecord> WriteCheckpointContainer(const std::string& path, uint32_t version,
                                             const std::string& meta, const std::string& data) {
  PTDP_ASSIGN_OR_RETURN(Written w, WriteAtomically(path, version, meta, {{0, data.data(), data.size()}},
                                                   data.size(), nullptr));
  ShardRecord rec;
  rec.file = std::filesystem::path(path).filename().string();
  rec.bytes = w.bytes;
  rec.crc32c = w.crc32c;
  return rec;
}

Status WriteCheckpointManifest(const std::string& path, const Checkpoint& ckpt, int world,
                               std::vector<ShardRecord> shards) {
  std::sort(shards.begin(), shards.end(),
            [](const ShardRecord& a, const ShardRecord& b) { return a.first_rank < b.first_rank; });
  std::ostringstream o;
  o << CommonMetadataYaml(ckpt, kShardedVersion) << "world: " << world << "\n"
    << "# every shard with its size and CRC32C: a checkpoint is whole when all of them are\n"
    << "shards:\n";
  for (const ShardRecord& r : shards)
    o << "  - {file: " << YamlQuote(r.file) << ", first_rank: " << r.first_rank
      << ", bytes: " << r.bytes << ", crc32c: " << YamlQuote(Hex(r.crc32c)) << ", tensors: "
      << RangesYaml(r.tensors) << "}\n";
  o << (ckpt.state.tensors.empty() ? "tensors: []\n" : "tensors:\n");
  for (const NamedTensor& t : ckpt.state.tensors)
    o << "  - {name: " << YamlQuote(t.name) << ", shape: " << ShapeYaml(t.shape) << "}\n";
  return WriteAtomically(path, kShardedVersion, o.str(), {}, 0, nullptr).status();
}

namespace {
// A checkpoint's metadata is its YAML header and tensor table: ~80 bytes per tensor, three
// tensors (parameter, m, v) per weight. 64 MiB holds ~800k tensors, far above any model (a
// 1,000-layer model has ~50k); a larger value is a damaged or crafted header.
constexpr uint64_t kMaxMetadataBytes = 64 * kMiB;

// Reads one file of any kind: Open checks everything that can be checked before a byte is
// interpreted (the header, the sizes, the trailer and the CRC32C of the whole file) and reads
// the metadata; Read then gives data sections in increasing offset order and Finish checks that
// the second pass over the bytes has the same CRC32C (a file changed while it was read).
class ContainerReader {
 public:
  Status Open(const std::string& path);
  uint32_t version() const { return version_; }
  const std::string& metadata() const { return meta_; }
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint32_t stored_crc() const { return stored_; }
  // `bytes` bytes at `offset` of the data section into dst; offset >= the end of the last read.
  Status Read(uint64_t offset, void* dst, size_t bytes);
  Status Finish();

 private:
  std::string path_;
  Fd fd_{-1};
  uint32_t version_ = 0, stored_ = 0, crc_ = 0;
  uint64_t file_bytes_ = 0, data_bytes_ = 0;
  uint64_t at_ = 0;  // the data read so far
  std::string meta_;
};

Status ContainerReader::Open(const std::string& path) {
  path_ = path;
  // O_NONBLOCK: a FIFO named like a checkpoint would block the open until a writer came.
  fd_.Reset(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  const int fd = fd_.get();
  if (fd < 0) return Status::Error(path + ": cannot open checkpoint: " + Errno());
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::Error(path + ": cannot stat: " + Errno());
  if (!S_ISREG(st.st_mode))
    return Status::Error(path + ": is not a regular file (a " +
                         (S_ISDIR(st.st_mode) ? "directory" : "FIFO, socket or device") +
                         "), not a checkpoint");
  const uint64_t size = uint64_t(st.st_size);
  if (size < kHeaderBytes + kTrailerBytes)
    return Status::Error(path + ": truncated or not a checkpoint: " + std::to_string(size) +
                         " bytes, less than the " + std::to_string(kHeaderBytes + kTrailerBytes) +
                         "-byte minimum");
  char head[kHeaderBytes];
  PTDP_RETURN_IF_ERROR(ReadAll(fd, head, sizeof head, nullptr, path));
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0)
    return Status::Error(path + ": not a ptdp checkpoint (no PTDPCKPT magic)");
  version_ = GetU32(head + 8);
  if (version_ != kVersion && version_ != kShardedVersion)
    return Status::Error(path + ": checkpoint format version " + std::to_string(version_) +
                         ", this ptdp reads versions " + std::to_string(kVersion) + " and " +
                         std::to_string(kShardedVersion));
  file_bytes_ = GetU64(head + 16);
  const uint64_t meta_bytes = GetU64(head + 24);
  const uint64_t data_offset = GetU64(head + 32);
  data_bytes_ = GetU64(head + 40);
  if (size < file_bytes_)
    return Status::Error(path + ": truncated: " + std::to_string(size) + " bytes of the " +
                         std::to_string(file_bytes_) + " its header records");
  if (size > file_bytes_)
    return Status::Error(path + ": " + std::to_string(size) + " bytes, more than the " +
                         std::to_string(file_bytes_) + " its header records (appended to?)");
  if (meta_bytes > file_bytes_ || data_offset != AlignUp(kHeaderBytes + meta_bytes) ||
      data_offset > file_bytes_ - kTrailerBytes ||
      data_bytes_ != file_bytes_ - kTrailerBytes - data_offset)
    return Status::Error(path + ": corrupt header: metadata " + std::to_string(meta_bytes) +
                         " bytes, data at " + std::to_string(data_offset) + " for " +
                         std::to_string(data_bytes_) + " bytes do not add up to " +
                         std::to_string(file_bytes_));
  if (meta_bytes > kMaxMetadataBytes)
    return Status::Error(path + ": corrupt header: " + ByteSize(meta_bytes) +
                         " of metadata, more than the " + ByteSize(kMaxMetadataBytes) +
                         " a checkpoint may have");

  // Pass 1: the CRC32C of every byte, before any of them is interpreted: a damaged or crafted
  // metadata block costs a read, never a parse (a 7 MB crafted table took 22 s and 839 MB to
  // be refused when it was parsed first).
  if (::lseek(fd, 0, SEEK_SET) != 0) return Status::Error(path + ": cannot seek: " + Errno());
  uint32_t crc = 0;
  PTDP_RETURN_IF_ERROR(SkipAll(fd, file_bytes_ - kTrailerBytes, &crc, path));
  char tail[kTrailerBytes];
  PTDP_RETURN_IF_ERROR(ReadAll(fd, tail, sizeof tail, nullptr, path));
  if (std::memcmp(tail + 4, kEnd, sizeof kEnd) != 0)
    return Status::Error(path + ": corrupt trailer (no END1 mark): damaged or not written by ptdp");
  stored_ = GetU32(tail);
  if (stored_ != crc)
    return Status::Error(path + ": checksum mismatch: stored CRC32C " + Hex(stored_) +
                         ", computed " + Hex(crc) + ": the file was altered or damaged");

  // Pass 2 starts: the header and metadata again, with the CRC computed once more.
  if (::lseek(fd, 0, SEEK_SET) != 0) return Status::Error(path + ": cannot seek: " + Errno());
  PTDP_RETURN_IF_ERROR(ReadAll(fd, head, sizeof head, &crc_, path));
  meta_.assign(size_t(data_offset - kHeaderBytes), '\0');
  PTDP_RETURN_IF_ERROR(ReadAll(fd, meta_.data(), meta_.size(), &crc_, path));
  meta_.resize(size_t(meta_bytes));
  return Status::Ok();
}

Status ContainerReader::Read(uint64_t offset, void* dst, size_t bytes) {
  assert(offset >= at_ && offset + bytes <= data_bytes_);
  PTDP_RETURN_IF_ERROR(SkipAll(fd_.get(), offset - at_, &crc_, path_));
  PTDP_RETURN_IF_ERROR(ReadAll(fd_.get(), dst, bytes, &crc_, path_));
  at_ = offset + bytes;
  return Status::Ok();
}

Status ContainerReader::Finish() {
  PTDP_RETURN_IF_ERROR(SkipAll(fd_.get(), data_bytes_ - at_, &crc_, path_));
  at_ = data_bytes_;
  if (crc_ != stored_)
    return Status::Error(path_ + ": changed while it was read (CRC32C " + Hex(crc_) +
                         " on the second pass, " + Hex(stored_) + " stored)");
  return Status::Ok();
}

// "[a, b)" of a tensor's flat elements, for messages.
std::string Range(int64_t a, int64_t b) {
  return "elements " + std::to_string(a) + ".." + std::to_string(b - 1);
}

// Whether `ranges` ([first, last), increasing) holds index i.
bool InRanges(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t i) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), i,
                             [](int64_t x, const std::pair<int64_t, int64_t>& r) { return x < r.second; });
  return it != ranges.end() && it->first <= i;
}

// What AssembleShards keeps while it reads the shards.
struct Assembly {
  std::vector<bool> want;                      // by table index
  std::map<std::string, size_t> index;         // table index by name
  std::vector<size_t> slot;                    // table index -> c->state.tensors (wanted ones)
  std::vector<std::vector<ElementRun>> covered;  // every shard's runs, by table index
  std::vector<int> holder;                     // the shard (index into `read`) of each rank
  std::vector<const ShardRecord*> read;        // the shards opened
  std::vector<float> buf;                      // a piece's elements
};

// A piece's run table, each run checked: non-empty, increasing, inside the tensor, the counts
// adding up to the piece's elements.
Result<std::vector<ElementRun>> ReadRuns(ContainerReader& r, const PieceEntry& e,
                                         const std::string& path) {
  std::vector<ElementRun> runs(size_t(e.runs));
  PTDP_RETURN_IF_ERROR(r.Read(e.runs_offset, runs.data(), runs.size() * sizeof(ElementRun)));
  uint64_t count = 0;
  int64_t end = 0;
  for (const ElementRun& run : runs) {
    if (run.length <= 0 || run.start < end || uint64_t(run.start) > e.numel ||
        uint64_t(run.length) > e.numel - uint64_t(run.start))
      return Status::Error(path + ": tensor '" + e.name + "': run (" + std::to_string(run.start) +
                           ", " + std::to_string(run.length) +
                           ") is empty, out of order or outside its " + std::to_string(e.numel) +
                           " elements");
    end = run.start + run.length;
    count += uint64_t(run.length);
  }
  if (count != e.elements)
    return Status::Error(path + ": tensor '" + e.name + "': its runs hold " +
                         std::to_string(count) + " elements, the piece records " +
                         std::to_string(e.elements));
  return runs;
}

// Shard a.read[si]: checked against its record and the manifest (`mp`, counters in `c`), then
// its wanted pieces scattered into c->state.tensors.
Status ReadShard(size_t si, const std::string& dir, const std::string& mp, const Manifest& m,
                 const std::vector<TableEntry>& table, Assembly* a, Checkpoint* c) {
  const ShardRecord& rec = *a->read[si];
  const std::string path = dir + "/" + rec.file;
  ContainerReader r;
  PTDP_RETURN_IF_ERROR(r.Open(path));
  if (r.file_bytes() != rec.bytes || r.stored_crc() != rec.crc32c)
    return Status::Error(path + ": CRC32C " + Hex(r.stored_crc()) + ", the manifest " + mp +
                         " records " + Hex(rec.crc32c) +
                         ": a shard of another run or another save of this step");
  if (r.version() != kShardedVersion)
    return Status::Error(path + ": a whole-tensor file, not a shard of " + mp);
  ShardMeta sm;
  PTDP_RETURN_IF_ERROR(ParseShardMetadata(r.metadata(), path, r.data_bytes(), &sm));
  if (sm.step != c->state.step || sm.optimizer_steps != c->state.optimizer_steps ||
      sm.consumed_samples != c->state.consumed_samples || sm.world != m.world)
    return Status::Error(path + ": step " + std::to_string(sm.step) + " of a world of " +
                         std::to_string(sm.world) + " ranks, but the manifest " + mp +
                         " is step " + std::to_string(c->state.step) + " of " +
                         std::to_string(m.world) + " (or their counters differ)");
  if (sm.ranks.front() != rec.first_rank)
    return Status::Error(path + ": its first rank is " + std::to_string(sm.ranks.front()) +
                         ", the manifest " + mp + " records " + std::to_string(rec.first_rank));
  for (int g : sm.ranks) {
    if (a->holder[size_t(g)] >= 0)
      return Status::Error(path + ": rank " + std::to_string(g) + " is also in " +
                           a->read[size_t(a->holder[size_t(g)])]->file);
    a->holder[size_t(g)] = int(si);
  }
  for (const PieceEntry& e : sm.pieces) {
    auto it = a->index.find(e.name);
    if (it == a->index.end())
      return Status::Error(path + ": tensor '" + e.name + "' is not in the manifest " + mp);
    const size_t ti = it->second;
    if (!InRanges(rec.tensors, int64_t(ti)))
      return Status::Error(path + ": has a piece of tensor '" + e.name + "', which the manifest " +
                           mp + " does not list for this shard");
    if (e.shape != table[ti].shape)
      return Status::Error(path + ": tensor '" + e.name + "' has shape " + ShapeYaml(e.shape) +
                           ", the manifest " + mp + " says " + ShapeYaml(table[ti].shape));
    if (!a->want[ti]) continue;  // its bytes are still read, for the CRC, by Finish
    PTDP_ASSIGN_OR_RETURN(std::vector<ElementRun> runs, ReadRuns(r, e, path));
    a->buf.resize(size_t(e.elements));
    PTDP_RETURN_IF_ERROR(r.Read(e.offset, a->buf.data(), a->buf.size() * sizeof(float)));
    std::vector<float>& data = c->state.tensors[a->slot[ti]].data;
    size_t k = 0;
    for (const ElementRun& run : runs) {
      std::copy(a->buf.begin() + ptrdiff_t(k), a->buf.begin() + ptrdiff_t(k + size_t(run.length)),
                data.begin() + ptrdiff_t(run.start));
      k += size_t(run.length);
    }
    a->covered[ti].insert(a->covered[ti].end(), runs.begin(), runs.end());
  }
  PTDP_RETURN_IF_ERROR(r.Finish());
  c->read_bytes += r.file_bytes();
  return Status::Ok();
}

// Every element of every wanted tensor in exactly one shard read.
Status CheckCoverage(const std::string& mp, const std::vector<TableEntry>& table, Assembly* a) {
  for (size_t ti = 0; ti < table.size(); ++ti) {
    if (!a->want[ti]) continue;
    std::vector<ElementRun>& cov = a->covered[ti];
    std::sort(cov.begin(), cov.end(),
              [](const ElementRun& x, const ElementRun& y) { return x.start < y.start; });
    int64_t end = 0;
    const int64_t n = Numel(table[ti].shape);
    const std::string what = mp + ": tensor '" + table[ti].name + "': ";
    for (const ElementRun& run : cov) {
      if (run.start < end)
        return Status::Error(what + Range(run.start, std::min(end, run.start + run.length)) +
                             " are in two shards");
      if (run.start > end) return Status::Error(what + Range(end, run.start) + " are in no shard");
      end = run.start + run.length;
    }
    if (end < n) return Status::Error(what + Range(end, n) + " are in no shard");
  }
  return Status::Ok();
}

// Reads the shards a manifest lists into whole tensors: `c` has the manifest's counters and
// `table` its tensors; fills c->state.tensors with the wanted ones (all without a filter),
// opening only the shards that hold pieces of them.
Status AssembleShards(const std::string& manifest_path, const Manifest& m,
                      const std::vector<TableEntry>& table, const TensorFilter& wanted,
                      Checkpoint* c) {
  const std::string dir = FolderOf(manifest_path);
  const std::string& mp = manifest_path;
  Assembly a;
  a.want.resize(table.size());
  for (size_t i = 0; i < table.size(); ++i) a.want[i] = !wanted || wanted(table[i].name);
  for (const ShardRecord& rec : m.shards) {
    bool needed = !wanted;
    for (const auto& [first, last] : rec.tensors)
      for (int64_t i = first; i < last && !needed; ++i) needed = a.want[size_t(i)];
    if (needed) a.read.push_back(&rec);
  }
  // Sizes first: every shard read must be there with the recorded size, and together they must
  // be able to hold every wanted element once (4 bytes each) before any tensor is allocated: a
  // crafted manifest cannot make the reader allocate more than the shards hold.
  uint64_t shard_bytes = 0, numel = 0;
  for (const ShardRecord* rec : a.read) {
    const std::string path = dir + "/" + rec->file;
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec)
      return Status::Error(path + ": a shard of checkpoint " + mp + " is missing or unreadable (" +
                           ec.message() + ")");
    if (uint64_t(size) != rec->bytes)
      return Status::Error(path + ": " + std::to_string(size) + " bytes, the manifest " + mp +
                           " records " + std::to_string(rec->bytes) +
                           ": a shard of another run or another save of this step");
    shard_bytes += rec->bytes;
  }
  for (size_t i = 0; i < table.size(); ++i)
    if (a.want[i]) numel += uint64_t(Numel(table[i].shape));
  if (numel > shard_bytes / sizeof(float))
    return Status::Error(mp + ": its tensors have " + std::to_string(numel) +
                         " elements, more than its shards' " + ByteSize(shard_bytes) + " can hold");
  a.slot.assign(table.size(), SIZE_MAX);
  for (size_t i = 0; i < table.size(); ++i) {
    a.index[table[i].name] = i;
    if (!a.want[i]) continue;
    a.slot[i] = c->state.tensors.size();
    c->state.tensors.push_back({table[i].name, table[i].shape,
                                std::vector<float>(size_t(Numel(table[i].shape)), 0.0f)});
  }
  a.covered.resize(table.size());
  a.holder.assign(size_t(m.world), -1);
  for (size_t si = 0; si < a.read.size(); ++si)
    PTDP_RETURN_IF_ERROR(ReadShard(si, dir, mp, m, table, &a, c));
  if (!wanted)  // with a filter only some shards were opened
    for (int g = 0; g < m.world; ++g)
      if (a.holder[size_t(g)] < 0)
        return Status::Error(mp + ": rank " + std::to_string(g) + " of " + std::to_string(m.world) +
                             " is in none of its " + std::to_string(m.shards.size()) + " shards");
  PTDP_RETURN_IF_ERROR(CheckCoverage(mp, table, &a));
  c->read_shards = int(a.read.size());
  c->shards = int(m.shards.size());
  return Status::Ok();
}

}  // namespace

Result<Checkpoint> ReadCheckpoint(const std::string& path, const TensorFilter& wanted) {
  ContainerReader r;
  PTDP_RETURN_IF_ERROR(r.Open(path));
  Checkpoint c;
  std::vector<TableEntry> table;
  Manifest manifest;
  PTDP_RETURN_IF_ERROR(
      ParseMetadata(r.metadata(), path, r.version(), r.data_bytes(), &c, &table, &manifest));
  if (r.version() == kVersion)
    for (const TableEntry& e : table) {
      if (wanted && !wanted(e.name)) continue;  // read for the CRC only, by Finish
      NamedTensor t{e.name, e.shape, std::vector<float>(size_t(Numel(e.shape)))};
      PTDP_RETURN_IF_ERROR(r.Read(e.offset, t.data.data(), t.data.size() * sizeof(float)));
      c.state.tensors.push_back(std::move(t));
    }
  PTDP_RETURN_IF_ERROR(r.Finish());
  c.read_bytes = r.file_bytes();
  if (r.version() == kShardedVersion)
    PTDP_RETURN_IF_ERROR(AssembleShards(path, manifest, table, wanted, &c));
  return c;
}

Result<bool> IsShardedCheckpoint(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return Status::Error(path + ": cannot open checkpoint: " + Errno());
  char head[12];
  const ssize_t n = ::pread(fd.get(), head, sizeof head, 0);
  if (n != ssize_t(sizeof head) || std::memcmp(head, kMagic, sizeof kMagic) != 0)
    return false;  // not a checkpoint at all: ReadCheckpoint says why
  return GetU32(head + 8) == kShardedVersion;
}

// ---- the checkpoint folder

std::string CheckpointFileName(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld.ckpt", static_cast<long long>(step));
  return buf;
}

namespace {

// The step of a "step-<digits>.ckpt" name, or -1.
int64_t StepOfName(const std::string& name) {
  const std::string pre = "step-", suf = ".ckpt";
  if (name.size() <= pre.size() + suf.size() || name.rfind(pre, 0) != 0 ||
      name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
    return -1;
  const std::string digits = name.substr(pre.size(), name.size() - pre.size() - suf.size());
  uint64_t v = 0;
  if (!ParseU64(digits, &v) || v > uint64_t(std::numeric_limits<int64_t>::max())) return -1;
  return int64_t(v);
}

// The step of a "step-<digits>.rank<digits>.shard" name, or -1.
int64_t ShardStepOfName(const std::string& name) {
  const std::string suf = ".shard";
  const size_t dot = name.find(".rank");
  if (dot == std::string::npos || name.size() <= dot + 5 + suf.size() ||
      name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
    return -1;
  const std::string rank = name.substr(dot + 5, name.size() - suf.size() - dot - 5);
  uint64_t r = 0;
  if (!ParseU64(rank, &r)) return -1;
  return StepOfName(name.substr(0, dot) + ".ckpt");
}

Result<std::vector<std::filesystem::path>> Entries(const std::string& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> out;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return Status::Error(dir + ": cannot list the checkpoint folder: " + ec.message());
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return Status::Error(dir + ": cannot list the checkpoint folder: " + ec.message());
    out.push_back(it->path());
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> ListCheckpoints(const std::string& dir) {
  PTDP_ASSIGN_OR_RETURN(auto entries, Entries(dir));
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& p : entries) {
    const int64_t step = StepOfName(p.filename().string());
    if (step >= 0) found.emplace_back(step, p.string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace {

// Removes `p` if it is there; adds its name to *removed when it was.
Status RemoveIfThere(const std::filesystem::path& p, const char* what,
                     std::vector<std::string>* removed) {
  std::error_code ec;
  const bool was_there = std::filesystem::remove(p, ec);
  if (ec) return Status::Error(p.string() + ": cannot delete " + what + ": " + ec.message());
  if (was_there) removed->push_back(p.string());  // else gone since the listing: nothing to do
  return Status::Ok();
}

// The shard files of `step` in `dir`.
Result<std::vector<std::filesystem::path>> ShardsOfStep(const std::string& dir, int64_t step) {
  PTDP_ASSIGN_OR_RETURN(auto entries, Entries(dir));
  std::vector<std::filesystem::path> out;
  for (const auto& p : entries)
    if (ShardStepOfName(p.filename().string()) == step) out.push_back(p);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Result<std::vector<std::string>> RemoveIncompleteCheckpoints(const std::string& dir) {
  PTDP_ASSIGN_OR_RETURN(auto entries, Entries(dir));
  std::unordered_set<int64_t> complete;  // steps with a checkpoint file
  for (const auto& p : entries) {
    const int64_t step = StepOfName(p.filename().string());
    if (step >= 0) complete.insert(step);
  }
  std::vector<std::string> removed;
  for (const auto& p : entries) {
    const std::string name = p.filename().string();
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    const std::string base = tmp ? name.substr(0, name.size() - 4) : name;
    const int64_t shard_step = ShardStepOfName(base);
    if (tmp && (StepOfName(base) >= 0 || shard_step >= 0))
      PTDP_RETURN_IF_ERROR(RemoveIfThere(p, "an incomplete checkpoint", &removed));
    else if (!tmp && shard_step >= 0 && !complete.count(shard_step))
      PTDP_RETURN_IF_ERROR(RemoveIfThere(p, "a shard without a manifest", &removed));
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

Result<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int keep) {
  assert(keep >= 1);
  PTDP_ASSIGN_OR_RETURN(std::vector<std::string> all, ListCheckpoints(dir));
  std::vector<std::string> removed, shards;
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    PTDP_RETURN_IF_ERROR(RemoveIfThere(all[i], "an old checkpoint", &removed));
    const int64_t step = StepOfName(std::filesystem::path(all[i]).filename().string());
    PTDP_ASSIGN_OR_RETURN(auto of_step, ShardsOfStep(dir, step));
    for (const auto& p : of_step) PTDP_RETURN_IF_ERROR(RemoveIfThere(p, "an old shard", &shards));
  }
  return removed;
}

Result<std::vector<std::string>> RemoveStaleShards(const std::string& dir, int64_t step,
                                                   const std::vector<std::string>& keep) {
  PTDP_ASSIGN_OR_RETURN(auto of_step, ShardsOfStep(dir, step));
  std::vector<std::string> removed;
  for (const auto& p : of_step)
    if (std::find(keep.begin(), keep.end(), p.filename().string()) == keep.end())
      PTDP_RETURN_IF_ERROR(RemoveIfThere(p, "a stale shard", &removed));
  return removed;
}

namespace {

// "pid 1234, host vm, since 2026-11-29T10:00:00Z": who holds a lock, as its file records it.
std::string HolderLine() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char since[32];
  std::strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return "pid " + std::to_string(::getpid()) + ", host " + host + ", since " + since;
}

// The holder a lock file records, printable ASCII only (the file is anyone's to write), at most
// 200 characters. The holder writes it right after taking the lock, so an empty file is read
// again for up to 0.5 s.
std::string ReadHolder(int fd) {
  std::string text;
  for (int attempt = 0; attempt < 50 && text.empty(); ++attempt) {
    if (attempt > 0) ::usleep(10000);
    char buf[201];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] >= 0x20 && buf[i] < 0x7f) text += buf[i];
  }
  return text.empty() ? "the holder has not recorded itself" : text;
}

}  // namespace

// Removing the file on release would let a third run lock a new file while a second still
// holds the old, unlinked one; so a taker checks, after flock, that the file it locked is still
// the one under the name (else it tries again), and the holder unlinks the name before closing.
Result<std::unique_ptr<CheckpointFolderLock>> CheckpointFolderLock::Acquire(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointLockName;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      const int err = errno;
      return SysError(path + ": cannot create the checkpoint folder's lock file", err);
    }
    Fd owner(fd);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK)
        return Status::Error(dir + ": in use by another run (" + ReadHolder(fd) + "; lock file " +
                             path + "): wait for it to end or use another folder");
      return SysError(path + ": cannot lock", err);
    }
    struct stat locked{}, named{};
    if (::fstat(fd, &locked) != 0) {
      const int err = errno;
      return SysError(path + ": cannot stat", err);
    }
    if (::stat(path.c_str(), &named) != 0 || named.st_ino != locked.st_ino ||
        named.st_dev != locked.st_dev)
      continue;  // its holder removed it between our open and flock: lock the new one
    const std::string holder = HolderLine() + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, holder.data(), holder.size(), 0) < 0) {
      const int err = errno;
      return SysError(path + ": cannot write the lock file", err);
    }
    auto lock = std::unique_ptr<CheckpointFolderLock>(new CheckpointFolderLock(fd, path));
    owner.Release();
    return lock;
  }
  return Status::Error(path + ": the lock file keeps being replaced; another run is starting "
                       "and ending in this folder over and over");
}

CheckpointFolderLock::CheckpointFolderLock(int fd, std::string path)
    : fd_(fd), path_(std::move(path)) {}

CheckpointFolderLock::~CheckpointFolderLock() {
  ::unlink(path_.c_str());  // while locked: see Acquire
  ::close(fd_);
}

}  // namespace ptdp::rt
