#include "tests/kernels/test_util.h"
