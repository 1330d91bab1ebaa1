"""Library and binary macros for memgrad's packages (tests have theirs in //tests:defs.bzl).

mg_cc_library(name, srcs = None, hdrs = None, cuda_only = False, visibility = PUBLIC, ...)
    a cc_library. One named after its file stem (name.cc and name.h, the usual case) leaves srcs
    and hdrs out; a header-only one says srcs = []. Public unless it says otherwise: the
    libraries are memgrad's API (//:memgrad gathers them for embedders).
mg_cc_binary(name, srcs = None, cuda_only = False, ...)   a cc_binary; srcs defaults to [name.cc].
cuda_only drops the target from builds without the CUDA toolkit (it needs CUDA headers or
libraries). Other arguments (deps, copts, data, alwayslink, visibility, ...) pass through.
"""

load("//tools/cuda:cuda.bzl", "cuda_compatible")

PUBLIC = ["//visibility:public"]

def _stem_default(files, name, ending):
    return [name + ending] if files == None else files

def _cuda_only(kwargs, cuda_only):
    if cuda_only:
        kwargs["target_compatible_with"] = cuda_compatible()
    return kwargs

def mg_cc_library(name, srcs = None, hdrs = None, cuda_only = False, visibility = PUBLIC, **kwargs):
    native.cc_library(
        name = name,
        srcs = _stem_default(srcs, name, ".cc"),
        hdrs = _stem_default(hdrs, name, ".h"),
        visibility = visibility,
        **_cuda_only(kwargs, cuda_only)
    )

def mg_cc_binary(name, srcs = None, cuda_only = False, **kwargs):
    native.cc_binary(
        name = name,
        srcs = _stem_default(srcs, name, ".cc"),
        **_cuda_only(kwargs, cuda_only)
    )
