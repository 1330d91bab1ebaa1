"""Minimal nvcc support for Bazel 4 (WORKSPACE mode, no downloads).

cuda_library(name, srcs, hdrs, deps, ...) compiles each .cu in srcs with nvcc
into a PIC object, and wraps the objects plus any .cc/.h srcs in a cc_library,
so the result is an ordinary C++ dependency.

GPU targets: --define cuda_archs=<list>, ';'-separated entries sm_XX (SASS)
or compute_XX (PTX, JIT-compiled by the driver on newer GPUs). Default
"sm_90;compute_90" (H100/H200 SASS + PTX). Use sm_90a for wgmma/setmaxnreg.
"""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH", "CUDA_VERSION")

_CU_EXTS = [".cu"]
_HDR_EXTS = [".h", ".hh", ".hpp", ".cuh", ".inc", ".inl"]

def _cuda_objects_impl(ctx):
    cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d]
    cc_ctx = cc_common.merge_cc_infos(cc_infos = cc_infos).compilation_context

    archs = ctx.var.get("cuda_archs", ctx.attr.default_archs).split(";")
    mode = ctx.var.get("COMPILATION_MODE", "fastbuild")

    # The version define puts the toolkit version into the action key, so a
    # toolkit upgrade recompiles (headers under CUDA_PATH are not tracked).
    args = ["-x", "cu", "-std=c++20", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
            "-DBZL_NVCC_VERSION=" + CUDA_VERSION]
    if mode == "opt":
        args += ["-O3", "-DNDEBUG"]
    elif mode == "dbg":
        args += ["-g", "-lineinfo", "-O0"]
    else:
        args += ["-O2", "-lineinfo"]
    for a in archs:
        kind, _, num = a.strip().partition("_")
        if kind == "sm":
            args += ["-gencode", "arch=compute_%s,code=sm_%s" % (num, num)]
        elif kind == "compute":
            args += ["-gencode", "arch=compute_%s,code=compute_%s" % (num, num)]
        else:
            fail("bad cuda_archs entry %r (want sm_XX or compute_XX)" % a)

    # Include paths: execroot, generated files, and those of all cc deps.
    iq = {".": 1, ctx.bin_dir.path: 1}
    for p in cc_ctx.quote_includes.to_list() + cc_ctx.includes.to_list():
        iq[p] = 1
    inc = ["-I" + p for p in iq.keys()]
    for p in {p: 1 for p in cc_ctx.system_includes.to_list()}.keys():
        inc += ["-isystem", p]
    defs = ["-D" + d for d in cc_ctx.defines.to_list() + ctx.attr.defines]

    hdrs = depset(ctx.files.hdrs, transitive = [cc_ctx.headers])
    objs = []
    for src in ctx.files.srcs:
        if not src.basename.endswith(".cu"):
            continue
        obj = ctx.actions.declare_file(
            "_cuda_objs/%s/%s.pic.o" % (ctx.label.name, src.path.replace("/", "_")[:-3]),
        )
        ctx.actions.run_shell(
            # Absolute path on purpose: nvcc finds cicc/ptxas/headers relative
            # to its own location, which a sandboxed symlink would break.
            # A temp dir of its own: nvcc names its intermediates tmpxft_<pid>, and
            # every sandboxed nvcc runs as pid 2 of its namespace over a shared /tmp,
            # so two at once overwrote each other's files.
            command = 'd=$(mktemp -d); TMPDIR="$d" "$@"; rc=$?; rm -rf "$d"; exit $rc',
            arguments = [CUDA_PATH + "/bin/nvcc"] + args + inc + defs + ctx.attr.copts +
                        ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [hdrs]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,  # PATH for the host compiler
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = _CU_EXTS),
        "hdrs": attr.label_list(allow_files = _HDR_EXTS),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "defines": attr.string_list(),
        "default_archs": attr.string(default = "sm_90;compute_90"),
    },
)

def cuda_compatible():
    """target_compatible_with value for anything that needs the CUDA toolkit."""
    if not CUDA_FOUND:
        return ["//tools/cuda:cuda_unavailable"]
    return select({
        "//tools/cuda:cuda_disabled": ["//tools/cuda:cuda_unavailable"],
        "//conditions:default": [],
    })

def if_cuda(if_true, if_false = []):
    """select() between CUDA and CPU-only variants (for optional GPU code)."""
    if not CUDA_FOUND:
        return if_false
    return select({
        "//tools/cuda:cuda_disabled": if_false,
        "//conditions:default": if_true,
    })

def cudart():
    return select({
        "//tools/cuda:cudart_shared": ["@local_cuda//:cudart"],
        "//conditions:default": ["@local_cuda//:cudart_static"],
    })

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], cuda_copts = [],
                 defines = [], visibility = None, testonly = False, **kwargs):
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    cuh_srcs = [s for s in srcs if s.endswith(".cuh")]  # nvcc-only headers
    other_srcs = [s for s in srcs if not s.endswith(".cu") and not s.endswith(".cuh")]
    _cuda_objects(
        name = name + "_cu",
        srcs = cu_srcs,
        hdrs = hdrs + cuh_srcs + [s for s in other_srcs if "." + s.split(".")[-1] in _HDR_EXTS],
        deps = deps + ["@local_cuda//:cuda_headers"],
        copts = cuda_copts,
        defines = defines,
        testonly = testonly,
        target_compatible_with = cuda_compatible(),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cu"] + other_srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_headers"] + cudart(),
        copts = copts,
        defines = defines,
        testonly = testonly,
        target_compatible_with = cuda_compatible(),
        visibility = visibility,
        # Never put CUDA code in a per-library .so (cc_test's default dynamic
        # mode): with static cudart its __cuda* symbols would be unresolved.
        linkstatic = kwargs.pop("linkstatic", True),
        **kwargs
    )
