"""The system libraries' names, shared by third_party/BUILD and binaries that link them statically."""

# Abseil's libraries in link order (a library before the ones it uses).
ABSL_LIBS = [
    "flags_parse",
    "flags_usage",
    "flags_usage_internal",
    "flags_internal",
    "flags_marshalling",
    "flags_reflection",
    "flags_config",
    "flags_program_name",
    "flags_private_handle_accessor",
    "flags_commandlineflag",
    "flags_commandlineflag_internal",
    "statusor",
    "status",
    "cord",
    "cordz_info",
    "cordz_handle",
    "cordz_functions",
    "cord_internal",
    "hash",
    "city",
    "low_level_hash",
    "raw_hash_set",
    "hashtablez_sampler",
    "exponential_biased",
    "synchronization",
    "graphcycles_internal",
    "stacktrace",
    "symbolize",
    "debugging_internal",
    "demangle_internal",
    "malloc_internal",
    "time",
    "civil_time",
    "time_zone",
    "str_format_internal",
    "strings",
    "strings_internal",
    "int128",
    "throw_delegate",
    "bad_optional_access",
    "bad_variant_access",
    "base",
    "spinlock_wait",
    "raw_logging_internal",
    "log_severity",
]

# Libraries the codec and its tools use that Debian also ships as static archives.
_CODEC_STATIC_LIBS = ["absl_" + lib for lib in ABSL_LIBS] + ["absl_strerror", "zstd", "lz4", "xxhash"]

def static_codec_linkopts():
    """Linkopts that link Abseil, zstd, lz4 and xxHash into a binary from their archives.

    For command-line tools started once a file: 55 shared libraries cost about 10 ms of
    loading and relocation a process (against 5 ms for all of zstd). A binary's own linkopts
    come before its dependencies' on the link line, so the archives resolve every symbol
    first, and --as-needed then drops the shared copies the deps still name. Only for
    binaries that link neither gRPC nor protobuf: those load Abseil's shared libraries
    themselves, and two copies of Abseil in one process is not safe.
    """
    return ["-Wl,--as-needed", "-Wl,--start-group"] + [
        "-l:lib%s.a" % lib
        for lib in _CODEC_STATIC_LIBS
    ] + ["-Wl,--end-group"]
