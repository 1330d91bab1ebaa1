"""Test-target macros: every memgrad test links gtest's main, //core and the device runtime.

mg_test(name, srcs, deps = [], size = "small", ...)   a gtest binary
mg_gpu_test(name, srcs, deps = [], cuda_only = False, ...)   one that exercises the GPU and
    skips without one (tag "gpu", for `--test_tag_filters=-gpu`); cuda_only also drops it from
    builds without the CUDA toolkit (for tests that include CUDA-only headers).
Other cc_test arguments (data, local_defines, shard_count, tags, ...) pass through.
"""

load("//tools/cuda:cuda.bzl", "cuda_compatible")

_COMMON_DEPS = [
    "//core",
    "//core:runtime",
    "@system_gtest//:gtest_main",
]

def _with_common(deps):
    return deps + [d for d in _COMMON_DEPS if d not in deps]

def mg_test(name, srcs, deps = [], size = "small", **kwargs):
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        deps = _with_common(deps),
        **kwargs
    )

def mg_gpu_test(name, srcs, deps = [], size = "small", tags = [], cuda_only = False, **kwargs):
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
