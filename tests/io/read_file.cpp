// Reads one file with <tide/io/json.hpp> and says whether it read: what tests/io/schema_test.py
// compares with the JSON Schema's verdict on the same document.
//
//   read_file policy FILE MODEL_FILE   (the policy is read for the model file's stack)
//   read_file model FILE
//   read_file calibration FILE
// Exit 0 when the file reads, 2 with the error on stderr when it does not.
#include <tide/io/json.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  std::string const kind = argc > 2 ? argv[1] : "";
  try {
    if (kind == "policy" && argc == 4) {
      auto const m = tide::io::read_model_file(argv[3]);
      (void)tide::io::read_policy_file(argv[2], m.stack);
    } else if (kind == "model" && argc == 3) {
      (void)tide::io::read_model_file(argv[2]);
    } else if (kind == "calibration" && argc == 3) {
      (void)tide::io::read_calibration_file(argv[2]);
    } else {
      std::fprintf(stderr, "usage: read_file policy FILE MODEL_FILE | model FILE | calibration FILE\n");
      return 64;
    }
  } catch (tide::error const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
