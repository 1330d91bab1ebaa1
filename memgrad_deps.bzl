"""Repositories memgrad needs, all local (no downloads).

The main WORKSPACE calls memgrad_dependencies(memgrad_path = "."); a workspace that embeds
memgrad through local_repository(name = "memgrad", path = P) loads this file from @memgrad
and calls memgrad_dependencies(memgrad_path = P).
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//tools/cuda:cuda_configure.bzl", "cuda_configure")

def memgrad_dependencies(memgrad_path):
    tp = memgrad_path + "/third_party"

    # Bazel 4.2.3 would download these; the local copies keep it offline.
    maybe(native.local_repository, name = "rules_cc", path = tp + "/rules_cc")
    maybe(native.local_repository, name = "rules_java", path = "/usr/share/bazel/rules/java")
    maybe(native.local_repository, name = "remote_coverage_tools", path = tp + "/remote_coverage_tools")

    # Autodetects $CUDA_PATH (default /usr/local/cuda); without nvcc the CUDA targets
    # become incompatible and the CPU build goes on.
    maybe(cuda_configure, name = "local_cuda")

    # System packages, each with its BUILD file in third_party/.
    for name, path, build in [
        ("system_gtest", "/usr", "gtest"),
        ("system_benchmark", "/usr", "benchmark"),
        ("eigen", "/usr/include/eigen3", "eigen"),
        ("system_zlib", "/usr", "zlib"),
        ("nlohmann_json", "/usr/include", "nlohmann_json"),
    ]:
        maybe(
            native.new_local_repository,
            name = name,
            path = path,
            build_file = str(Label("//third_party:%s.BUILD" % build)),
        )
