// A program may define a C function named like one of tide's internals: tide's host-task
// trampoline has C++ linkage inside tide::detail (an `extern "C" inline` one was a weak global
// symbol that this definition would have silently replaced, or clashed with in this TU).
#include <tide/backends/cuda/cuda_backend.hpp>

extern "C" void run_host_task(void*) {}
