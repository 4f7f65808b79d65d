// Checkpoint files: CRC32C against the published check values, a round trip that keeps every
// bit, refusals of truncated, altered and foreign files naming the file and what is wrong, the
// atomic write (no partial file under the final name) and the checkpoint folder helpers.
#include "runtime/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace ptdp::rt {
namespace {

namespace fs = std::filesystem;

// A fresh empty folder under the test temp dir.
std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/ckpt_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

ModelSpec SmallModel() {
  ModelSpec m;
  m.name = "ckpt-test \"quoted\"";
  m.layers = 2;
  m.hidden = 8;
  m.heads = 2;
  m.kv_heads = 2;
  m.ffn_hidden = 32;
  m.seq_len = 4;
  m.vocab = 256;
  return m;
}

// Values chosen to catch any rounding: the smallest subnormal, -0, a NaN payload, infinities.
Checkpoint Sample() {
  Checkpoint c;
  c.model = SmallModel();
  c.state.step = 7;
  c.state.optimizer_steps = 6;
  c.seed = 18446744073709551615ull;  // 2^64 - 1: the seed is a full u64
  c.global_batch = 8;
  c.state.consumed_samples = 56;
  c.layout = "tp2 pp1 dp2";
  c.optimizer = {{"lr", 1e-3}, {"min_lr", 1.0 / 3.0}, {"warmup_steps", 2}, {"clip_grad", 0}};
  c.state.tensors.push_back({"param/a", {2, 3}, {1.5f, -0.0f, std::numeric_limits<float>::denorm_min(),
                                           std::numeric_limits<float>::infinity(), 3.14159265f,
                                           -1e30f}});
  c.state.tensors.push_back({"param/scalar", {}, {42.0f}});
  c.state.tensors.push_back({"adam_m/empty", {0, 5}, {}});
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i) * 0.001f - 0.3f;
  c.state.tensors.push_back({"adam_v/big", {10, 100}, big});
  return c;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Crc32c, PublishedCheckValues) {
  // The CRC catalogue's check value for CRC-32C, and RFC 3720 appendix B.4's test vectors.
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = (unsigned char)i, dec[size_t(i)] = (unsigned char)(31 - i);
  EXPECT_EQ(Crc32c(0, zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(0, ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(0, inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(0, dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
}

TEST(Crc32c, PortableAndFastAgree) {
  // The same values for the portable table version and the one the CPU offers, at every length
  // and alignment around the 8-byte steps.
  EXPECT_EQ(Crc32cPortable(0, "123456789", 9), 0xE3069283u);
  std::vector<unsigned char> buf(300);
  uint32_t x = 12345;
  for (auto& c : buf) c = (unsigned char)((x = x * 1103515245u + 12345u) >> 24);
  for (size_t start = 0; start < 9; ++start)
    for (size_t len = 0; len + start <= buf.size(); len += 7)
      ASSERT_EQ(Crc32c(7, buf.data() + start, len), Crc32cPortable(7, buf.data() + start, len))
          << start << " " << len;
}

TEST(Crc32c, ContinuesAcrossPiecesAtAnyAlignment) {
  std::vector<unsigned char> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = (unsigned char)(i * 131 + 7);
  const uint32_t whole = Crc32c(0, buf.data(), buf.size());
  for (size_t cut : {size_t(1), size_t(3), size_t(8), size_t(13), size_t(500), size_t(999)}) {
    const uint32_t a = Crc32c(0, buf.data(), cut);
    EXPECT_EQ(Crc32c(a, buf.data() + cut, buf.size() - cut), whole) << cut;
  }
}

TEST(Checkpoint, RoundTripKeepsEveryBit) {
  const std::string path = FreshDir("roundtrip") + "/" + CheckpointFileName(7);
  const Checkpoint c = Sample();
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->model.name, c.model.name);
  EXPECT_EQ(r->model.layers, 2);
  EXPECT_EQ(r->model.ffn_hidden, 32);
  EXPECT_EQ(r->state.step, 7);
  EXPECT_EQ(r->state.optimizer_steps, 6);
  EXPECT_EQ(r->seed, c.seed);
  EXPECT_EQ(r->global_batch, 8);
  EXPECT_EQ(r->state.consumed_samples, 56);
  EXPECT_EQ(r->layout, "tp2 pp1 dp2");
  ASSERT_EQ(r->optimizer.size(), c.optimizer.size());
  for (const auto& [k, v] : c.optimizer) EXPECT_EQ(r->optimizer.at(k), v) << k;  // exact
  ASSERT_EQ(r->state.tensors.size(), c.state.tensors.size());
  for (size_t i = 0; i < c.state.tensors.size(); ++i) {
    EXPECT_EQ(r->state.tensors[i].name, c.state.tensors[i].name);
    EXPECT_EQ(r->state.tensors[i].shape, c.state.tensors[i].shape);
    ASSERT_EQ(r->state.tensors[i].data.size(), c.state.tensors[i].data.size());
    for (size_t k = 0; k < c.state.tensors[i].data.size(); ++k)
      EXPECT_EQ(Bits(r->state.tensors[i].data[k]), Bits(c.state.tensors[i].data[k])) << c.state.tensors[i].name << k;
  }
}

TEST(Checkpoint, FileSizeFollowsTheDocumentedLayout) {
  // 48-byte header + metadata padded to 64, tensors at 64-byte offsets, 8-byte trailer:
  // a (24 B) at 0, scalar (4 B) at 64, empty (0 B) at 128, big (4000 B) at 128, ending at 4128.
  const std::string path = FreshDir("layout") + "/x.ckpt";
  const Checkpoint c = Sample();
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  const std::string meta = CheckpointMetadataYaml(c);
  const uint64_t data_offset = (48 + meta.size() + 63) / 64 * 64;
  EXPECT_EQ(fs::file_size(path), data_offset + 4128 + 8);
  const std::string bytes = ReadBytes(path);
  EXPECT_EQ(bytes.substr(0, 8), "PTDPCKPT");
  EXPECT_EQ(bytes.substr(bytes.size() - 4), "END1");
  EXPECT_EQ(bytes.substr(48, meta.size()), meta);
  EXPECT_NE(meta.find("{name: \"param/scalar\", shape: [], offset: 64}"), std::string::npos)
      << meta;
  EXPECT_NE(meta.find("{name: \"adam_v/big\", shape: [10, 100], offset: 128}"), std::string::npos)
      << meta;
}

// Each damaged copy must be refused with the file name and the stated reason.
TEST(Checkpoint, RefusesDamagedFilesNamingThem) {
  const std::string dir = FreshDir("damaged");
  const std::string good = dir + "/good.ckpt";
  ASSERT_TRUE(WriteCheckpoint(good, Sample()).ok());
  const std::string bytes = ReadBytes(good);
  struct Case {
    std::string name, bytes, expect;
  };
  std::string flipped_data = bytes;
  flipped_data[bytes.size() - 100] ^= 0x01;  // one bit of adam_v/big
  std::string flipped_meta = bytes;
  flipped_meta[bytes.find("step: 7")] = 'x';  // the metadata's "step" key becomes "xtep"
  std::string flipped_crc = bytes;
  flipped_crc[bytes.size() - 8] ^= 0x80;
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  std::string bad_version = bytes;
  bad_version[8] = 3;  // 1 and 2 are both read (whole files; sharded manifests and shards)
  const std::vector<Case> cases = {
      {"truncated_half", bytes.substr(0, bytes.size() / 2), "truncated"},
      {"truncated_trailer", bytes.substr(0, bytes.size() - 1), "truncated"},
      {"tiny", bytes.substr(0, 20), "truncated or not a checkpoint"},
      {"empty", "", "truncated or not a checkpoint"},
      {"appended", bytes + "x", "more than"},
      {"data_bit", flipped_data, "checksum mismatch"},
      {"meta_byte", flipped_meta, "checksum mismatch"},
      {"crc", flipped_crc, "checksum mismatch"},
      {"magic", bad_magic, "not a ptdp checkpoint"},
      {"version", bad_version, "format version 3, this ptdp reads versions 1 and 2"},
  };
  for (const Case& c : cases) {
    const std::string path = dir + "/" + c.name + ".ckpt";
    WriteBytes(path, c.bytes);
    auto r = ReadCheckpoint(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << c.name << ": " << r.status().message();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << r.status().message();
  }
  auto missing = ReadCheckpoint(dir + "/missing.ckpt");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir + "/missing.ckpt: cannot open"), std::string::npos);
}

TEST(Checkpoint, FailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string dir = FreshDir("failed_write");
  const std::string path = dir + "/x.ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  const std::string before = ReadBytes(path);
  // A hook that removes the folder's write permission cannot stop an open file; instead write
  // into a folder that does not exist: the error names the temporary file, nothing appears.
  Status st = WriteCheckpoint(dir + "/no/such/folder/x.ckpt", Sample());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir + "/no/such/folder/x.ckpt.tmp: cannot create"), std::string::npos)
      << st.message();
  EXPECT_EQ(ReadBytes(path), before);
}

TEST(Checkpoint, TheHookSeesAPartialTemporaryFileAndTheFinalNameUnchanged) {
  const std::string dir = FreshDir("partial");
  const std::string path = dir + "/x.ckpt";
  Checkpoint old = Sample();
  old.state.step = 1;
  ASSERT_TRUE(WriteCheckpoint(path, old).ok());
  const uintmax_t old_size = fs::file_size(path);
  Checkpoint c = Sample();
  c.state.tensors.push_back({"param/more", {4096}, std::vector<float>(4096, 1.0f)});
  int calls = 0;
  ASSERT_TRUE(WriteCheckpoint(path, c, [&](const std::string& tmp) {
                ++calls;
                EXPECT_EQ(tmp, path + ".tmp");
                EXPECT_TRUE(fs::exists(tmp));
                // About half: past the header, short of the whole.
                EXPECT_GT(fs::file_size(tmp), 48u);
                auto partial = ReadCheckpoint(tmp);
                EXPECT_FALSE(partial.ok());
                EXPECT_NE(partial.status().message().find("truncated"), std::string::npos)
                    << partial.status().message();
                // The final name still holds the previous complete checkpoint.
                EXPECT_EQ(fs::file_size(path), old_size);
                auto prev = ReadCheckpoint(path);
                EXPECT_TRUE(prev.ok());
                if (prev.ok()) { EXPECT_EQ(prev->state.step, 1); }
              }).ok());
  EXPECT_EQ(calls, 1);
  auto now = ReadCheckpoint(path);
  ASSERT_TRUE(now.ok()) << now.status().message();
  EXPECT_EQ(now->state.tensors.size(), 5u);
}

TEST(CheckpointFolder, ListsPrunesAndRemovesIncompleteFiles) {
  const std::string dir = FreshDir("folder");
  EXPECT_EQ(CheckpointFileName(12), "step-00000012.ckpt");
  for (int64_t step : {10, 2, 30, 4}) ASSERT_TRUE(WriteCheckpoint(dir + "/" + CheckpointFileName(step), Sample()).ok());
  WriteBytes(dir + "/step-00000040.ckpt.tmp", "partial");
  WriteBytes(dir + "/notes.txt", "not a checkpoint");
  WriteBytes(dir + "/step-x.ckpt", "not a number");
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 4u);  // by step, not by name order of the digits alone
  EXPECT_EQ((*list)[0], dir + "/step-00000002.ckpt");
  EXPECT_EQ((*list)[3], dir + "/step-00000030.ckpt");
  auto removed = RemoveIncompleteCheckpoints(dir);
  ASSERT_TRUE(removed.ok());
  ASSERT_EQ(removed->size(), 1u);
  EXPECT_EQ((*removed)[0], dir + "/step-00000040.ckpt.tmp");
  EXPECT_FALSE(fs::exists(dir + "/step-00000040.ckpt.tmp"));
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  auto pruned = PruneCheckpoints(dir, 2);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(pruned->size(), 2u);
  list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0], dir + "/step-00000010.ckpt");
  EXPECT_EQ((*list)[1], dir + "/step-00000030.ckpt");
  auto bad = ListCheckpoints(dir + "/absent");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(dir + "/absent"), std::string::npos);
}

// A failed write names the system's reason, read right after the failing call (messages such as
// "cannot delete an old checkpoint: Success" came from errno read after it was overwritten).
TEST(CheckpointFolder, WriteErrorsCarryTheSystemsReason) {
  const std::string dir = FreshDir("errno");
  Status st = WriteCheckpoint(dir + "/absent/x.ckpt", Sample());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("x.ckpt.tmp: cannot create: No such file or directory"),
            std::string::npos) << st.message();
  WriteBytes(dir + "/file", "a file, not a folder");
  st = WriteCheckpoint(dir + "/file/x.ckpt", Sample());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot create: Not a directory"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("Success"), std::string::npos) << st.message();
}

// One lock object at a time per folder (a second one, in this process or another, is refused
// naming the holder); the holder removes the lock file when it ends; the file a killed holder
// leaves behind (its flock is gone with it) is taken over.
TEST(CheckpointFolderLock, OneHolderAtATimeNamedInTheRefusal) {
  const std::string dir = FreshDir("lock");
  const std::string lock_file = dir + "/" + kCheckpointLockName;
  const std::string pid = "pid " + std::to_string(::getpid()) + ", host ";
  {
    auto first = CheckpointFolderLock::Acquire(dir);
    ASSERT_TRUE(first.ok()) << first.status().message();
    EXPECT_EQ((*first)->path(), lock_file);
    EXPECT_EQ(ReadBytes(lock_file).rfind(pid, 0), 0u) << ReadBytes(lock_file);
    auto second = CheckpointFolderLock::Acquire(dir);
    ASSERT_FALSE(second.ok());
    const std::string m = second.status().message();
    EXPECT_EQ(m.rfind(dir + ": in use by another run (" + pid, 0), 0u) << m;
    EXPECT_NE(m.find(", since 20"), std::string::npos) << m;
    EXPECT_NE(m.find("lock file " + lock_file), std::string::npos) << m;
    // Listing and pruning do not see the lock file.
    auto list = ListCheckpoints(dir);
    ASSERT_TRUE(list.ok());
    EXPECT_TRUE(list->empty());
  }
  EXPECT_FALSE(fs::exists(lock_file));
  WriteBytes(lock_file, "pid 1, host elsewhere, since 1999-01-01T00:00:00Z\n");  // stale
  auto again = CheckpointFolderLock::Acquire(dir);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(ReadBytes(lock_file).rfind(pid, 0), 0u) << ReadBytes(lock_file);
}

TEST(CheckpointFolderLock, RefusesAFolderWhereNoFileCanBeCreated) {
  // /proc takes no new files, even from root.
  auto proc = CheckpointFolderLock::Acquire("/proc");
  ASSERT_FALSE(proc.ok());
  EXPECT_NE(proc.status().message().find("/proc/.ptdp-lock: cannot create the checkpoint folder's lock file: "),
            std::string::npos) << proc.status().message();
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores folder permissions: the read-only case needs another user";
  const std::string dir = FreshDir("lock_readonly");
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  auto ro = CheckpointFolderLock::Acquire(dir);
  fs::permissions(dir, fs::perms::owner_all);
  ASSERT_FALSE(ro.ok());
  EXPECT_NE(ro.status().message().find("cannot create the checkpoint folder's lock file: Permission denied"),
            std::string::npos) << ro.status().message();
}

}  // namespace
}  // namespace ptdp::rt
