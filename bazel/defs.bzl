"""Build macros: every target of the project gets the same flags from here.

gcomp_cc_library / gcomp_cc_binary / gcomp_cc_test wrap the native C++ rules;
gcomp_proto_library generates C++ (and optionally gRPC) code with the system protoc;
gcomp_cuda_library compiles .cu files with /usr/local/cuda/bin/nvcc.
"""

GCOMP_COPTS = [
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
]

# Generated protobuf/gRPC code is not ours to keep warning-clean.
GENERATED_COPTS = ["-std=c++17", "-w"]

def gcomp_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = GCOMP_COPTS + copts, **kwargs)

def gcomp_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = GCOMP_COPTS + copts, **kwargs)

def gcomp_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test; links gtest_main unless deps bring their own main."""
    native.cc_test(
        name = name,
        copts = GCOMP_COPTS + copts,
        deps = deps + ["//third_party:gtest_main"],
        size = size,
        **kwargs
    )

def gcomp_proto_library(name, srcs, deps = [], grpc = False, visibility = None):
    """C++ code for `srcs` (.proto files in this package) with the system protoc.

    Makes `<name>` (a cc_library named after the proto target, e.g. health_cc_proto);
    with grpc = True the library also holds the gRPC service stubs.
    `deps` are other gcomp_proto_library targets whose .proto files these import.
    """
    pkg = native.package_name()
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    dep_protos = [d + "_srcs" for d in deps]
    cmd = "protoc -I. --cpp_out=$(GENDIR)"
    if grpc:
        cmd += " --grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)"
    cmd += " " + " ".join(["%s/%s" % (pkg, s) for s in srcs])
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + dep_protos,
        visibility = visibility,
    )
    native.genrule(
        name = name + "_gen",
        srcs = [name + "_srcs"],
        outs = outs,
        cmd = cmd,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        copts = GENERATED_COPTS,
        deps = deps + ["//third_party:grpc" if grpc else "//third_party:protobuf"],
        visibility = visibility,
    )

NVCC = "/usr/local/cuda/bin/nvcc"

# sm_90 machine code (H100/H200) plus compute_90 PTX so newer GPUs can JIT it.
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "-Xcompiler",
    "-Wall",
    "-Werror",
    "all-warnings",
    "-gencode",
    "arch=compute_90,code=[sm_90,compute_90]",
]

def gcomp_cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], extra_headers = [], deps = [], visibility = None):
    """Compiles each .cu in `srcs` with nvcc into an object wrapped in a cc_library.

    `hdrs` are host-only headers (they may name cudaStream_t, never a __global__);
    `cuda_hdrs` are the .cuh files the .cu files include; `extra_headers` are other
    project headers (labels) the .cu files include, e.g. the CPU codec's format header.
    """
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + cuda_hdrs + extra_headers,
            outs = [obj],
            cmd = "%s %s -I. -c $(location %s) -o $@" % (NVCC, " ".join(NVCC_FLAGS), src),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs + cuda_hdrs,
        copts = GCOMP_COPTS,
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
    )

def gcomp_fuzz_target(name, srcs, deps = []):
    """A fuzz target `name` whose srcs define LLVMFuzzerTestOneInput (docs/FUZZING.md).

    Makes `<name>_fuzz`: under --config=fuzz (clang) a libFuzzer binary; otherwise a replay
    tool that runs the files and folders named on its command line through the target.
    Makes `<name>_fuzz_test`: replays fuzz/corpus/<name>/ and fuzz/regressions/<name>/ in the
    ordinary test suite, so every committed input (and every crasher found) stays a test.
    """
    native.cc_binary(
        name = name + "_fuzz",
        srcs = srcs,
        copts = GCOMP_COPTS,
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.cc_test(
        name = name + "_fuzz_test",
        srcs = srcs + ["//fuzz:replay_test.cc"],
        copts = GCOMP_COPTS + ["-DGCOMP_FUZZ_TARGET=" + name],
        data = native.glob(["corpus/%s/**" % name, "regressions/%s/**" % name]),
        deps = deps + ["//fuzz:replay", "//third_party:gtest_main"],
        size = "small",
    )
