// The one line at the top of every CPU kernel that hands the call to its CUDA twin when the
// calling thread computes on a GPU (core/device.h). Without a CUDA build it is nothing.
#pragma once

#include "core/device.h"

#if MESHTRAIN_CUDA
#include "kernels/cuda/kernels_cuda.h"
#define MT_CUDA_DISPATCH(call)                         \
  do {                                                 \
    if (::mt::device::on_cuda()) return cuda::call;    \
  } while (0)
#else
#define MT_CUDA_DISPATCH(call) \
  do {                         \
  } while (0)
#endif
