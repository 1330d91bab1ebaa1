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

    maybe(
        native.new_local_repository,
        name = "system_gtest",
        path = "/usr",
        build_file = str(Label("//third_party:gtest.BUILD")),
    )
    maybe(
        native.new_local_repository,
        name = "system_benchmark",
        path = "/usr",
        build_file = str(Label("//third_party:benchmark.BUILD")),
    )
    maybe(
        native.new_local_repository,
        name = "eigen",
        path = "/usr/include/eigen3",
        build_file = str(Label("//third_party:eigen.BUILD")),
    )
    maybe(
        native.new_local_repository,
        name = "system_zlib",
        path = "/usr",
        build_file = str(Label("//third_party:zlib.BUILD")),
    )
    maybe(
        native.new_local_repository,
        name = "nlohmann_json",
        path = "/usr/include",
        build_file = str(Label("//third_party:nlohmann_json.BUILD")),
    )
