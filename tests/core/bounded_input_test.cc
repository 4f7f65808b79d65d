// Issue 12, bounded inputs: every input file has a stated size limit and is read only when it
// is a regular file; a YAML map's duplicate-key check is linear in its keys.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/file_io.h"
#include "core/yaml_reader.h"

namespace ptdp {
namespace {

std::string Temp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ByteSize, SaysBytesKiBMiB) {
  EXPECT_EQ(ByteSize(812), "812 bytes");
  EXPECT_EQ(ByteSize(1536), "1.5 KiB");
  EXPECT_EQ(ByteSize(16 * kMiB), "16 MiB");
  EXPECT_EQ(ByteSize(kMaxCorpusBytes), "2 GiB");
}

TEST(ReadFileText, RefusesAFileOverItsLimitNamingBoth) {
  const std::string path = Temp("bounded_big.yaml");
  std::ofstream(path, std::ios::binary) << std::string(3000, 'x');
  auto r = ReadFileText(path, "a plan.yaml", 2048);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), path + ": 2.9 KiB, more than the 2 KiB a plan.yaml may have");
  auto ok = ReadFileText(path, "a plan.yaml", 3000);  // exactly the limit is fine
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->size(), 3000u);
}

TEST(ReadFileText, ShippedLimitsAreStatedPerKind) {
  // The kinds users give: configs and plans 16 MiB, measured.json 256 MiB, corpus 2 GiB.
  EXPECT_EQ(kMaxConfigBytes, 16 * kMiB);
  EXPECT_EQ(kMaxMeasuredBytes, 256 * kMiB);
  const std::string path = Temp("bounded_17mib.yaml");
  {
    std::ofstream out(path, std::ios::binary);
    out.seekp(std::streamoff(17 * kMiB) - 1);
    out.put('\n');  // a sparse 17 MiB file: refused from its size, never read
  }
  auto r = ReadFileText(path, "a model YAML");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), path + ": 17 MiB, more than the 16 MiB a model YAML may have");
  auto y = LoadYamlFile(path);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("more than the 16 MiB"), std::string::npos);
  ::unlink(path.c_str());
}

TEST(ReadFileText, DevicesAreRefusedNotRead) {
  // /dev/zero would be read until memory ran out; /dev/stdin may be a terminal that never ends.
  for (const char* dev : {"/dev/zero", "/dev/null", "/dev/urandom"}) {
    auto r = ReadFileText(dev, "a cluster YAML");
    ASSERT_FALSE(r.ok()) << dev;
    EXPECT_EQ(r.status().message(), std::string(dev) +
                                        ": is not a regular file (a FIFO, socket or device), "
                                        "not a cluster YAML");
  }
}

TEST(ReadFileText, AFifoWithAWriterIsStillRefused) {
  // Opened without blocking and refused from fstat, whether or not a writer holds it open.
  const std::string fifo = Temp("bounded_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = ReadFileText(fifo, "a measured.json", kMaxMeasuredBytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is not a regular file"), std::string::npos);
  ::unlink(fifo.c_str());
}

// 200,000 keys, the last one a repeat of the first: a pairwise check (2e10 comparisons; the
// issue measured 100k keys still running at 300 s) would not finish in the suite's time; one
// pass with a hash set takes well under a second beside yaml-cpp's own parse.
TEST(YamlReader, DuplicateKeyCheckIsLinear) {
  constexpr int kKeys = 200000;
  std::string text;
  text.reserve(size_t(kKeys) * 16);
  for (int i = 0; i < kKeys; ++i) text += "k" + std::to_string(i) + ": 1\n";
  text += "k0: 2\n";
  auto node = ParseYamlText(text, "big.yaml");
  ASSERT_TRUE(node.ok()) << node.status().message();
  YamlReader r(*node, "big.yaml", "");
  for (int i = 0; i < 3; ++i) r.PositiveInt("k" + std::to_string(i));
  const Status st = r.Finish();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "big.yaml:" + std::to_string(kKeys + 1) +
                              ": duplicate key 'k0' (first at line 1)");
}

TEST(YamlReader, UnknownKeyAmongManyIsNamed) {
  std::string text;
  for (int i = 0; i < 50000; ++i) text += "k" + std::to_string(i) + ": 1\n";
  auto node = ParseYamlText(text, "many.yaml");
  ASSERT_TRUE(node.ok());
  YamlReader r(*node, "many.yaml", "");
  r.PositiveInt("k0");
  const Status st = r.Finish();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("many.yaml:2: unknown key 'k1' (valid keys: k0)", 0), 0u)
      << st.message();
}

}  // namespace
}  // namespace ptdp
