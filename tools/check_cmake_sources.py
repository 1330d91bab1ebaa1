#!/usr/bin/env python3
"""Keeps the CMake build's targets equal to the Bazel build's. cmake/bazel_targets.cmake holds
one mg_bazel_target() call per Bazel target that CMake builds: every C++ library of the library
packages, the C++ tests under tests/, the main job (//examples:fashion_mnist), and what they
depend on. This script reads the BUILD.bazel files (Starlark parsed as Python, with the project's
macros expanded the way tools/defs.bzl, tests/defs.bzl and tools/cuda/cuda.bzl define them) and
compares them with that file, target by target: a source, header, dependency, copt or linkopt
that one build lists and the other does not fails the check, and so does a target only one has,
a plain cc_* rule CMake would need, or an attribute CMake does not mirror (defines, includes, ...).

    python3 tools/check_cmake_sources.py           # exit 1 and name each difference (CI runs it)
    python3 tools/check_cmake_sources.py --write   # rewrite cmake/bazel_targets.cmake from Bazel

Python 3 standard library only; reads files, runs nothing (no Bazel), well under a second.
"""
import argparse
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CMAKE_FILE = os.path.join(ROOT, "cmake", "bazel_targets.cmake")

# Every C++ library under these directories is a root; so is every C++ test and test helper
# under tests/, and the main job. Whatever they depend on (e.g. //bench:training_trace) follows.
LIBRARY_DIRS = ["", "core", "kernels", "autograd", "nn", "optim", "memory", "data", "serialize", "distributed"]
TEST_DIRS = ["tests"]
EXTRA_ROOTS = ["//examples:fashion_mnist"]

LISTS = ["SRCS", "HDRS", "DEPS", "COPTS", "LINKOPTS"]
# A list attribute's entries hold always, only with CUDA, or only without (if_cuda(a, b)).
CONDITIONS = {"": "", "cuda": "CUDA_", "nocuda": "NOCUDA_"}
FLAGS = ["ALWAYSLINK", "CUDA_ONLY", "TESTONLY", "CORE_ONLY", "GPU"]
KINDS = ["library", "test", "binary"]

# The attributes CMake mirrors, and those that do not change what is compiled or linked. Any
# other (defines, includes, local_defines, ...) fails the check until CMake learns it.
MIRRORED = {"name", "srcs", "hdrs", "deps", "copts", "linkopts", "alwayslink", "testonly", "cuda_only",
            "core_only", "tags", "size"}
IGNORED = {"visibility", "data", "timeout", "shard_count", "flaky", "args", "env", "linkstatic"}

# tests/defs.bzl: what every test links.
TEST_COMMON_DEPS = ["//core:core", "//core:runtime", "@system_gtest//:gtest_main"]


class BuildError(Exception):
    pass


def normalize(label, package):
    """A dependency as a full label: ":x" -> //pkg:x, //a/b -> //a/b:b, @r -> @r//:r."""
    if label.startswith(":"):
        return "//%s%s" % (package, label)
    if label.startswith("@") and "//" not in label:
        return "%s//:%s" % (label, label[1:])
    if label.startswith("//") or label.startswith("@"):
        if ":" not in label.split("//", 1)[1]:
            return "%s:%s" % (label, label.rsplit("/", 1)[-1])
        return label
    return "//%s:%s" % (package, label)


class Cond:
    """A list attribute split by condition: {"": always, "cuda": [...], "nocuda": [...]}."""

    def __init__(self, always=None, cuda=None, nocuda=None):
        self.parts = {"": list(always or []), "cuda": list(cuda or []), "nocuda": list(nocuda or [])}

    def __add__(self, other):
        out = Cond()
        for k in out.parts:
            out.parts[k] = self.parts[k] + other.parts[k]
        return out


def evaluate(node, where):
    """The value of a BUILD-file expression: strings, lists, +, if_cuda(), booleans, numbers."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        values = [evaluate(e, where) for e in node.elts]
        if all(isinstance(v, str) for v in values):
            return Cond(values)
        raise BuildError("%s: a list of non-strings" % where)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = evaluate(node.left, where), evaluate(node.right, where)
        if isinstance(left, Cond) and isinstance(right, Cond):
            return left + right
        raise BuildError("%s: + of something other than lists" % where)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "if_cuda":
        args = [evaluate(a, where) for a in node.args]
        kw = {k.arg: evaluate(k.value, where) for k in node.keywords}
        yes = args[0] if args else kw["if_true"]
        no = args[1] if len(args) > 1 else kw.get("if_false", Cond())
        return Cond(cuda=yes.parts[""], nocuda=no.parts[""])
    # glob(), select() and the like: only allowed where the value is not needed (data = ...).
    return None


class Target:
    def __init__(self, kind, label):
        self.kind = kind
        self.label = label
        self.lists = {}  # "SRCS" / "CUDA_SRCS" / ... -> list of strings
        self.flags = set()
        self.size = None

    def add(self, name, cond, package, label_like):
        for c, prefix in CONDITIONS.items():
            for v in cond.parts[c]:
                if label_like:
                    v = normalize(v, package)
                elif v.startswith(":") or v.startswith("//") or v.startswith("@"):
                    raise BuildError("%s: %s names a label (%s); only plain files are mirrored" % (
                        self.label, name.lower(), v))
                elif name in ("SRCS", "HDRS"):
                    v = os.path.join(package, v) if package else v
                key = prefix + name
                if v not in self.lists.setdefault(key, []):
                    self.lists[key].append(v)

    def deps(self):
        return [d for k in ("DEPS", "CUDA_DEPS", "NOCUDA_DEPS") for d in self.lists.get(k, [])]


def expand(call, package):
    """One BUILD-file rule or macro call as a Target (None for rules CMake does not build)."""
    rule = call.func.id if isinstance(call.func, ast.Name) else None
    if rule not in ("mg_cc_library", "cuda_library", "mg_cc_binary", "mg_test", "mg_gpu_test",
                    "mg_parity_test", "mg_test_library", "cc_library", "cc_binary", "cc_test"):
        return None
    if call.args:
        raise BuildError("//%s: %s with positional arguments" % (package, rule))
    kw = {}
    for k in call.keywords:
        kw[k.arg] = evaluate(k.value, "//%s:%s" % (package, k.arg))
    name = kw["name"]
    label = "//%s:%s" % (package, name)
    if rule in ("cc_library", "cc_binary", "cc_test"):
        t = Target("unsupported", label)
        t.why = "a plain %s; CMake mirrors the project's macros (tools/defs.bzl, tests/defs.bzl)" % rule
        return t
    unknown = sorted(set(kw) - MIRRORED - IGNORED)
    if unknown:
        t = Target("unsupported", label)
        t.why = "%s not mirrored by CMake (cmake/memgrad_targets.cmake)" % ", ".join(unknown)
        return t

    def lst(key, default=None):
        v = kw.get(key)
        if v is None and key in kw and key in ("srcs", "hdrs", "deps"):
            raise BuildError("%s: %s is not a plain list (glob/select are not mirrored)" % (label, key))
        return v if v is not None else Cond(default or [])

    srcs, hdrs, deps = lst("srcs"), lst("hdrs"), lst("deps")
    copts, linkopts = lst("copts"), lst("linkopts")
    flags = set()
    if kw.get("alwayslink"):
        flags.add("ALWAYSLINK")
    if kw.get("testonly"):
        flags.add("TESTONLY")
    if kw.get("cuda_only"):
        flags.add("CUDA_ONLY")
    tags = kw.get("tags")
    if tags is not None and "gpu" in tags.parts[""]:
        flags.add("GPU")
    size = kw.get("size")

    # tools/defs.bzl: mg_cc_library / mg_cc_binary default to name.cc (+ name.h).
    if rule == "mg_cc_library":
        kind = "library"
        if kw.get("srcs") is None and "srcs" not in kw:
            srcs = Cond([name + ".cc"])
        if kw.get("hdrs") is None and "hdrs" not in kw:
            hdrs = Cond([name + ".h"])
    elif rule == "mg_cc_binary":
        kind = "binary"
        if "srcs" not in kw:
            srcs = Cond([name + ".cc"])
    # tools/cuda/cuda.bzl: .cu through nvcc, CUDA headers and the static runtime; CUDA-only.
    elif rule == "cuda_library":
        kind = "library"
        flags.add("CUDA_ONLY")
        deps = deps + Cond(["@local_cuda//:cuda_headers", "@local_cuda//:cudart_static"])
        if kw.get("cuda_copts"):
            raise BuildError("%s: cuda_copts are not mirrored" % label)
    # tests/defs.bzl: name.cc, the common deps (no runtime for core_only), gpu tag, parity deps.
    elif rule in ("mg_test", "mg_gpu_test", "mg_parity_test"):
        kind = "test"
        if "srcs" not in kw:
            srcs = Cond([name + ".cc"])
        if rule in ("mg_gpu_test", "mg_parity_test"):
            flags.add("GPU")
        if rule == "mg_parity_test":
            flags.add("CUDA_ONLY")
            deps = Cond(["//tests/kernels/cuda:cuda_test_util"]) + deps
            size = size or "medium"
        common = [d for d in TEST_COMMON_DEPS
                  if not (kw.get("core_only") and d == "//core:runtime")]
        have = [normalize(d, package) for d in deps.parts[""]]
        deps = deps + Cond([d for d in common if d not in have])
        if kw.get("core_only"):
            flags.add("CORE_ONLY")
        size = size or "small"
    elif rule == "mg_test_library":
        kind = "library"
        flags.add("TESTONLY")
        if "hdrs" not in kw:
            hdrs = Cond([name + ".h"])
    else:
        raise BuildError("%s: %s is not mirrored" % (label, rule))

    t = Target(kind, label)
    t.flags = flags
    t.size = size if kind == "test" else None
    t.add("SRCS", srcs, package, False)
    t.add("HDRS", hdrs, package, False)
    t.add("DEPS", deps, package, True)
    t.add("COPTS", copts, package, False)
    t.add("LINKOPTS", linkopts, package, False)
    return t


def read_package(package, cache):
    if package in cache:
        return cache[package]
    path = os.path.join(ROOT, package, "BUILD.bazel")
    targets = {}
    if os.path.exists(path):
        tree = ast.parse(open(path).read(), path)
        for stmt in tree.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                t = expand(stmt.value, package)
                if t:
                    targets[t.label] = t
    cache[package] = targets
    return targets


def packages_under(top):
    base = os.path.join(ROOT, top)
    out = []
    for dirpath, dirnames, files in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("bazel-") and not d.startswith("."))
        if "BUILD.bazel" in files:
            out.append(os.path.relpath(dirpath, ROOT).replace(os.sep, "/").lstrip("."))
        if top == "":
            break  # the root package only; the other directories are listed themselves
    return out


def bazel_targets():
    """Every target CMake mirrors, in dependency order (a target after what it depends on)."""
    cache = {}
    roots = []
    for top in LIBRARY_DIRS:
        for pkg in packages_under(top):
            roots += [t.label for t in read_package(pkg, cache).values() if t.kind in ("library", "unsupported")]
    for top in TEST_DIRS:
        for pkg in packages_under(top):
            roots += [t.label for t in read_package(pkg, cache).values()
                      if t.kind in ("test", "unsupported") or (t.kind == "library" and "TESTONLY" in t.flags)]
    roots += EXTRA_ROOTS

    order, seen = [], set()

    def visit(label, path):
        if label in seen:
            return
        if label in path:
            raise BuildError("dependency cycle: %s" % " -> ".join(path + [label]))
        if label.startswith("@"):
            return  # system packages: cmake/ maps each to a found library
        package = label[2:].split(":")[0]
        t = read_package(package, cache).get(label)
        if t is None:
            raise BuildError("%s is needed (by %s) but not a C++ target CMake can build" % (
                label, path[-1] if path else "the roots"))
        if t.kind == "unsupported":
            raise BuildError("%s: %s" % (label, t.why))
        for d in t.deps():
            visit(d, path + [label])
        seen.add(label)
        order.append(t)

    for r in sorted(set(roots)):
        visit(r, [])
    return order


def render(targets):
    out = ["# Generated by tools/check_cmake_sources.py --write from the BUILD.bazel files; CI runs the",
           "# script, which fails when this file and Bazel disagree. One call per Bazel target, each after",
           "# the targets it depends on; CMakeLists.txt defines mg_bazel_target().",
           ""]
    for t in targets:
        head = [t.kind, t.label] + [f for f in FLAGS if f in t.flags]
        if t.size:
            head += ["SIZE", t.size]
        out.append("mg_bazel_target(%s" % " ".join(head))
        for key in [p + n for n in LISTS for p in CONDITIONS.values()]:
            values = t.lists.get(key)
            if values:
                out.append("  %s" % key)
                out += ["    %s" % quote(v) for v in values]
        out.append(")")
    return "\n".join(out) + "\n"


def quote(v):
    return v if re.fullmatch(r"[A-Za-z0-9_./:@+=-]+", v) else '"%s"' % v.replace('"', '\\"')


def parse_cmake(text):
    """cmake/bazel_targets.cmake back into Targets (the format render() writes)."""
    targets = []
    keys = set(p + n for n in LISTS for p in CONDITIONS.values())
    for m in re.finditer(r"^mg_bazel_target\((.*?)^\)", text, re.S | re.M):
        words = re.findall(r'"(?:[^"\\]|\\.)*"|[^\s"]+', re.sub(r"#[^\n]*", "", m.group(1)))
        words = [w[1:-1].replace('\\"', '"') if w.startswith('"') else w for w in words]
        if len(words) < 2 or words[0] not in KINDS:
            raise BuildError("cmake/bazel_targets.cmake: a call without kind and label: %r" % words[:2])
        t = Target(words[0], words[1])
        current, i = None, 2
        while i < len(words):
            w = words[i]
            if w in FLAGS:
                t.flags.add(w)
            elif w == "SIZE":
                i += 1
                t.size = words[i]
            elif w in keys:
                current = t.lists.setdefault(w, [])
            elif current is not None:
                current.append(w)
            else:
                raise BuildError("cmake/bazel_targets.cmake: %s: unexpected %r" % (t.label, w))
            i += 1
        targets.append(t)
    return targets


def compare(bazel, cmake):
    problems = []
    b = {t.label: t for t in bazel}
    c = {t.label: t for t in cmake}
    for label in sorted(set(b) - set(c)):
        problems.append("%s: a Bazel target CMake does not build" % label)
    for label in sorted(set(c) - set(b)):
        problems.append("%s: in cmake/bazel_targets.cmake but not a Bazel target CMake mirrors" % label)
    for label in sorted(set(b) & set(c)):
        tb, tc = b[label], c[label]
        if tb.kind != tc.kind:
            problems.append("%s: a %s in Bazel, a %s in CMake" % (label, tb.kind, tc.kind))
        for key in sorted(set(tb.lists) | set(tc.lists)):
            vb, vc = set(tb.lists.get(key, [])), set(tc.lists.get(key, []))
            what = key.lower()
            for v in sorted(vb - vc):
                problems.append("%s: %s %s is in BUILD.bazel, not in CMake" % (label, what, v))
            for v in sorted(vc - vb):
                problems.append("%s: %s %s is in CMake, not in BUILD.bazel" % (label, what, v))
        for f in sorted(tb.flags ^ tc.flags):
            problems.append("%s: %s in %s only" % (label, f, "Bazel" if f in tb.flags else "CMake"))
        if tb.size != tc.size:
            problems.append("%s: size %s in Bazel, %s in CMake" % (label, tb.size, tc.size))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite cmake/bazel_targets.cmake from Bazel")
    args = ap.parse_args()
    try:
        targets = bazel_targets()
        labels = {}
        for t in targets:
            key = re.sub(r"[/:]", ".", t.label[2:].lstrip(":"))
            if key in labels:
                raise BuildError("%s and %s map to one CMake name" % (labels[key], t.label))
            labels[key] = t.label
        if args.write:
            os.makedirs(os.path.dirname(CMAKE_FILE), exist_ok=True)
            with open(CMAKE_FILE, "w") as f:
                f.write(render(targets))
            print("wrote %s (%d targets)" % (os.path.relpath(CMAKE_FILE, ROOT), len(targets)))
            return 0
        if not os.path.exists(CMAKE_FILE):
            raise BuildError("no %s (run with --write)" % os.path.relpath(CMAKE_FILE, ROOT))
        problems = compare(targets, parse_cmake(open(CMAKE_FILE).read()))
        # Every listed file exists (a file renamed in both lists but not on disk).
        for t in targets:
            for key, values in t.lists.items():
                if key.endswith("SRCS") or key.endswith("HDRS"):
                    problems += ["%s: %s does not exist" % (t.label, v) for v in values
                                 if not os.path.exists(os.path.join(ROOT, v))]
    except (BuildError, SyntaxError, KeyError) as e:
        print("check_cmake_sources: %s" % e, file=sys.stderr)
        return 1
    if problems:
        print("CMake and Bazel disagree (cmake/bazel_targets.cmake vs the BUILD.bazel files):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        print("Run python3 tools/check_cmake_sources.py --write after changing a BUILD.bazel file.", file=sys.stderr)
        return 1
    print("check_cmake_sources: %d targets agree" % len(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
