// expect: Layer has no slot of this name
#include <tide/tide.hpp>
// "q_prj" for "q_proj": a handle is resolved at compile time, so the typo does not compile.
using dense = tide::layer<"dense", tide::slot<"q_proj", 64>, tide::slot<"mlp_up", 256>>;
constexpr auto q = tide::slot_handle_of<dense, "q_prj", float>;
