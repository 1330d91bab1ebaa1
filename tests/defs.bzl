"""Test-target macros: every memgrad test links gtest's main, //core and the device runtime.

mg_test(name, srcs = [name.cc], deps = [], size = "small", core_only = False, ...)   a gtest
    binary; core_only links //core without the device runtime (for tests of what //core does
    alone, e.g. that a CUDA tensor is a clear DeviceError without one).
mg_gpu_test(name, srcs = [name.cc], deps = [], cuda_only = False, ...)   one that exercises the
    GPU and skips without one (tag "gpu", for `--test_tag_filters=-gpu`); cuda_only also drops
    it from builds without the CUDA toolkit (for tests that include CUDA-only headers).
mg_parity_test(name, deps = [], ...)   a CUDA-vs-CPU parity test (tests/kernels/cuda): an
    mg_gpu_test of size medium, built only with the CUDA toolkit, linking the shared parity
    helpers (cuda_test_util.h).
mg_test_library(name, hdrs = [name.h], deps = [], ...)   a header-only helper tests share
    (testonly).
Other cc_test / cc_library arguments (data, local_defines, shard_count, tags, ...) pass through.
"""

load("//tools/cuda:cuda.bzl", "cuda_compatible")

_RUNTIME = "//core:runtime"

_COMMON_DEPS = [
    "//core",
    _RUNTIME,
    "@system_gtest//:gtest_main",
]

def _with_common(deps, core_only):
    return deps + [d for d in _COMMON_DEPS if d not in deps and not (core_only and d == _RUNTIME)]

def mg_test(name, srcs = None, deps = [], size = "small", core_only = False, **kwargs):
    native.cc_test(
        name = name,
        size = size,
        srcs = [name + ".cc"] if srcs == None else srcs,
        deps = _with_common(deps, core_only),
        **kwargs
    )

def mg_gpu_test(name, srcs = None, deps = [], size = "small", tags = [], cuda_only = False, **kwargs):
    if cuda_only:
        kwargs["target_compatible_with"] = cuda_compatible()
    mg_test(
        name = name,
        srcs = srcs,
        deps = deps,
        size = size,
        tags = tags + ([] if "gpu" in tags else ["gpu"]),
        **kwargs
    )

def mg_parity_test(name, deps = [], **kwargs):
    mg_gpu_test(
        name = name,
        size = "medium",
        cuda_only = True,
        deps = ["//tests/kernels/cuda:cuda_test_util"] + deps,
        **kwargs
    )

def mg_test_library(name, hdrs = None, **kwargs):
    native.cc_library(
        name = name,
        testonly = True,
        hdrs = [name + ".h"] if hdrs == None else hdrs,
        **kwargs
    )
