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

// Writing over a FIFO (a device such as /dev/null, a folder) is refused, never replaces it:
// `--out /dev/null` as root made /dev/null a regular file. The temporary file is removed.
TEST(WriteFileAtomically, RefusesToReplaceWhatIsNotARegularFile) {
  const std::string fifo = Temp("file_io_out_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Status st = WriteFileAtomically(fifo, "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), fifo + ": is not a regular file (a FIFO, socket or device); give the "
                                 "path of a file to write");
  struct stat s {};
  ASSERT_EQ(::stat(fifo.c_str(), &s), 0);
  EXPECT_TRUE(S_ISFIFO(s.st_mode));
  const Status dir = WriteFileAtomically(::testing::TempDir(), "x");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.message().find("is not a regular file (a folder)"), std::string::npos);
  const std::string file = Temp("file_io_out.txt");
  ASSERT_TRUE(WriteFileAtomically(file, "y").ok());
  EXPECT_EQ(*ReadFileText(file), "y");
  ::unlink(fifo.c_str());
}

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
