// memgrad's one public header: tensors, the CUDA runtime and memory surface, differentiable
// ops and the tape, layers, optimizers and data loading. Depend on //:memgrad (or @memgrad//:memgrad).
#pragma once

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "core/tensor.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "kernels/ops.h"
#include "nn/nn.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
