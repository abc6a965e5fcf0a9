// The storage tier compiled without TIDE_HAVE_LIBURING, as a plain compiler line compiles it where
// liburing is installed but the macro was not defined (issue 39, item 4): the message says "not
// compiled in" and how to compile it in, not "install liburing-dev"; automatic falls back to
// pread/pwrite and says the same. No GoogleTest: the program checks and exits 1 with the reason.
#ifdef TIDE_HAVE_LIBURING
#error "this test is compiled without TIDE_HAVE_LIBURING (tests/meson.build)"
#endif
#include <tide/storage/spill_file.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace {
int failures = 0;
void expect(bool ok, std::string const& what, std::string const& got) {
  if (ok) return;
  std::fprintf(stderr, "FAIL: %s\n  got: %s\n", what.c_str(), got.c_str());
  ++failures;
}
}  // namespace

int main() {
  auto const dir = std::filesystem::temp_directory_path() / ("tide-no-liburing-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  tide::storage_options o{.directory = dir.string(), .quiet = true};
  {
    tide::spill_file f(o, 1 << 20, 4096);
    expect(f.io() == tide::storage_io::posix, "automatic falls back to pread/pwrite", f.description());
  }
  o.io = tide::storage_io::io_uring;
  std::string m = "(no error)";
  try {
    tide::spill_file g(o, 1 << 20, 4096);
  } catch (tide::storage_error const& e) {
    m = e.what();
  }
  expect(m.find("not compiled in") != std::string::npos, "io_uring asked for: 'not compiled in'", m);
  expect(m.find("TIDE_HAVE_LIBURING") != std::string::npos && m.find("-luring") != std::string::npos,
         "the message says what to define and link", m);
  expect(m.find("install liburing-dev") == std::string::npos, "not 'install liburing-dev'", m);
  std::filesystem::remove_all(dir);
  if (failures == 0) std::printf("spill_without_liburing: the messages say 'not compiled in' and how to compile it in\n");
  return failures ? 1 : 0;
}
