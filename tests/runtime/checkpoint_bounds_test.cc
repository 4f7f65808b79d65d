// Issue 12, bounded inputs on the checkpoint read path: a FIFO named like a checkpoint is
// refused without waiting for a writer; a header that claims more metadata than a checkpoint
// may have is refused from the header; the CRC32C of the whole file is checked before the
// metadata is parsed; the tensor table's checks are linear in its entries.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>

#include "runtime/checkpoint.h"

namespace ptdp::rt {
namespace {

namespace fs = std::filesystem;

std::string Fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/ckptb_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Checkpoint Small() {
  Checkpoint c;
  c.model.name = "bounds";
  c.model.layers = 2;
  c.model.hidden = 8;
  c.model.heads = 2;
  c.model.kv_heads = 2;
  c.model.ffn_hidden = 32;
  c.model.seq_len = 4;
  c.model.vocab = 256;
  c.state.step = 3;
  c.state.optimizer_steps = 3;
  c.global_batch = 4;
  c.state.consumed_samples = 12;
  c.optimizer = {{"lr", 1e-3}};
  c.state.tensors.push_back({"param/a", {2, 2}, {1, 2, 3, 4}});
  return c;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CheckpointBounds, AFifoNamedLikeACheckpointIsRefusedAtOnce) {
  const std::string dir = Fresh("fifo");
  const std::string fifo = dir + "/" + CheckpointFileName(8);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { return ReadCheckpoint(fifo); });
  if (read.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // The reader is blocked in open(): give it a writer so the test ends, and fail.
    const int w = ::open(fifo.c_str(), O_WRONLY);
    if (w >= 0) ::close(w);
    read.wait();
    FAIL() << "ReadCheckpoint waited on a FIFO";
  }
  const Result<Checkpoint> r = read.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            fifo + ": is not a regular file (a FIFO, socket or device), not a checkpoint");
}

TEST(CheckpointBounds, MetadataOverTheLimitIsRefusedFromTheHeader) {
  // A consistent header claiming 100 MiB of metadata, in a sparse file: refused before any
  // of it is read or allocated.
  const std::string path = Fresh("huge_meta") + "/x.ckpt";
  const uint64_t meta = 100ull << 20, offset = (48 + meta + 63) / 64 * 64, data = 64;
  const uint64_t file = offset + data + 8;
  std::string head(48, '\0');
  std::memcpy(head.data(), "PTDPCKPT", 8);
  const uint32_t version = 1;
  std::memcpy(head.data() + 8, &version, 4);
  std::memcpy(head.data() + 16, &file, 8);
  std::memcpy(head.data() + 24, &meta, 8);
  std::memcpy(head.data() + 32, &offset, 8);
  std::memcpy(head.data() + 40, &data, 8);
  {
    std::ofstream out(path, std::ios::binary);
    out << head;
  }
  ASSERT_EQ(::truncate(path.c_str(), off_t(file)), 0);
  const Result<Checkpoint> r = ReadCheckpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), path + ": corrupt header: 100 MiB of metadata, more than the "
                                         "64 MiB a checkpoint may have");
}

TEST(CheckpointBounds, TheChecksumIsCheckedBeforeTheMetadataIsParsed) {
  // The metadata replaced by bytes that are not YAML: with the stored CRC left as it was the
  // refusal is the checksum (the parse never ran); with the CRC recomputed over the new bytes
  // the checksum passes and the parse refuses it.
  const std::string dir = Fresh("crc_first");
  const std::string good = dir + "/good.ckpt";
  ASSERT_TRUE(WriteCheckpoint(good, Small()).ok());
  std::string bytes = ReadBytes(good);
  const size_t meta = bytes.find("format:");
  ASSERT_NE(meta, std::string::npos);
  bytes.replace(meta, 7, "[{{{::]");
  const std::string stale = dir + "/stale.ckpt";
  std::ofstream(stale, std::ios::binary) << bytes;
  Result<Checkpoint> r = ReadCheckpoint(stale);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos)
      << r.status().message();

  const uint32_t crc = Crc32c(0, bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &crc, 4);
  const std::string resealed = dir + "/resealed.ckpt";
  std::ofstream(resealed, std::ios::binary) << bytes;
  r = ReadCheckpoint(resealed);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("malformed YAML"), std::string::npos)
      << r.status().message();
}

// 100,000 tensors, the last a repeat of the first name: the duplicate-name check was pairwise
// (5e9 string comparisons); with a hash set the file is refused in about the time yaml-cpp
// takes to parse the table. Every entry is an empty tensor, so the file is ~6 MB of metadata.
TEST(CheckpointBounds, ALargeTableIsCheckedInLinearTime) {
  const std::string dir = Fresh("big_table");
  Checkpoint c = Small();
  c.state.tensors.clear();
  constexpr int kTensors = 100000;
  for (int i = 0; i < kTensors; ++i)
    c.state.tensors.push_back({"param/t" + std::to_string(i), {0}, {}});
  const std::string ok = dir + "/ok.ckpt";
  ASSERT_TRUE(WriteCheckpoint(ok, c).ok());
  const Result<Checkpoint> r = ReadCheckpoint(ok);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->state.tensors.size(), size_t(kTensors));

  c.state.tensors.push_back({"param/t0", {0}, {}});
  const std::string dup = dir + "/dup.ckpt";
  ASSERT_TRUE(WriteCheckpoint(dup, c).ok());
  const Result<Checkpoint> d = ReadCheckpoint(dup);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), dup + ": tensor 'param/t0' appears twice");
}

}  // namespace
}  // namespace ptdp::rt
