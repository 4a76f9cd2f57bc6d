// How our kernels are launched: with programmatic dependent launch (Hopper) on by default, so that
// a kernel's blocks are scheduled while the previous kernel in the stream drains; every kernel
// waits for its predecessor's results before reading or writing anything it shares. The switch
// applies to launches from the calling thread (a backend sets it for its own steps). It has no
// effect on a device that runs code built for an architecture without the waits (before sm_90).
#pragma once

namespace hr::kernels {

void set_programmatic_launch(bool on);
bool programmatic_launch();

// Whether the code the current device runs was built for sm_90 or later, where every kernel's
// griddepcontrol.wait is compiled in (a newer GPU may run the compute_80 PTX instead, JIT-compiled,
// whose kernels do not wait). Asked once per device; call it before capturing graphs, since the
// first call loads a kernel.
bool programmatic_launch_supported();

}  // namespace hr::kernels
