// The original trainer alone (before tide): prints each step's loss and gradient checksum.
#include <cstdio>

#include "original.hpp"

int main() {
  porting::config const c;
  int step = 0;
  for (auto const& r : porting::train_original(c))
    std::printf("step %d  loss %.6f  grad checksum %016llx\n", step++, static_cast<double>(r.loss),
                static_cast<unsigned long long>(r.grad_checksum));
}
