// How our kernels are launched: with programmatic dependent launch (Hopper) on by default, so that
// a kernel's blocks are scheduled while the previous kernel in the stream drains; every kernel
// waits for its predecessor's results before reading or writing anything it shares. The switch
// applies to launches from the calling thread (a backend sets it for its own steps). It has no
// effect on a device that runs code built for an architecture without the waits (before sm_90).
#pragma once

namespace hr::kernels {

void set_programmatic_launch(bool on);
bool programmatic_launch();

}  // namespace hr::kernels
