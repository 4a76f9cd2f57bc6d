// The launch-mode switch.
#include "kernels/launch.cuh"

namespace hr::kernels {
namespace {
thread_local bool t_programmatic = true;
}  // namespace

void set_programmatic_launch(bool on) { t_programmatic = on; }
bool programmatic_launch() { return t_programmatic; }

}  // namespace hr::kernels
