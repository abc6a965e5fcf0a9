// expect: this type is not a tide backend
#include <tide/tide.hpp>
#include <tide/executor/executor.hpp>
struct mine {};
void f(mine& m, tide::schedule const& s) { tide::executor<mine> e(m, s); }
