// The log lines of the libraries under the shard, routed into its own log: protobuf's (for
// example "invalid UTF-8" for a string field a peer sent, logged while parsing, before any
// token check) and gRPC core's (for example "Failed getpeername" for every connection a
// peer resets before it is accepted, written to stderr in gRPC's own format). A peer can
// cause either at will, so each library gets a budget of lines a second, and the lines take
// the process's format (text or JSON) with what the peer chose escaped.
#ifndef GCOMP_SERVER_LIBRARY_LOGS_H_
#define GCOMP_SERVER_LIBRARY_LOGS_H_

namespace gcomp::server {

// protobuf warnings and errors: at most 10 lines a second.
inline constexpr int kProtobufLinesPerSecond = 10;
// gRPC core lines (at GRPC_VERBOSITY, ERROR by default): at most 20 a second; an
// "assertion failed" line, which gRPC writes just before it aborts, is always kept.
inline constexpr int kGrpcLinesPerSecond = 20;

// Installs both handlers for the whole process. Call after InitLogging.
void RouteLibraryLogs();

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_LIBRARY_LOGS_H_
