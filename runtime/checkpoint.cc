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
constexpr uint32_t kVersion = 1;
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

std::string MetadataYaml(const Checkpoint& c, const std::vector<uint64_t>& offsets) {
  std::ostringstream o;
  o << "# ptdp checkpoint metadata; the byte layout is described in runtime/checkpoint.h\n"
    << "format: ptdp-checkpoint\n"
    << "version: " << kVersion << "\n"
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
  o << "tensors:\n";
  for (size_t i = 0; i < c.state.tensors.size(); ++i) {
    const NamedTensor& t = c.state.tensors[i];
    o << "  - {name: " << YamlQuote(t.name) << ", shape: [";
    for (size_t k = 0; k < t.shape.size(); ++k) o << (k ? ", " : "") << t.shape[k];
    o << "], offset: " << offsets[i] << "}\n";
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

 private:
  int fd_;
};

Status WriteFile(const std::string& tmp, const Checkpoint& c, const PartialWriteHook& hook) {
  uint64_t data_bytes = 0;
  const std::vector<uint64_t> offsets = Offsets(c, &data_bytes);
  const std::string meta = MetadataYaml(c, offsets);
  const uint64_t data_offset = AlignUp(kHeaderBytes + meta.size());
  const uint64_t file_bytes = data_offset + data_bytes + kTrailerBytes;

  std::string head(kMagic, sizeof kMagic);
  PutU32(head, kVersion);
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
  const char zeros[kAlign] = {};
  uint64_t at = 0;
  bool hooked = !hook;
  for (size_t i = 0; i < c.state.tensors.size(); ++i) {
    const NamedTensor& t = c.state.tensors[i];
    assert(int64_t(t.data.size()) == Numel(t.shape));
    PTDP_RETURN_IF_ERROR(WriteAll(fd.get(), zeros, size_t(offsets[i] - at), &crc, tmp));
    const size_t bytes = t.data.size() * sizeof(float);
    PTDP_RETURN_IF_ERROR(WriteAll(fd.get(), t.data.data(), bytes, &crc, tmp));
    at = offsets[i] + bytes;
    if (!hooked && at * 2 >= data_bytes) {
      hooked = true;
      hook(tmp);
    }
  }
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
  return Status::Ok();
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

// One entry of the tensor table.
struct TableEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
};

Status ReadTable(const YAML::Node& list, const std::string& file, uint64_t data_bytes,
                 std::vector<TableEntry>* out) {
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
    const int64_t offset = r.NonNegativeInt("offset", -1);
    PTDP_RETURN_IF_ERROR(r.Finish());
    if (offset < 0) return Status::Error(file + ": " + where + ": missing offset");
    e.offset = uint64_t(offset);
    if (!shape.IsSequence() || shape.size() > 8)
      return Status::Error(file + ": " + where + " (" + e.name + "): shape must be a list of at most 8 sizes");
    uint64_t numel = 1;
    for (size_t k = 0; k < shape.size(); ++k) {
      uint64_t d = 0;
      if (!shape[k].IsScalar() || !ParseU64(shape[k].Scalar(), &d) || d > data_bytes)
        return Status::Error(file + ": " + where + " (" + e.name + "): bad size in shape");
      e.shape.push_back(int64_t(d));
      numel = d == 0 ? 0 : (numel > data_bytes / d ? data_bytes + 1 : numel * d);
    }
    const uint64_t bytes = numel > data_bytes ? data_bytes + 1 : numel * sizeof(float);
    if (e.offset < end || e.offset % kAlign != 0 || e.offset > data_bytes ||
        bytes > data_bytes - e.offset)
      return Status::Error(file + ": " + where + " (" + e.name + "): offset " +
                           std::to_string(e.offset) + " and size do not fit the data section of " +
                           std::to_string(data_bytes) + " bytes in order");
    end = e.offset + bytes;
    if (!names.insert(e.name).second)  // a hash set: a pairwise check is quadratic
      return Status::Error(file + ": tensor '" + e.name + "' appears twice");
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

// Parses the metadata into `c` (tensors named and shaped, data not yet read) and the table.
Status ParseMetadata(const std::string& text, const std::string& file, uint64_t data_bytes,
                     Checkpoint* c, std::vector<TableEntry>* table) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, ParseYamlText(text, file + " (metadata)"));
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
  if (format != "ptdp-checkpoint") r.Fail("format", "'" + format + "' is not ptdp-checkpoint");
  if (version != kVersion) r.Fail("version", std::to_string(version) + " is not 1");
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
  return ReadTable(tensors, file, data_bytes, table);
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
  const std::string tmp = path + ".tmp";
  Status st = WriteFile(tmp, ckpt, hook);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return RenameIntoPlace(tmp, path);
}

namespace {
// A checkpoint's metadata is its YAML header and tensor table: ~80 bytes per tensor, three
// tensors (parameter, m, v) per weight. 64 MiB holds ~800k tensors, far above any model (a
// 1,000-layer model has ~50k); a larger value is a damaged or crafted header.
constexpr uint64_t kMaxMetadataBytes = 64 * kMiB;
}  // namespace

Result<Checkpoint> ReadCheckpoint(const std::string& path) {
  // O_NONBLOCK: a FIFO named like a checkpoint would block the open until a writer came.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return Status::Error(path + ": cannot open checkpoint: " + Errno());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::Error(path + ": cannot stat: " + Errno());
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
  PTDP_RETURN_IF_ERROR(ReadAll(fd.get(), head, sizeof head, nullptr, path));
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0)
    return Status::Error(path + ": not a ptdp checkpoint (no PTDPCKPT magic)");
  const uint32_t version = GetU32(head + 8);
  if (version != kVersion)
    return Status::Error(path + ": checkpoint format version " + std::to_string(version) +
                         ", this ptdp reads version " + std::to_string(kVersion));
  const uint64_t file_bytes = GetU64(head + 16), meta_bytes = GetU64(head + 24);
  const uint64_t data_offset = GetU64(head + 32), data_bytes = GetU64(head + 40);
  if (size < file_bytes)
    return Status::Error(path + ": truncated: " + std::to_string(size) + " bytes of the " +
                         std::to_string(file_bytes) + " its header records");
  if (size > file_bytes)
    return Status::Error(path + ": " + std::to_string(size) + " bytes, more than the " +
                         std::to_string(file_bytes) + " its header records (appended to?)");
  if (meta_bytes > file_bytes || data_offset != AlignUp(kHeaderBytes + meta_bytes) ||
      data_offset > file_bytes - kTrailerBytes ||
      data_bytes != file_bytes - kTrailerBytes - data_offset)
    return Status::Error(path + ": corrupt header: metadata " + std::to_string(meta_bytes) +
                         " bytes, data at " + std::to_string(data_offset) + " for " +
                         std::to_string(data_bytes) + " bytes do not add up to " +
                         std::to_string(file_bytes));
  if (meta_bytes > kMaxMetadataBytes)
    return Status::Error(path + ": corrupt header: " + ByteSize(meta_bytes) +
                         " of metadata, more than the " + ByteSize(kMaxMetadataBytes) +
                         " a checkpoint may have");

  // Pass 1: the CRC32C of every byte, before any of them is interpreted: a damaged or crafted
  // metadata block costs a read, never a parse (a 7 MB crafted table took 22 s and 839 MB to
  // be refused when it was parsed first).
  const auto crc_of_file = [&](uint32_t* stored) -> Status {
    if (::lseek(fd.get(), 0, SEEK_SET) != 0) return Status::Error(path + ": cannot seek: " + Errno());
    uint32_t crc = 0;
    PTDP_RETURN_IF_ERROR(SkipAll(fd.get(), file_bytes - kTrailerBytes, &crc, path));
    char tail[kTrailerBytes];
    PTDP_RETURN_IF_ERROR(ReadAll(fd.get(), tail, sizeof tail, nullptr, path));
    if (std::memcmp(tail + 4, kEnd, sizeof kEnd) != 0)
      return Status::Error(path + ": corrupt trailer (no END1 mark): damaged or not written by ptdp");
    *stored = GetU32(tail);
    if (*stored != crc)
      return Status::Error(path + ": checksum mismatch: stored CRC32C " + Hex(*stored) +
                           ", computed " + Hex(crc) + ": the file was altered or damaged");
    return Status::Ok();
  };
  uint32_t stored = 0;
  PTDP_RETURN_IF_ERROR(crc_of_file(&stored));

  // Pass 2: parse the metadata and read the tensors, computing the CRC again over the same
  // bytes, so that a file changed between the passes is refused too.
  if (::lseek(fd.get(), 0, SEEK_SET) != 0) return Status::Error(path + ": cannot seek: " + Errno());
  uint32_t crc = 0;
  PTDP_RETURN_IF_ERROR(ReadAll(fd.get(), head, sizeof head, &crc, path));
  std::string meta(size_t(data_offset - kHeaderBytes), '\0');
  PTDP_RETURN_IF_ERROR(ReadAll(fd.get(), meta.data(), meta.size(), &crc, path));
  meta.resize(size_t(meta_bytes));
  Checkpoint c;
  std::vector<TableEntry> table;
  PTDP_RETURN_IF_ERROR(ParseMetadata(meta, path, data_bytes, &c, &table));
  uint64_t at = 0;
  for (const TableEntry& e : table) {
    PTDP_RETURN_IF_ERROR(SkipAll(fd.get(), e.offset - at, &crc, path));
    NamedTensor t{e.name, e.shape, std::vector<float>(size_t(Numel(e.shape)))};
    const size_t bytes = t.data.size() * sizeof(float);
    PTDP_RETURN_IF_ERROR(ReadAll(fd.get(), t.data.data(), bytes, &crc, path));
    at = e.offset + bytes;
    c.state.tensors.push_back(std::move(t));
  }
  PTDP_RETURN_IF_ERROR(SkipAll(fd.get(), data_bytes - at, &crc, path));
  if (crc != stored)
    return Status::Error(path + ": changed while it was read (CRC32C " + Hex(crc) +
                         " on the second pass, " + Hex(stored) + " stored)");
  return c;
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

Result<std::vector<std::string>> RemoveIncompleteCheckpoints(const std::string& dir) {
  PTDP_ASSIGN_OR_RETURN(auto entries, Entries(dir));
  std::vector<std::string> removed;
  for (const auto& p : entries) {
    const std::string name = p.filename().string();
    if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".tmp") != 0) continue;
    if (StepOfName(name.substr(0, name.size() - 4)) < 0) continue;
    std::error_code ec;
    const bool was_there = std::filesystem::remove(p, ec);
    if (ec) return Status::Error(p.string() + ": cannot remove an incomplete checkpoint: " + ec.message());
    if (was_there) removed.push_back(p.string());  // else gone since the listing: nothing to do
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

Result<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int keep) {
  assert(keep >= 1);
  PTDP_ASSIGN_OR_RETURN(std::vector<std::string> all, ListCheckpoints(dir));
  std::vector<std::string> removed;
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    std::error_code ec;
    const bool was_there = std::filesystem::remove(all[i], ec);
    if (ec) return Status::Error(all[i] + ": cannot delete an old checkpoint: " + ec.message());
    if (was_there) removed.push_back(all[i]);  // else gone since the listing: nothing to do
  }
  return removed;
}

// ---- the folder's lock

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
