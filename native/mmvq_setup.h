// Per-thread launch set-up of the mat-vec kernels, and what a device reset
// does to it. Plain C++ (no CUDA), so that mmvq_host_check.cpp can run the
// same code for a CPU test of the reset order.
//
// A kernel that needs more than 48 KB of shared memory must have its limit
// raised (cudaFuncSetAttribute) and sizes its grid from an occupancy query;
// both cost host time, so launch_lanes keeps the result per host thread. A
// cudaDeviceReset may drop the raised limit, so a set-up made before a reset
// must be redone after it, in every thread: the reset epoch says which
// set-ups are stale.
#pragma once

#include <atomic>

namespace smv {

inline std::atomic<int> &reset_epoch() {
    static std::atomic<int> e{0};
    return e;
}

// The epoch a set-up is made under: read before the set-up starts.
inline int epoch_now() { return reset_epoch().load(std::memory_order_acquire); }

// One kernel's cached set-up in one host thread.
struct SetupCache {
    int dev = -1, smem = -1, epoch = -1, fill = 1;
    bool fresh(int d, int s, int e) const { return d == dev && s == smem && e == epoch; }
    void keep(int d, int s, int e, int f) {
        dev = d;
        smem = s;
        epoch = e;
        fill = f;
    }
};

// Runs `reset` (cudaDeviceReset) and only then bumps the epoch. A set-up that
// another thread makes while the reset runs read the epoch before the bump,
// so its next call finds it stale and redoes it; any set-up that reads the
// bumped epoch started after the reset had returned. Bumping first (the
// order before issue 20) let a set-up made during the reset carry the new
// epoch and survive it.
template <class Reset>
int reset_then_bump(Reset reset) {
    const int st = reset();
    reset_epoch().fetch_add(1, std::memory_order_acq_rel);
    return st;
}

}  // namespace smv
