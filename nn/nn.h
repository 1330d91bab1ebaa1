// Everything in nn/ in one include: Module, the layers, the initialisers and the losses.
// Model code usually needs just this and autograd/functions.h.
#pragma once

#include "nn/activation.h"
#include "nn/conv.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "nn/transformer.h"
