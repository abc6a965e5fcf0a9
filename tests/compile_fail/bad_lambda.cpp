// expect: the forward lambda must be callable
#include <tide/tide.hpp>
#include <tide/backends/host/host_backend.hpp>
#include <tide/executor/executor.hpp>
void f(tide::executor<tide::host_backend>& e) { e.step([](int) {}, [](auto const&) {}); }
