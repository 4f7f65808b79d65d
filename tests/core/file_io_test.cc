// ReadFileText: a regular file whole; a directory, a FIFO or a missing path as one line naming
// the path and what is wrong, never an empty text (a FIFO is not opened: that could block).
#include "core/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

namespace ptdp {
namespace {

std::string Temp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ReadFileText, ReadsARegularFileWhole) {
  const std::string path = Temp("file_io_ok.txt");
  std::ofstream(path, std::ios::binary) << std::string("a\0b\n", 4);
  auto text = ReadFileText(path, "a corpus");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, std::string("a\0b\n", 4));
}

TEST(ReadFileText, NamesWhatIsWrong) {
  const std::string dir = ::testing::TempDir();
  auto d = ReadFileText(dir, "a plan.yaml");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), dir + ": is a directory, not a plan.yaml");

  const std::string fifo = Temp("file_io_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = ReadFileText(fifo);  // returns at once: a FIFO is refused before it is opened
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(),
            fifo + ": is not a regular file (a FIFO, socket or device), not a file");

  auto m = ReadFileText("/nonexistent/x.yaml");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "/nonexistent/x.yaml: cannot open file: No such file or directory");
}

}  // namespace
}  // namespace ptdp
