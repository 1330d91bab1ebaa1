// Every raw op (no autograd) in one include: the family headers below each declare their ops,
// check inputs (naming the op and the values) and dispatch to the device's Backend (backend.h).
#pragma once

#include "kernels/amp.h"
#include "kernels/attention.h"
#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/index.h"
#include "kernels/linalg.h"
#include "kernels/loss.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/pool.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "kernels/types.h"
